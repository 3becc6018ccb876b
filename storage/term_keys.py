"""Text to the keys a keyword index holds: each term of `engine.text_terms` (Latin words
stemmed by Snowball's English stemmer, PyStemmer) replaced by a keyed 64-bit hash, with a
record's label (`engine.text_terms.split_label`: "Caroline: …", who speaks in a transcript)
under label keys of its own; a record's keys among its neighbours' (`in_context`); keys packed
for storage. The index that ranks by them is storage/search_index.py.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections import _count_elements  # type: ignore[attr-defined]  # Counter's C helper
from collections.abc import Sequence
from functools import partial
from operator import add, is_not
from struct import pack

import numpy as np
import Stemmer

from engine.text_terms import ASCII_WORDS, TermMaker, split_label

_stemmer = Stemmer.Stemmer("english")
_MEMO_MAX = 500_000

# A label key's top 16 bits (`is_label_key`); its low 48 are its word's. A word's key has
# them by chance once in 65,536 words: such a word is scored as a label would be and not lent
# to a neighbour (`in_context`), a difference too rare and too small to matter in a ranking.
LABEL_MARK = 0x1ABE
WORD_MASK = (1 << 48) - 1
# A query term counts this many times as a label (once as a word): who a record is said by
# or about weighs more than a word of it. Chosen on LoCoMo's tuning half (docs/search.md).
LABEL_QUERY_WEIGHT = 2


def is_label_key(key: int) -> bool:
    return key >> 48 == LABEL_MARK


def stem(words: Sequence[str]) -> list[str]:
    """Snowball English stems (used on the shard's event loop only: not thread-safe)."""
    return _stemmer.stemWords(list(words))


text_terms = TermMaker(stem)  # one memo of word -> term for every pool of the process
_has_term = partial(is_not, None)


class Analyzer:
    """Text to term keys: the terms of `engine.text_terms`, each replaced by a keyed 64-bit
    hash (BLAKE2b with a secret key: each pool's own, storage/term_store.py `TermKeys`). Keys
    are what the index holds and what may be stored (search_terms table): without the key a
    stored list says nothing of the words."""

    def __init__(self, key: bytes, memo_max: int = _MEMO_MAX) -> None:
        self._key = key[:64]
        self._memo: dict[str, int] = {}
        self._memo_max = memo_max
        # Folded ASCII word -> its term's key (None: a word with no term). A write's words are
        # split and looked up as bytes, in C (`key_list`), without a term list in between.
        self._words: dict[bytes, int | None] = {}

    def _hash(self, term: str) -> int:
        h = int.from_bytes(
            hashlib.blake2b(term.encode(), key=self._key, digest_size=8).digest(),
            "little",
            signed=True,
        )
        if len(self._memo) >= self._memo_max:
            self._memo.clear()
        self._memo[term] = h
        return h

    def _label_hash(self, term: str) -> int:
        # The word's key with the label mark for its top bits: a search tells the query's
        # words that are labels by it (`TermIndex.scores`). (`\x01` is in no term.)
        word = self._memo[term] if term in self._memo else self._hash(term)
        key = (word & WORD_MASK) | (LABEL_MARK << 48)
        self._memo["\x01label\x00" + term] = key
        return key

    def term_keys(self, terms: Sequence[str]) -> list[int]:
        """The keys of terms (as `text_terms` makes them), in their order."""
        memo, miss = self._memo, self._hash
        return [memo[t] if t in memo else miss(t) for t in terms]

    def label_keys(self, terms: Sequence[str]) -> list[int]:
        """The keys of terms as a label's (`is_label_key`), in their order."""
        memo, miss = self._memo, self._label_hash
        return [memo.get("\x01label\x00" + t) or miss(t) for t in terms]

    def keys(self, text: str) -> np.ndarray:
        """The text's term keys, sorted, repeats kept (their count is the term frequency; the
        order of the words is not kept)."""
        return np.array(self.key_list(text), dtype=np.int64)

    def key_list(self, text: str) -> list[int]:
        """`keys` as a list (a write's few tens of keys: cheaper to merge and count): its
        label's as label keys, the rest's as words."""
        label, rest = split_label(text)
        if rest.isascii():  # (most notes)
            out = self._word_keys(rest.encode().translate(ASCII_WORDS).split())
        else:
            memo, miss = self._memo, self._hash
            out = [memo[t] if t in memo else miss(t) for t in text_terms(rest)]
        if label:
            out += (
                self._label_word_keys(label)
                if label.isascii()
                else self.label_keys(text_terms(label))
            )
        out.sort()  # a note has tens of terms: a list sorts them faster than numpy
        return out

    def memoised(self) -> int:
        """How many words and terms this analyzer holds the keys of (each memo is bounded by
        `memo_max`)."""
        return len(self._memo) + len(self._words)

    def _word_keys(self, words: list[bytes]) -> list[int]:
        """The keys of the terms of folded ASCII words, in their order."""
        known = self._words
        try:
            keys = list(map(known.__getitem__, words))
        except KeyError:  # a word not seen yet (in this pool, since the memo was last cleared)
            keys = [known[w] if w in known else self._word_key(w) for w in words]
        return list(filter(_has_term, keys))

    def _label_word_keys(self, label: str) -> list[int]:
        """The label keys of an ASCII label's terms, in their order (memoised with the words,
        each under a byte no word has first)."""
        known, out = self._words, []
        for w in label.encode().translate(ASCII_WORDS).split():
            marked = b"\x01" + w
            key = known[marked] if marked in known else self._label_word_key(w, marked)
            if key is not None:
                out.append(key)
        return out

    def _label_word_key(self, word: bytes, marked: bytes) -> int | None:
        term = text_terms.term(word.decode())
        return self._keep(marked, None if term is None else self.label_keys([term])[0])

    def _word_key(self, word: bytes) -> int | None:
        term = text_terms.term(word.decode())
        memo = self._memo
        return self._keep(
            word, None if term is None else memo[term] if term in memo else self._hash(term)
        )

    def _keep(self, word: bytes, key: int | None) -> int | None:
        """Memoise a word's key (the memo bounded as the term memo is)."""
        if len(self._words) >= self._memo_max:
            self._words.clear()
        self._words[word] = key
        return key

    def query(self, query: str) -> list[int]:
        """The query's keys: each term as a word, then each as a label `LABEL_QUERY_WEIGHT`
        times (a repeated key adds its score again, `TermIndex.scores`)."""
        memo, miss = self._memo, self._hash
        terms = text_terms.query(query)
        words = [memo[t] if t in memo else miss(t) for t in terms]
        return words + self.label_keys(terms) * LABEL_QUERY_WEIGHT


class Counted:
    """Keys as the index counts them (`in_context`): each distinct key once, ascending, with
    its count (the term frequency), and the counts' total (the record's length). What the
    sorted list of repeated keys says, without making that list: a record in context repeats
    tens of keys several times over, and sorting and counting them would be most of what its
    indexing costs."""

    __slots__ = ("keys", "length", "tfs")

    def __init__(self, keys: list[int], tfs: list[int], length: int) -> None:
        self.keys = keys
        self.tfs = tfs
        self.length = length

    def expanded(self) -> list[int]:
        """The sorted list of keys with repeats this stands for."""
        return [k for k, n in zip(self.keys, self.tfs, strict=True) for _ in range(n)]


def in_context(
    own: list[int],
    before: list[int] | None = None,
    after: list[int] | None = None,
    further: list[int] | None = None,
) -> list[int] | Counted:
    """The keys a record is indexed under among the records written around it (its own keys
    alone when it has no neighbour): its own keys four times, each neighbour's twice and
    those of the record before its `before` (`further`) once, so that its own words weigh
    most and a record still ranks above its neighbours for its own words. Every list sorted
    (as `Analyzer.key_list` makes them).

    The weights were chosen on the retrieval lab's sets (docs/search.md, "Context weights")."""
    if before is None and after is None:
        return own
    # Counted twice over (own twice, each neighbour once), doubled, then `further` once: the
    # same counts as the whole repeated list, from half as many elements, all in C.
    counts: dict[int, int] = {}
    _count_elements(counts, own + own + _lent(before) + _lent(after))
    twice = counts.values()
    counts = dict(zip(counts, map(add, twice, twice), strict=True))
    if further:
        _count_elements(counts, _lent(further))
    keys = sorted(counts)
    tfs = list(map(counts.__getitem__, keys))
    return Counted(keys, tfs, sum(tfs))


_LABELS_FROM, _LABELS_TO = LABEL_MARK << 48, (LABEL_MARK + 1) << 48


def _lent(keys: list[int] | None) -> list[int]:
    """A neighbour's keys (sorted) without its label's (see the module's description): in a
    sorted list those are one block."""
    if not keys:
        return []
    lo = bisect_left(keys, _LABELS_FROM)
    if lo == len(keys) or keys[lo] >= _LABELS_TO:
        return keys
    return keys[:lo] + keys[bisect_left(keys, _LABELS_TO, lo) :]


def pack_keys(keys: np.ndarray | list[int] | Counted) -> bytes:
    """Keys as stored: sorted, repeats kept, 8 bytes each (little-endian)."""
    if type(keys) is Counted:
        return np.array(keys.keys, dtype="<i8").repeat(keys.tfs).tobytes()
    if type(keys) is list and len(keys) <= _STRUCT_MAX:
        return pack(f"<{len(keys)}q", *keys)
    return np.asarray(keys, dtype="<i8").tobytes()


# A write's few tens of keys are packed by `struct`, in a fraction of numpy's time for so few;
# longer lists by numpy (no argument per key).
_STRUCT_MAX = 512


def unpack_keys(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<i8")


TF_MAX = 65_535  # the largest count a term row's `tfs` holds (uint16)


def pack_row(keys: np.ndarray | list[int] | Counted) -> tuple[bytes, bytes | None]:
    """Keys as a term row stores them, (terms, tfs): counted keys (a record among its
    neighbours) as each distinct key once and its count, a few times smaller than every
    repeat (each byte of a row is written to the journal, then to DuckDB's log, then again by
    each DuckDB checkpoint that rewrites its table's last row group); others, or a count too
    large, as every repeat and no counts."""
    if type(keys) is Counted and keys.tfs and max(keys.tfs) <= TF_MAX:
        n = len(keys.keys)
        if n <= _STRUCT_MAX:
            return pack(f"<{n}q", *keys.keys), pack(f"<{n}H", *keys.tfs)
        return np.array(keys.keys, dtype="<i8").tobytes(), np.array(keys.tfs, dtype="<u2").tobytes()
    return pack_keys(keys), None


def unpack_row(terms: bytes, tfs: bytes | None) -> np.ndarray:
    """A stored row's keys, sorted, repeats kept (as `pack_keys` packs them)."""
    keys = unpack_keys(terms)
    return keys if tfs is None else np.repeat(keys, np.frombuffer(tfs, dtype="<u2"))


def unpack_rows(
    counts: np.ndarray, terms: list[bytes], tfs: list[bytes]
) -> tuple[np.ndarray, np.ndarray]:
    """Rows' keys end to end, repeats kept, and how many each row has: `counts` the keys each
    row's `terms` holds, `tfs` each row's counts with ones for a row without them (as
    `storage.term_store.TFS` reads them)."""
    keys = unpack_keys(b"".join(terms))
    reps = np.frombuffer(b"".join(tfs), dtype="<u2")
    if reps.size != keys.size:
        raise ValueError("term rows whose keys and counts differ in number")
    if not keys.size or bool((reps == 1).all()):
        return np.asarray(counts, dtype=np.int64), keys
    ends = np.cumsum(np.concatenate(([0], reps)), dtype=np.int64)
    bounds = np.cumsum(np.concatenate(([0], counts)), dtype=np.int64)
    return ends[bounds[1:]] - ends[bounds[:-1]], np.repeat(keys, reps)
