"""`term_keys.in_context` counts a record's keys among its neighbours' without making the
list of repeated keys: the counts, the stored bytes and the index it makes are those of that
list (what a record in context was indexed and stored under when the list was made)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from storage.search_index import TermIndex
from storage.term_keys import LABEL_MARK, Analyzer, Counted, in_context, is_label_key, pack_keys

LABEL_LO = LABEL_MARK << 48
# Few distinct values, so that keys repeat within a record and across its neighbours; label
# keys among them, and words just outside the label block on either side.
KEY = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.integers(LABEL_LO, LABEL_LO + 3),  # label keys
    st.sampled_from([LABEL_LO - 1, LABEL_LO + (1 << 48), -5, 0, 7, 2**62]),
    st.sampled_from([-3, 11, 12, 2**40]),
)
KEYS = st.lists(KEY, max_size=30).map(sorted)
NEIGHBOUR = st.none() | KEYS


def repeated(own, before=None, after=None, further=None) -> list[int]:
    """The sorted list of repeated keys a record in context stands for: its own keys four
    times, each neighbour's twice and `further`'s once, neighbours' label keys left out."""
    if before is None and after is None:
        return own

    def lent(keys):
        return [k for k in keys or () if k >> 48 != LABEL_MARK]

    return sorted(own * 4 + lent(before) * 2 + lent(after) * 2 + lent(further))


@settings(max_examples=400, deadline=None)
@given(own=KEYS, before=NEIGHBOUR, after=NEIGHBOUR, further=NEIGHBOUR)
def test_counts_are_those_of_the_repeated_list(own, before, after, further):
    got = in_context(own, before, after, further)
    want = repeated(own, before, after, further)
    if before is None and after is None:
        assert got is own
        return
    assert isinstance(got, Counted)
    assert got.keys == sorted(set(want))
    assert got.tfs == [want.count(k) for k in got.keys]
    assert got.length == len(want)
    assert got.expanded() == want
    assert pack_keys(got) == pack_keys(want)


@settings(max_examples=150, deadline=None)
@given(
    records=st.lists(KEYS, min_size=1, max_size=6),
    query=st.lists(KEY, min_size=1, max_size=5),
)
def test_an_index_of_counts_is_the_index_of_the_repeated_lists(records, query):
    """Each record in context of the ones around it, put as counts in one index and as the
    repeated lists in another (the record before indexed again with its successor's words,
    as a write in sequence does): both lie and rank alike."""
    counted, listed = TermIndex(), TermIndex()
    for n, own in enumerate(records):
        before = records[n - 1] if n else None
        further = records[n - 2] if n > 1 else None
        if before is not None:  # the record before, now with this one after it
            again = (before, further, own, records[n - 3] if n > 2 else None)
            counted.put(f"r{n - 1}", in_context(*again))
            listed.put(f"r{n - 1}", repeated(*again))
        counted.put(f"r{n}", in_context(own, before, None, further))
        listed.put(f"r{n}", repeated(own, before, None, further))
    a, b = counted.layout(), listed.layout()
    assert a.tail == b.tail and a.terms == b.terms and a.row_slots == b.row_slots
    assert (a.alive == b.alive).all()
    assert counted.search(query, 10) == listed.search(query, 10)
    assert counted.stats(query) == listed.stats(query)


def test_a_neighbour_lends_its_words_not_its_label():
    """Real text: a turn of the other speaker lends its words (twice) and not its speaker's
    name, which the record's own label keeps (four times)."""
    an = Analyzer(b"k" * 32)
    q = an.key_list("Melanie: Did you go to the pottery workshop?")
    a = an.key_list("Caroline: Yes! I made a bowl.")
    got = in_context(a, q)
    assert isinstance(got, Counted)
    assert got.expanded() == repeated(a, q)
    words = [k for k in q if not is_label_key(k)]
    assert len(words) < len(q) and any(map(is_label_key, a))
    assert got.length == 4 * len(a) + 2 * len(words)
