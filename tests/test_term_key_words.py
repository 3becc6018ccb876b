"""`Analyzer.key_list`: folded ASCII words looked up straight to their keys give exactly the
keys of the terms `engine.text_terms` makes, whatever the text, and the memo behind that stays
bounded."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import text_terms as tt
from storage.term_keys import Analyzer, Counted, pack_keys, pack_row, text_terms, unpack_row

KEY = bytes(range(32))


def reference(analyzer: Analyzer, text: str) -> list[int]:
    """The keys as made from the terms: each term of the rest as a word, the label's as a
    label, sorted."""
    label, rest = text_terms.labelled(text)
    return sorted(analyzer.term_keys(rest) + analyzer.label_keys(label))


OTHERS = ["\u00e9", "\u00dc", "\u00df", "\uff46", "\u8ba8", "\u8bba", "\u0130", "\ufb01"]
WORDS = ["Deploy", "deploys", "the", "a", "I", "x", "42", "7", "snake_case", "Caroline"]
ascii_heavy = st.text(
    alphabet=st.sampled_from([*"abcXYZ09_ -.,;:!?'\"\t\n()[]\x00\x7f", *OTHERS]), max_size=60
)
wordy = st.lists(st.sampled_from([*WORDS, ":", ": ", ", ", "(8 May): ", " "]), max_size=20).map(
    "".join
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(ascii_heavy, wordy, st.text(st.characters(max_codepoint=127), max_size=60)))
def test_keys_are_those_of_the_terms(text):
    fast, slow = Analyzer(KEY), Analyzer(KEY)
    assert fast.key_list(text) == reference(slow, text)
    assert fast.key_list(text) == reference(slow, text)  # again, from the memo


def test_keys_stay_right_and_the_memo_bounded_when_it_is_cleared():
    """A memo of 4 entries for texts of more distinct words than that: it is cleared while a
    text is being keyed, and every key is still the term's."""
    small, slow = Analyzer(KEY, memo_max=4), Analyzer(KEY)
    for i in range(300):
        text = f"Speaker{i}: deploying note {i} with words w{i % 7} v{i % 11}, stemmed deploys"
        assert small.key_list(text) == reference(slow, text)
        assert small.memoised() <= 2 * (4 + 1)  # (a label key goes in after its word)
    for i in range(100):  # new labels, the same words
        text = f"Speaker{i}: deploying"
        assert small.key_list(text) == reference(slow, text)
        assert small.memoised() <= 2 * (4 + 1)
    assert tt.split_label("Deploy: x") == ("Deploy", "x")


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(-(2**63), 2**63 - 1), max_size=40),
        st.lists(st.integers(-(2**63), 2**63 - 1), min_size=500, max_size=600),
    ),
    st.integers(1, 300),
)
def test_rows_pack_keys_as_little_endian_int64_and_counts_as_uint16(keys, tf):
    keys.sort()
    assert pack_keys(keys) == np.asarray(keys, dtype="<i8").tobytes()
    assert pack_row(keys) == (np.asarray(keys, dtype="<i8").tobytes(), None)
    counted = Counted(keys, [tf] * len(keys), tf * len(keys))
    terms, tfs = pack_row(counted)
    if keys:
        assert terms == np.asarray(keys, dtype="<i8").tobytes()
        assert tfs == np.full(len(keys), tf, dtype="<u2").tobytes()
    assert unpack_row(terms, tfs).tolist() == counted.expanded()
