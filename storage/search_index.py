"""The in-memory BM25 keyword index of one memory pool (SC-7).

Store-agnostic: it knows entries only by id. Its owner builds it from the pool's decrypted
texts when the pool loads (`build`) and tells it of every change (`put` for new or edited text,
`remove` for deleted entries); it never reads or writes a file, so neither plaintext nor terms
ever reach the disk (SEC-1). Who may read what is not its business either: a search walks the
ranking best first and keeps only ids the caller's `allowed` lets through, so an entry the
caller may not read is never a hit and never pushes a readable one out of the list.

It holds term keys (storage/term_keys.py: the terms of `engine.text_terms`, case folding,
stop words, CJK character bigrams, Latin words stemmed, each as a keyed hash). Ranking is Okapi
BM25 (k1 and b below, Lucene's idf), any query term matching.

A record's label (`engine.text_terms.split_label`: "Caroline: …", who speaks in a transcript)
is indexed under label keys of its own, not as words, and a query asks for each of its terms
both as a word and, at twice the weight, as a label: "what does Caroline paint?" prefers what
Caroline said to what was said to her. A label scores the same in a record of any length, and
a query term that is a label ranks the records matching the rest of the query without finding
any alone (unless the query is nothing else): a name would otherwise fill the list with the
speaker's shortest small talk. A record indexed with its neighbours' words
(`term_keys.in_context`) does not take their labels: in a dialog every neighbour is the other
speaker, whose name would otherwise weigh more in a turn than its own speaker's.

Layout: postings are a compressed sparse row "base" (numpy: one slice of row numbers and term
frequencies per term) plus per-term Python lists for entries added since (the "tail"), merged
into the base once the tail holds a quarter as many postings. A write only extends flat lists
(its keys, their frequencies, its row: a few calls in C, not a dict lookup and two appends per
term); the first search after it files them under their terms in the tail, in the order they
were written, so what a search reads is what filing each write at once would have made. So a
write costs a few list extends and a search a few numpy slices. Rows are never reused: an
edited entry gets a new row and its old one is dead (masked out of every ranking, dropped at
the next merge). Document frequencies count live rows only: a record is indexed again each
time its thread's order gives it a new neighbour, and a ranking must not depend on how often
that happened.

Why not bm25s or tantivy: bm25s builds a static index (every write would rebuild it), tantivy
needs a commit and a searcher reload before a write is visible (milliseconds per write, against
the issue's 1 ms); both score the same formula as this. benchmarks/retrieval.py computes a
bm25s ranking on the same data as a reference.
"""

from __future__ import annotations

import math
from collections import _count_elements  # type: ignore[attr-defined]  # Counter's C helper
from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat
from typing import NamedTuple

import numpy as np

from storage.term_keys import LABEL_MARK, WORD_MASK, Counted

# BM25's term saturation and length normalisation: Anserini's short-passage values (k1 0.9,
# b 0.4) rather than the classic 1.2 / 0.75. Dialog turns and notes are short, and the longer
# ones are those that tell something: full length normalisation buried them (docs/search.md,
# "Context weights").
K1 = 0.9
B = 0.4
# A query's postings at most this fraction of the rows are scored sparsely (`_sparse_scores`).
SPARSE_RATIO = 8
JOINED_MAX = 4_096  # terms whose joined postings an index keeps (`_postings`)

# A query term that is a label here counts half as much as a word: where a name stands in a
# record's words it mostly addresses the other speaker ("Thanks, Nate!"), and such greetings
# crowded out what was said about the query's subject. Chosen on LoCoMo's tuning half
# (docs/search.md).
LABEL_WORD_WEIGHT = 0.5
LABEL_NORM = K1  # a label's BM25 length norm: a record of average length's, whatever its own


# Keys below this many are counted in Python (np.unique costs ~20 µs at any size).
PYTHON_COUNT_MAX = 512


def order_by_key(keys: np.ndarray) -> np.ndarray:
    """`np.argsort(keys, kind="stable")` for int64 keys, in a fraction of its time (a pool's
    load sorts about a million postings). A plain sort of numbers is many times faster than an
    argsort here, so each position rides in the low bits of its key's high bits and one sort
    orders both: by key, ties by position. Two keys whose high bits agree (random 64-bit
    hashes: rare) may come out interleaved; that is checked, and the stable argsort used."""
    n = keys.size
    bits = max(1, (n - 1).bit_length())
    if n < 4_096 or bits > 40:
        return np.argsort(keys, kind="stable")
    # Unsigned order of the keys with their sign bit flipped is their signed order.
    u = keys.view(np.uint64) ^ np.uint64(1 << 63)
    mixed = (u >> np.uint64(bits)) << np.uint64(bits)
    mixed |= np.arange(n, dtype=np.uint64)
    mixed.sort()
    order = (mixed & np.uint64((1 << bits) - 1)).astype(np.int64)
    ranked = keys[order]
    if n > 1 and not (ranked[1:] >= ranked[:-1]).all():
        return np.argsort(keys, kind="stable")
    return order


def stable_order(ids: np.ndarray) -> np.ndarray:
    """`np.argsort(ids, kind="stable")` for small non-negative ints (term ids): each position
    rides in the low bits below its id and one plain sort orders both, faster than a stable
    argsort (a merge orders every posting written since the last one: in write order, not by
    term)."""
    n = ids.size
    bits = max(1, (n - 1).bit_length())
    if n < 64 or int(ids.max()).bit_length() + bits > 62:
        return np.argsort(ids, kind="stable")
    mixed = (ids.astype(np.int64) << bits) | np.arange(n, dtype=np.int64)
    mixed.sort()
    return mixed & ((1 << bits) - 1)


class Stats(NamedTuple):
    """What BM25 scores a query by besides a row's own terms: live rows, their total length,
    and each query key's document frequency."""

    live: int
    total_len: float
    df: dict[int, int]

    @staticmethod
    def of(parts: Sequence[Stats]) -> Stats:
        """Several indexes' statistics as those of one index holding all their rows."""
        df: dict[int, int] = {}
        for p in parts:
            for key, n in p.df.items():
                df[key] = df.get(key, 0) + n
        return Stats(sum(p.live for p in parts), sum(p.total_len for p in parts), df)

    @staticmethod
    def across(parts: Sequence[tuple[Stats, Sequence[int]]]) -> list[Stats]:
        """`of` for indexes whose keys differ (pools hash terms with keys of their own): each
        part is an index's statistics with the query's keys for that index (`Analyzer.query`
        of one query: the same terms in the same order, so position k is one term in every
        part). Returns, for each part, the combined statistics in that part's keys."""
        total: dict[int, int] = {}
        for stats, keys in parts:
            seen: set[int] = set()
            for slot, key in enumerate(keys):
                if key in seen:
                    continue
                seen.add(key)
                total[slot] = total.get(slot, 0) + stats.df.get(key, 0)
        live = sum(s.live for s, _ in parts)
        length = sum(s.total_len for s, _ in parts)
        out = []
        for _, keys in parts:
            df: dict[int, int] = {}
            for slot, key in enumerate(keys):
                if key not in df and total.get(slot):
                    df[key] = total[slot]
            out.append(Stats(live, length, df))
        return out


class Postings(NamedTuple):
    """A built index as arrays (`TermIndex.postings`, `TermIndex.restore`): each row's id and
    length, the sorted term keys, and per term (in `indptr` slices) its rows and frequencies."""

    ids: list[str]
    lengths: np.ndarray  # float32, one per row
    keys: np.ndarray  # int64, sorted, distinct
    indptr: np.ndarray  # int64, len(keys) + 1
    rows: np.ndarray  # int32
    tfs: np.ndarray  # float32


class Layout(NamedTuple):
    """How an index lies now (`TermIndex.layout`), for checks and diagnosis: the base's
    postings by term id (`indptr` slices of `rows` and `tfs`), the tail not merged yet (term
    id -> its rows and frequencies), which row slots are alive, how many terms and how many
    rows it has made (dead ones included), and whether its id -> row map is made yet. The
    arrays are the index's own, not copies: read them, do not change them."""

    indptr: np.ndarray
    rows: np.ndarray
    tfs: np.ndarray
    tail: dict[int, tuple[list[int], list[int]]]
    alive: np.ndarray
    terms: int
    row_slots: int
    row_map_made: bool


class TermIndex:
    def __init__(self) -> None:
        # Term key -> term id. The base's terms are `_keys` (sorted: term id t is `_keys[t]`);
        # the map of them is made when first needed (a write; a search looks keys up in
        # `_keys` until then), as a pool restored from its snapshot need not pay for it.
        self._keys = np.zeros(0, dtype=np.int64)
        self._vocab_map: dict[int, int] | None = {}
        self._indptr = np.zeros(1, dtype=np.int64)
        self._rows = np.zeros(0, dtype=np.int32)
        self._tfs = np.zeros(0, dtype=np.float32)
        self._tail: dict[int, tuple[list[int], list[int]]] = {}
        self._tail_postings = 0  # the tail's and the unfiled postings'
        # Postings written and not filed in the tail yet (`_file`): their term keys and
        # frequencies end to end, and each write's row and how many of them are its.
        self._unfiled_keys: list[int] = []
        self._unfiled_tfs: list[int] = []
        self._unfiled_rows: list[int] = []
        self._unfiled_sizes: list[int] = []
        # A queried term's postings as arrays (base and tail joined), with the tail's length
        # they were made at: the tail only grows until a merge, which drops them.
        self._joined: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}
        self._ids: list[str | None] = []
        # id -> row, made from `_ids` when first needed (a search reads `_ids` only; at
        # 100,000 records the map costs a first search after a pool's load tens of ms).
        self._row_map: dict[str, int] | None = {}
        self._len = np.zeros(0, dtype=np.float32)
        self._alive = np.zeros(0, dtype=bool)
        self._live = 0
        self._live_len = 0.0
        self._dead = 0

    def __len__(self) -> int:
        return self._live

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._row

    @property
    def _vocab(self) -> dict[int, int]:
        if self._vocab_map is None:
            keys = self._keys
            self._vocab_map = dict(zip(keys.tolist(), range(keys.size), strict=True))
        return self._vocab_map

    def warm(self) -> None:
        """Make the maps a write needs now (after a pool's load, off its first search)."""
        _ = self._vocab, self._row

    @property
    def _row(self) -> dict[str, int]:
        if self._row_map is None:
            ids = self._ids  # a dead row's id is None; the live ones are unique
            self._row_map = dict(zip(ids, range(len(ids)), strict=True))
            self._row_map.pop(None, None)  # type: ignore[call-overload]
        return self._row_map

    # --- writing --------------------------------------------------------------------------------

    def build(self, items: Iterable[tuple[str, np.ndarray]]) -> None:
        """Index (id, term keys) pairs in one go (a pool's load): postings are counted and
        grouped by numpy (one sort), not one by one."""
        ids: list[str] = []
        parts: list[np.ndarray] = []
        for entry_id, keys in items:
            ids.append(entry_id)
            parts.append(keys)
        lengths = np.fromiter((k.size for k in parts), dtype=np.int64, count=len(parts))
        flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        self.build_flat(ids, lengths, flat)

    def build_flat(
        self, ids: list[str], lengths: np.ndarray, flat: np.ndarray, *, distinct: bool = False
    ) -> None:
        """`build` from the records' keys end to end in one array (`lengths` says how many
        are whose, each record's sorted), as they are read from storage. `distinct`: the
        caller has checked that no id is given twice."""
        fresh = not self._ids
        if fresh and not distinct and len(set(ids)) != len(ids):
            raise ValueError("an id is given twice")
        if not fresh:
            for entry_id in ids:
                self.remove(entry_id)
        first = len(self._ids)
        self._add_rows(ids, lengths)
        if not ids or not lengths.sum():
            return
        all_keys = flat.astype(np.int64, copy=False)
        owners = np.repeat(np.arange(first, first + len(ids), dtype=np.int32), lengths)
        # Each record's keys come sorted: a run of one key in one record is one posting.
        new_run = np.ones(all_keys.size, dtype=bool)
        new_run[1:] = (all_keys[1:] != all_keys[:-1]) | (owners[1:] != owners[:-1])
        starts = np.flatnonzero(new_run)
        tf = np.diff(np.append(starts, all_keys.size)).astype(np.float32)
        run_keys, run_rows = all_keys[starts], owners[starts]
        if fresh:
            order = order_by_key(run_keys)  # by term; rows stay in order
            sorted_keys = run_keys[order]
            new_term = np.ones(sorted_keys.size, dtype=bool)
            new_term[1:] = sorted_keys[1:] != sorted_keys[:-1]
            bounds = np.flatnonzero(new_term)
            self._keys = sorted_keys[bounds]
            self._vocab_map = None  # made from `_keys` when first needed
            self._indptr = np.append(bounds, sorted_keys.size).astype(np.int64)
            self._rows = run_rows[order]
            self._tfs = tf[order]
            return
        vocab = self._vocab
        tids = np.fromiter(
            (vocab.setdefault(k, len(vocab)) for k in run_keys.tolist()),
            dtype=np.int64,
            count=run_keys.size,
        )
        self.merge(tids, run_rows, tf)

    def restore(self, snap: Postings) -> None:
        """Take over a built index's postings (`postings`, e.g. from a stored snapshot) into
        an empty index: no sort, no map made (see `_vocab`, `_row`)."""
        if self._ids:
            raise ValueError("restore into an empty index only")
        n = len(snap.ids)
        if snap.lengths.size != n or snap.indptr.size != snap.keys.size + 1:
            raise ValueError("inconsistent postings")
        if snap.rows.size != snap.tfs.size or int(snap.indptr[-1]) != snap.rows.size:
            raise ValueError("inconsistent postings")
        if snap.rows.size and not (int(snap.rows.min()) >= 0 and int(snap.rows.max()) < n):
            raise ValueError("a posting of no row")
        self._add_rows(list(snap.ids), snap.lengths)
        self._keys = snap.keys
        self._vocab_map = None
        self._indptr, self._rows, self._tfs = snap.indptr, snap.rows, snap.tfs

    def layout(self) -> Layout:
        """The index's arrays as they lie (nothing is made or merged to answer; postings
        written since the last search are filed in the tail first, as a search would)."""
        self._file()
        vocab = self._vocab_map
        return Layout(
            self._indptr,
            self._rows,
            self._tfs,
            self._tail,
            self._alive,
            len(vocab) if vocab is not None else self._keys.size,
            len(self._ids),
            self._row_map is not None,
        )

    def postings(self) -> Postings:
        """The index as arrays, for a snapshot: only of an index built in one go (`build`,
        `build_flat` into an empty one) and not changed since."""
        if self._vocab_map or self._tail or self._unfiled_sizes or self._dead:
            raise ValueError("only a freshly built index")
        if self._live != len(self._ids):
            raise ValueError("only a freshly built index")
        n = len(self._ids)
        ids = self._ids
        return Postings(ids, self._len[:n].copy(), self._keys, self._indptr, self._rows, self._tfs)  # type: ignore[arg-type]

    def _add_rows(self, ids: list[str], lengths: np.ndarray) -> None:
        first = len(self._ids)
        need = first + len(ids)
        if need > self._len.size:
            size = max(1_024, 2 * self._len.size, need)
            self._len = np.resize(self._len, size)
            alive = np.zeros(size, dtype=bool)
            alive[: self._alive.size] = self._alive
            self._alive = alive
        self._ids.extend(ids)
        if self._row_map is not None:
            if first == 0:
                self._row_map = None  # made when first needed
            else:
                self._row_map.update(zip(ids, range(first, need), strict=True))
        self._len[first:need] = lengths
        self._alive[first:need] = True
        self._live += len(ids)
        self._live_len += float(lengths.sum())

    def put(self, entry_id: str, keys: np.ndarray | list[int] | Counted) -> None:
        """Index a new entry, or an entry's new text (its old text is forgotten), by the term
        keys `Analyzer.keys` (or `key_list`, or `in_context`) made of it."""
        row_map = self._row
        if entry_id in row_map:
            self.remove(entry_id)
        ids = self._ids
        row = len(ids)
        ids.append(entry_id)
        row_map[entry_id] = row
        if row >= self._len.size:
            self._grow()
        self._alive[row] = True
        self._live += 1
        if type(keys) is Counted:
            self._unfiled_keys += keys.keys
            self._unfiled_tfs += keys.tfs
            length, postings = keys.length, len(keys.keys)
        else:
            length = len(keys)
            if length > PYTHON_COUNT_MAX:
                uniq, counts = np.unique(np.asarray(keys), return_counts=True)
                self._unfiled_keys += uniq.tolist()
                self._unfiled_tfs += counts.tolist()
                postings = uniq.size
            else:
                # Counted in C (half the cost of a Python loop, on every write): each distinct
                # key once, in order of first appearance.
                counted: dict[int, int] = {}
                _count_elements(counted, keys if type(keys) is list else keys.tolist())
                self._unfiled_keys += counted
                self._unfiled_tfs += counted.values()
                postings = len(counted)
        self._unfiled_rows.append(row)
        self._unfiled_sizes.append(postings)
        self._tail_postings += postings
        self._len[row] = length
        self._live_len += length
        if self._tail_postings > max(20_000, self._rows.size // 4):
            self.merge()

    def _file(self) -> None:
        """File the postings written since the last search under their terms in the tail, in
        the order they were written (what `put` filing each at once would have made)."""
        sizes = self._unfiled_sizes
        if not sizes:
            return
        owners = chain.from_iterable(map(repeat, self._unfiled_rows, sizes))
        vocab, tail = self._vocab, self._tail
        for term, row, tf in zip(self._unfiled_keys, owners, self._unfiled_tfs, strict=True):
            tid = vocab.setdefault(term, len(vocab))
            slot = tail.get(tid)
            if slot is None:
                slot = tail[tid] = ([], [])
            slot[0].append(row)
            slot[1].append(tf)
        self._drop_unfiled()

    def _drop_unfiled(self) -> None:
        self._unfiled_keys, self._unfiled_tfs = [], []
        self._unfiled_rows, self._unfiled_sizes = [], []

    def remove(self, entry_id: str) -> None:
        """Forget an entry (deleted, or about to be re-indexed); unknown ids are ignored."""
        row = self._row.pop(entry_id, None)
        if row is None:
            return
        self._ids[row] = None
        self._alive[row] = False
        self._live -= 1
        self._live_len -= float(self._len[row])
        self._dead += 1
        if self._dead > max(1_000, len(self._ids) // 4):
            self.merge()

    def _grow(self) -> None:
        """Room for twice as many rows (`put`)."""
        size = max(1_024, 2 * self._len.size)
        self._len = np.resize(self._len, size)
        alive = np.zeros(size, dtype=bool)
        alive[: self._alive.size] = self._alive
        self._alive = alive

    def merge(
        self,
        term_ids: np.ndarray | None = None,
        rows: np.ndarray | None = None,
        tfs: np.ndarray | None = None,
    ) -> None:
        """Fold the tail (and any given postings) into the base, dropping dead rows.

        The base is already in term order: only the new postings are sorted (stably, by term),
        then placed after the base's postings of the same term (one `searchsorted`), so a merge
        costs a few passes over the base instead of sorting it again. Within a term the order
        is the base's, then the tail's, then the given postings' (what a stable sort of all of
        them in that order gives)."""
        parts_t, parts_r, parts_f = [], [], []
        tail = self._tail
        if tail:  # flattened in C (one small array per term would cost ~3 µs a term)
            slots = tail.values()
            lengths = np.fromiter(map(len, (r for r, _ in slots)), dtype=np.int64, count=len(tail))
            n = int(lengths.sum())
            tids = np.fromiter(tail.keys(), dtype=np.int64, count=len(tail))
            parts_t.append(np.repeat(tids, lengths))
            parts_r.append(np.fromiter(chain.from_iterable(r for r, _ in slots), np.int32, n))
            parts_f.append(np.fromiter(chain.from_iterable(f for _, f in slots), np.float32, n))
        if self._unfiled_sizes:  # written after everything in the tail: placed after it
            vocab, keys = self._vocab, self._unfiled_keys
            for k in dict.fromkeys(keys):  # new terms numbered as filing them would
                if k not in vocab:
                    vocab[k] = len(vocab)
            parts_t.append(np.fromiter(map(vocab.__getitem__, keys), np.int64, len(keys)))
            parts_r.append(
                np.repeat(np.asarray(self._unfiled_rows, dtype=np.int32), self._unfiled_sizes)
            )
            parts_f.append(np.asarray(self._unfiled_tfs, dtype=np.float32))
            self._drop_unfiled()
        if term_ids is not None and rows is not None and tfs is not None:
            parts_t.append(np.asarray(term_ids, dtype=np.int64))
            parts_r.append(np.asarray(rows, dtype=np.int32))
            parts_f.append(np.asarray(tfs, dtype=np.float32))
        alive = self._alive
        base_t = np.repeat(np.arange(self._indptr.size - 1, dtype=np.int64), np.diff(self._indptr))
        keep = alive[self._rows]
        base_t, base_r, base_f = base_t[keep], self._rows[keep], self._tfs[keep]
        if parts_t:
            new_t = np.concatenate(parts_t)
            new_r = np.concatenate(parts_r)
            new_f = np.concatenate(parts_f)
            keep = alive[new_r]
            new_t, new_r, new_f = new_t[keep], new_r[keep], new_f[keep]
            order = stable_order(new_t)
            new_t, new_r, new_f = new_t[order], new_r[order], new_f[order]
            # Each new posting goes after the base's postings of its term (and the new ones
            # before it): its place in the merged arrays.
            at = np.searchsorted(base_t, new_t, side="right") + np.arange(new_t.size)
            size = base_t.size + new_t.size
            from_base = np.ones(size, dtype=bool)
            from_base[at] = False
            merged_r = np.empty(size, dtype=np.int32)
            merged_f = np.empty(size, dtype=np.float32)
            merged_r[at], merged_r[from_base] = new_r, base_r
            merged_f[at], merged_f[from_base] = new_f, base_f
            counts = np.bincount(base_t, minlength=len(self._vocab)) + np.bincount(
                new_t, minlength=len(self._vocab)
            )
        else:
            merged_r, merged_f = base_r, base_f
            counts = np.bincount(base_t, minlength=len(self._vocab))
        self._indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self._rows = merged_r
        self._tfs = merged_f
        self._tail = {}
        self._tail_postings = 0
        self._joined = {}
        self._dead = 0

    # --- searching ------------------------------------------------------------------------------

    def _terms(self, query: Sequence[int]) -> list[tuple[int, int]]:
        """(key, term id) of each query key in the index, in the query's order."""
        self._file()
        vocab = self._vocab_map
        if vocab is not None:
            return [(t, vocab[t]) for t in query if t in vocab]
        if not query or not self._keys.size:
            return []
        q = np.asarray(query, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._keys, q), self._keys.size - 1)
        found = self._keys[at] == q
        return list(zip(q[found].tolist(), at[found].tolist(), strict=True))

    def stats(self, query: Sequence[int]) -> Stats:
        """The index's BM25 statistics for the query: `Stats.of` adds those of several indexes
        searched as one (`scores(..., stats)`)."""
        df = {key: self._df(self._postings(tid)[0]) for key, tid in self._terms(sorted(set(query)))}
        return Stats(self._live, self._live_len, df)

    def _df(self, rows: np.ndarray) -> int:
        """A term's document frequency: its live rows."""
        if self._live == len(self._ids):
            return rows.size
        return int(np.count_nonzero(self._alive[rows]))

    def _postings(self, tid: int) -> tuple[np.ndarray, np.ndarray]:
        rows, tfs = self._rows, self._tfs
        if tid + 1 < self._indptr.size:
            lo, hi = int(self._indptr[tid]), int(self._indptr[tid + 1])
            rows, tfs = rows[lo:hi], tfs[lo:hi]
        else:
            rows, tfs = rows[:0], tfs[:0]
        extra = self._tail.get(tid)
        if extra is not None:
            hit = self._joined.get(tid)
            count = len(extra[0])
            if hit is not None and hit[0] == count:
                return hit[1], hit[2]
            # A term's tail only grows until a merge (which drops these): what it had when
            # last joined is still its start, so only the postings added since are converted
            # (a list converts element by element; a turn adds one posting to a common word).
            done, rows, tfs = (0, rows, tfs) if hit is None else hit
            rows = np.concatenate((rows, np.asarray(extra[0][done:], dtype=np.int32)))
            tfs = np.concatenate((tfs, np.asarray(extra[1][done:], dtype=np.float32)))
            if len(self._joined) >= JOINED_MAX:
                self._joined.clear()
            self._joined[tid] = (count, rows, tfs)
        return rows, tfs

    def scores(self, query: Sequence[int], stats: Stats | None = None) -> np.ndarray | None:
        """BM25 score of every row for the query's term keys (`Analyzer.query`): 0 where no
        query term occurs or the row is dead; None when no query term is in the index.
        `stats`: of several indexes searched as one (their scores then compare as those of one
        index holding all their rows would), else this index's own."""
        terms = self._terms(query)
        if not terms or not self._live:
            return None
        n = len(self._ids)
        scores = np.zeros(n, dtype=np.float32)
        live, total = (self._live, self._live_len) if stats is None else stats[:2]
        avgdl = max(total / max(live, 1), 1e-9)
        lens = self._len
        labels, rest, times = self._label_rule(query, terms, stats)
        matched = np.zeros(n, dtype=bool) if rest else None
        for key, tid in dict(terms).items():
            rows, tfs = self._postings(tid)
            if not rows.size:
                continue
            df = self._df(rows) if stats is None else stats.df.get(key, rows.size)
            idf = math.log(1.0 + (max(live, df) - df + 0.5) / (df + 0.5))
            if key >> 48 == LABEL_MARK:
                # A label scores the same in a short record as in a long one: else a speaker's
                # shortest small talk outranks what they said about the query's subject.
                norm = LABEL_NORM
            else:
                norm = K1 * (1.0 - B + B * lens[rows] / avgdl)
                if matched is not None and key & WORD_MASK not in labels:
                    matched[rows] = True
            scores[rows] += (times[key] * idf) * tfs * (K1 + 1.0) / (tfs + norm)
        if matched is not None:
            scores[~matched] = 0.0
        scores[~self._alive[:n]] = 0.0
        return scores

    def _label_rule(
        self, query: Sequence[int], terms: list[tuple[int, int]], stats: Stats | None
    ) -> tuple[set[int], bool, dict[int, float]]:
        """The query's words that are labels here, whether the rest of the query is more than
        them (then only records matching the rest score), and how much each key weighs: how
        often it is asked for (a key asked for twice, a label, is scored once, doubled), a word
        that is a label here `LABEL_WORD_WEIGHT` of that.

        The query's terms that are labels here (names: "what does Caroline paint?") rank the
        records that match the rest of the query, and find none alone unless the query is
        nothing else: a name alone would fill the list with the speaker's small talk."""
        if stats is None:
            labels = {k & WORD_MASK for k, _ in terms if k >> 48 == LABEL_MARK}
        else:
            labels = {k & WORD_MASK for k, n_ in stats.df.items() if n_ and k >> 48 == LABEL_MARK}
        rest = bool(labels) and any(
            k >> 48 != LABEL_MARK and k & WORD_MASK not in labels for k in query
        )
        times: dict[int, float] = {}
        for key, _ in terms:
            times[key] = times.get(key, 0) + 1
        for key in times:
            if key >> 48 != LABEL_MARK and key & WORD_MASK in labels:
                times[key] *= LABEL_WORD_WEIGHT
        return labels, rest, times

    def search(
        self,
        query: Sequence[int],
        depth: int,
        allowed: Callable[[str], bool] | None = None,
        stats: Stats | None = None,
    ) -> list[tuple[str, float]]:
        """Up to `depth` (id, score) pairs of entries matching any query term, best first
        (ties: the earlier indexed first), only ids that `allowed` accepts (`stats`: see
        `scores`)."""
        if depth <= 0:
            return []
        sparse = self._sparse_scores(query, stats)
        if sparse is not None:
            return ranked_rows(*sparse, self._ids, depth, allowed)
        scores = self.scores(query, stats)
        if scores is None:
            return []
        return ranked(scores, self._ids, depth, allowed)

    def _sparse_scores(
        self, query: Sequence[int], stats: Stats | None
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """`scores` for the rows the query's terms occur in only, as (rows, scores) with the
        rows ascending and dead ones left out: the same float32 sums in the same term order,
        without arrays as long as the index (a few postings among many rows). None when the
        postings are too many for that to pay (then `scores` is used)."""
        terms = self._terms(query)
        if not terms or not self._live:
            return None
        labels, rest, times = self._label_rule(query, terms, stats)
        postings = [(key, *self._postings(tid)) for key, tid in dict(terms).items()]
        total = sum(rows.size for _, rows, _ in postings)
        if total * SPARSE_RATIO > len(self._ids):
            return None
        live, whole = (self._live, self._live_len) if stats is None else stats[:2]
        avgdl = max(whole / max(live, 1), 1e-9)
        weights, labelled, counted = [], [], []
        for key, rows, _ in postings:
            df = self._df(rows) if stats is None else stats.df.get(key, rows.size)
            idf = math.log(1.0 + (max(live, df) - df + 0.5) / (df + 0.5))
            weights.append(np.float32(times[key] * idf))
            labelled.append(key >> 48 == LABEL_MARK)
            counted.append(not rest or (key & WORD_MASK not in labels and key >> 48 != LABEL_MARK))
        # Every posting at once, in term order; each row's sum is then added up in that order
        # (`add.at` is unbuffered), as the dense scores add one term after another. The length
        # norms too, element by element the same float32 operations as one term's at a time
        # (a few terms of a few postings each: the calls, not the postings, are the cost).
        sizes = [r.size for _, r, _ in postings]
        rows = np.concatenate([r for _, r, _ in postings])
        tfs = np.concatenate([t for _, _, t in postings])
        weight = np.repeat(np.asarray(weights, dtype=np.float32), sizes)
        norm = K1 * (1.0 - B + B * self._len[rows] / avgdl)
        if any(labelled):
            norm[np.repeat(np.asarray(labelled), sizes)] = LABEL_NORM
        touched, at = np.unique(rows, return_inverse=True)
        sums = np.zeros(touched.size, dtype=np.float32)
        np.add.at(sums, at, weight * tfs * (K1 + 1.0) / (tfs + norm))
        keep = self._alive[touched]
        if rest:  # only the records matching the query's words that are no label
            matched = np.zeros(touched.size, dtype=bool)
            matched[at[np.repeat(np.asarray(counted), sizes)]] = True
            keep &= matched
        return touched[keep], sums[keep]

    def row_ids(self) -> list[str | None]:
        return self._ids

    def row_of(self, entry_id: str) -> int | None:
        """The entry's row (rows are given in indexing order; a new text gets a new one)."""
        return self._row.get(entry_id)


def ranked(
    scores: np.ndarray,
    ids: Sequence[str | None],
    depth: int,
    allowed: Callable[[str], bool] | None,
    floor: float = 0.0,
    row_ok: Callable[[int], bool] | None = None,
) -> list[tuple[str, float]]:
    """The best `depth` rows of `scores` above `floor` whose id is live and allowed (and the
    row itself `row_ok`, when given: checked first), best first (ties by row). Only the top
    few times `depth` are sorted, unless the caller may read too few of them: then the whole
    ranking is."""
    hit = np.flatnonzero(scores > floor)
    return ranked_rows(hit, scores[hit], ids, depth, allowed, floor, row_ok)


def ranked_rows(
    rows: np.ndarray,
    scores: np.ndarray,
    ids: Sequence[str | None],
    depth: int,
    allowed: Callable[[str], bool] | None,
    floor: float = 0.0,
    row_ok: Callable[[int], bool] | None = None,
) -> list[tuple[str, float]]:
    """`ranked` of the rows `rows` (ascending) scored `scores` (rows not given score 0)."""
    above = scores > floor
    if not above.all():
        rows, scores = rows[above], scores[above]
    if not rows.size or depth <= 0:
        return []
    chunk = max(4 * depth, 256)
    if rows.size > 2 * chunk:
        top = np.argpartition(-scores, chunk)[:chunk]
        order = top[np.lexsort((rows[top], -scores[top]))]
        out = _walk(rows[order], scores[order], ids, depth, allowed, row_ok)
        if len(out) >= depth:
            return out
    order = np.lexsort((rows, -scores))
    return _walk(rows[order], scores[order], ids, depth, allowed, row_ok)


def _walk(
    rows: np.ndarray,
    scores: np.ndarray,
    ids: Sequence[str | None],
    depth: int,
    allowed: Callable[[str], bool] | None,
    row_ok: Callable[[int], bool] | None = None,
) -> list[tuple[str, float]]:
    """The allowed ones of `rows` (best first, `scores` theirs), up to `depth`."""
    out: list[tuple[str, float]] = []
    for r, score in zip(rows.tolist(), scores.tolist(), strict=True):
        entry_id = ids[r]
        if (
            entry_id is not None
            and (row_ok is None or row_ok(r))
            and (allowed is None or allowed(entry_id))
        ):
            out.append((entry_id, score))
            if len(out) >= depth:
                break
    return out
