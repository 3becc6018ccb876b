"""Workspace record vectors on a shard's DuckDB file (SC-7 semantic search; migration 6).

One row per record: the embedding model's ident, the record's content fingerprint when it was
embedded, and the vector as little-endian float32, sealed with the pool's data key (embeddings
can be inverted to much of the text they came from, so they are content, SEC-1). A row whose
model or fingerprint no longer matches is stale and is recomputed, never trusted.

Kept rather than rebuilt at every start: re-embedding a whole shard costs a model call per
record (money, rate limits, minutes) each time a shard actor (re)starts.

This module only loads and builds rows; the shard's group commit writes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from storage.crypto import Cipher, aad
from storage.database import Database
from storage.group_commit import Put, Write
from storage.shard_schema import WS_VECTORS
from storage.workspace_store import entry_key


def _vector_aad(pool: str, entry_id: str, model: str) -> bytes:
    return aad(pool, f"ws-vec\x00{entry_id}\x00{model}")


def pack(vector: Sequence[float] | np.ndarray) -> bytes:
    """Little-endian float32, whatever the machine."""
    return np.asarray(vector, dtype="<f4").tobytes()


def unpack(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4")


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
