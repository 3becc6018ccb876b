"""A bot's workspace records in the bot memory routes of its one memory (API-2 … API-5, MEM-1).

A bot's memory is its seed pool and the records people wrote for it through the workspace
(engine/bot_memory.py); `GET /v1/bots/:id/memory` lists both, so every bot memory route that
changes or reports on that memory reaches both:

- Forget of a record the caller sees forgets it as the workspace's forget does, at its current
  revision (a record the caller does not see is "not yours", as a seed entry is);
- a purge by a system tag deletes the records carrying it (`from:`, `org:`; records carry no
  `chat:` or `channel:`) with everything kept of them: revisions, forget barriers, term rows,
  stored answers of the pool's requests; the pool's keyword snapshot and vectors, which may hold
  them, are dropped and made again from what remains, and so are the vectors of the bot's
  learned entries when the purge deleted some of those;
- the memory log lists their revisions: `version` is the record's revision, `who` is `person`
  (a bot pool's records are written by people);
- a purge of `chat:<id>` also deletes the user and project facts the bot's memory bot learned
  from that chat (their evidence cites it), on every shard (`purge_learned`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Protocol

import msgspec

from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, durable
from actors.workspace.access import WorkspaceRules
from actors.workspace.pools import WorkspacePool, WorkspacePools
from actors.workspace.receipts import RECEIPT_SCOPE, WorkspaceReceipts
from actors.workspace.semantic import LEARNED, SemanticSearch
from engine import memory_union as bm
from engine import scoped_memory as sm
from engine.errors import Conflict
from engine.events import MemoryChanged
from engine.memory_entries import Change, EntryView, LogRow, Reader, Who
from engine.scoped_memory import WorkspaceEntry
from storage.group_commit import Delete, DeleteWhere, Write
from storage.receipts import fingerprint, receipt_key
from storage.shard_schema import (
    RECEIPTS,
    SEARCH_SNAPSHOTS,
    WORKSPACE_BARRIERS,
    WORKSPACE_ENTRIES,
    WORKSPACE_REVISIONS,
    WORKSPACE_VECTOR_BLOCKS,
    WORKSPACE_VECTORS,
)
from storage.workspace_store import WorkspaceStore, entry_key


class Keeper(Protocol):
    """What keeps the records (actors/workspace/service.py `Workspace`)."""

    kernel: ShardKernel
    pools: WorkspacePools
    store: WorkspaceStore
    receipts: WorkspaceReceipts
    rules: WorkspaceRules
    semantic: SemanticSearch | None

    def change_batch(
        self, pool: WorkspacePool, edit: sm.Edit, content: str, change: str, *, new: bool
    ) -> Batch: ...


_view_dec = msgspec.json.Decoder(EntryView)
_CHANGES = {
    "created": Change.CREATED,
    "extracted": Change.CREATED,
    "edited": Change.UPDATED,
    "updated": Change.UPDATED,
    "forgotten": Change.RETRACTED,
}


class BotRecords:
    def __init__(self, workspace: Keeper) -> None:
        self.ws = workspace

    async def forget(
        self, pool_id: str, reader: Reader, entry_id: str, request_id: str | None
    ) -> EntryView:
        """API-2's Forget of record `entry_id` of bot pool `pool_id`; with a `request_id` a
        retry returns the first answer."""
        ws = self.ws
        # One request id per caller and bot (as a seed entry's Forget), within 128 characters.
        key = (
            None
            if request_id is None
            else receipt_key(
                RECEIPT_SCOPE, reader.user, "forget:" + fingerprint((pool_id, request_id))
            )
        )
        print_ = fingerprint(("memory.forget.seed", pool_id, entry_id))
        pool = await ws.pools.pool(pool_id)
        held = contextlib.nullcontext() if key is None else ws.receipts.request(key)
        async with held, pool.lock:
            if key is not None:
                raw = await ws.receipts.replay(key, print_, pool.keyed)
                if raw is not None:
                    return _view_dec.decode(raw)
            entry = pool.stored.entries.get(entry_id)
            if entry is None or not bm.record_visible(reader, entry):
                raise Conflict("this entry is not yours to forget", code="not_yours")
            old = ws.pools.open(pool, entry_id)
            edit = sm.forget(
                entry, entry.revision, operator=reader.user, old_content=old, now=ws.kernel.clock()
            )
            answer = bm.as_entry_view(edit.entry, old)
            batch = ws.change_batch(pool, edit, old, "forgotten", new=False)
            changed = bool(batch.writes)
            if key is None:
                fut = ws.kernel.stage(batch.key(pool.keyed)) if changed else None
            else:
                receipt = (key, print_, msgspec.json.encode(answer), pool.keyed)
                fut = ws.receipts.stage(batch, receipt)
            if changed:
                pool.pending = fut
                ws.pools.resident(pool)
        await durable(fut)
        return answer

    async def purge(self, pool_id: str, tag: str, *, learned: bool = False) -> int:
        """Delete the records of bot pool `pool_id` that carry system tag `tag`; their count.
        `learned`: the purge deleted learned entries of the pool too (their vectors go)."""
        pool = await self.ws.pools.pool(pool_id)
        async with pool.lock:
            gone = [e for e in pool.stored.entries.values() if tag in e.tags]
            fut = self._delete(pool, gone, learned=learned)
        await durable(fut)
        await self._end_replays(pool, gone)
        return len(gone)

    async def purge_learned(self, bot: str, chat: str) -> int:
        """Delete the user and project facts of the pools hosted here that bot `bot` learned
        from chat `chat` (a fact citing any item of it); their count."""
        ws = self.ws
        cites = f"{chat}/"
        pools = set(await ws.store.contributed_pools(bot))
        pools.update(p.id for p in ws.pools.loaded() if not p.id.startswith("bot:"))
        count = 0
        for pool_id in sorted(pools):
            pool = await ws.pools.pool(pool_id)
            async with pool.lock:
                gone = [
                    e
                    for e in pool.stored.entries.values()
                    if e.contributor == bot and any(m.startswith(cites) for m in e.evidence)
                ]
                fut = self._delete(pool, gone)
            await durable(fut)
            await self._end_replays(pool, gone)
            count += len(gone)
        return count

    async def log(self, pool_id: str, reader: Reader) -> list[LogRow]:
        """The revisions of the records of bot pool `pool_id` the reader sees, as log rows."""
        ws = self.ws
        pool = await ws.pools.pool(pool_id)
        await ws.pools.settle_read(pool)
        visible = bm.record_check(reader)
        seen = {i for i, e in pool.stored.entries.items() if visible(e)}
        if not seen:
            return []
        return [
            LogRow(
                version=revision,
                at=at,
                who=Who.PERSON,
                entry=entry,
                change=_CHANGES.get(change, Change.UPDATED),
            )
            for entry, revision, at, change in await ws.store.revision_log(pool_id)
            if entry in seen
        ]

    async def _end_replays(self, pool: WorkspacePool, gone: list[WorkspaceEntry]) -> None:
        """Stored answers of the pool's requests may quote what was just deleted: a purge ends
        their replay, as it does a seed pool's (a repeat is then a new request)."""
        if not gone:
            return
        ws = self.ws
        keys = await ws.kernel.receipts.sealed_with(RECEIPT_SCOPE, pool.keyed.cipher, pool.id)
        if keys:
            await durable(
                ws.kernel.stage(Batch(writes=[DeleteWhere(RECEIPTS.name, "key", tuple(keys))]))
            )

    def _delete(
        self, pool: WorkspacePool, gone: Iterable[WorkspaceEntry], *, learned: bool = False
    ):
        """Take `gone` out of the pool and stage the deletion of everything kept of them (call
        under the pool's lock); with `learned`, the vectors of the bot's learned entries too
        (`<pool>#learned`: some were just deleted). The commit to wait for, or None."""
        ws = self.ws
        gone = list(gone)
        if not gone and not learned:
            return None
        stored, terms = pool.stored, ws.kernel.terms
        writes: list[Write] = []
        batch = Batch(writes=writes)
        for entry in gone:
            # Revisions and barriers are keyed by the revision that made them (1 … current).
            made = tuple(f"{pool.id}\x00{entry.id}\x00{r}" for r in range(1, entry.revision + 1))
            writes += [
                Delete(WORKSPACE_ENTRIES.name, entry_key(pool.id, entry.id)),
                DeleteWhere(WORKSPACE_REVISIONS.name, "key", made),
                DeleteWhere(WORKSPACE_BARRIERS.name, "key", made),
                terms.delete(pool.id, entry.id),
            ]
            batch.emit(
                MemoryChanged(
                    pool=pool.id,
                    entry=entry.id,
                    version=entry.revision,
                    change="purged",
                    bot=entry.contributor,
                ),
                ws.rules.audience(pool.id, entry),
            )
            del stored.entries[entry.id]
            stored.sealed.pop(entry.id, None)
            pool.metas.pop(entry.id, None)
            pool.index.remove(entry.id)
        ids = {e.id for e in gone}
        stored.barriers = [b for b in stored.barriers if b.entry not in ids]
        # Derived data of the whole pool that may hold them: made again from what remains.
        if gone:
            for table in (SEARCH_SNAPSHOTS, WORKSPACE_VECTOR_BLOCKS, WORKSPACE_VECTORS):
                writes.append(DeleteWhere(table.name, "pool", (pool.id,)))
            pool.snapshot_covers = -1
        if learned:
            for table in (WORKSPACE_VECTOR_BLOCKS, WORKSPACE_VECTORS):
                writes.append(DeleteWhere(table.name, "pool", (pool.id + LEARNED,)))
        if ws.semantic is not None:
            ws.semantic.evict(pool.id)
        fut = ws.kernel.stage(batch.fail(lambda: ws.pools.drop(pool)))
        pool.pending = fut
        ws.pools.resident(pool)
        return fut
