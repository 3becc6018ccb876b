"""One pool's vectors for semantic search (actors/workspace/semantic.py): a growable matrix of
unit vectors with each row's record id and content fingerprint, and the top hits for a query.

A pool's stored vectors load as int8 directions with each row's factor to unit length
(storage/vector_store.py) and are kept so until the pool's first new vector: a search scores
them `CHUNK` rows at a time (each chunk widened into a small float32 buffer that stays in the
CPU's cache, then one matrix-vector product), which at 100,000 x 384 costs about what one
product over a float32 matrix does (it reads 38 MB instead of 150), and the first search after
a shard opens does not wait for that 150 MB matrix to be written (~40-100 ms of its time, more
on a loaded host). A new vector (`put`) widens the rows once: floats as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from engine.scoped_memory import WorkspaceEntry
from engine.workspace_search import Hit
from storage.bulk import paused_gc
from storage.vector_store import unit_rows

CHUNK = 512  # int8 rows widened at a time when scoring (384 dims: 0.8 MB of float32)


class PoolVectors:
    """One pool's unit vectors: a growable float32 matrix whose rows never move (an edited
    record's row is overwritten), with each row's record id and content fingerprint."""

    def __init__(self) -> None:
        self.dim = 0
        self.n = 0
        self.mat = np.zeros((0, 0), dtype=np.float32)
        # The rows as loaded, int8 directions (then `mat` is unused) until the first `put`.
        self.codes: np.ndarray | None = None
        self.ids: list[str] = []
        self.fps: list[str] = []
        # Each row's factor to unit length (None: every row is unit): a search scales its
        # scores, so a pool's load need not scale the matrix.
        self.scale: np.ndarray | None = None
        # id -> row, made from `ids` when first needed: a search walks rows (`_top`), and at
        # 100,000 records the map costs a pool's first search tens of ms.
        self._row: dict[str, int] | None = {}

    def clear(self) -> None:
        self.__init__()

    @property
    def row(self) -> dict[str, int]:
        if self._row is None:
            with paused_gc():
                self._row = dict(zip(self.ids, range(len(self.ids)), strict=True))
        return self._row

    def fp(self, entry_id: str) -> str | None:
        r = self.row.get(entry_id)
        return None if r is None else self.fps[r]

    def put(self, entry_id: str, fp: str, vector: Sequence[float]) -> None:
        v = np.asarray(vector, dtype=np.float32)
        if v.ndim != 1 or v.size == 0:
            raise ValueError("a vector must be one non-empty row")
        if v.size != self.dim:
            self.clear()  # another vector space: what was kept is worthless
            self.dim = v.size
        self.widen()
        norm = float(np.linalg.norm(v))
        unit = v / norm if norm > 0 and np.isfinite(norm) else np.zeros_like(v)
        r = self.row.get(entry_id)
        if r is None:
            if self.n == self.mat.shape[0]:
                grown = np.zeros((max(16, 2 * self.n), self.dim), dtype=np.float32)
                if self.n:
                    grown[: self.n] = self.mat[: self.n]
                self.mat = grown
                if self.scale is not None:
                    self.scale = np.resize(self.scale, grown.shape[0])
            r = self.n
            self.n += 1
            self.row[entry_id] = r
            self.ids.append(entry_id)
            self.fps.append(fp)
        else:
            self.fps[r] = fp
        self.mat[r] = unit
        if self.scale is not None:
            self.scale[r] = 1.0

    def load(self, items: Sequence[tuple[str, str, np.ndarray]]) -> None:
        """Fill an empty index with (record, fingerprint, vector) rows in one go."""
        if self.n or len({v.size for _, _, v in items}) != 1:
            for entry_id, fp, vector in items:
                self.put(entry_id, fp, vector)
            return
        mat = np.stack([v for _, _, v in items]).astype(np.float32)
        norms = np.linalg.norm(mat, axis=1, keepdims=True)
        usable = (norms > 0) & np.isfinite(norms)
        self.mat = np.where(usable, mat / np.where(usable, norms, 1.0), 0.0).astype(np.float32)
        self.dim, self.n = mat.shape[1], mat.shape[0]
        self.ids = [entry_id for entry_id, _, _ in items]
        self.fps = [fp for _, fp, _ in items]
        self._row = {entry_id: r for r, entry_id in enumerate(self.ids)}

    def widen(self, mat: np.ndarray | None = None) -> None:
        """Keep the rows as float32 from now on (`mat`: `widened(codes)` of the current
        codes, made on another thread; otherwise made here)."""
        codes = self.codes
        if codes is None:
            return
        self.mat = widened(codes) if mat is None else mat
        self.codes = None
        if self.scale is not None:  # one factor a row, the spare rows' too
            self.scale = np.resize(self.scale, self.mat.shape[0])

    def load_matrix(
        self,
        ids: list[str],
        fps: list[str],
        mat: np.ndarray,
        *,
        unit: bool = False,
        row: dict[str, int] | None = None,
        scale: np.ndarray | None = None,
    ) -> None:
        """Fill an empty index with a whole matrix, taken over (scaled to unit length in
        place, unless `unit` says its rows already are, or `scale` gives each row's factor to
        unit length, then kept beside it) when it is a writable float32 one; `row`, each id's
        row when the caller has it, is taken over too."""
        if not ids:
            return
        if mat.dtype == np.int8 and scale is not None:  # scored as they are (see above)
            self.codes = np.ascontiguousarray(mat)
            self.scale = np.array(scale, dtype=np.float32)
            self.mat = np.zeros((0, mat.shape[1]), dtype=np.float32)
            self.dim, self.n = mat.shape[1], mat.shape[0]
            self.ids, self.fps = list(ids), list(fps)
            self._row = row if row is not None and len(row) == len(ids) else None
            return
        if not (mat.dtype == np.float32 and mat.flags.writeable and mat.flags.c_contiguous):
            mat = np.array(mat, dtype=np.float32)  # one of its own, written in place
            if scale is not None:
                mat *= np.asarray(scale, dtype=np.float32)[:, None]
                scale = None
            unit = False
        if scale is not None:
            self.scale = np.array(scale, dtype=np.float32)  # (of its own: `put` writes it)
        elif not unit:
            unit_rows(mat)
        self.mat = mat
        self.dim, self.n = mat.shape[1], mat.shape[0]
        self.ids, self.fps = list(ids), list(fps)
        self._row = row if row is not None and len(row) == len(ids) else None

    def split(self, entries: Iterable[WorkspaceEntry]) -> tuple[list[int], list[WorkspaceEntry]]:
        """The rows of the records among `entries` whose vector is current, and the records
        whose vector is missing or stale (one pass: this runs over every candidate)."""
        row, fps = self.row, self.fps
        rows: list[int] = []
        stale: list[WorkspaceEntry] = []
        for e in entries:
            r = row.get(e.id)
            if r is not None and fps[r] == e.content_fp:
                rows.append(r)
            else:
                stale.append(e)
        return rows, stale

    def scores(self, query: np.ndarray) -> np.ndarray:
        """The cosine of every row with the unit vector `query`."""
        if self.codes is not None:
            scores = _int8_scores(self.codes, query)
        else:
            scores = self.mat[: self.n] @ query
        if self.scale is not None:
            scores *= self.scale[: self.n]
        return scores

    def top(self, query: np.ndarray, rows: Sequence[int], k: int, min_score: float) -> list[Hit]:
        """The `k` of `rows` nearest to the unit vector `query`, best first, ties by id; none
        below `min_score`."""
        if k <= 0 or not rows or query.size != self.dim:
            return []
        picked = np.asarray(rows, dtype=np.int64)
        if 4 * picked.size >= self.n:
            scores = self.scores(query)[picked]  # most rows: no copy of the matrix
        else:
            if self.codes is not None:
                scores = self.codes[picked].astype(np.float32) @ query
            else:
                scores = self.mat[picked] @ query
            if self.scale is not None:
                scores *= self.scale[picked]
        keep = scores >= min_score
        picked, scores = picked[keep], scores[keep]
        if picked.size > k:
            # Everything tied with the k-th best stays in, so that ties are broken by id.
            kth = np.partition(scores, picked.size - k)[picked.size - k]
            keep = scores >= kth
            picked, scores = picked[keep], scores[keep]
        hits = [
            Hit(id=self.ids[r], score=float(x), kinds=("semantic",))
            for r, x in zip(picked.tolist(), scores.tolist(), strict=True)
        ]
        hits.sort(key=lambda h: (-h.score, h.id))
        return hits[:k]


def unit_vector(vector: Sequence[float]) -> np.ndarray:
    v = np.asarray(vector, dtype=np.float32)
    norm = float(np.linalg.norm(v))
    return v / norm if norm > 0 and np.isfinite(norm) else np.zeros_like(v)


def widened(codes: np.ndarray) -> np.ndarray:
    """int8 rows as a new float32 matrix, with room for more (it is widened for a `put`)."""
    n = codes.shape[0]
    mat = np.zeros((n + max(16, n // 8), codes.shape[1]), dtype=np.float32)
    np.copyto(mat[:n], codes, casting="unsafe")
    return mat


def _int8_scores(codes: np.ndarray, query: np.ndarray) -> np.ndarray:
    """`codes @ query` for int8 rows and a float32 query, `CHUNK` rows widened at a time."""
    n = codes.shape[0]
    out = np.empty(n, dtype=np.float32)
    buf = np.empty((min(CHUNK, n), codes.shape[1]), dtype=np.float32)
    query = np.asarray(query, dtype=np.float32)
    for at in range(0, n, CHUNK):
        rows = min(CHUNK, n - at)
        np.copyto(buf[:rows], codes[at : at + rows], casting="unsafe")
        np.matmul(buf[:rows], query, out=out[at : at + rows])
    return out
