"""The terms of a text for keyword search (SC-7): what a record is indexed under and
what a query looks for.

- Text is NFKC-normalized and case-folded, so full-width `DEPLOY`, `Deploy` and `deploy` are
  one term.
- Words of scripts written with spaces (Latin, Cyrillic, Greek, Hangul, …) are split on anything
  that is not a letter or digit; one-letter words and English stop words ("the", "what",
  "did", …) are dropped, since they match nearly every record and only add noise to a ranking.
  The caller stems what is left (a Snowball stemmer, passed in: this module stays pure), so
  "deployment" and "deploys" both find "deploy".
- Runs of scripts written without spaces (Han, hiragana, katakana) become overlapping character
  bigrams (`讨论会` → `讨论`, `论会`; a lone character is its own term): a query's bigrams are
  found in any record that contains the same two characters in a row, with no dictionary.
- A text may start with a label: one to three words before a colon, as a transcript names who
  speaks ("Caroline: …", "Caroline (8 May): …") or a note its subject ("Deploy: …").
  `labelled` tells its terms apart from the rest (a bracketed part of it, such as a date, is
  part of the rest): the keyword index weighs who or what a record is about apart from what it
  says (storage/search_index.py).

Pure: no I/O, no library but the standard one.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence

# Scripts written without spaces between words. Hangul is not among them: Korean uses spaces.
_NO_SPACE = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u31f0-\u31ff"  # katakana extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B-G
)
# A word, or (group 1) a run of a script written without spaces (its terms: its letter pairs).
TOKEN = re.compile(rf"([{_NO_SPACE}]+)|[^\W_{_NO_SPACE}]+")
_LATIN = re.compile(r"^[a-z\u00c0-\u024f]+$")

# English function words and the question words that start most queries ("when did …").
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are aren as at be because been
    before being below between both but by can cannot could couldn did didn do does doesn
    doing don down during each few for from further had hadn has hasn have haven having he
    her here hers herself him himself his how i if in into is isn it its itself just let ll
    me more most mustn my myself no nor not now of off on once only or other ought our ours
    ourselves out over own re same shan she should shouldn so some such than that the their
    theirs them themselves then there these they this those through to too under until up ve
    very was wasn we were weren what when where which while who whom why will with won would
    wouldn you your yours yourself yourselves also did does get got s t d m o y ok yes yeah
    oh hey hi
    """.split()  # noqa: SIM905
)

Stemmer = Callable[[Sequence[str]], Sequence[str]]
_WORD = re.compile(rf"[^\W_{_NO_SPACE}]+")
_HAS_NO_SPACE = re.compile(rf"[{_NO_SPACE}]")
_ASCII_WORD = re.compile(r"[a-z0-9]+")  # `_WORD` on casefolded ASCII text
# `_ASCII_WORD.findall` as a translation and a split (both in C, no regex engine): every other
# ASCII character becomes a space.
_ASCII_SPACES = str.maketrans({c: " " for c in range(128) if not _ASCII_WORD.fullmatch(chr(c))})
# `bytes.translate` table for ASCII text: its capitals made small (all that NFKC and case
# folding do to ASCII), and a space for every character `_ASCII_SPACES` makes one, so that
# `text.encode().translate(ASCII_WORDS).split()` is its folded words, as bytes.
ASCII_WORDS = bytes(
    c + 32 if 65 <= c <= 90 else c if _ASCII_WORD.fullmatch(chr(c)) else 32 for c in range(256)
)
_CACHE_MAX = 500_000
# A label: up to 60 characters without a line break or colon, then a colon and a space.
_LABEL = re.compile(r"\A\s*([^\n:\uff1a]{1,60}?)\s*[:\uff1a]\s")  # (full-width colon too)
_BRACKETED = re.compile(r"\([^()]*\)|\[[^\[\]]*\]")
# What a name or a heading is written with: it starts with a letter and has no punctuation
# but dots, apostrophes and hyphens ("Dr. O'Neil-Smith"; not "Well, I said").
_NAME = re.compile(r"\A[^\W\d_][\w.'\u2019 -]*\Z")
LABEL_WORDS_MAX = 3


def split_label(text: str) -> tuple[str, str]:
    """(the text's label, the rest): ("", text) when it starts with none. A label is one to
    three words before a colon and a space, bracketed parts aside (they stay in the rest),
    written as a name or a heading: not starting with a small letter, no commas or the like."""
    if ":" not in text and "\uff1a" not in text:  # (no colon: no label, without the regex)
        return "", text
    m = _LABEL.match(text)
    if m is None:
        return "", text
    head = m.group(1)
    if "(" in head or "[" in head:
        aside = _BRACKETED.findall(head)
        label = _BRACKETED.sub(" ", head).strip()
    else:  # (nothing bracketed: no pattern to run)
        aside, label = [], head.strip()
    words = label.split()
    if not words or len(words) > LABEL_WORDS_MAX or not _NAME.match(label) or label[0].islower():
        return "", text
    return " ".join(words), " ".join([*aside, text[m.end() :]]) if aside else text[m.end() :]


def fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


class TermMaker:
    """`terms(text)` with a memo of what each word becomes (dropped, kept, stemmed): indexing
    a pool's records meets the same few thousand words again and again."""

    def __init__(self, stem: Stemmer | None = None) -> None:
        self._stem = stem
        self._memo: dict[str, str | None] = {}

    def word(self, word: str) -> str | None:
        """What one folded word becomes: None (too short, or a stop word), or its term."""
        if (len(word) < 2 and not word.isdigit()) or word in STOP_WORDS:
            term = None
        elif self._stem is not None and _LATIN.match(word):
            term = self._stem([word])[0]
        else:
            term = word
        if len(self._memo) >= _CACHE_MAX:
            self._memo.clear()
        self._memo[word] = term
        return term

    def term(self, word: str) -> str | None:
        """`word` through the memo: what one folded word becomes."""
        memo = self._memo
        return memo[word] if word in memo else self.word(word)

    def __call__(self, text: str) -> list[str]:
        """The terms of `text` in order, repeats kept (they count in a ranking)."""
        folded = fold(text)
        memo, miss = self._memo, self.word
        if folded.isascii() or _HAS_NO_SPACE.search(folded) is None:
            # Folded ASCII has no capitals: its words are runs of [a-z0-9] (a smaller pattern,
            # and no search for CJK first; most notes are ASCII).
            out = []
            ascii_ = folded.isascii()
            words = folded.translate(_ASCII_SPACES).split() if ascii_ else _WORD.findall(folded)
            for w in words:
                t = memo[w] if w in memo else miss(w)
                if t is not None:
                    out.append(t)
            return out
        out = []
        for m in TOKEN.finditer(folded):
            run = m.group(1)
            if run is None:
                w = m.group(0)
                t = memo[w] if w in memo else miss(w)
                if t is not None:
                    out.append(t)
            elif len(run) == 1:
                out.append(run)
            else:
                out.extend(run[k : k + 2] for k in range(len(run) - 1))
        return out

    def query(self, query: str) -> list[str]:
        """A query's distinct terms, in order (a query of stop words only has none)."""
        return list(dict.fromkeys(self(query)))

    def labelled(self, text: str) -> tuple[list[str], list[str]]:
        """(the terms of the text's label, the terms of the rest): see `split_label`."""
        label, rest = split_label(text)
        return (self(label) if label else []), self(rest)


def terms(text: str, stem: Stemmer | None = None) -> list[str]:
    """The terms of `text` in order, repeats kept (they count in a ranking)."""
    return TermMaker(stem)(text)


def query_terms(query: str, stem: Stemmer | None = None) -> list[str]:
    """A query's distinct terms, in order (a query of stop words only has none)."""
    return TermMaker(stem).query(query)
