"""The stored snapshot of a pool's keyword index (storage/term_store.py): taken once many term
rows are not in the last one, and as the shard closes, so that a load restores the index whole
instead of building it from every row (a mixin of `WorkspacePools`, actors/workspace/pools.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel
from actors.workspace.pool_state import WorkspacePool
from storage.search_index import TermIndex
from storage.term_store import seal_snapshot

log = logging.getLogger("openbot.workspace")


class TermSnapshots:
    kernel: ShardKernel
    # Term rows not in a pool's snapshot that make a new one worth storing.
    snapshot_rows: int

    def loaded(self) -> Iterator[WorkspacePool]:
        raise NotImplementedError

    async def snapshot(self, pool: WorkspacePool) -> None:
        """Store the pool's keyword index whole, built from its committed term rows.

        `covers` is the highest seq of the rows read, in the same statement: rows commit in
        the order their seqs are taken (each is staged as it is made: in a load, under the
        pool's lock, held here, or as derived data at once), so every row up to it is among
        them and a row not committed yet has a higher seq (the next load applies it). Built
        from the rows, not the index in memory, which may hold writes not durable yet."""
        if pool.snapshotting or pool.poisoned:
            return
        pool.snapshotting = True
        terms, pool_id = self.kernel.terms, pool.id
        try:
            async with pool.lock:
                await self.kernel.committer.drain()
                ids, lengths, flat, covers = await self.kernel.db.run(
                    lambda con: terms.read_all(con, pool_id)
                )
            if pool.poisoned or len(set(ids)) != len(ids):
                return  # a write failed (the pool reloads), or a record listed twice
            body = await asyncio.to_thread(
                _seal, pool.keyed.cipher, pool_id, covers, ids, lengths, flat
            )
            await self.kernel.commit(Batch(writes=[terms.snapshot_row(pool_id, covers, body)]))
            pool.snapshot_covers = max(pool.snapshot_covers, covers)
            pool.terms_seq = max(pool.terms_seq, covers)
        finally:
            pool.snapshotting = False

    async def snapshot_due(self) -> None:
        """Store the snapshot of each pool in memory with many term rows written since its
        last (the shard is closing: its next start loads them at once)."""
        for pool in self.loaded():
            if pool.poisoned:
                continue
            pool_id, covers = pool.id, pool.snapshot_covers
            try:
                since = await self.kernel.db.run(
                    lambda con, p=pool_id, c=covers: self.kernel.terms.rows_since(con, p, c)
                )
                if since >= self.snapshot_rows:
                    await self.snapshot(pool)
            except Exception as e:  # derived data: the next load reads the rows instead
                log.warning("keyword snapshot of %s not stored: %r", pool_id, e)


def _seal(cipher, pool_id: str, covers: int, ids: list[str], lengths, flat) -> bytes:
    """A snapshot of the index built from these rows, sealed (on a worker thread)."""
    index = TermIndex()
    index.build_flat(ids, lengths, flat, distinct=True)
    return seal_snapshot(cipher, pool_id, covers, index.postings())
