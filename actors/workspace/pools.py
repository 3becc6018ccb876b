"""The workspace memory pools loaded on a shard: loading, residency, keyword index, content.

A `WorkspacePool` (actors/workspace/pool_state.py) is one pool's records (`bot:<id>`,
`user:<accountId>`, `project:<id>`) as stored, with its lock and its pending commit.
`WorkspacePools` is the registry both the workspace routes and a bot's one memory
(actors/shard/memory_reader.py) read through; the entry pool of the same name holds the pool's
data key (`keyed`). A pool's keyword index is stored whole (`snapshot`, storage/term_store.py)
once many term rows are not in the last snapshot, and as the shard closes, so that a load restores
it instead of building it from every row.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from itertools import compress

import msgspec
import numpy as np

from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, ignore_failure
from actors.shard.residency import POOL_WEIGHT, unused
from actors.shard.rwlock import PoolMutex
from actors.shard.single_flight import SingleFlight
from actors.workspace.pool_state import WorkspacePool, Written
from engine import memory_union as bm
from engine import scoped_memory as sm
from engine import tags as tagmod
from engine import write_context as wc
from engine.errors import OpenBotError
from engine.scoped_memory import WorkspaceEntry
from storage.bulk import paused_gc
from storage.group_commit import Write
from storage.memory_store import StoredPool
from storage.search_index import Postings, TermIndex
from storage.term_keys import Counted, in_context
from storage.term_store import TermsLoad, covered, open_snapshot, seal_snapshot, unindexed
from storage.workspace_store import (
    LazyEntries,
    StoredWorkspacePool,
    WorkspaceStore,
    content_fp,
    pool_scope,
)

CONTEXT_WINDOW_MS = 120_000  # a new record this soon after the last is read in its context
# Checks of a loaded pool against its derived data (term rows, vectors) wait this long, so that
# the search that loaded the pool is answered first (at 100,000 records each walk takes about
# 0.1 s of the event loop; the first search after a shard opens, under a second).
UPKEEP_DELAY_S = 1.0
UPKEEP_SLICE = 1_024  # records such a check walks between two turns of the event loop
# A pool's keyword index is stored whole again once this many term rows are not in its snapshot
# (below it, a load applies them in a few ms).
SNAPSHOT_ROWS = 2_000
# ... and, after a load, once they are this share of its records: a snapshot reads, builds and
# writes the whole index, so a pool the residency budget evicts and loads again and again (two
# pools over it, used in turn) would pay for one at each load, a cost that grows with the pool.
SNAPSHOT_SHARE = 4
CHECKED_POOLS = 65_536  # pools whose term rows this shard checked (`_check_terms`) kept
THREAD_KEYS_CACHED = 4_096  # threaded records' own term keys kept per pool (pool_state.py)
log = logging.getLogger("openbot.workspace")


class WorkspacePools:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        store: WorkspaceStore,
        peers: Peers,
        context_window_ms: int = CONTEXT_WINDOW_MS,  # [search] context_window_s; 0: off
    ) -> None:
        self.kernel = kernel
        self.store = store
        self.peers = peers
        self.context_window_ms = context_window_ms
        # Asked before a pool leaves memory: False keeps it (semantic search's vectors in use).
        self.keepers: list[Callable[[str], bool]] = []
        self._loader: SingleFlight[WorkspacePool] = SingleFlight(self.resident)
        kernel.before_close.append(self._loader.close)
        self._pools: dict[str, WorkspacePool] = self._loader.loaded
        self.upkeep_delay = UPKEEP_DELAY_S
        self.snapshot_rows = SNAPSHOT_ROWS
        # Pools whose term rows were checked against their records since the shard opened
        # (`_check_terms`): every row written since is this shard's own, made with its record
        # in the same commit, so a load after an eviction need not walk every record again.
        self._checked: set[str] = set()
        kernel.before_close.append(self.snapshot_due)
        self._upkeep: set[asyncio.Task[None]] = set()
        kernel.on_close.append(self.stop_upkeep)

    def later(self, pool: WorkspacePool, fn: Callable[[WorkspacePool], object]) -> None:
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

    def get(self, pool_id: str) -> WorkspacePool | None:
        """The pool if it is in memory now."""
        return self._pools.get(pool_id)

    def loaded(self) -> Iterator[WorkspacePool]:
        return iter(list(self._pools.values()))

    def __len__(self) -> int:
        return len(self._pools)

    async def pool(self, pool_id: str) -> WorkspacePool:
        async def load() -> WorkspacePool:
            # The records and their stored term keys (with the vectors a search asks for at
            # the same time: `Database.run_aside`), started before the entry pool with the
            # key loads; the keyword snapshot is opened while the records, the longest step,
            # are read. Two reads, not one state of the file: whatever differs (a record
            # without a current row, a row of a record gone) is indexed from the records.
            db = self.kernel.db
            reads = [
                asyncio.ensure_future(
                    db.run(lambda con: self.store.read_pool(con, pool_id), pool_scope(pool_id))
                ),
                asyncio.ensure_future(self.kernel.terms.load_aside(pool_id)),
            ]
            try:
                keyed = (await self.kernel.pool(pool_id)).stored
                terms, postings = await self._postings(keyed, pool_id, await reads[1])
                rows = await reads[0]
            finally:
                for read in reads:
                    ignore_failure(read)  # (raised above where awaited)
            stored = self.store.stored_pool(pool_id, rows)
            bot_org = await self._link(stored) if pool_id.startswith("bot:") else None
            pool = WorkspacePool(
                stored=stored,
                keyed=keyed,
                fp_key=self.store.fingerprint_key(pool_id),
                lock=PoolMutex(),
                bot_org=bot_org,
            )
            self._index(pool, terms, postings)
            return pool

        pool = await self._loader.get(pool_id, load)
        self.resident(pool)
        return pool

    def resident(self, pool: WorkspacePool) -> None:
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

    async def _postings(
        self, keyed: StoredPool, pool_id: str, terms: TermsLoad
    ) -> tuple[TermsLoad, Postings | None]:
        """The pool's stored snapshot opened; when it cannot be (damaged, another format),
        every term row read instead, as if there were none."""
        if terms.snapshot is None:
            return terms, None
        try:
            return terms, open_snapshot(keyed.cipher, pool_id, terms.covers, terms.snapshot)
        except Exception as e:
            log.warning("keyword snapshot of %s not used: %r", pool_id, e)
        ids, lengths, flat = await self.kernel.db.run(
            lambda con: self.kernel.terms.read_flat(con, pool_id)
        )
        return TermsLoad(terms.covers, None, ids, lengths, flat, terms.last_seq), None

    def _index(self, pool: WorkspacePool, terms: TermsLoad, postings: Postings | None) -> None:
        """Build the pool's keyword index: its stored snapshot restored (if any), then the
        term rows written since (`TermStore.read_load`); records without current keys (written
        before migration 8, or imported) are tokenized now and their keys stored for next
        time."""
        current = pool.stored.entries
        analyzer = self.kernel.analyzer(pool.id)
        index = pool.index
        # Above the snapshot's `covers` too: a row whose commit failed may have taken a seq the
        # snapshot covers, and a new row must never fall below what the next load applies.
        pool.terms_seq = max(terms.last_seq, terms.covers)
        ids, lengths, flat = terms.ids, terms.lengths, terms.flat
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
            missing: set[str] = set()
            if postings is not None:
                index.restore(postings)
                pool.snapshot_covers = terms.covers
                if twice or not covered(current, postings.ids, have):  # (most loads: are)
                    missing = unindexed(index, current, postings.ids, have, twice)
            elif len(have) != len(current):
                missing = current.keys() - have
            stored = len(index.row_ids()) + len(ids)  # rows below: made from stored keys
            extra_ids = sorted(missing)
            extra = [analyzer.keys(self.open(pool, i)) for i in extra_ids]
            rows = [
                self.kernel.terms.row(pool.id, i, current[i].content_fp, keys, pool.next_seq())
                for i, keys in zip(extra_ids, extra, strict=True)
            ]
            if extra:
                ids = [*ids, *extra_ids]
                lengths = np.concatenate((lengths, [k.size for k in extra])).astype(np.int64)
                flat = np.concatenate((flat, *extra))
            if ids or postings is None:
                index.build_flat(ids, lengths, flat, distinct=True)
        self._store_terms(rows)
        # A record's terms row commits with the record, so a row made from other content
        # than the record's is all but impossible; still, check once the search that loaded
        # the pool is answered (a walk of every record). The snapshot is made again then when
        # many rows were not in it, and the maps a write needs are made.
        if pool.id not in self._checked:
            self.later(pool, lambda p: self._check_terms(p, stored))
        if len(ids) >= max(self.snapshot_rows, len(current) // SNAPSHOT_SHARE):
            self.later(pool, self.snapshot)
        self.later(pool, lambda p: p.index.warm())

    async def _check_terms(self, pool: WorkspacePool, stored: int) -> None:
        """Index again the records whose stored terms (the first `stored` rows of the index
        built at load) were not made from their content."""
        fps = await self.kernel.terms.fingerprints(pool.id)
        if self._pools.get(pool.id) is not pool or pool.poisoned:
            return  # evicted or reloaded meanwhile: done again by its next load
        # In slices, the event loop free between them (a walk of 100,000 records took 0.1 to
        # 0.5 s at once: the searches that came meanwhile waited); each record is checked and
        # re-indexed within one slice, and a slice's rows are staged as their seqs are taken.
        for at in range(0, len(fps), UPKEEP_SLICE):
            if at:
                await asyncio.sleep(0)
                if self._pools.get(pool.id) is not pool or pool.poisoned:
                    return
            entries, row_of = pool.stored.entries, pool.index.row_of
            rows = []
            with paused_gc():
                for entry_id, fp in fps[at : at + UPKEEP_SLICE]:
                    row = row_of(entry_id)
                    # Indexed from its stored keys at load and not since (a write re-indexes
                    # it and writes its row: a new index row).
                    if row is None or row >= stored:
                        continue
                    now = content_fp(entries, entry_id)
                    if now is not None and now != fp:
                        keys = self.kernel.analyzer(pool.id).keys(self.open(pool, entry_id))
                        pool.index.put(entry_id, keys)
                        rows.append(
                            self.kernel.terms.row(pool.id, entry_id, now, keys, pool.next_seq())
                        )
            self._store_terms(rows)
        if len(self._checked) >= CHECKED_POOLS:
            self._checked.clear()
        self._checked.add(pool.id)

    def _store_terms(self, rows: list[Write]) -> None:
        if rows:
            # Derived data: nothing waits for it, and a failure only means doing it again.
            fut = self.kernel.stage(Batch(writes=rows))
            if fut is not None:
                ignore_failure(fut)

    def indexed(
        self, pool: WorkspacePool, entry: WorkspaceEntry, content: str, *, new: bool
    ) -> list[Write]:
        """Index a record's new content; the rows that store term keys.

        Records written in sequence (a new one within `context_window_ms` of the last new one of
        its stream, engine/write_context.py: by the same contributor, with the same visibility
        and topics; the turns of one conversation, a batch of notes) are indexed with their
        neighbours' words too (`in_context`: own words four times, each neighbour's twice, the
        second record before once): a new record with the words of the two before it, and the
        one before again with the new one's. "Yes! I made a bowl" is found by a question about
        the pottery workshop the turn before asked about, and "Did you go to the pottery
        workshop?" by a question about the bowl. Only keywords: the record's vector and text are
        its own; an edit indexes a record by its own words again."""
        # (lists: ~25 keys, numpy costs more)
        own = self.kernel.analyzer(pool.id).key_list(content)
        placed = wc.placed(entry)
        if placed is not None:
            return self._threaded(pool, entry, own, placed, new=new)
        before = further = None
        now = self.kernel.clock()
        stream = wc.stream_of(entry.contributor, entry.tags, entry.topics)
        last = pool.last_written.get(stream)
        rows: list[Write] = []
        if new and last is not None and wc.in_window(last, now, self.context_window_ms):
            before, further = last.own, last.before
            rows += self._with_next(pool, last, own)
        if new:
            last = Written(entry.contributor, now, entry.id, entry.content_fp, own, before, further)
            wc.remember(pool.last_written, stream, last, now, self.context_window_ms)
        if new and pool.gathering is not None:  # indexed once, when its batch is complete
            pool.gathering[entry.id] = [entry.content_fp, own, before, None, further]
            return rows
        keys = in_context(own, before, further=further)
        rows.append(self._put(pool, entry.id, entry.content_fp, keys, new=new))
        return rows

    def _threaded(
        self,
        pool: WorkspacePool,
        entry: WorkspaceEntry,
        own: list[int],
        placed: tuple[str, int],
        *,
        new: bool,
    ) -> list[Write]:
        """Index a record of a thread with its neighbours in the thread's order, and those
        whose context it changes again (engine/write_context.py `Thread`): where and when it
        was written does not matter, only its thread and position. An edit keeps its place,
        so its neighbours are indexed with its new words."""
        thread = self._threads(pool).setdefault(
            wc.thread_of(entry.contributor, entry.tags, placed[0]), wc.Thread()
        )
        self._cache_own(pool, entry.id, entry.content_fp, own)
        if entry.id in thread:
            changed = thread.touching(entry.id)
        else:
            pool.thread_seq += 1
            changed = thread.insert(entry.id, placed[1], pool.thread_seq)
        rows: list[Write] = []
        for other in changed:
            if pool.gathering is not None and other in pool.gathering:
                continue  # indexed once its call is complete
            rows += self._in_thread_again(pool, thread, other, entry, own)
        if new and pool.gathering is not None:
            pool.gathering[entry.id] = [entry.content_fp, own, None, None, None, thread, entry]
            return rows
        keys = self.thread_keys(pool, thread, entry.id, entry, own)
        rows.append(self._put(pool, entry.id, entry.content_fp, keys, new=new))
        return rows

    def _put(self, pool: WorkspacePool, entry_id: str, fp, keys, *, new: bool) -> Write:
        """A record's keys in the pool's index, and the row that stores them (`new`: of a
        record just created)."""
        pool.index.put(entry_id, keys)
        return self.kernel.terms.row(pool.id, entry_id, fp, keys, pool.next_seq(), new=new)

    def thread_keys(
        self,
        pool: WorkspacePool,
        thread: wc.Thread,
        entry_id: str,
        current: WorkspaceEntry,
        current_own: list[int],
    ) -> list[int] | Counted:
        """The keys a threaded record is indexed under (`in_context` of its neighbours);
        `current` is the record being written, with its own keys (not stored yet)."""
        at = (current, current_own)
        own = self._own(pool, entry_id, at) or []
        before, after, further = (self._own(pool, n, at) for n in thread.around(entry_id))
        return in_context(own, before, after, further)

    def _own(
        self,
        pool: WorkspacePool,
        entry_id: str | None,
        current: tuple[WorkspaceEntry, list[int]],
    ) -> list[int] | None:
        """A threaded record's own keys, if it is active (a forgotten neighbour lends no
        words); read and analyzed again when its content changed since it was cached. The
        record being written, and those of a call not complete yet, are not stored yet: their
        keys are those given."""
        if entry_id is None:
            return None
        if entry_id == current[0].id:
            return current[1] if current[0].status == sm.WorkspaceStatus.ACTIVE else None
        gathered = pool.gathering.get(entry_id) if pool.gathering is not None else None
        if gathered is not None:
            return gathered[1]
        entry = pool.stored.entries.get(entry_id)
        if entry is None or entry.status != sm.WorkspaceStatus.ACTIVE:
            return None
        cached = pool.thread_own.get(entry_id)
        if cached is not None and cached[0] == entry.content_fp:
            return cached[1]
        own = self.kernel.analyzer(pool.id).key_list(self.open(pool, entry_id))
        self._cache_own(pool, entry_id, entry.content_fp, own)
        return own

    @staticmethod
    def _cache_own(pool: WorkspacePool, entry_id: str, fp: str, own: list[int]) -> None:
        # A bounded cache: a miss costs one record opened and analyzed again, while keeping
        # every threaded record's keys would grow with the pool.
        if len(pool.thread_own) >= THREAD_KEYS_CACHED:
            pool.thread_own.clear()
        pool.thread_own[entry_id] = (fp, own)

    def _in_thread_again(
        self,
        pool: WorkspacePool,
        thread: wc.Thread,
        entry_id: str,
        current: WorkspaceEntry,
        current_own: list[int],
    ) -> list[Write]:
        """A neighbour indexed again (its context changed); its row as for `_with_next`."""
        entry = pool.stored.entries.get(entry_id)
        if entry is None or entry_id not in pool.index:
            return []
        keys = self.thread_keys(pool, thread, entry_id, current, current_own)
        pool.index.put(entry_id, keys)
        return [self.kernel.terms.row(pool.id, entry_id, entry.content_fp, keys, pool.next_seq())]

    def _threads(self, pool: WorkspacePool) -> dict:
        """The pool's threads, made from its stored records at the first threaded write after
        a load (ties of position in the order the records were created)."""
        if not pool.threads_ready:
            placed = []
            for entry in pool.stored.entries.values():
                where = wc.placed(entry)
                if where is not None:
                    placed.append((entry.created_at, entry.id, entry, where))
            placed.sort(key=lambda p: (p[0], p[1]))
            for _, entry_id, entry, (name, position) in placed:
                pool.thread_seq += 1
                pool.threads.setdefault(
                    wc.thread_of(entry.contributor, entry.tags, name), wc.Thread()
                ).insert(entry_id, position, pool.thread_seq)
            pool.threads_ready = True
        return pool.threads

    def _with_next(self, pool: WorkspacePool, last: Written, following: list[int]) -> list[Write]:
        """The previous record indexed again with the words of the one written after it, if it
        is still as it was written (not edited, forgotten or purged since); the row to store
        with the new record, if any: it goes into the new record's batch, whether or not the
        previous record's commit is still pending. That commit comes first (commits keep their
        order) and the new one does not depend on it: if it fails, the row it leaves names a
        record that is not stored, which a load skips (as it skips any row of a record gone).
        One of the same coalesced call is indexed once, with both neighbours (`gathering`)."""
        gathered = pool.gathering.get(last.entry_id) if pool.gathering is not None else None
        if gathered is not None:
            gathered[3] = following
            return []
        entry = pool.stored.entries.get(last.entry_id)
        if entry is None or entry.content_fp != last.fp or last.entry_id not in pool.index:
            return []
        keys = in_context(last.own, last.before, following, last.further)
        pool.index.put(last.entry_id, keys)
        return [self.kernel.terms.row(pool.id, last.entry_id, last.fp, keys, pool.next_seq())]

    async def _link(self, stored: StoredWorkspacePool) -> str | None:
        """A bot pool's records as part of the bot's one memory (engine/memory_union.py): records
        stored before migration 7 read as written by the bot's owner for everyone who uses the
        bot, and every record without an `org:` gets the bot's home org. Returns that org (None
        when the bot is unknown: its records then stay hidden).

        Done to each record as it is first read (`LazyEntries.link`): finding the few without
        an `org:` took a scan of every record's JSON in the first search after a shard opens."""
        try:
            bot = await self.peers.directory().get_bot(sm.pool_owner(stored.pool))
        except OpenBotError:
            return None
        linked: dict[tuple[str, ...], tuple[str, ...]] = {}  # a pool's records share few tag sets

        def link(entry: WorkspaceEntry) -> WorkspaceEntry:
            new = linked.get(entry.tags)
            if new is None:
                tags = entry.tags or (tagmod.author(bot.owner), tagmod.FOR_BOT)
                new = linked[entry.tags] = bm.link_tags(tags, bot.org)
            return entry if new == entry.tags else msgspec.structs.replace(entry, tags=new)

        entries = stored.entries
        if isinstance(entries, LazyEntries):
            entries.set_link(link)
        else:
            with paused_gc():
                for entry_id, entry in list(entries.items()):
                    entries[entry_id] = link(entry)
        return bot.org

    def drop(self, pool: WorkspacePool) -> None:
        pool.poisoned = True
        if self._pools.get(pool.id) is pool:
            del self._pools[pool.id]
            self.kernel.residency.forget("ws:" + pool.id)

    async def settle_read(self, pool: WorkspacePool) -> None:
        """A read waits for the commit of the state it saw; a failed one fails the read."""
        await self.kernel.settle(pool, pool.pending)

    def open(self, pool: WorkspacePool, entry_id: str) -> str:
        return self.store.open(pool.keyed.cipher, pool.id, entry_id, pool.stored.sealed[entry_id])

    # --- keyword index snapshots ---

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
