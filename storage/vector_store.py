"""Workspace record vectors on a shard's DuckDB file (SC-7 semantic search; migration 6).

One block per embedding batch (`ws_vector_blocks`, migration 8): the embedding model's ident,
the records' ids and content fingerprints when they were embedded, and their vectors as one
little-endian float32 matrix sealed with the pool's data key (embeddings can be inverted to
much of the text they came from, so they are content, SEC-1). A pool's vectors load as a few
hundred decryptions and one concatenation instead of one per record (100,000 records: seconds
before). A later block's vector of a record replaces an earlier one; a vector whose model or
fingerprint no longer matches is stale and is recomputed, never trusted. Rows of the older
one-per-record table (`ws_vectors`, migration 6) are still read, before the blocks.

Kept rather than rebuilt at every start: re-embedding a whole shard costs a model call per
record (money, rate limits, minutes) each time a shard actor (re)starts.

This module only loads and builds rows; the shard's group commit writes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
import numpy as np

from storage.crypto import Cipher, aad
from storage.database import Database
from storage.group_commit import Put, Write
from storage.shard_schema import WS_VECTOR_BLOCKS, WS_VECTORS
from storage.workspace_store import entry_key


def _vector_aad(pool: str, entry_id: str, model: str) -> bytes:
    return aad(pool, f"ws-vec\x00{entry_id}\x00{model}")


def _block_aad(pool: str, model: str, seq: int) -> bytes:
    return aad(pool, f"ws-vecblock\x00{model}\x00{seq}")


_entries_dec = msgspec.json.Decoder(list[tuple[str, str]])
_OVERHEAD = 12 + 16  # a sealed blob's nonce and tag (storage/crypto.py)


def pack(vector: Sequence[float] | np.ndarray) -> bytes:
    """Little-endian float32, whatever the machine."""
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4")


def _assemble(
    pool: str, model: str, cipher: Cipher, legacy: list[tuple], blocks: list[tuple]
) -> tuple[list[str], list[str], np.ndarray]:
    """Stored rows and blocks as (ids, fingerprints, matrix); see `VectorStore.load_all`."""
    ids: list[str] = []
    fps: list[str] = []
    parts: list[tuple[int, bytes, bytes, int]] = []  # (rows, blob, aad, floats)
    for entry, fp, vec in legacy:
        ids.append(entry)
        fps.append(fp)
        parts.append((1, vec, _vector_aad(pool, entry, model), (len(vec) - _OVERHEAD) // 4))
    for seq, entries, vecs in blocks:
        pairs = _entries_dec.decode(entries)
        floats = (len(vecs) - _OVERHEAD) // 4
        if not pairs or floats <= 0 or floats % len(pairs):
            continue  # nothing usable: recomputed like a missing vector
        ids.extend(p[0] for p in pairs)
        fps.extend(p[1] for p in pairs)
        parts.append((len(pairs), vecs, _block_aad(pool, model, seq), floats))
    dims = {floats // rows for rows, _, _, floats in parts}
    if not ids or len(dims) != 1:
        return [], [], np.zeros((0, 0), dtype=np.float32)
    mat = np.empty((len(ids), dims.pop()), dtype="<f4")
    flat = memoryview(mat.reshape(-1)).cast("B")
    at = 0
    for _, blob, where, floats in parts:
        cipher.open_into(blob, where, flat[at : at + 4 * floats])
        at += 4 * floats
    mat = mat.astype(np.float32, copy=False)  # the machine's order (a no-op on x86 and ARM)
    last = {entry: k for k, entry in enumerate(ids)}  # a later vector replaces an earlier
    if len(last) != len(ids):
        keep = sorted(last.values())
        return [ids[k] for k in keep], [fps[k] for k in keep], mat[keep]
    return ids, fps, mat


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

    async def load_all(
        self, pool: str, model: str, cipher: Cipher
    ) -> tuple[list[str], list[str], np.ndarray]:
        """The pool's current vectors for `model`: record ids, fingerprints and one matrix of
        its own (writable; a record's latest vector only).

        The rows are read on the database's thread; the blocks are decrypted on another, each
        straight into its rows of one matrix allocated once (100,000 x 384 floats are 150 MB:
        every extra copy costs tens of milliseconds of the first search)."""

        def read(con):
            legacy = con.execute(
                "SELECT entry, fp, vec FROM ws_vectors WHERE pool = ? AND model = ?",
                [pool, model],
            ).fetchall()
            blocks = con.execute(
                "SELECT seq, entries, vecs FROM ws_vector_blocks WHERE pool = ? AND model = ? "
                "ORDER BY seq",
                [pool, model],
            ).fetchall()
            return legacy, blocks

        legacy, blocks = await self.db.run(read)
        return await asyncio.to_thread(_assemble, pool, model, cipher, legacy, blocks)

    @staticmethod
    def block(
        pool: str,
        model: str,
        seq: int,
        items: Sequence[tuple[str, str, Sequence[float] | np.ndarray]],
        cipher: Cipher,
    ) -> Write:
        """One batch of (record, fingerprint, vector) as one sealed block; `seq` orders the
        blocks of a pool (a later one wins)."""
        entries = msgspec.json.encode([(entry, fp) for entry, fp, _ in items]).decode()
        mat = np.stack([np.asarray(v, dtype="<f4") for _, _, v in items])
        sealed = cipher.seal(pack(mat.ravel()), _block_aad(pool, model, seq))
        key = f"{pool}\x00{model}\x00{seq:020d}"
        return Put(WS_VECTOR_BLOCKS.name, (key, pool, model, seq, entries, sealed))

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
        return Put(WS_VECTORS.name, (entry_key(pool, entry_id), pool, entry_id, model, fp, sealed))
