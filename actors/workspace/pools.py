"""The workspace memory pools loaded on a shard: loading, residency, keyword index, content.

A `WsPool` is one pool's records (`bot:<id>`, `user:<accountId>`, `project:<id>`) as stored,
with its lock and its pending commit. `WsPools` is the registry both the workspace routes and a
bot's one memory (actors/shard/bot_memory.py) read through; the seed-000 pool of the same name
holds the pool's data key (`keyed`).
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import compress

import msgspec
import numpy as np

from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, ignore_failure
from actors.shard.residency import POOL_WEIGHT, unused
from actors.shard.rwlock import PoolMutex
from actors.shard.single_flight import SingleFlight
from engine import bot_memory as bm
from engine import scoped_memory as sm
from engine import tags as tagmod
from engine.errors import OpenBotError
from engine.scoped_memory import WsEntry
from storage.bulk import paused_gc
from storage.group_commit import Write
from storage.memory_store import StoredPool
from storage.search_index import TermIndex
from storage.workspace_store import StoredWsPool, WorkspaceStore, content_fp, pool_scope

CONTEXT_WINDOW_MS = 120_000  # a new record this soon after the last is read in its context
# Checks of a loaded pool against its derived data (term rows, vectors) wait this long, so that
# the search that loaded the pool is answered first (at 100,000 records each walk takes about
# 0.1 s of the event loop; the first search after a shard opens, under a second).
UPKEEP_DELAY_S = 1.0


@dataclass
class WsPool:
    stored: StoredWsPool
    keyed: StoredPool  # the seed-000 pool state that holds this pool's data key
    fp_key: bytes
    lock: asyncio.Lock
    pending: asyncio.Future[None] | None = None
    poisoned: bool = False
    index: TermIndex = field(default_factory=TermIndex)  # keyword search, in memory only
    # The last new record's contributor, time and own term keys (context for the next one).
    last_written: tuple[str | None, int, np.ndarray] | None = None
    bot_org: str | None = None  # a bot pool's bot's home org (its records' `org:` tag)
    # Records as bot-memory entries (actors/shard/bot_memory.py), per record state.
    metas: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.stored.pool


class WsPools:
    def __init__(
        self,
        kernel: ShardKernel,
        store: WorkspaceStore,
        peers: Peers,
        *,
        context_window_ms: int = CONTEXT_WINDOW_MS,  # [search] context_window_s; 0: off
    ) -> None:
        self.kernel = kernel
        self.store = store
        self.peers = peers
        self.context_window_ms = context_window_ms
        # Asked before a pool leaves memory: False keeps it (semantic search's vectors in use).
        self.keepers: list[Callable[[str], bool]] = []
        self._loader: SingleFlight[WsPool] = SingleFlight()
        self._pools: dict[str, WsPool] = self._loader.loaded
        self.upkeep_delay = UPKEEP_DELAY_S
        self._upkeep: set[asyncio.Task[None]] = set()
        kernel.on_close.append(self.stop_upkeep)

    def later(self, pool: WsPool, fn: Callable[[WsPool], object]) -> None:
        """Run `fn(pool)` on the event loop `upkeep_delay` seconds from now (checks of a pool
        that just loaded: see UPKEEP_DELAY_S), unless the pool has left memory by then. The
        wait holds no reference to the pool: it never keeps one from being evicted."""
        ref = weakref.ref(pool)
        pool_id = pool.id
        del pool

        async def run() -> None:
            await asyncio.sleep(self.upkeep_delay)
            pool = ref()
            if pool is None or self._pools.get(pool_id) is not pool or pool.poisoned:
                return  # evicted or reloaded meanwhile: done again by its next load
            done = fn(pool)
            del pool
            if inspect.isawaitable(done):
                await done

        task = asyncio.get_running_loop().create_task(run())
        self._upkeep.add(task)
        task.add_done_callback(self._upkeep.discard)

    async def upkept(self) -> None:
        """Wait until the checks scheduled by `later` have run (tests and benchmarks)."""
        while self._upkeep:
            await asyncio.gather(*self._upkeep, return_exceptions=True)

    def stop_upkeep(self) -> None:
        for task in list(self._upkeep):
            task.cancel()

    def get(self, pool_id: str) -> WsPool | None:
        """The pool if it is in memory now."""
        return self._pools.get(pool_id)

    def loaded(self) -> Iterator[WsPool]:
        return iter(list(self._pools.values()))

    def __len__(self) -> int:
        return len(self._pools)

    async def pool(self, pool_id: str) -> WsPool:
        async def load() -> WsPool:
            keyed = (await self.kernel.pool(pool_id)).stored
            # The records on the database's thread, their stored term keys beside it (with
            # the vectors a search asks for at the same time: `Database.run_aside`). Two
            # reads, not one state of the file: whatever differs (a record without a current
            # row, a row of a record gone) is indexed from the records, as after any change.
            rows, terms = await asyncio.gather(
                self.kernel.db.run(
                    lambda con: self.store.read_pool(con, pool_id), pool_scope(pool_id)
                ),
                self.kernel.db.run_aside(lambda con: self.kernel.terms.read_flat(con, pool_id)),
            )
            stored = self.store.stored_pool(pool_id, rows)
            bot_org = await self._link(stored) if pool_id.startswith("bot:") else None
            pool = WsPool(
                stored=stored,
                keyed=keyed,
                fp_key=self.store.fingerprint_key(pool_id),
                lock=PoolMutex(),
                bot_org=bot_org,
            )
            self._index(pool, *terms)
            return pool

        pool = await self._loader.get(pool_id, load)
        self.resident(pool)
        return pool

    def resident(self, pool: WsPool) -> None:
        """Count the pool as used now, at its current size."""
        pool_id, stored = pool.id, pool.stored
        if self._pools.get(pool_id) is pool:
            self.kernel.residency.touch(
                "ws:" + pool_id,
                POOL_WEIGHT + len(stored.entries) + len(stored.barriers),
                lambda: self.evict(pool_id),
            )

    def evict(self, pool_id: str) -> bool:
        """Drop a workspace pool (and what hooks keep for it) unless it is in use."""
        pool = self._pools.get(pool_id)
        if pool is None:
            return True
        if pool.lock.locked() or (pool.pending is not None and not pool.pending.done()):
            return False
        if not unused(pool, 1):  # a coroutine or a search still holds it
            return False
        if not all(keep(pool_id) for keep in self.keepers):
            return False
        del self._pools[pool_id]
        for hook in self.kernel.on_evict:
            hook(pool_id)
        return True

    def _index(self, pool: WsPool, ids: list[str], lengths: np.ndarray, flat: np.ndarray) -> None:
        """Build the pool's keyword index from the stored term keys (`TermStore.read_flat`);
        records without current ones (written before migration 8, or imported) are tokenized
        now and their keys stored for next time."""
        current = pool.stored.entries
        analyzer = self.kernel.analyzer
        with paused_gc():
            have = set(ids)
            # One row per record (a write replaces it): a record listed twice is not trusted
            # and is indexed from its text, like one without a row.
            twice = {i for i, n in Counter(ids).items() if n > 1} if len(have) != len(ids) else ()
            if twice or not have <= current.keys():  # rows of records gone since: not indexed
                keep = np.fromiter(
                    (i in current and i not in twice for i in ids), dtype=bool, count=len(ids)
                )
                flat = flat[np.repeat(keep, lengths)]
                lengths = lengths[keep]
                ids = list(compress(ids, keep.tolist()))
                have = set(ids)
            stored = len(ids)  # rows 0..stored-1: made from stored keys
            missing = current.keys() - have if len(have) != len(current) else set()
            extra_ids = sorted(missing)
            extra = [analyzer.keys(self.open(pool, i)) for i in extra_ids]
            rows = [
                self.kernel.terms.row(pool.id, i, current[i].content_fp, keys)
                for i, keys in zip(extra_ids, extra, strict=True)
            ]
            if extra:
                ids = [*ids, *extra_ids]
                lengths = np.concatenate((lengths, [k.size for k in extra])).astype(np.int64)
                flat = np.concatenate((flat, *extra))
            pool.index.build_flat(ids, lengths, flat, distinct=True)
        self._store_terms(rows)
        # A record's terms row commits with the record, so a row made from other content
        # than the record's is all but impossible; still, check once the search that loaded
        # the pool is answered (a walk of every record).
        self.later(pool, lambda p: self._check_terms(p, stored))

    async def _check_terms(self, pool: WsPool, stored: int) -> None:
        """Index again the records whose stored terms (the first `stored` rows of the index
        built at load) were not made from their content."""
        fps = await self.kernel.terms.fingerprints(pool.id)
        if self._pools.get(pool.id) is not pool or pool.poisoned:
            return  # evicted or reloaded meanwhile: done again by its next load
        entries, row_of = pool.stored.entries, pool.index.row_of
        rows = []
        with paused_gc():
            for entry_id, fp in fps:
                row = row_of(entry_id)
                # Indexed from its stored keys at load and not since (a write re-indexes it
                # and writes its row: a new index row).
                if row is None or row >= stored:
                    continue
                now = content_fp(entries, entry_id)
                if now is not None and now != fp:
                    keys = self.kernel.analyzer.keys(self.open(pool, entry_id))
                    pool.index.put(entry_id, keys)
                    rows.append(self.kernel.terms.row(pool.id, entry_id, now, keys))
        self._store_terms(rows)

    def _store_terms(self, rows: list[Write]) -> None:
        if rows:
            # Derived data: nothing waits for it, and a failure only means doing it again.
            fut = self.kernel.stage(Batch(writes=rows))
            if fut is not None:
                ignore_failure(fut)

    def indexed(self, pool: WsPool, entry: WsEntry, content: str, *, new: bool) -> Write:
        """Index a record's new content; the row that stores its term keys.

        A new record written right after another of the same contributor in the same pool
        (within `context_window_ms`: the turns of one conversation, a batch of notes) is indexed
        with that one's words too, as its context: "Yes! I made a bowl" is found by a question
        about the pottery workshop the turn before asked about. Only keywords: the record's
        vector and text are its own."""
        own = self.kernel.analyzer.keys(content)
        keys = own
        now = self.kernel.clock()
        last = pool.last_written
        if (
            new
            and self.context_window_ms > 0  # 0: off (not "the same millisecond")
            and last is not None
            and last[0] == entry.contributor
            and 0 <= now - last[1] <= self.context_window_ms
        ):
            keys = np.sort(np.concatenate((own, last[2])))
        if new:
            pool.last_written = (entry.contributor, now, own)
        pool.index.put(entry.id, keys)
        return self.kernel.terms.row(pool.id, entry.id, entry.content_fp, keys)

    async def _link(self, stored: StoredWsPool) -> str | None:
        """A bot pool's records as part of the bot's one memory (engine/bot_memory.py): records
        stored before migration 7 read as written by the bot's owner for everyone who uses the
        bot, and every record without an `org:` gets the bot's home org. Returns that org (None
        when the bot is unknown: its records then stay hidden)."""
        try:
            bot = await self.peers.directory().get_bot(sm.pool_owner(stored.pool))
        except OpenBotError:
            return None
        linked: dict[tuple[str, ...], tuple[str, ...]] = {}  # a pool's records share few tag sets
        entries = stored.entries
        with paused_gc():
            for entry_id in stored.unlinked:  # those without `org:` (most pools: none)
                entry = entries.get(entry_id)
                if entry is None:
                    continue
                new = linked.get(entry.tags)
                if new is None:
                    tags = entry.tags or (tagmod.author(bot.owner), tagmod.FOR_BOT)
                    new = linked[entry.tags] = bm.link_tags(tags, bot.org)
                if new != entry.tags:
                    entries[entry_id] = msgspec.structs.replace(entry, tags=new)
        return bot.org

    def drop(self, pool: WsPool) -> None:
        pool.poisoned = True
        if self._pools.get(pool.id) is pool:
            del self._pools[pool.id]
            self.kernel.residency.forget("ws:" + pool.id)

    async def settle_read(self, pool: WsPool) -> None:
        """A read waits for the commit of the state it saw; a failed one fails the read."""
        await self.kernel.settle(pool, pool.pending)

    def open(self, pool: WsPool, entry_id: str) -> str:
        return self.store.open(pool.keyed.cipher, pool.id, entry_id, pool.stored.sealed[entry_id])
