"""Workspace memory search (SC-7): keyword hits, semantic hits, and their authorized merge."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidInput
from engine.text_terms import TermMaker, fold, query_terms, terms
from engine.workspace_search import Hit, cosine_top_k, fusion_depth, merge_hits


def test_terms_fold_case_drop_stop_words_and_stem_through_the_given_stemmer():
    assert terms("What did Caroline DEPLOY to the staging?") == ["caroline", "deploy", "staging"]
    # Full-width letters fold; a one-letter word drops.
    assert terms("\uff24\uff45\uff50\uff4c\uff4f\uff59 x 42") == ["deploy", "42"]
    stem = lambda words: [w.rstrip("s") for w in words]  # noqa: E731 - a stand-in stemmer
    assert terms("Deploys and builds", stem) == ["deploy", "build"]


def test_spaceless_scripts_become_character_bigrams():
    assert terms("我们讨论了计划") == ["我们", "们讨", "讨论", "论了", "了计", "计划"]
    assert terms("讨论") == ["讨论"] and terms("论") == ["论"]
    assert terms("Python部署") == ["python", "部署"]  # a word and a run of Han characters
    assert terms("会議を開く") == ["会議", "議を", "を開", "開く"]


def test_query_terms_are_distinct_and_a_stop_word_query_has_none():
    assert query_terms("plan the plan, PLAN") == ["plan"]
    assert query_terms("what is the") == [] and query_terms("  ,.  ") == []


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_terms_are_deterministic_and_memo_free(text):
    maker = TermMaker()
    assert maker(text) == maker(text) == terms(text)
    assert all(t and t == fold(t) for t in terms(text))


# --- semantic -------------------------------------------------------------------------------------


def test_cosine_top_k():
    vectors = {
        "a": [1.0, 0.0],
        "b": [0.6, 0.8],
        "c": [-1.0, 0.0],
        "z": [0.0, 0.0],
        "a2": [2.0, 0.0],
    }
    hits = cosine_top_k([1.0, 0.0], vectors, 3)
    assert [h.id for h in hits] == ["a", "a2", "b"]
    assert hits[0].score == pytest.approx(1.0) and hits[2].score == pytest.approx(0.6)
    assert hits[0].kinds == ("semantic",)
    assert [h.id for h in cosine_top_k([1.0, 0.0], vectors.items(), 10, min_score=0.5)] == [
        "a",
        "a2",
        "b",
    ]
    assert cosine_top_k([0.0, 0.0], vectors, 3) == []
    assert cosine_top_k([1.0, 0.0], vectors, 0) == []
    with pytest.raises(InvalidInput):
        cosine_top_k([1.0, 0.0, 0.0], vectors, 3)


vec_st = st.lists(st.floats(-10, 10, allow_nan=False), min_size=3, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    vec_st,
    st.dictionaries(st.text(alphabet="abcdef", min_size=1, max_size=3), vec_st),
    st.integers(0, 8),
)
def test_cosine_top_k_agrees_with_brute_force(query, vectors, k):
    def cos(u, v):
        nu, nv = math.hypot(*u), math.hypot(*v)
        if nu == 0 or nv == 0:
            return None
        return sum((a / nu) * (b / nv) for a, b in zip(u, v, strict=True))

    hits = cosine_top_k(query, vectors, k)
    scored = {i: cos(query, v) for i, v in vectors.items()}
    expected = sorted(
        (i for i, s in scored.items() if s is not None), key=lambda i: (-scored[i], i)
    )
    if cos(query, query) is None:
        expected = []
    assert len(hits) == min(k, len(expected))
    for hit, want in zip(hits, expected, strict=False):
        assert hit.score == pytest.approx(scored[want], abs=1e-9)
    assert all(-1 - 1e-9 <= h.score <= 1 + 1e-9 for h in hits)


# --- merged ---------------------------------------------------------------------------------------


def k(i: str, score: float = 1.0) -> Hit:
    return Hit(id=i, score=score, kinds=("keyword",))


def s(i: str, score: float = 0.5) -> Hit:
    return Hit(id=i, score=score, kinds=("semantic",))


def test_merge_keeps_both_kinds_once_each_and_only_what_is_allowed():
    keyword = [k("m1", 3), k("m2", 2), k("secret", 9)]
    semantic = [s("m9", 0.9), s("m2", 0.8), s("hidden", 0.99)]
    merged = merge_hits(keyword, semantic, lambda i: i.startswith("m"), 10)
    assert [h.id for h in merged] == ["m2", "m1", "m9"]
    assert merged[0].kinds == ("keyword", "semantic")
    assert merged[1].kinds == ("keyword",) and merged[2].kinds == ("semantic",)


def test_a_semantic_hit_need_not_contain_the_query():
    docs = [("m1", "We deploy on Fridays"), ("m2", "Releases go out at the end of the week")]
    keyword = [k(i) for i, text in docs if "deploy" in terms(text)]
    assert [h.id for h in keyword] == ["m1"]
    vectors = {"m1": [0.9, 0.1], "m2": [0.8, 0.3]}
    merged = merge_hits(keyword, cosine_top_k([1.0, 0.2], vectors, 10), lambda _: True, 10)
    assert {h.id for h in merged} == {"m1", "m2"}
    assert "deploy" not in dict(docs)["m2"]


def test_hidden_hits_do_not_move_visible_ones():
    with_hidden = merge_hits([k("x", 9), k("a", 2)], [s("b")], lambda i: i != "x", 10)
    without = merge_hits([k("a", 2)], [s("b")], lambda _: True, 10)
    assert with_hidden == without


def test_allowed_is_asked_once_per_record_and_limits_hold():
    asked: list[str] = []

    def allowed(i: str) -> bool:
        asked.append(i)
        return True

    merged = merge_hits([k("a"), k("b")], [s("a"), s("c")], allowed, 2)
    assert sorted(asked) == ["a", "b", "c"]
    assert [h.id for h in merged] == ["a", "b"]
    assert merge_hits([k("a")], [s("a")], allowed, 0) == []


ids_st = st.lists(st.sampled_from(list("abcdefgh")), max_size=8)


@settings(max_examples=300, deadline=None)
@given(ids_st, ids_st, st.sets(st.sampled_from(list("abcdefgh"))), st.integers(0, 10))
def test_merge_properties(kw_ids, sem_ids, hidden, limit):
    keyword = [k(i, float(len(kw_ids) - n)) for n, i in enumerate(kw_ids)]
    semantic = [s(i, 1.0 - n / 10) for n, i in enumerate(sem_ids)]
    merged = merge_hits(keyword, semantic, lambda i: i not in hidden, limit)
    got = [h.id for h in merged]
    assert len(got) == len(set(got)) <= limit
    assert not set(got) & hidden
    assert set(got) <= set(kw_ids) | set(sem_ids)
    visible_kw = set(kw_ids) - hidden
    visible_sem = set(sem_ids) - hidden
    assert len(got) == min(limit, len(visible_kw | visible_sem))
    for h in merged:
        assert ("keyword" in h.kinds) == (h.id in visible_kw)
        assert ("semantic" in h.kinds) == (h.id in visible_sem)
    # SC-7: with room for two, neither kind crowds the other out.
    if limit >= 2 and visible_kw and visible_sem:
        kinds = {kind for h in merged for kind in h.kinds}
        assert kinds == {"keyword", "semantic"}


def test_weights_tilt_the_fusion_and_the_depth_bound_is_exact():
    keyword = [k("a", 3), k("b", 2)]
    semantic = [s("b", 0.9), s("a", 0.8)]
    assert [h.id for h in merge_hits(keyword, semantic, lambda _: True, 2)] == ["a", "b"]
    tilted = merge_hits(keyword, semantic, lambda _: True, 2, weights=(1.0, 2.0))
    assert [h.id for h in tilted] == ["b", "a"]
    assert fusion_depth(10, (1.0, 1.0), k=60) == 2 * 70 - 60 + 1
    assert fusion_depth(10, (1.0, 1.0), floor=1000) == 1000


@settings(max_examples=200, deadline=None)
@given(
    st.permutations(list(range(40))),
    st.permutations(list(range(40))),
    st.integers(1, 6),
    st.sampled_from([(1.0, 1.0), (1.0, 0.5), (2.0, 1.0)]),
)
def test_no_record_below_fusion_depth_in_every_list_is_among_the_first_hits(
    kw, sem, limit, weights
):
    keyword = [k(f"r{i:02d}", float(40 - n)) for n, i in enumerate(kw)]
    semantic = [s(f"r{i:02d}", 1.0 - n / 100) for n, i in enumerate(sem)]
    depth = fusion_depth(limit, weights, k=5)
    whole = merge_hits(keyword, semantic, lambda _: True, limit, k=5, weights=weights)
    within = {h.id for h in keyword[:depth]} | {h.id for h in semantic[:depth]}
    assert {h.id for h in whole} <= within


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.sampled_from([0.5, 1.0, 2.0, 3.5])),
        max_size=20,
    ),
    st.frozensets(st.sampled_from("abcdefgh")),
    st.integers(1, 10),
    st.sampled_from([(1.0, 1.0), (1.5, 1.0)]),
)
def test_keyword_hits_alone_fuse_as_the_merge_of_two_lists_does(found, hidden, limit, weights):
    """With no semantic list, the fused ranking is the keyword list's own order (duplicates
    once, at their better rank; ties by id; hidden records left out), scored as the merge of
    two lists scores it."""
    hits = [Hit(id=i, score=s, kinds=("keyword",)) for i, s in found]

    def allowed(entry_id: str) -> bool:
        return entry_id not in hidden

    alone = merge_hits(hits, [], allowed, limit, weights=weights)
    assert alone == merge_hits(hits, iter(()), allowed, limit, weights=weights)
