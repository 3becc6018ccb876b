"""Stored search terms (migration 8): what a pool's keyword index is rebuilt from.

One row per record: the record's term keys (`storage.term_keys.Analyzer`: sorted keyed
hashes, never a word, each pool's under its own key: `pool_terms_key`) and the content
fingerprint they were made from. A row whose fingerprint no longer matches the record is stale
and the terms are made again from the text. Kept so that the first search after a shard opens
need not decrypt and tokenize every record of a pool in Python, far slower than a bulk read of
these rows.

A workspace pool's built index is also kept whole (`search_snapshots`, migration 10): its
postings, sealed with the pool's data key, and `covers`, the highest `seq` of the term rows it
was built from. Every term row of a workspace pool carries a `seq` from the pool's counter
(`WorkspacePool.next_seq`), so a load restores the snapshot and applies only the rows written after
it (`seq > covers`) instead of sorting every posting again. The snapshot holds term keys only
(keyed hashes, as the rows do), record ids and counts: no word, and not readable without the
pool's key either.

This module only loads and builds rows; the shard's group commit writes them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import NamedTuple

import msgspec
import numpy as np

from storage.crypto import Cipher, aad, derive_key
from storage.database import Database, ReadScope
from storage.group_commit import Delete, Insert, Put, Write
from storage.search_index import Postings, TermIndex
from storage.shard_schema import SEARCH_SNAPSHOTS, SEARCH_TERMS
from storage.term_keys import Analyzer, Counted, pack_row, unpack_keys, unpack_row, unpack_rows
from storage.workspace_store import entry_key

_SNAP = b"OBTS1"  # a snapshot's plaintext starts with this (its format's version)
# A row's counts as `unpack_rows` takes them: ones for a row that stores every repeat.
TFS = "coalesce(tfs, repeat('\\x01\\x00'::BLOB, octet_length(terms) // 8))"


class _Snap(msgspec.Struct, array_like=True):
    ids: list[str]
    lengths: bytes  # float32 LE
    keys: bytes  # int64 LE
    indptr: bytes  # int64 LE
    rows: bytes  # int32 LE
    tfs: bytes  # float32 LE


_snap_dec = msgspec.msgpack.Decoder(_Snap)


class TermsLoad(NamedTuple):
    """What a workspace pool's load reads of its terms (`TermStore.read_load`)."""

    covers: int  # the snapshot's, -1 without one
    snapshot: bytes | None  # sealed
    ids: list[str]  # the rows written after the snapshot (all rows without one)
    lengths: np.ndarray
    flat: np.ndarray
    last_seq: int  # the highest seq of the pool's rows (0: none)


def pool_terms_key(master_key: bytes, pool: str) -> bytes:
    """A pool's secret for its term hashes, derived from the master key and the pool's id:
    the same word hashes differently in every pool, so known words written in one pool and
    their stored keys read back say nothing of another pool's rows. A bot memory pool and the
    workspace pool of the same id (`bot:<id>`: one bot's one memory, searched as one) share
    it."""
    return derive_key(master_key, "search terms", pool)


class TermKeys:
    """Each pool's analyzer (`Analyzer` under `pool_terms_key`): a text is hashed for the pool
    it is stored or searched in, a query once per pool it searches. The analyzers of the
    pools used last are kept with their memos (a pool's load hashes every word of it)."""

    def __init__(self, master_key: bytes, keep: int = 8) -> None:
        self._master = master_key
        self._keep = keep
        self._by_pool: OrderedDict[str, Analyzer] = OrderedDict()

    def of(self, pool: str) -> Analyzer:
        found = self._by_pool.get(pool)
        if found is not None:
            self._by_pool.move_to_end(pool)
            return found
        made = Analyzer(pool_terms_key(self._master, pool), memo_max=_MEMO_PER_POOL)
        self._by_pool[pool] = made
        if len(self._by_pool) > self._keep:
            self._by_pool.popitem(last=False)
        return made


_MEMO_PER_POOL = 65_536  # words memoised per analyzer kept (8 kept: about one memo of before)


class TermStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def load(self, pool: str) -> dict[str, tuple[str, np.ndarray]]:
        """entry -> (fingerprint, term keys) of the pool's rows."""
        entries, fps, blobs = await self.load_raw(pool)
        return {e: (fp, unpack_keys(raw)) for e, fp, raw in zip(entries, fps, blobs, strict=True)}

    async def load_raw(self, pool: str) -> tuple[list[str], list[str], list[bytes]]:
        """The pool's rows as columns: entries, fingerprints, packed term keys (every repeat,
        as `pack_keys` packs them)."""

        def read(con):
            rows = con.execute(
                "SELECT entry, fp, terms, tfs FROM search_terms WHERE pool = ?", [pool]
            ).fetchall()
            blobs = [t if n is None else unpack_row(t, n).tobytes() for _, _, t, n in rows]
            return [r[0] for r in rows], [r[1] for r in rows], blobs

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
            f"SELECT entry, octet_length(terms) // 8 AS n, terms, {TFS} AS tfs "
            "FROM search_terms WHERE pool = ?",
            [pool],
        ).fetchnumpy()
        return cols["entry"].tolist(), *_flat(cols)

    async def load_aside(self, pool: str) -> TermsLoad:
        """`read_load` beside the database thread (`Database.run_aside`), with its scope: a
        pool's first load does not apply the journal's writes of other pools and chats."""
        return await self.db.run_aside(lambda con: self.read_load(con, pool), load_scope(pool))

    @staticmethod
    def read_load(con, pool: str) -> TermsLoad:
        """A workspace pool's snapshot and the term rows written after it (on the database's
        thread)."""
        snap = con.execute(
            "SELECT covers, body FROM search_snapshots WHERE pool = ?", [pool]
        ).fetchall()
        covers, body = snap[0] if len(snap) == 1 else (-1, None)
        cols = con.execute(
            f"SELECT entry, octet_length(terms) // 8 AS n, terms, {TFS} AS tfs "
            "FROM search_terms WHERE pool = ? AND seq > ?",
            [pool, covers],
        ).fetchnumpy()
        ((last,),) = con.execute(
            "SELECT coalesce(max(seq), 0) FROM search_terms WHERE pool = ?", [pool]
        ).fetchall()
        lengths, flat = _flat(cols)
        return TermsLoad(covers, body, cols["entry"].tolist(), lengths, flat, last)

    @staticmethod
    def read_all(con, pool: str) -> tuple[list[str], np.ndarray, np.ndarray, int]:
        """Every term row of a pool (what a snapshot is built from) and their highest seq, in
        one statement: one state of the file, whatever commits around it."""
        cols = con.execute(
            f"SELECT entry, octet_length(terms) // 8 AS n, terms, {TFS} AS tfs, "
            "max(seq) OVER () AS last FROM search_terms WHERE pool = ?",
            [pool],
        ).fetchnumpy()
        lengths, flat = _flat(cols)
        last = int(cols["last"][0]) if len(cols["last"]) else 0
        return cols["entry"].tolist(), lengths, flat, last

    @staticmethod
    def rows_since(con, pool: str, covers: int) -> int:
        ((n,),) = con.execute(
            "SELECT count(*) FROM search_terms WHERE pool = ? AND seq > ?", [pool, covers]
        ).fetchall()
        return n

    async def fingerprints(self, pool: str) -> list[tuple[str, str]]:
        """(entry, fingerprint of the content its keys were made from) of the pool's rows."""
        return await self.db.run(
            lambda con: con.execute(
                "SELECT entry, fp FROM search_terms WHERE pool = ?", [pool]
            ).fetchall(),
            _scope(pool),
        )

    @staticmethod
    def row(
        pool: str,
        entry_id: str,
        fp: str,
        keys: np.ndarray | list[int] | Counted,
        seq: int = 0,
        *,
        new: bool = False,
    ) -> Write:
        """A record's term row; `seq`: from its workspace pool's counter (a entry pool's
        rows, never in a snapshot, keep 0). `new`: the record was just created, so no row of
        it can be stored yet (an insert: nothing to delete first when the journal is applied)."""
        terms, tfs = pack_row(keys)
        row = (entry_key(pool, entry_id), pool, entry_id, fp, terms, seq, tfs)
        return Insert(SEARCH_TERMS.name, row) if new else Put(SEARCH_TERMS.name, row)

    @staticmethod
    def snapshot_row(pool: str, covers: int, body: bytes) -> Write:
        return Put(SEARCH_SNAPSHOTS.name, (pool, covers, body))

    @staticmethod
    def delete(pool: str, entry_id: str) -> Write:
        return Delete(SEARCH_TERMS.name, entry_key(pool, entry_id))


def _flat(cols: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """How many keys each row read has (repeats kept) and all of them end to end."""
    return unpack_rows(
        np.asarray(cols["n"], dtype=np.int64), cols["terms"].tolist(), cols["tfs"].tolist()
    )


def load_scope(pool: str) -> tuple[ReadScope, ...]:
    """What `TermStore.read_load` reads: the pool's snapshot and term rows."""
    return (*_scope(pool), ReadScope(SEARCH_SNAPSHOTS.name, "pool", (pool,)))


def _scope(pool: str) -> tuple[ReadScope]:
    """The rows a pool's term reads read (a new pool's first load, and the check a second after
    it, need not wait for the journal's other writes)."""
    return (ReadScope(SEARCH_TERMS.name, "pool", (pool,)),)


def _snapshot_aad(pool: str, covers: int) -> bytes:
    return aad(pool, f"terms-snapshot\x00{covers}")


def seal_snapshot(cipher: Cipher, pool: str, covers: int, postings: Postings) -> bytes:
    doc = _Snap(
        ids=list(postings.ids),
        lengths=np.asarray(postings.lengths, dtype="<f4").tobytes(),
        keys=np.asarray(postings.keys, dtype="<i8").tobytes(),
        indptr=np.asarray(postings.indptr, dtype="<i8").tobytes(),
        rows=np.asarray(postings.rows, dtype="<i4").tobytes(),
        tfs=np.asarray(postings.tfs, dtype="<f4").tobytes(),
    )
    return cipher.seal(_SNAP + msgspec.msgpack.encode(doc), _snapshot_aad(pool, covers))


def open_snapshot(cipher: Cipher, pool: str, covers: int, body: bytes) -> Postings:
    """A stored snapshot's postings (raises on a wrong key, tampering or another format)."""
    plain = cipher.open(body, _snapshot_aad(pool, covers))
    if not plain.startswith(_SNAP):
        raise ValueError("not a terms snapshot of this version")
    doc = _snap_dec.decode(memoryview(plain)[len(_SNAP) :])
    return Postings(
        ids=doc.ids,
        lengths=np.frombuffer(doc.lengths, dtype="<f4"),
        keys=np.frombuffer(doc.keys, dtype="<i8"),
        indptr=np.frombuffer(doc.indptr, dtype="<i8"),
        rows=np.frombuffer(doc.rows, dtype="<i4"),
        tfs=np.frombuffer(doc.tfs, dtype="<f4"),
    )


def covered(current: Mapping[str, object], snap_ids: list[str], have: set[str]) -> bool:
    """Whether every record (`current`) is in a pool's restored snapshot (`snap_ids`,
    distinct) or in the rows after it (`have`, all records), and the snapshot holds only
    records: then the two together number as many as the records (no set of 100,000 ids to
    compare at a load)."""
    # The mapping's own key view: a record mapping's `__contains__` may be a Python method (a
    # call per record: tens of ms at 100,000), the dict view's is C.
    if not all(map(current.keys().__contains__, snap_ids)):
        return False
    both = sum(map(have.__contains__, snap_ids)) if have else 0
    return len(snap_ids) + len(have) - both == len(current)


def unindexed(
    index: TermIndex, current: Mapping[str, object], snap_ids: list[str], have: set[str], twice
) -> set[str]:
    """The records in neither the restored snapshot nor the rows after it; records of the
    snapshot gone since, or listed twice in the rows, are taken out of the index."""
    kept = set(snap_ids)
    # The snapshot holds only current records exactly when the others number as many.
    missing = current.keys() - kept
    if len(current) - len(missing) != len(kept):  # records gone since: not indexed
        for gone in kept - current.keys():
            index.remove(gone)
    for entry_id in twice:
        index.remove(entry_id)
        if entry_id in current:
            missing.add(entry_id)
    return missing - have
