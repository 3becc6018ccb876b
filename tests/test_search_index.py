"""The keyword index (storage/search_index.py) and the entry pool's search over it: BM25
ranking, stems, CJK, changes, and visibility checked against the independent oracle."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.shard.pool import Pool
from engine.memory_entries import EntryMeta, Reader, Status
from storage.crypto import Cipher
from storage.memory_store import StoredPool
from storage.search_index import Stats, TermIndex, order_by_key, stable_order
from storage.term_keys import Analyzer, Counted, in_context, is_label_key
from tests.test_engine_visibility_oracle import cases, oracle_visible

AN = Analyzer(b"k" * 32)
DOCS = {
    "m1": "We deployed the billing service to staging on Friday.",
    "m2": "The release train leaves on Fridays.",
    "m3": "项目讨论会定在周五\uff0c先部署到预发环境",  # a full-width comma
    "m4": "Lunch is at noon; the cafeteria serves soup.",
    "m5": "Deploy, deploy, deploy: the billing team deploys everything.",
}


def index(docs: dict[str, str] = DOCS) -> TermIndex:
    idx = TermIndex()
    idx.build((i, AN.keys(t)) for i, t in docs.items())
    return idx


def ids(idx: TermIndex, q: str, depth: int = 10, allowed=None) -> list[str]:
    return [i for i, _ in idx.search(AN.query(q), depth, allowed)]


def test_any_word_matches_and_stems_meet():
    idx = index()
    # "deployment" shares only its stem with m1 and m5; "fridays" only its stem with m1.
    assert set(ids(idx, "deployment")) == {"m1", "m5"}
    assert ids(idx, "when was the billing service deployment")[0] == "m1"
    assert set(ids(idx, "friday soup")) == {"m1", "m2", "m4"}  # any word, not every word
    assert ids(idx, "what is the") == []  # stop words only
    assert ids(idx, "zeppelin") == []


def test_bm25_prefers_rarer_terms_and_saturates_repeats():
    idx = index()
    hits = idx.search(AN.query("billing deploy"), 10)
    assert [i for i, _ in hits][:2] == ["m5", "m1"]  # m5 says both, and "deploy" four times
    scores = dict(hits)
    # A term in one record (cafeteria) outweighs one in several (friday).
    one = dict(idx.search(AN.query("cafeteria"), 10))["m4"]
    many = dict(idx.search(AN.query("friday"), 10))["m2"]
    assert one > many > 0 and all(s > 0 for s in scores.values())


def test_a_chinese_query_finds_a_chinese_record():
    idx = index()
    assert ids(idx, "讨论") == ["m3"]
    assert ids(idx, "部署环境") == ["m3"]
    assert ids(idx, "周一开会") == []  # no two characters in a row in common


def test_put_remove_and_edit_change_hits_at_once():
    idx = index()
    idx.put("m6", AN.keys("The cafeteria closes early on holidays."))
    assert set(ids(idx, "cafeteria")) == {"m4", "m6"}
    idx.remove("m4")
    assert ids(idx, "cafeteria") == ["m6"]
    idx.put("m6", AN.keys("Holidays are in August."))  # an edit: the old text is gone
    assert ids(idx, "cafeteria") == [] and ids(idx, "august") == ["m6"]
    assert len(idx) == 5 and "m4" not in idx


def test_allowed_filters_without_shifting_the_others():
    idx = index()
    everything = ids(idx, "deploy billing friday")
    hidden = everything[0]
    rest = ids(idx, "deploy billing friday", allowed=lambda i: i != hidden)
    assert rest == everything[1:]
    assert ids(idx, "deploy billing friday", depth=1, allowed=lambda i: i == everything[-1]) == [
        everything[-1]
    ]


def test_stored_keys_are_hashes_not_words():
    keys = AN.keys("zyxquokka zyxquokka marmalade")
    raw = keys.tobytes()
    assert b"zyxquokka" not in raw and b"marmalad" not in raw
    assert len(keys) == 3 and keys[0] <= keys[1] <= keys[2]  # sorted, the order of words lost
    other = Analyzer(b"j" * 32).keys("zyxquokka zyxquokka marmalade")
    assert set(other.tolist()).isdisjoint(keys.tolist())  # another key, other hashes


words = st.sampled_from(
    ["alpha", "beta", "gamma", "delta", "deploys", "deploying", "讨论", "会议", "soup"]
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(words, max_size=8).map(" ".join), min_size=1, max_size=30),
    st.lists(words, min_size=1, max_size=3).map(" ".join),
    st.data(),
)
def test_incremental_changes_rank_like_a_fresh_build(texts, query, data):
    """Writes one by one, edits and removals give the ranking a fresh build of what is left
    gives (after a merge, when no dead posting skews document frequencies)."""
    docs = {f"d{n:02d}": t for n, t in enumerate(texts)}
    inc = TermIndex()
    for i, t in docs.items():
        inc.put(i, AN.keys(t))
    for i in data.draw(st.lists(st.sampled_from(sorted(docs)), max_size=5, unique=True)):
        if data.draw(st.booleans()):
            inc.remove(i)
            del docs[i]
        else:
            docs[i] = data.draw(st.lists(words, max_size=8).map(" ".join))
            inc.put(i, AN.keys(docs[i]))
    inc.merge()
    fresh = index(docs)
    a = dict(inc.search(AN.query(query), 100))
    b = dict(fresh.search(AN.query(query), 100))
    assert a.keys() == b.keys()
    for i in a:
        assert math.isclose(a[i], b[i], rel_tol=1e-5)
    # Every hit holds a query term; every record holding one is a hit.
    q_terms = set(AN.query(query))
    for i, t in docs.items():
        assert (i in a) == bool(q_terms & set(AN.keys(t).tolist()))


def _merged_by_sorting_everything(ix: TermIndex, extra=None):
    """The layout the merge had before it placed new postings by `searchsorted` (one stable
    sort of the base, the tail and the given postings, in that order): the reference."""
    lay = ix.layout()
    parts_t = [np.repeat(np.arange(lay.indptr.size - 1), np.diff(lay.indptr))]
    parts_r, parts_f = [lay.rows], [lay.tfs]
    for tid, (r, f) in lay.tail.items():
        parts_t.append(np.full(len(r), tid, dtype=np.int64))
        parts_r.append(np.asarray(r, dtype=np.int32))
        parts_f.append(np.asarray(f, dtype=np.float32))
    if extra is not None:
        parts_t.append(extra[0])
        parts_r.append(extra[1])
        parts_f.append(extra[2])
    all_t, all_r, all_f = (np.concatenate(p) for p in (parts_t, parts_r, parts_f))
    keep = lay.alive[all_r]
    all_t, all_r, all_f = all_t[keep], all_r[keep], all_f[keep]
    order = np.argsort(all_t, kind="stable")
    counts = np.bincount(all_t, minlength=lay.terms)
    return np.concatenate(([0], np.cumsum(counts))), all_r[order], all_f[order]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(words, max_size=8).map(" ".join), min_size=0, max_size=25),
    st.lists(st.lists(words, max_size=8).map(" ".join), min_size=0, max_size=25),
    st.data(),
)
def test_a_merge_lays_postings_out_as_one_stable_sort_would(built, written, data):
    """The merge places new postings into the term-ordered base without sorting the base
    again: the arrays are exactly those one stable sort of everything gives (dead rows
    dropped), so rankings and their tie order are what they were. Checked on every merge:
    explicit, and `build_flat`'s into a non-empty index (given postings)."""
    real = TermIndex.merge
    merges: list[int] = []

    def checked(self, *given):
        want = _merged_by_sorting_everything(self, given or None)
        real(self, *given)
        lay = self.layout()
        for got, expected in zip((lay.indptr, lay.rows, lay.tfs), want, strict=True):
            assert np.array_equal(got, expected)
        assert not lay.tail
        merges.append(len(given))

    TermIndex.merge = checked  # type: ignore[method-assign]
    try:
        ix = TermIndex()
        ix.build((f"b{n}", AN.keys(t)) for n, t in enumerate(built))
        names = [f"b{n}" for n in range(len(built))]
        for n, t in enumerate(written):
            ix.put(f"w{n}", AN.keys(t))
            names.append(f"w{n}")
        picked = (
            data.draw(st.lists(st.sampled_from(names), max_size=6, unique=True)) if names else []
        )
        for i in picked:
            if data.draw(st.booleans()):
                ix.remove(i)
            else:
                ix.put(i, AN.keys(data.draw(st.lists(words, max_size=8).map(" ".join))))
        ix.merge()
        ix.put("y", AN.keys("alpha beta deploy"))
        more = [(f"x{n}", AN.keys(t)) for n, t in enumerate(written[:5])]
        ix.build([*more, ("y", AN.keys("soup deploy"))])  # into a non-empty index
    finally:
        TermIndex.merge = real  # type: ignore[method-assign]
    assert merges[0] == 0 and (not ix.layout().row_slots or merges[-1] == 3)


def test_term_counts_are_the_same_counted_in_python_or_numpy(monkeypatch):
    """`put` counts a note's few keys in Python and a long text's with numpy: same ranking."""
    from storage import search_index

    long = " ".join(["alpha"] * 400 + ["beta"] * 150 + ["gamma deploys"] * 30)
    texts = {"short": "alpha beta alpha soup", "long": long, "mid": "gamma gamma soup"}

    def ranking():
        ix = TermIndex()
        for i, t in texts.items():
            keys = AN.keys(t)
            ix.put(i, keys[::-1].copy())  # order does not matter to the count
        return dict(ix.search(AN.query("alpha gamma soup beta"), 10))

    mixed = ranking()
    assert AN.keys(long).size > search_index.PYTHON_COUNT_MAX  # the long text: numpy's count
    monkeypatch.setattr(search_index, "PYTHON_COUNT_MAX", 10**9)
    assert ranking() == mixed
    monkeypatch.setattr(search_index, "PYTHON_COUNT_MAX", -1)
    assert ranking() == mixed


# --- a entry pool: only what the reader may see --------------------------------------------


def _pool(entries: dict[str, EntryMeta], texts: dict[str, str]) -> Pool:
    stored = StoredPool(pool="p", cipher=Cipher(b"\x00" * 32), wrapped_key=b"", entries=entries)
    pool = Pool(stored)
    pool.terms.build((i, AN.keys(texts[i])) for i in entries)
    return pool


@settings(max_examples=200, deadline=None)
@given(case=cases(), data=st.data())
def test_search_results_are_exactly_the_active_matches_the_oracle_lets_the_reader_see(case, data):
    entries, reader = case
    texts = {
        i: data.draw(st.sampled_from(["zebra crossing", "zebras", "no match here", "zebra"]))
        for i in entries
    }
    pool = _pool(entries, texts)
    found = [i for i, _ in pool.search(AN.query("zebra"), reader, 100)]
    expected = {
        i
        for i, e in entries.items()
        if "zebra" in texts[i] and e.status == Status.ACTIVE and oracle_visible(reader, entries, i)
    }
    assert set(found) == expected and len(found) == len(set(found))
    # A small limit gives the best of what may be seen, never a hidden entry in their place.
    top = [i for i, _ in pool.search(AN.query("zebra"), reader, 2)]
    assert top == found[:2]


def test_search_ranks_by_bm25_among_what_the_reader_sees():
    reader = Reader(user="u1", org="o1", channels=frozenset(), uses_bot=True)
    from tests.test_engine_visibility_oracle import pinned

    entries = {
        "a": pinned("a", "org:o1", "for:person:u1"),
        "b": pinned("b", "org:o1", "for:person:u2"),  # someone else's
        "c": pinned("c", "org:o1", "for:bot"),
    }
    texts = {"a": "tea", "b": "tea tea tea", "c": "tea and tea"}
    pool = _pool(entries, texts)
    hits = pool.search(AN.query("tea"), reader, 10)
    assert [i for i, _ in hits] == ["c", "a"]
    assert np.all(np.diff([s for _, s in hits]) <= 0)


def test_postings_are_ordered_as_a_stable_argsort_would():
    """A pool's load orders its postings by one plain sort of keys with positions in their low
    bits; the result must be exactly the stable argsort's, also when keys share their high
    bits (then the plain sort's order is wrong and the argsort is used)."""
    rng = np.random.default_rng(7)
    for n in (1, 100, 5_000, 200_000):
        distinct = rng.integers(-(2**63), 2**63 - 1, size=max(1, n // 4), dtype=np.int64)
        keys = rng.choice(distinct, size=n)
        assert (order_by_key(keys) == np.argsort(keys, kind="stable")).all()
    near = np.array([5, 4, 5, 4, -1, 3] * 2_000, dtype=np.int64)  # same high bits, other keys
    assert (order_by_key(near) == np.argsort(near, kind="stable")).all()


def test_a_loaded_index_then_changed_ranks_like_a_fresh_build():
    """An index built in one go from stored keys (as a pool loads: enough postings for the
    fast ordering, its id map made when first needed), then written to, edited and pruned,
    ranks like a fresh build of what is left and knows each id's row."""
    rng = np.random.default_rng(3)
    vocab = [f"w{k}" for k in range(400)]
    docs = {f"d{n:05d}": " ".join(rng.choice(vocab, size=12)) for n in range(3_000)}
    keys = {i: AN.keys(t) for i, t in docs.items()}
    idx = TermIndex()
    idx.build_flat(
        list(keys),
        np.array([k.size for k in keys.values()], dtype=np.int64),
        np.concatenate(list(keys.values())),
    )
    assert not idx.layout().row_map_made  # not made by the load
    assert "d00007" in idx and idx.row_of("d00007") == 7 and "nope" not in idx
    for n in range(0, 3_000, 7):
        i = f"d{n:05d}"
        if n % 2:
            idx.remove(i)
            del docs[i]
        else:
            docs[i] = " ".join(rng.choice(vocab, size=5))
            idx.put(i, AN.keys(docs[i]))
    for n in range(50):
        docs[f"n{n}"] = " ".join(rng.choice(vocab, size=9))
        idx.put(f"n{n}", AN.keys(docs[f"n{n}"]))
    idx.merge()
    fresh = index(docs)
    for q in ("w1 w2", "w300", "w7 w8 w9 w10"):
        a, b = dict(idx.search(AN.query(q), 5_000)), dict(fresh.search(AN.query(q), 5_000))
        assert a.keys() == b.keys() and all(math.isclose(a[i], b[i], rel_tol=1e-6) for i in a)
    assert len(idx) == len(docs) and all(i in idx for i in docs)
    assert all(idx.row_ids()[idx.row_of(i)] == i for i in docs)


def test_a_record_in_context_ranks_first_for_its_own_words_and_is_found_by_its_neighbours():
    """`in_context`: own words count four times, each neighbour's twice and the second record
    before once, so the record is found by the words around it (a reply by its question's
    words, and by the words of the turn before the question) yet ranks above its neighbours
    for its own words, even when it is the longer text."""
    analyzer = Analyzer(b"k" * 32)
    texts = {
        "q": "Did you go to the pottery workshop?",
        "a": "Yes! I made a bowl and a little mug, it is lopsided but I love it so much.",
        "n": "It rained all afternoon.",
    }
    own = {i: analyzer.key_list(t) for i, t in texts.items()}
    index = TermIndex()
    index.put("q", in_context(own["q"], None, own["a"]))
    index.put("a", in_context(own["a"], own["q"], own["n"]))
    index.put("n", in_context(own["n"], own["a"], further=own["q"]))
    index.put("x", in_context(analyzer.key_list("Nothing to do with it.")))
    ranked = [i for i, _ in index.search(analyzer.query("bowl mug"), 10)]
    assert ranked[0] == "a" and set(ranked) == {"q", "a", "n"}
    assert index.search(analyzer.query("pottery workshop"), 10)[0][0] == "q"
    assert index.search(analyzer.query("rained afternoon"), 10)[0][0] == "n"
    assert {i for i, _ in index.search(analyzer.query("pottery workshop"), 10)} == {"q", "a", "n"}
    assert list(in_context(own["n"])) == list(own["n"])  # no neighbour: its own keys as they are
    q, n = own["q"], own["n"]
    assert in_context(q, n).expanded() == sorted([*q, *q, *q, *q, *n, *n])  # type: ignore[union-attr]
    both = sorted([*q, *q, *q, *q, *n, *n, *own["a"]])
    assert in_context(q, n, None, own["a"]).expanded() == both  # type: ignore[union-attr]


def test_indexes_searched_as_one_score_as_one_index_holding_every_row():
    """`Stats.of` (actors/workspace/search.py `keyword_stats`): two pools' indexes scored under
    their statistics added up give every row the score it has in one index holding both pools'
    rows; under their own, a row of the pool where a word is rare outranks better ones."""
    first = {"u1": "zork blip", "u2": "zork zork fleem", "u3": "zork gronk wibble"}
    first["u4"] = "fleem gronk"
    second = {"b1": "zork wibble", "b2": "fleem plonk quux", "b3": "quux"}
    a, b, both = index(first), index(second), index({**first, **second})
    for q in ("zork", "zork fleem", "wibble zork", "quux blip", "nothing"):
        keys = AN.query(q)
        stats = Stats.of([a.stats(keys), b.stats(keys)])
        got = dict(a.search(keys, 10, None, stats) + b.search(keys, 10, None, stats))
        want = dict(both.search(keys, 10))
        assert got.keys() == want.keys()
        assert all(math.isclose(got[i], want[i], rel_tol=1e-5) for i in want)
    keys = AN.query("zork")
    own = sorted(a.search(keys, 10) + b.search(keys, 10), key=lambda h: -h[1])
    assert own[0][0] == "b1" and ids(both, "zork")[:2] == ["u2", "u1"]


def test_a_longer_record_holding_every_query_word_is_not_buried_by_its_length():
    """BM25's k1 0.9 / b 0.4 (short passages): the turn that tells something, longer and
    holding every query word once, ranks above a short one repeating two of them (with the
    classic 1.2 / 0.75 the short one came first: LoCoMo-like recall@10 0.497 against 0.682)."""
    idx = index(
        {
            "told": "At the pottery class I made a bowl, garden morning.",
            "asked": "Pottery class? Pottery class!",
            "o1": "Lovely weather",
            "o2": "See you soon",
            "o3": "The train was late",
            "o4": "Bowls and cups",
        }
    )
    assert ids(idx, "Which bowl came out of the pottery class?")[:2] == ["told", "asked"]


def test_a_query_naming_a_label_prefers_the_records_under_it():
    """A record's label ("Caroline: …", who speaks) is indexed apart from its words, and a
    query asks for each term as a label too, at twice a word's weight: "what does Caroline
    paint?" finds what Caroline said before what was said to her, though the reply to her
    names her and is the shorter."""
    idx = index(
        {
            "said": "Caroline: I paint landscapes in the evening, mostly lakes and hills.",
            "told": "Melanie: Caroline, you paint so well!",
            "other": "Melanie: I went hiking.",
        }
    )
    assert ids(idx, "What does Caroline paint?")[:2] == ["said", "told"]
    keys = AN.key_list("Caroline: I paint.")
    assert sorted(map(is_label_key, keys)) == [False, True]  # "paint" a word, "caroline" a label
    assert not any(map(is_label_key, AN.key_list("I paint, Caroline.")))


def test_a_name_among_a_records_words_weighs_less_than_its_label():
    """A query's name that is a label here counts half as much as a word: in a record's words
    a name mostly addresses the other speaker ("Thanks, Nate!"), so what Nate said about the
    query's subject ranks above a short thanks to him, though the thanks holds the rarer word."""
    idx = index(
        {
            "thanks": "Joanna: Thanks, Nate! Appreciate it.",
            "said": "Nate: I appreciate the quiet of the lake at dawn, when only the birds are up.",
            "n1": "Nate: Morning!",
            "n2": "Nate: The game went well.",
            "j1": "Joanna: I wrote a new script.",
            "j2": "Joanna: See you soon.",
        }
    )
    assert ids(idx, "What does Nate appreciate?") == ["said", "thanks"]
    # A name that is no label here keeps a word's full weight.
    plain = index({"t": "Thanks, Nate! Appreciate it.", "s": "I appreciate the quiet lake."})
    assert ids(plain, "What does Nate appreciate?") == ["t", "s"]


def test_a_label_alone_finds_records_only_when_the_query_is_nothing_else():
    """A name ranks the records matching the rest of the query; it finds none alone unless
    the query asks for nothing else (else the speaker's small talk fills the list). A label
    scores the same in a short record as in a long one."""
    docs = {
        "hi": "Caroline: Hey! How have you been?",
        "long": "Caroline: Big news, we bought a used car so I can stop taking two buses to work.",
        "bike": "Melanie: A car!",
    }
    idx = index(docs)
    assert ids(idx, "Which vehicle did Caroline purchase?") == []  # nothing but the name matches
    assert ids(idx, "Which car did Caroline get?") == ["long", "bike"]  # the name ranks, not finds
    assert ids(idx, "Which vehicle did Melanie purchase?") == []
    alone = dict(idx.search(AN.query("Caroline"), 10))
    assert alone.keys() == {"hi", "long"} and math.isclose(alone["hi"], alone["long"])
    # A name that is no label here is a word like any other.
    assert ids(idx, "zork Caroline") == [] and ids(index({"n": "Hey Caroline"}), "zork Caroline")


def test_a_neighbour_lends_its_words_but_not_its_label():
    """`in_context`: in a dialog each neighbour is the other speaker; a turn indexed with its
    label would weigh the other speaker's name more than its own speaker's."""
    analyzer = Analyzer(b"k" * 32)
    q = analyzer.key_list("Melanie: Did you go to the pottery workshop?")
    a = analyzer.key_list("Caroline: Yes! I made a bowl.")
    n = analyzer.key_list("Melanie: It rained.")
    keys = in_context(a, q, n, q)
    assert isinstance(keys, Counted)
    flat = keys.expanded()
    mine = [k for k in a if is_label_key(k)]
    assert mine and [k for k in flat if is_label_key(k)] == sorted(mine * 4)
    lent = [k for k in q if not is_label_key(k)]
    assert all(flat.count(k) == 3 for k in lent)  # twice as the turn before, once as further
    index = TermIndex()
    index.put("q", in_context(q, None, a))
    index.put("a", keys)
    index.put("n", in_context(n, a, further=q))
    assert index.search(analyzer.query("Caroline bowl"), 10)[0][0] == "a"
    assert [i for i, _ in index.search(analyzer.query("Caroline"), 10)] == ["a"]


def test_indexes_searched_as_one_agree_on_which_query_words_are_labels():
    """Under shared statistics (`Stats.of`), a pool where a query's name is no label filters
    as the pool where it is one: the hits are those of one index holding both pools."""
    first = {"c1": "Caroline: I bought a car.", "c2": "Caroline: Hello there!"}
    second = {"m1": "Melanie: Caroline has a car.", "m2": "Melanie: Caroline says hello."}
    a, b, both = index(first), index(second), index({**first, **second})
    for q in ("Caroline car", "Caroline", "Caroline zork", "car"):
        keys = AN.query(q)
        stats = Stats.of([a.stats(keys), b.stats(keys)])
        got = dict(a.search(keys, 10, None, stats) + b.search(keys, 10, None, stats))
        want = dict(both.search(keys, 10))
        assert got.keys() == want.keys(), q
        assert all(math.isclose(got[i], want[i], rel_tol=1e-5) for i in want)
    assert set(ids(both, "Caroline car")) == {"c1", "m1"}


_OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.integers(0, 9),
            st.lists(words, max_size=10).map(" ".join),
            st.integers(0, 3),  # 0: as counts in context, else as the sorted key list
        ),
        st.tuples(st.just("remove"), st.integers(0, 9), st.just(""), st.just(0)),
        st.tuples(st.just("merge"), st.just(0), st.just(""), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=_OPS, built=st.lists(st.lists(words, max_size=8).map(" ".join), max_size=6))
def test_writes_filed_at_the_next_search_rank_as_if_filed_at_once(ops, built):
    """A write's postings wait, unfiled, for the next search (or merge): an index searched
    after every write (each filed at once) and one searched only at the end lie exactly
    alike (tail, base, terms, rows) and answer every query alike, scores and tie order."""
    at_once, later = TermIndex(), TermIndex()
    for ix in (at_once, later):
        ix.build((f"b{n}", AN.keys(t)) for n, t in enumerate(built))
    before = AN.key_list("alpha beta soup")
    for kind, n, text, form in ops:
        for ix in (at_once, later):
            if kind == "put":
                own = AN.key_list(text)
                ix.put(f"r{n}", in_context(own, before, None, None) if not form else own)
            elif kind == "remove":
                ix.remove(f"r{n}")
            else:
                ix.merge()
        at_once.layout()  # files what was just written
    for q in ("alpha", "beta soup deploy", "gamma alpha friday", "zeppelin"):
        query = AN.query(q)
        assert later.stats(query) == at_once.stats(query)
        assert later.search(query, 50) == at_once.search(query, 50)
    a, b = at_once.layout(), later.layout()
    assert a.tail == b.tail and a.terms == b.terms and a.row_slots == b.row_slots
    for x, y in ((a.indptr, b.indptr), (a.rows, b.rows), (a.tfs, b.tfs), (a.alive, b.alive)):
        assert np.array_equal(x, y)


def test_a_search_right_after_a_write_finds_it():
    """Unfiled postings are read: a write is found by the very next search, before any
    merge, and its old text is not."""
    ix = index()
    ix.put("m9", AN.keys("the zeppelin lands at noon"))
    assert ids(ix, "zeppelin") == ["m9"]
    ix.put("m9", AN.key_list("the airship lands"))
    ix.put("m8", in_context(AN.key_list("cafeteria soup"), AN.key_list("zeppelin")))
    assert ids(ix, "airship") == ["m9"]
    assert ids(ix, "zeppelin") == ["m8"]  # a neighbour's word; m9's old text is forgotten
    assert "m8" in ids(ix, "cafeteria")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=3_000), st.integers(0, 40))
def test_stable_order_is_a_stable_argsort(ids, shift):
    """A merge orders the postings written since the last one by term with `stable_order`:
    exactly what a stable argsort gives (ties in written order), at any size and id range."""
    a = np.asarray(ids, dtype=np.int64) << shift
    assert np.array_equal(stable_order(a), np.argsort(a, kind="stable"))
