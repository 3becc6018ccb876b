"""`engine.text_terms`: the ASCII fast path finds exactly the terms the general patterns find."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import text_terms as tt


def old_terms(text: str) -> list[str]:
    """The terms as found before the ASCII fast path (the reference; no stemming)."""
    folded = tt.fold(text)
    maker = tt.TermMaker()
    out: list[str] = []
    for m in tt.TOKEN.finditer(folded):
        run = m.group(1)
        if run is None:
            w = maker.word(m.group(0))
            if w is not None:
                out.append(w)
        elif len(run) == 1:
            out.append(run)
        else:
            out.extend(run[k : k + 2] for k in range(len(run) - 1))
    return out


# Mostly ASCII, with letters that fold to ASCII (full-width f, the fi ligature) or do not.
OTHERS = ["\u00e9", "\u00dc", "\u00df", "\uff46", "\u8ba8", "\u8bba", "\u30ab", "\u0130", "\ufb01"]
ascii_heavy = st.text(
    alphabet=st.sampled_from([*"abcXYZ09_ -.,;:!?'\"\t\n()[]", *OTHERS]), max_size=60
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(ascii_heavy, st.text(max_size=40)))
def test_terms_are_the_same_with_and_without_the_ascii_fast_path(text):
    assert tt.TermMaker()(text) == old_terms(text)


def test_a_label_is_a_name_or_heading_before_a_colon():
    """`split_label`: one to three words before a colon and a space, written as a name or a
    heading; a bracketed part (a date) stays with the rest."""
    assert tt.split_label("Caroline: I paint.") == ("Caroline", "I paint.")
    dated = "Caroline (8 May 2023): I paint."
    assert tt.split_label(dated) == ("Caroline", "(8 May 2023) I paint.")
    assert tt.split_label("[2023-05-08] Dr. O'Neil: hi") == ("Dr. O'Neil", "[2023-05-08] hi")
    assert tt.split_label("王小明: 你好") == ("王小明", "你好")
    for plain in (
        "Meet at 10:30 on Friday",  # no space after the colon
        "https://example.org: a link",
        "so I told him: no way",  # starts with a small letter
        "Well, I said: no",  # a comma: a sentence, not a name
        "The summary of the call: short",  # four words
        "2023: a good year",  # a number
        "Caroline:",  # nothing after it
    ):
        assert tt.split_label(plain) == ("", plain)
    maker = tt.TermMaker()
    assert maker.labelled("Caroline: painting sunsets") == (["caroline"], ["painting", "sunsets"])
    assert maker.labelled("painting sunsets") == ([], ["painting", "sunsets"])


@settings(max_examples=500, deadline=None)
@given(st.text(st.characters(max_codepoint=127), max_size=80))
def test_ascii_words_are_split_without_the_regex_as_the_regex_splits_them(text):
    """Folded ASCII text's words come from a translation and a split: the same words, in
    the same order, as `[a-z0-9]+` finds (whatever the text, capitals and controls too)."""
    # private: the fast path is checked against the pattern it stands for
    spaces, word, label = tt._ASCII_SPACES, tt._ASCII_WORD, tt._LABEL
    for t in (text, text.casefold()):
        assert t.translate(spaces).split() == word.findall(t)
    if label.match(text) is None:  # the colon check before it agrees
        assert tt.split_label(text) == ("", text)


def test_a_label_before_a_full_width_colon_is_still_found():
    assert tt.split_label("Caroline\uff1a hi there") == ("Caroline", "hi there")
    assert tt.split_label("Caroline: hi there") == ("Caroline", "hi there")
    assert tt.split_label("no colon here at all") == ("", "no colon here at all")
