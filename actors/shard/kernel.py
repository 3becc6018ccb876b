"""The shard's kernel: one DuckDB file and the one way anything on it changes.

It owns the file, the group committer, the event log, the keyring (through the memory store),
the receipts table, the keyword analyzer and term rows, the registry of loaded memory pools with
their locks, the residency budget, the clock and the id maker. Every feature of the shard (chats,
learning, workspace, requests, the bot memory API) is built with the kernel and writes
through it:

- `pool(id)` loads (once, single-flight) and counts a memory pool as used;
- `stage(batch, pool)` queues a `Batch` for group commit; on commit its events are published and
  its new pool keys count as stored, on failure its pool is poisoned and its hooks run;
- `stage_outcome(pool, outcome, ...)` applies an engine outcome to a pool and stages its rows,
  term rows and `memory.changed` events;
- `settle(pool, fut)` waits for a commit a reply depends on (the one owner of poison logic);
- `emit(items)` writes events that go with no memory change.

Changes hold the pool's lock exclusively only while deciding and staging; nothing here awaits a
model or another actor.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Container, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from actors.shard.batch import Batch
from actors.shard.pool import Pool
from actors.shard.residency import POOL_WEIGHT, Residency, budget_from, unused
from actors.shard.single_flight import SingleFlight
from engine.commands import Outcome
from engine.errors import StorageError
from engine.events import NOBODY, Audience, MemoryChanged, Payload, entry_audience, union
from storage.bulk import small_pages
from storage.crypto import Keyring, load_master_key, random_bytes
from storage.database import Database
from storage.event_log import MARK_RESTORED, EventLog
from storage.group_commit import FORGET_JOURNAL, GroupCommitter, Write
from storage.key_upgrade import upgrade_keys
from storage.memory_store import MemoryStore
from storage.receipts import Receipts
from storage.shard_schema import MIGRATIONS, TABLES
from storage.term_keys import Analyzer, pack_keys, unpack_keys
from storage.term_store import TermKeys, TermStore

log = logging.getLogger("openbot")


class Poisonable(Protocol):
    """State kept in memory ahead of the disk (a memory pool, a workspace pool)."""

    poisoned: bool


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def new_entry_id() -> str:
    return "mem_" + random_bytes(12).hex()


def terms_pool(pool_id: str) -> str:
    """Where a entry pool's term rows are kept: apart from the workspace pool of the same
    name (`bot:<id>` is both)."""
    return f"seed:{pool_id}"


def sealed_fp(sealed: bytes) -> str:
    """Which sealing of an entry's content stored terms were made from (a new seal, even of
    the same text, is a new nonce and so a new fingerprint)."""
    return hashlib.blake2b(sealed, digest_size=12).hexdigest()


async def durable(fut: asyncio.Future[None] | None) -> None:
    """Wait for a commit (None: nothing to wait for); a cancelled waiter does not cancel it."""
    if fut is not None:
        await asyncio.shield(fut)


def ignore_failure(fut: asyncio.Future[None]) -> None:
    """For derived data (term rows, resealed turns): a failure only means doing it again."""
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


class ShardKernel:
    def __init__(
        self,
        data_dir: str | Path,
        index: int,
        *,
        group_commit: bool = True,
        clock: Callable[[], int] = now_ms,
        new_id: Callable[[], str] = new_entry_id,
        db_path: str | None = None,
        event_retain: int = 100_000,
        cache_records: int | None = None,  # the residency budget (actors/shard/residency.py)
    ) -> None:
        small_pages()  # (a pool's vectors: see storage/bulk.py)
        self.index = index
        self.clock = clock
        self.new_id = new_id
        self.residency = Residency(budget_from(cache_records))
        # Called with a pool id when a pool (memory or workspace) leaves memory, so per-pool
        # state kept elsewhere (search indexes, vectors, learning positions) goes with it.
        self.on_evict: list[Callable[[str], None]] = []
        # Called only when a memory pool leaves (its state elsewhere is keyed by the same id).
        self.on_evict_memory: list[Callable[[str], None]] = []
        self._on_start: list[Callable[[], Awaitable[object]]] = []
        self.on_close: list[Callable[[], None]] = []  # background work to stop first
        # Awaited first when the shard closes (derived data worth storing for the next start).
        self.before_close: list[Callable[[], Awaitable[object]]] = []
        self._started: asyncio.Task[None] | None = None
        self.master = load_master_key(Path(data_dir))
        self.db = Database(db_path or Path(data_dir) / f"shard-{index}.duckdb", MIGRATIONS)
        # Opening the committer applies what a crash left in the journal; everything below
        # reads after it (the event log's head must count the events the journal held, or new
        # events would reuse seqs already published).
        self.committer = GroupCommitter(
            self.db, TABLES, enabled=group_commit, background=True, sync_aside=True
        )
        self.store = MemoryStore(self.db, Keyring(self.master))
        self.receipts = Receipts(self.db)
        self.events = EventLog(self.db, retain=event_retain)
        # Data written under the keys of earlier versions is brought to the current ones
        # before anything reads it (after the journal is applied: its rows too).
        upgrade_keys(self.db, self.master)
        # Keyword search: one term table for memory and workspace pools, each pool's
        # terms hashed with its own key.
        self.term_keys = TermKeys(self.master)
        self.terms = TermStore(self.db)
        self._loader: SingleFlight[Pool] = SingleFlight(self.resident)
        self._pools: dict[str, Pool] = self._loader.loaded

    @property
    def keyring(self) -> Keyring:
        return self.store.keyring

    def analyzer(self, pool_id: str) -> Analyzer:
        """The keyword analyzer of a pool (its own term key; a bot memory pool and the
        workspace pool of the same id share one)."""
        return self.term_keys.of(pool_id)

    # --- start ------------------------------------------------------------------------------

    def on_start(self, recover: Callable[[], Awaitable[object]]) -> None:
        """Run `recover` once, on the first use after (re)start (open jobs, chains: LRN-4)."""
        self._on_start.append(recover)

    def ensure_started(self) -> None:
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> None:
        for recover in self._on_start:
            await recover()

    async def started(self) -> None:
        """Wait until the recovery started by the first call has run."""
        self.ensure_started()
        assert self._started is not None
        await self._started

    # --- pools ------------------------------------------------------------------------------

    async def pool(self, pool_id: str) -> Pool:
        """The loaded memory pool (loaded once however many ask at the same time)."""
        self.ensure_started()

        async def load() -> Pool:
            pool = Pool(await self.store.load(pool_id))
            await self._index_pool(pool)
            return pool

        pool = await self._loader.get(pool_id, load)
        self.resident(pool)
        return pool

    def loaded(self) -> Iterator[Pool]:
        """The pools in memory now (a snapshot: loads and evictions may follow)."""
        return iter(list(self._pools.values()))

    @property
    def pool_count(self) -> int:
        return len(self._pools)

    def is_loaded(self, pool_id: str) -> bool:
        return pool_id in self._pools

    def loaded_pool(self, pool_id: str) -> Pool | None:
        """The pool if it is in memory now (never loads it)."""
        return self._pools.get(pool_id)

    def resident(self, pool: Pool) -> None:
        """Count the pool as used now, at its current size."""
        pool_id = pool.id
        if self._pools.get(pool_id) is not pool:
            return
        self.residency.touch(
            "pool:" + pool_id,
            POOL_WEIGHT + len(pool.stored.entries) + len(pool.stored.log) // 2,
            lambda: self.evict(pool_id),
        )

    def evict(self, pool_id: str) -> bool:
        """Drop a pool from memory unless it is in use (locked or awaited, a commit pending,
        referenced by a running coroutine or a workspace pool); says whether it went."""
        pool = self._pools.get(pool_id)
        if pool is None:
            return True
        lock = pool.lock
        if lock.readers or lock.writing or lock.waiting:
            return False
        if pool.pending is not None and not pool.pending.done():
            return False
        stored = pool.stored
        if not unused(pool, 1) or not unused(stored, 1):  # _pools, and the pool's attribute
            return False
        del self._pools[pool_id]
        self.keyring.forget(pool_id)
        for hook in [*self.on_evict_memory, *self.on_evict]:
            hook(pool_id)
        return True

    async def _index_pool(self, pool: Pool) -> None:
        """Fill the pool's keyword index from the stored term keys; entries without current
        ones are tokenized now and their keys stored for next time."""
        terms, where = self.terms, terms_pool(pool.id)
        entries, fps, blobs = await terms.load_raw(where)
        sealed = pool.stored.sealed
        ids: list[str] = []
        kept: list[bytes] = []
        for entry_id, fp, blob in zip(entries, fps, blobs, strict=True):
            if entry_id in sealed and sealed_fp(sealed[entry_id]) == fp:
                ids.append(entry_id)
                kept.append(blob)
        missing: list[Write] = []
        analyzer = self.analyzer(pool.id)
        if len(ids) < len(sealed):
            have = set(ids)
            for entry_id, blob in sealed.items():
                if entry_id in have:
                    continue
                keys = analyzer.keys(self.store.open_content(pool.stored, entry_id))
                ids.append(entry_id)
                kept.append(pack_keys(keys))
                missing.append(terms.row(where, entry_id, sealed_fp(blob), keys))
        lengths = np.fromiter((len(b) // 8 for b in kept), dtype=np.int64, count=len(kept))
        pool.terms.build_flat(ids, lengths, unpack_keys(b"".join(kept)))
        if missing:
            fut = self.stage(Batch(writes=missing))
            if fut is not None:
                ignore_failure(fut)

    def _term_rows(
        self,
        pool: Pool,
        outcome: Outcome,
        sealed: dict[str, bytes] | None,
        texts: Mapping[str, str] | None = None,
        fresh: Container[str] = (),
    ):
        """Keep the keyword index current with an applied outcome: new content indexed,
        deleted entries gone (in memory at once); the rows that store it. `texts`: the
        plaintext of (some of) the new content, as the writer had it (else it is opened).
        `fresh`: entries the outcome creates (no term row of theirs is stored yet)."""
        rows: list[Write] = []
        terms = self.terms
        texts = texts or {}
        where = terms_pool(pool.id)
        for entry_id, blob in (sealed or {}).items():
            if entry_id not in pool.entries:
                continue
            text = texts.get(entry_id)
            if text is None:
                text = self.store.open_content(pool.stored, entry_id)
            keys = self.analyzer(pool.id).key_list(text)  # (a list: `put` counts it in Python)
            pool.terms.put(entry_id, keys)
            fp = sealed_fp(blob)
            rows.append(terms.row(where, entry_id, fp, keys, new=entry_id in fresh))
        for entry_id in outcome.deletes:
            pool.terms.remove(entry_id)
            rows.append(terms.delete(where, entry_id))
        return rows

    # --- the commit pipeline ------------------------------------------------------------------

    def stage_outcome(
        self,
        pool: Pool,
        outcome: Outcome,
        sealed: dict[str, bytes] | None = None,
        extra: Sequence[Write] = (),
        more_events: Sequence[tuple[Payload, Audience]] = (),
        into: Batch | None = None,
        *,
        texts: Mapping[str, str] | None = None,
    ) -> asyncio.Future[None] | None:
        """Apply an outcome to the pool and stage its rows with one `memory.changed` per entry
        changed (plus `more_events`); events are published once the transaction commits. Call
        under the pool's exclusive lock. With `into`, the rows and events join that batch
        instead (several writes, one commit: the caller stages it) and None is returned.
        `texts`: the plaintext sealed into `sealed`, where the caller has it (the keyword index
        is made from it instead of opening the seal again)."""
        writes = self.store.outcome_writes(pool.stored, outcome, sealed)
        writes.extend(extra)
        bot = pool.id[4:] if pool.id.startswith("bot:") else None
        entries = pool.entries
        before = {
            i: entry_audience(bot, i, entries)
            for i in [*(m.id for m in outcome.upserts), *outcome.deletes]
            if i in entries
        }
        fresh = {m.id for m in outcome.upserts if m.id not in entries}
        pool.apply(outcome, sealed)
        writes.extend(self._term_rows(pool, outcome, sealed, texts, fresh))
        changes = {row.entry: row.change for row in outcome.log}
        events: list[tuple[Payload, Audience]] = []
        for meta in outcome.upserts:
            audience = entry_audience(bot, meta.id, entries)
            if meta.id in before:  # an edit also tells those who could see the old version
                audience = union([before[meta.id], audience])
            change = changes.get(meta.id, "updated")
            data = MemoryChanged(
                pool=pool.id, bot=bot, entry=meta.id, version=outcome.version, change=change
            )
            events.append((data, audience))
        for entry_id in outcome.deletes:
            data = MemoryChanged(
                pool=pool.id, bot=bot, entry=entry_id, version=outcome.version, change="purged"
            )
            events.append((data, before.get(entry_id, NOBODY)))
        events.extend(more_events)
        if into is not None:  # (no batch of its own: a write of a coalesced call)
            into.writes.extend(writes)
            into.events.extend(events)
            return None
        batch = Batch(writes=writes, events=events)
        return self.stage(batch, pool)

    def stage(self, batch: Batch, pool: Pool | None = None) -> asyncio.Future[None] | None:
        """Queue a batch for group commit; returns its commit's future (None: nothing to write
        and no pool commit to wait for). On commit its events are published and its new pool
        keys count as stored. If it fails, the memory state built on it is dropped (`pool`,
        the batch's failure hooks), so nothing answers from a change that is not on disk; later
        reads reload from the file. With `pool`, the future becomes the pool's pending commit.
        `batch.after`: a commit it depends on (with nothing to write, that one is returned)."""
        batch.staged = True
        events, event_rows = self.events.stage(batch.events, self.clock())
        writes = [*batch.writes, *event_rows]
        if not writes:
            if batch.after is not None:
                return batch.after
            return pool.pending if pool is not None else None
        keys = list(batch.keys)
        keys += [k for k in self.store.keys_in(batch.writes) if all(k is not o for o in keys)]
        hooks, committed = list(batch.on_failure), list(batch.on_commit)
        after = batch.after  # (only passed when set: code that wraps `submit` takes writes)
        fut = (
            self.committer.submit(writes) if after is None else self.committer.submit(writes, after)
        )

        def settled(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is None:
                self.store.stored(keys)
                self.events.publish(events)  # before the hooks: a failing hook costs no event
                for hook in committed:
                    try:
                        hook()
                    except Exception:
                        log.exception("a commit hook failed")
                return
            if pool is not None:
                self.poison(pool)
            for hook in hooks:
                hook()

        fut.add_done_callback(settled)
        if pool is not None:
            pool.pending = fut
            self.resident(pool)  # its size changed
        return fut

    async def commit(self, batch: Batch) -> None:
        """Stage a batch and wait until it is durable (raises if it failed)."""
        fut = self.stage(batch)
        if fut is not None:
            await fut

    async def settle(
        self, state: Poisonable, fut: asyncio.Future[None] | None, *, reads_state: bool = True
    ) -> None:
        """Wait until `fut` (a commit this reply depends on) is durable. If it failed, the state
        in memory is ahead of the disk: a memory pool is dropped here (other state by the failed
        batch's own hooks) so the next call reloads what was stored. A reply that shows the
        state (`reads_state`) also fails when an earlier change it may include failed; a write
        whose own rows committed is acknowledged."""
        if fut is not None:
            try:
                # (shielded: a caller that goes away leaves its commit alone; one settled
                # already needs no waiting, nor a future and callbacks to wait with)
                await (fut if fut.done() else asyncio.shield(fut))
            except BaseException:
                if isinstance(state, Pool):
                    self.poison(state)
                raise
        if reads_state and state.poisoned:  # an earlier change this state includes failed
            raise StorageError("a change could not be stored; try again")

    def poison(self, pool: Pool) -> None:
        """A change of this pool failed: drop it so the next use reloads the stored state."""
        pool.poisoned = True
        if self._pools.get(pool.id) is pool:
            del self._pools[pool.id]
            self.residency.forget("pool:" + pool.id)

    async def emit(self, items: Sequence[tuple[Payload, Audience]]) -> int:
        """Write events that go with no memory change; returns the last seq once they are
        durable and published."""
        await self.commit(Batch(events=list(items)))
        return self.events.published

    # --- lifecycle ----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        return {
            "pools": len(self._pools),
            "resident_records": self.residency.total,
            "evictions": self.residency.evictions,
            "transactions": self.committer.transactions,
            "batches": self.committer.batches,
        }

    async def backup(self, dest_dir: str) -> str:
        """A consistent copy of this shard's file in `dest_dir` (everything committed so far)."""
        await self.committer.drain()
        dest = Path(dest_dir) / f"shard-{self.index}.duckdb"
        await self.db.snapshot(dest, [MARK_RESTORED, FORGET_JOURNAL])
        return str(dest)

    async def close(self) -> None:
        for store in self.before_close:
            await store()
        for stop in self.on_close:
            stop()
        await self._loader.close()
        await self.committer.close()
        self.db.close()
