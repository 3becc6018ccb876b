"""Workspace record vectors on a shard's DuckDB file (SC-7 semantic search; migration 6).

One block per embedding batch (`ws_vector_blocks`, migration 8): the embedding model's ident,
the records' ids and content fingerprints when they were embedded, and their vectors as one
matrix sealed with the pool's data key, the list of ids and fingerprints in its associated data
(embeddings can be inverted to much of the text they came from, so they are content, SEC-1). A
pool's vectors load as a few hundred decryptions and one concatenation instead of one per
record (100,000 records: seconds before). A later block's vector of a record replaces an
earlier one; a vector whose model or fingerprint no longer matches is stale and is recomputed,
never trusted. Rows of the older one-per-record table (`ws_vectors`, migration 6) are still
read, before the blocks.

A block's matrix is stored as directions, one signed byte per dimension (`_I8`: each row
scaled so that its largest component is +-127, with the factor that makes it a unit vector;
search compares unit vectors only, so the original length is not kept). A quarter of
float32's bytes to read and decrypt when a pool loads (100,000 x 384: 39 MB instead of 150
MB), and a quarter of the memory: a loaded pool keeps them as they are until its first new
vector (`Loaded`). Measured on the retrieval benchmark's 6,120
turns and 440 questions with all-MiniLM-L6-v2: the dense ranking's recall@10 (0.682) and MRR
(0.407) unchanged, recall@5 0.559 -> 0.557 (near-identical small-talk turns swap places: 10%
of top-10 places differ, 0.3% of top-1000). Blocks stored as float32 (before) still load.

Kept rather than rebuilt at every start: re-embedding a whole shard costs a model call per
record (money, rate limits, minutes) each time a shard actor (re)starts.

This module only loads and builds rows; the shard's group commit writes them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence

import msgspec
import numpy as np

from storage.bulk import paused_gc
from storage.crypto import Cipher, aad
from storage.database import Database
from storage.group_commit import Put, Write
from storage.shard_schema import WORKSPACE_VECTOR_BLOCKS, WORKSPACE_VECTORS
from storage.workspace_store import entry_key


def _vector_aad(pool: str, entry_id: str, model: str) -> bytes:
    return aad(pool, f"ws-vec\x00{entry_id}\x00{model}")


def block_aad(pool: str, model: str, seq: int, entries: str) -> bytes:
    """A block's associated data: its place and its list of (record, fingerprint), as stored
    (a block whose list was swapped for another's, or edited, does not open)."""
    listed = hashlib.sha256(entries.encode()).hexdigest()
    return aad(pool, f"ws-vecblock2\x00{model}\x00{seq}\x00{listed}")


def legacy_block_aad(pool: str, model: str, seq: int) -> bytes:
    """A block's associated data in the first block format (its list not covered): only to
    seal such a block again (storage/key_upgrade.py)."""
    return aad(pool, f"ws-vecblock\x00{model}\x00{seq}")


def reseal_block(
    cipher: Cipher, pool: str, model: str, seq: int, entries: str, vecs: bytes
) -> bytes:
    """A block stored under `legacy_block_aad`, sealed again under `block_aad`."""
    plain = cipher.open(vecs, legacy_block_aad(pool, model, seq))
    return cipher.seal(plain, block_aad(pool, model, seq, entries))


_entries_dec = msgspec.json.Decoder(list[tuple[str, str]])
_OVERHEAD = 12 + 16  # a sealed blob's nonce and tag (storage/crypto.py)
# A block of int8 directions starts with this and its dimension (uint32 LE), then each row's
# factor to unit length (float32 LE), then the rows; its size must be exactly 8 + rows x (4 +
# dim). (A float32 block starting with these bytes would have to begin with a component of
# about 5.8e10 and have that very size: not an embedding.)
_I8 = b"OBI8"


def pack(vector: Sequence[float] | np.ndarray) -> bytes:
    """Little-endian float32, whatever the machine."""
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4")


def quantize(mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows as int8 directions, each scaled so that its largest component is +-127, and for
    each the factor that makes it a unit vector again (0 for a zero or non-finite row: never
    a hit, as before)."""
    mat = np.asarray(mat, dtype=np.float32)
    peak = np.abs(mat).max(axis=1, keepdims=True) if mat.size else np.ones((len(mat), 1))
    usable = (peak > 0) & np.isfinite(peak) & np.isfinite(mat).all(axis=1, keepdims=True)
    scaled = np.where(usable, mat * (127.0 / np.where(usable, peak, 1.0)), 0.0)
    codes = np.rint(scaled).astype(np.int8)
    norms = np.sqrt(np.einsum("ij,ij->i", codes, codes, dtype=np.float64))
    scale = np.where(norms > 0, 1.0 / np.where(norms > 0, norms, 1.0), 0.0)
    return codes, scale.astype("<f4")


def _layout(rows: int, plain: int, head: bytes) -> tuple[str, int] | None:
    """A block's format and dimension from its first bytes and plaintext size; None when
    unusable."""
    if head[:4] == _I8 and len(head) >= 8:
        dim = int.from_bytes(head[4:8], "little")
        if dim > 0 and plain == 8 + rows * (4 + dim):
            return "i8", dim
    if plain > 0 and plain % (4 * rows) == 0:
        return "f32", plain // (4 * rows)
    return None


# What a pool's stored vectors load as: record ids (distinct), fingerprints, a matrix of rows,
# each record's row (None: not made, the row of `ids[k]` is k) and each row's factor to unit
# length (None: the rows are unit already). When every block is int8 (all but blocks stored
# before int8 ones existed), the matrix is the int8 directions themselves, neither widened nor
# scaled: a search scores them a few hundred rows at a time and applies the factor to the
# scores (actors/workspace/vectors.py), so the first search after a shard opens does not wait
# for a fresh 150 MB float32 matrix (100,000 x 384) to be written. Otherwise float32 directions
# (int8 blocks widened), with the factors likewise kept aside.
Loaded = tuple[list[str], list[str], np.ndarray, dict[str, int] | None, np.ndarray | None]


def assemble_blocks(
    pool: str, model: str, cipher: Cipher, legacy: list[tuple], blocks: list[tuple]
) -> Loaded:
    """Stored rows and blocks as loaded vectors; see `VectorStore.load_all`."""
    empty: Loaded = ([], [], np.zeros((0, 0), dtype=np.float32), None, None)
    ids: list[str] = []
    fps: list[str] = []
    parts: list[tuple[int, bytes, bytes]] = []  # (rows, blob, aad)
    with paused_gc():  # (a tuple per record: collections that find no garbage)
        for entry, fp, vec in legacy:
            ids.append(entry)
            fps.append(fp)
            parts.append((1, vec, _vector_aad(pool, entry, model)))
        for seq, entries, vecs in blocks:
            pairs = _entries_dec.decode(entries)
            if not pairs or len(vecs) <= _OVERHEAD:
                continue  # nothing usable: recomputed like a missing vector
            block_ids, block_fps = zip(*pairs, strict=True)
            ids.extend(block_ids)
            fps.extend(block_fps)
            parts.append((len(pairs), vecs, block_aad(pool, model, seq, entries)))
    if not ids:
        return empty
    plain = [len(blob) - _OVERHEAD for _, blob, _ in parts]
    opened = _open_int8(cipher, parts, plain, len(ids))
    if opened is not None:
        mat, factor = opened
        return _latest(ids, fps, mat, factor)
    # Every block is opened into one buffer; float32 ones land where their rows go.
    buf = np.empty(sum(plain), dtype=np.uint8)
    flat = memoryview(buf)
    at = 0
    for (_, blob, where), size in zip(parts, plain, strict=True):
        cipher.open_into(blob, where, flat[at : at + size])
        at += size
    layouts = []
    at = 0
    for (rows, _, _), size in zip(parts, plain, strict=True):
        layouts.append(_layout(rows, size, bytes(buf[at : at + 8])))
        at += size
    dims = {lay[1] for lay in layouts if lay is not None}
    if len(dims) != 1 or None in layouts:
        return empty
    dim = dims.pop()
    int8 = all(kind == "i8" for kind, _ in layouts)
    mat = np.empty((len(ids), dim), dtype=np.int8 if int8 else np.float32)
    factor = np.ones(len(ids), dtype=np.float32)
    # int8 rows are copied as bytes: a numpy copy of each block lets go of the GIL and then
    # waits to take it back while the event loop's thread runs Python (the same search loads
    # the pool's records meanwhile), which for several hundred blocks was most of this time.
    dest = memoryview(mat).cast("B") if int8 else None
    row = at = 0
    for (rows, _, _), size, (kind, _) in zip(parts, plain, layouts, strict=True):
        out = mat[row : row + rows]
        if kind == "i8":  # copied (or widened) as they are; the factor kept aside
            factor[row : row + rows] = buf[at + 8 : at + 8 + 4 * rows].view("<f4")
            if dest is not None:
                dest[row * dim : (row + rows) * dim] = flat[at + 8 + 4 * rows : at + size]
            else:
                codes = buf[at + 8 + 4 * rows : at + size].view(np.int8).reshape(rows, dim)
                np.copyto(out, codes, casting="unsafe")
        else:
            np.copyto(out, buf[at : at + size].view("<f4").reshape(rows, dim))
            unit_rows(out)
        row += rows
        at += size
    del buf, flat, dest
    return _latest(ids, fps, mat, factor)


def _latest(ids: list[str], fps: list[str], mat: np.ndarray, factor: np.ndarray) -> Loaded:
    """Each record's latest vector only (a later block's replaces an earlier one's)."""
    with paused_gc():
        if len(set(ids)) == len(ids):
            return ids, fps, mat, None, factor  # (the map of rows is made when first needed)
        last = dict(zip(ids, range(len(ids)), strict=True))  # a later vector replaces an earlier
        keep = sorted(last.values())
        ids, fps, mat = [ids[k] for k in keep], [fps[k] for k in keep], mat[keep]
        return ids, fps, mat, dict(zip(ids, range(len(ids)), strict=True)), factor[keep]


def _open_int8(
    cipher: Cipher, parts: list[tuple[int, bytes, bytes]], plain: list[int], n: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Blocks that are all int8 of one dimension (every block written since int8 blocks
    exist), each opened straight into its place in one matrix: no second 40 MB buffer to
    fill and copy out of at 100,000 x 384 (a copy that took 12 to 130 ms of the first search
    after a shard opens). The matrix and each row's factor; None when the sizes say the
    blocks are not all int8 of one dimension, or a block's head is not int8's (the general
    path then opens them again).

    A block's plaintext is its head, its factors, then its rows. Block k is opened so that its
    rows land on their rows of the matrix, its head and factors on the end of block k - 1's
    rows just before; so the blocks are opened last first (each factor taken out before the
    block before it is opened over them), and room for the first block's head and factors is
    left before row 0."""
    dims = set()
    for (rows, _, _), size in zip(parts, plain, strict=True):
        if size <= 8 or (size - 8) % rows:
            return None
        dims.add((size - 8) // rows - 4)
    if len(dims) != 1 or (dim := dims.pop()) <= 0:
        return None
    head = _I8 + dim.to_bytes(4, "little")
    lead = 8 + 4 * max(rows for rows, _, _ in parts)
    room = np.empty(lead + n * dim, dtype=np.uint8)
    flat = memoryview(room)
    factor = np.empty(n, dtype=np.float32)
    end_row = n
    for (rows, blob, where), size in zip(reversed(parts), reversed(plain), strict=True):
        first = end_row - rows
        end = lead + end_row * dim
        at = end - size
        cipher.open_into(blob, where, flat[at:end])
        if flat[at : at + 8] != head:
            return None
        factor[first:end_row] = room[at + 8 : at + 8 + 4 * rows].view("<f4")
        end_row = first
    del flat
    return room[lead:].view(np.int8).reshape(n, dim), factor


def _seq(block: tuple) -> int:
    return block[0]


def unit_rows(mat: np.ndarray) -> None:
    """Scale a float32 matrix's rows to unit length in place (zero or non-finite rows become
    zeros); one pass for the norms, no temporary matrix."""
    norms = np.sqrt(np.einsum("ij,ij->i", mat, mat))
    bad = ~((norms > 0) & np.isfinite(norms))
    mat[bad] = 0.0
    norms[bad] = 1.0
    mat /= norms[:, None]


class VectorStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def load(
        self, pool: str, model: str, cipher: Cipher
    ) -> list[tuple[str, str, np.ndarray]]:
        """(entry, fingerprint, vector) of the pool's rows for `model`."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT entry, fp, vec FROM ws_vectors WHERE pool = ? AND model = ?",
                [pool, model],
            ).fetchall()
        )
        return [
            (entry, fp, unpack(cipher.open(vec, _vector_aad(pool, entry, model))))
            for entry, fp, vec in rows
        ]

    async def load_all(self, pool: str, model: str, cipher: Cipher) -> Loaded:
        """The pool's current vectors for `model`: record ids, fingerprints, one matrix of
        their directions (int8 or float32, see `Loaded`), of its own (writable; a record's
        latest vector only), each record's row (None when it is simply its place in `ids`) and
        each row's factor to unit length (`Loaded`)."""
        return await self.assemble(pool, model, cipher, await self.read(pool, model))

    async def read(self, pool: str, model: str) -> tuple[list[tuple], list[tuple]]:
        """The pool's stored vectors for `model`, sealed, as `assemble` takes them: read
        beside the database thread's work when it can be (`Database.run_aside`: the first
        search after a shard opens reads a pool's records and its vectors at once; they are
        tens of MB at 100,000 records, derived data that a write made meanwhile could only
        make stale, which is checked)."""

        def read(con):
            legacy = con.execute(
                "SELECT entry, fp, vec FROM ws_vectors WHERE pool = ? AND model = ?",
                [pool, model],
            ).fetchall()
            blocks = con.execute(
                "SELECT seq, entries, vecs FROM ws_vector_blocks WHERE pool = ? AND model = ?",
                [pool, model],
            ).fetchall()
            # Ordered here: an ORDER BY has DuckDB sort the rows with their blobs (tens of MB
            # at 100,000 records), about twice the CPU of reading them.
            blocks.sort(key=_seq)
            return legacy, blocks

        return await self.db.run_aside(read)

    @staticmethod
    async def assemble(
        pool: str, model: str, cipher: Cipher, rows: tuple[list[tuple], list[tuple]]
    ) -> Loaded:
        """`read`'s rows opened and put in one matrix on another thread (numpy and the
        cipher let the event loop run meanwhile)."""
        legacy, blocks = rows
        return await asyncio.to_thread(assemble_blocks, pool, model, cipher, legacy, blocks)

    @staticmethod
    def block(
        pool: str,
        model: str,
        seq: int,
        items: Sequence[tuple[str, str, Sequence[float] | np.ndarray]],
        cipher: Cipher,
    ) -> Write:
        """One batch of (record, fingerprint, vector) as one sealed block of int8 directions;
        `seq` orders the blocks of a pool (a later one wins)."""
        entries = msgspec.json.encode([(entry, fp) for entry, fp, _ in items]).decode()
        codes, scale = quantize(np.stack([np.asarray(v, dtype=np.float32) for _, _, v in items]))
        head = _I8 + codes.shape[1].to_bytes(4, "little")
        plain = head + scale.tobytes() + codes.tobytes()
        sealed = cipher.seal(plain, block_aad(pool, model, seq, entries))
        key = f"{pool}\x00{model}\x00{seq:020d}"
        return Put(WORKSPACE_VECTOR_BLOCKS.name, (key, pool, model, seq, entries, sealed))

    @staticmethod
    def row(
        pool: str,
        entry_id: str,
        model: str,
        fp: str,
        vector: Sequence[float] | np.ndarray,
        cipher: Cipher,
    ) -> Write:
        sealed = cipher.seal(pack(vector), _vector_aad(pool, entry_id, model))
        return Put(
            WORKSPACE_VECTORS.name, (entry_key(pool, entry_id), pool, entry_id, model, fp, sealed)
        )
