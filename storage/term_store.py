"""Stored search terms (issue 11; migration 8): what a pool's keyword index is rebuilt from.

One row per record: the record's term keys (`storage.search_index.Analyzer`: sorted keyed
hashes, never a word) and the content fingerprint they were made from. A row whose fingerprint
no longer matches the record is stale and the terms are made again from the text. Kept so that
the first search after a shard opens need not decrypt and tokenize every record of a pool
(about 10 s per 100,000 records in Python, against a bulk read of these rows).

This module only loads and builds rows; the shard's group commit writes them.
"""

from __future__ import annotations

import hashlib
import hmac

import numpy as np

from storage.database import Database, ReadScope
from storage.group_commit import Delete, Put, Write
from storage.search_index import pack_keys, unpack_keys
from storage.shard_schema import SEARCH_TERMS
from storage.workspace_store import entry_key


def terms_key(master_key: bytes) -> bytes:
    """The shard's secret for term hashes, derived from the master key (nothing more to store
    or back up)."""
    return hmac.new(master_key, b"openbot search terms", hashlib.sha256).digest()


class TermStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def load(self, pool: str) -> dict[str, tuple[str, np.ndarray]]:
        """entry -> (fingerprint, term keys) of the pool's rows."""
        entries, fps, blobs = await self.load_raw(pool)
        return {e: (fp, unpack_keys(raw)) for e, fp, raw in zip(entries, fps, blobs, strict=True)}

    async def load_raw(self, pool: str) -> tuple[list[str], list[str], list[bytes]]:
        """The pool's rows as columns: entries, fingerprints, packed term keys."""

        def read(con):
            cols = con.execute(
                "SELECT entry, fp, terms FROM search_terms WHERE pool = ?", [pool]
            ).fetchnumpy()
            return cols["entry"].tolist(), cols["fp"].tolist(), cols["terms"].tolist()

        return await self.db.run(read, _scope(pool))

    async def load_flat(self, pool: str) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The pool's rows as `TermIndex.build_flat` takes them: entries, how many keys each
        has and all keys end to end (joined on the database's thread). Without fingerprints:
        a pool's load checks them later (`fingerprints`)."""
        return await self.db.run(lambda con: self.read_flat(con, pool), _scope(pool))

    @staticmethod
    def read_flat(con, pool: str) -> tuple[list[str], np.ndarray, np.ndarray]:
        """`load_flat` on the database's thread (a caller may read more in the same call)."""
        cols = con.execute(
            "SELECT entry, octet_length(terms) // 8 AS n, terms FROM search_terms WHERE pool = ?",
            [pool],
        ).fetchnumpy()
        flat = unpack_keys(b"".join(cols["terms"].tolist()))
        lengths = np.asarray(cols["n"], dtype=np.int64)
        return cols["entry"].tolist(), lengths, flat

    async def fingerprints(self, pool: str) -> list[tuple[str, str]]:
        """(entry, fingerprint of the content its keys were made from) of the pool's rows."""
        return await self.db.run(
            lambda con: con.execute(
                "SELECT entry, fp FROM search_terms WHERE pool = ?", [pool]
            ).fetchall(),
            _scope(pool),
        )

    @staticmethod
    def row(pool: str, entry_id: str, fp: str, keys: np.ndarray) -> Write:
        return Put(
            SEARCH_TERMS.name, (entry_key(pool, entry_id), pool, entry_id, fp, pack_keys(keys))
        )

    @staticmethod
    def delete(pool: str, entry_id: str) -> Write:
        return Delete(SEARCH_TERMS.name, entry_key(pool, entry_id))


def _scope(pool: str) -> tuple[ReadScope]:
    """The rows a pool's term reads read (a new pool's first load, and the check a second after
    it, need not wait for the journal's other writes)."""
    return (ReadScope(SEARCH_TERMS.name, "pool", (pool,)),)
