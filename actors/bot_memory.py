"""The one visibility-checked read of a bot's memory (MEM-1, ENR-5; design in engine/bot_memory.py).

A bot's memory is the union of its seed-000 pool (`Pool`, the shard's) and its workspace
bot-scope records (`WsPool`, the workspace's). Every reader goes through `BotMemory`: context and
enrichment, the HTTP views, search, the prompt, the learning context. Callers never read a pool
and filter it themselves.

Locking (ACL-9): a read holds the seed pool's shared lock while it checks visibility and opens
content; the workspace records are read in the same synchronous stretch (their writes happen
under the workspace pool's lock without an await in between), so a read never mixes old
permissions with new content. Content is opened only for entries the check let through (ACL-8).
"""

from __future__ import annotations

import contextlib
from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine import bot_memory as bm
from engine.learning import ContextEntry, context_entry, context_selection
from engine.memory import EntryMeta, Reader
from engine.order import in_memory_order
from engine.visibility import Visibility

if TYPE_CHECKING:
    from actors.pool import Pool
    from actors.shard import ShardService
    from actors.workspace import WsPool


@dataclass
class Snapshot:
    """The union of one bot pool as one reader may see it, valid while the read lock is held."""

    pool: Pool
    ws: WsPool | None
    entries: Mapping[str, EntryMeta]  # seed entries and workspace records, by id
    visibility: Visibility
    candidates: set[str]
    open: Callable[[str], str]

    def visible(self) -> list[EntryMeta]:
        """Entries the reader may see (history included), in memory order (MEM-5)."""
        vis = self.visibility
        return in_memory_order(self.entries[i] for i in self.candidates if vis.visible(i))

    def usable(self) -> list[EntryMeta]:
        """Visible and active, in memory order: what context, prompts and search use."""
        vis = self.visibility
        return in_memory_order(self.entries[i] for i in self.candidates if vis.usable(i))

    def is_record(self, entry_id: str) -> bool:
        return self.ws is not None and entry_id in self.ws.stored.entries


class BotMemory:
    def __init__(self, shard: ShardService) -> None:
        self.shard = shard

    async def pools(self, pool_id: str) -> tuple[Pool, WsPool | None]:
        pool = await self.shard._pool(pool_id)
        ws = await self.shard.workspace._pool(pool_id) if pool_id.startswith("bot:") else None
        return pool, ws

    @staticmethod
    def metas(ws: WsPool | None) -> dict[str, EntryMeta]:
        if ws is None:
            return {}
        return {i: bm.as_meta(r) for i, r in ws.stored.entries.items()}

    def snapshot(self, pool: Pool, ws: WsPool | None, reader: Reader) -> Snapshot:
        """Call under `pool.lock.shared()` (or exclusive)."""
        records = self.metas(ws)
        # Seed entries win an id clash (ids are random 96-bit: it does not happen).
        entries: Mapping[str, EntryMeta] = (
            ChainMap(pool.entries, records) if records else (pool.entries)
        )
        candidates = pool.candidates(reader) | set(records)
        store = self.shard.store
        workspace = self.shard.workspace

        def open_(entry_id: str) -> str:
            if entry_id in pool.stored.sealed:
                return store.open_content(pool.stored, entry_id)
            assert ws is not None
            return workspace._open(ws, entry_id)

        return Snapshot(
            pool=pool,
            ws=ws,
            entries=entries,
            visibility=Visibility(reader, entries),
            candidates=candidates,
            open=open_,
        )

    @contextlib.asynccontextmanager
    async def read(self, pool_id: str, reader: Reader) -> Iterator[Snapshot]:  # type: ignore[misc]
        """A shared-locked snapshot; after the block, waits for the commit of what it saw."""
        pool, ws = await self.pools(pool_id)
        async with pool.lock.shared():
            snap = self.snapshot(pool, ws, reader)
            yield snap
            pending = pool.pending
        await self.shard._settle(pool, pending)
        if ws is not None:
            await self.shard.workspace._settle_read(ws)

    async def texts(self, pool_id: str, reader: Reader) -> list[tuple[str, str]]:
        """(id, text) of every usable entry the reader may see, in memory order: what a search
        index of the pool serves for this reader (the text supplier of ranked search)."""
        async with self.read(pool_id, reader) as snap:
            return [(m.id, snap.open(m.id)) for m in snap.usable()]

    async def search(
        self, pool_id: str, reader: Reader, query: str, limit: int
    ) -> list[tuple[str, str]]:
        """Usable entries whose text has every word of `query` (casefolded), in memory order."""
        terms = [t for t in query.casefold().split() if t]
        if not terms or limit <= 0:
            return []
        hits: list[tuple[str, str]] = []
        async with self.read(pool_id, reader) as snap:
            for meta in snap.usable():
                text = snap.open(meta.id)
                folded = text.casefold()
                if all(t in folded for t in terms):
                    hits.append((meta.id, text))
                    if len(hits) >= limit:
                        break
        return hits

    async def learning_context(
        self, pool_id: str, reader: Reader
    ) -> tuple[list[ContextEntry], dict[str, int]]:
        """LRN-7 over the bot's one memory as the turn's audience may see it: the first 300
        valid entries in memory order with their text, and topic counts over all valid ones.
        The selection is kept per pool state and reader (recomputing it walks every entry)."""
        pool, ws = await self.pools(pool_id)
        async with pool.lock.shared():
            records = (
                ()
                if ws is None
                else tuple((i, r.revision, r.status) for i, r in sorted(ws.stored.entries.items()))
            )
            key = (pool.version, records, reader)
            cached = pool.learning_view
            if cached is None or cached[0] != key:
                snap = self.snapshot(pool, ws, reader)
                seen = {m.id: m for m in snap.usable()}
                cached = (key, *context_selection(seen), snap.open)
                pool.learning_view = cached
            _, chosen, topics, open_ = cached
            entries = [context_entry(m, open_(m.id)) for m in chosen]
        return entries, topics

    def learning_state(self, pool: Pool, ws: WsPool | None) -> Mapping[str, EntryMeta]:
        """What the memory bot's proposals are checked against (under the exclusive lock): the
        whole union, so an observation may rest on a person's record; only seed entries are
        ever changed by it (see engine/bot_memory.py)."""
        records = self.metas(ws)
        return ChainMap(pool.entries, records) if records else pool.entries
