"""The shard actor: owns one DuckDB file and hosts the memory pools of its accounts.

A thin shell. It keeps loaded pools in memory with their locks, asks engine/ what a change
means, queues the rows with group commit and answers once they are durable. Changes hold the
pool's lock exclusively only while deciding and queueing; reads hold it shared while checking
visibility and decrypting, so a read never mixes old permissions with new content (ACL-9). No
reply carries state that is not yet on disk: a read that saw a queued change waits for its commit.

`ShardService` is a plain class (tests drive it without Ray); `ShardActor` wraps it for Ray.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import msgspec
import numpy as np

from actors.chats.conversations import Conversations
from actors.chats.requests import Requests
from actors.contracts import (
    ChainView,
    Mirrored,
    NodeInfo,
    RevisionView,
    StepInput,
    StepOutcome,
    TurnResult,
    TurnStart,
    WsAccess,
    WsListing,
    WsQuery,
)
from actors.learning.memory_bot import MemoryBotRuntime
from actors.learning.runs import LearningRunner
from actors.models.embeddings import Embedder, search_settings
from actors.models.node_hub import BUILTIN_NODE, UPGRADE_HINT, NodeModel
from actors.models.registry import Model, load_models
from actors.runtime import lock_guard
from actors.runtime.node_hub_handle import RayNodeHub
from actors.runtime.peers import Peers
from actors.shard.bot_memory import BotMemory, Snapshot
from actors.shard.pool import Pool
from actors.shard.residency import POOL_WEIGHT, Residency, budget_from, unused
from actors.shard.single_flight import SingleFlight
from actors.workspace.semantic import semantic_search
from actors.workspace.service import Workspace
from engine import commands, widening
from engine.bot_memory import as_entry_view
from engine.chat_records import Confession, Enrichment, ItemView, LearningJob, Turn
from engine.commands import Outcome
from engine.directory import Bot, Channel, Chat, Org
from engine.errors import Conflict, InvalidInput, NotFound, StorageError
from engine.events import (
    NOBODY,
    Audience,
    Event,
    MemoryChanged,
    Payload,
    ShardHead,
    entry_audience,
    union,
)
from engine.memory import (
    Change,
    Context,
    EntryMeta,
    EntryView,
    LogPage,
    LogRow,
    MemoryPage,
    Reader,
    SearchHitView,
    SearchPage,
    Status,
    Who,
    view,
)
from engine.memory_bot import MemoryBotSettings, SettingsPatch, apply_patch
from engine.projects import ProjectChange, ProjectCreate, ProjectView
from engine.requests import RequestView
from engine.scoped_memory import (
    Decision,
    Extraction,
    ForgetBarrier,
    SourceItem,
    WsEntryView,
    WsForget,
    WsMemoryChange,
    WsMemoryCreate,
)
from engine.turns import ANSWER_WAIT
from storage.chat_store import ChatStore
from storage.crypto import Keyring, load_master_key
from storage.database import Database
from storage.event_log import MARK_RESTORED, EventLog
from storage.group_commit import DeleteWhere, GroupCommitter, Write
from storage.memory_store import MemoryStore
from storage.receipts import Receipts, fingerprint, receipt_key
from storage.search_index import pack_keys, unpack_keys
from storage.shard_schema import MIGRATIONS, RECEIPTS, TABLES
from storage.stats import STATS

log = logging.getLogger("openbot.shard")
_view_dec = msgspec.json.Decoder(EntryView)
_json = msgspec.json.Encoder()


def _terms_pool(pool_id: str) -> str:
    """Where a seed-000 pool's term rows are kept: apart from the workspace pool of the same
    name (`bot:<id>` is both)."""
    return f"seed:{pool_id}"


def _sealed_fp(sealed: bytes) -> str:
    """Which sealing of an entry's content stored terms were made from (a new seal, even of
    the same text, is a new nonce and so a new fingerprint)."""
    return hashlib.blake2b(sealed, digest_size=12).hexdigest()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _new_entry_id() -> str:
    return "mem_" + secrets.token_hex(12)


def _seed_view(snap: Snapshot, meta: EntryMeta) -> EntryView:
    """An entry of a bot's one memory in the seed-000 format (API-1)."""
    if (
        snap.ws is not None
        and meta.id in snap.ws.stored.entries
        and meta.id not in snap.pool.entries
    ):
        return as_entry_view(snap.ws.stored.entries[meta.id], snap.open(meta.id))
    return view(meta, snap.open(meta.id))


def _job_for(job: LearningJob, user: str, channels: frozenset[str]) -> bool:
    return job.grant == f"for:person:{user}" or (
        job.channel is not None and job.channel in channels
    )


class ShardService:
    def __init__(
        self,
        data_dir: str | Path,
        index: int,
        *,
        group_commit: bool = True,
        clock: Callable[[], int] = _now_ms,
        new_id: Callable[[], str] = _new_entry_id,
        db_path: str | None = None,
        event_retain: int = 100_000,
        models: Mapping[str, Model] | None = None,
        models_config: Mapping[str, Mapping] | None = None,
        config_dir: str | None = None,
        search: Mapping[str, object] | None = None,  # the config's [search] table (SC-7)
        embedder: Embedder | None = None,  # instead of search's embedding_model (in-process use)
        answer_wait: float = ANSWER_WAIT,  # MB-4; tests shorten it
        prefix: str | None = None,
        shard_count: int = 1,
        namespace: str = "openbot",
        cache_records: int | None = None,  # the residency budget (actors/shard/residency.py)
    ) -> None:
        self.index = index
        self.residency = Residency(budget_from(cache_records))
        # Called with a pool id when a pool (memory or workspace) leaves memory, so per-pool
        # state kept elsewhere (search indexes, vectors) goes with it.
        self.on_evict: list[Callable[[str], None]] = []
        self.peers = Peers(self, index, prefix=prefix, count=shard_count, namespace=namespace)
        self.db = Database(db_path or Path(data_dir) / f"shard-{index}.duckdb", MIGRATIONS)
        self.committer = GroupCommitter(self.db, TABLES, enabled=group_commit)
        self.store = MemoryStore(self.db, Keyring(load_master_key(Path(data_dir))))
        self.receipts = Receipts(self.db)
        self.events = EventLog(self.db, retain=event_retain)
        self.clock = clock
        self.new_id = new_id
        self._loader: SingleFlight[Pool] = SingleFlight()
        self._pools: dict[str, Pool] = self._loader.loaded
        if models is None:
            base = Path(config_dir) if config_dir else Path(".")
            models = load_models(
                models_config or {}, base_dir=base, hub=RayNodeHub(prefix or "openbot")
            )
        chats = ChatStore(self.store)
        self.memory_bot = MemoryBotRuntime(
            models, chats, self.committer, self.clock, answer_wait=answer_wait
        )
        self.learning = LearningRunner(self, chats, self.memory_bot)
        self.conversations = Conversations(self, chats, self.memory_bot, self.learning)
        self.learning.conversations = self.conversations
        self.requests = Requests(self)
        self._started: asyncio.Task[int] | None = None
        self.workspace = Workspace(self, data_dir)
        fusion = search_settings(search, models_config)
        self.workspace.context_window_ms = int(fusion.context_window_s * 1000)
        self.bot_memory = BotMemory(self)
        self.workspace.semantic = semantic_search(
            self.workspace,
            search,
            models_config,
            base_dir=Path(config_dir or "."),
            embedder=embedder,
        )

    def _ensure_started(self) -> None:
        """Resume open learning jobs once, on the first call after (re)start (LRN-4)."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._recover())

    async def _recover(self) -> int:
        jobs = await self.learning.recover()
        try:
            await self.conversations.chains.recover()
        except Exception:  # a chain that cannot resume must not stop the shard from serving
            log.exception("resuming collaboration chains failed")
        return jobs

    # --- pools ---

    async def _pool(self, pool_id: str) -> Pool:
        self._ensure_started()

        async def load() -> Pool:
            pool = Pool(await self.store.load(pool_id))
            await self._index_pool(pool)
            return pool

        pool = await self._loader.get(pool_id, load)
        self._resident(pool)
        return pool

    def _resident(self, pool: Pool) -> None:
        """Count the pool as used now, at its current size."""
        pool_id = pool.id
        if self._pools.get(pool_id) is not pool:
            return
        self.residency.touch(
            "pool:" + pool_id,
            POOL_WEIGHT + len(pool.stored.entries) + len(pool.stored.log) // 2,
            lambda: self._evict_pool(pool_id),
        )

    def _evict_pool(self, pool_id: str) -> bool:
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
        self.store.keyring.forget(pool_id)
        self.learning.forget_pool(pool_id)
        for hook in self.on_evict:
            hook(pool_id)
        return True

    async def _index_pool(self, pool: Pool) -> None:
        """Fill the pool's keyword index from the stored term keys; entries without current
        ones are tokenized now and their keys stored for next time."""
        terms, where = self.workspace.terms, _terms_pool(pool.id)
        entries, fps, blobs = await terms.load_raw(where)
        sealed = pool.stored.sealed
        ids: list[str] = []
        kept: list[bytes] = []
        for entry_id, fp, blob in zip(entries, fps, blobs, strict=True):
            if entry_id in sealed and _sealed_fp(sealed[entry_id]) == fp:
                ids.append(entry_id)
                kept.append(blob)
        missing: list[Write] = []
        if len(ids) < len(sealed):
            have = set(ids)
            for entry_id, blob in sealed.items():
                if entry_id in have:
                    continue
                keys = self.workspace.analyzer.keys(self.store.open_content(pool.stored, entry_id))
                ids.append(entry_id)
                kept.append(pack_keys(keys))
                missing.append(terms.row(where, entry_id, _sealed_fp(blob), keys))
        lengths = np.fromiter((len(b) // 8 for b in kept), dtype=np.int64, count=len(kept))
        pool.terms.build_flat(ids, lengths, unpack_keys(b"".join(kept)))
        if missing:
            fut = self._submit(None, missing)
            if fut is not None:  # derived data: a failure only means doing it again
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _term_rows(self, pool: Pool, outcome: Outcome, sealed: dict[str, bytes] | None):
        """Keep the keyword index current with an applied outcome: new content indexed,
        deleted entries gone (in memory at once); the rows that store it."""
        rows: list[Write] = []
        terms = self.workspace.terms
        for entry_id, blob in (sealed or {}).items():
            if entry_id not in pool.entries:
                continue
            keys = self.workspace.analyzer.keys(self.store.open_content(pool.stored, entry_id))
            pool.terms.put(entry_id, keys)
            rows.append(terms.row(_terms_pool(pool.id), entry_id, _sealed_fp(blob), keys))
        for entry_id in outcome.deletes:
            pool.terms.remove(entry_id)
            rows.append(terms.delete(_terms_pool(pool.id), entry_id))
        return rows

    async def _settle(
        self, pool: Pool, fut: asyncio.Future[None] | None, *, reads_state: bool = True
    ) -> None:
        """Wait until `fut` (a commit this reply depends on) is durable. If it failed, the pool's
        memory is ahead of the disk: drop it so the next call reloads what was stored. A reply
        that shows pool state (`reads_state`) also fails when an earlier change it may include
        failed; a write whose own rows committed is acknowledged."""
        if fut is None:
            return
        try:
            await asyncio.shield(fut)
        except BaseException:
            self._poison(pool)
            raise
        if reads_state and pool.poisoned:  # an earlier change this state includes failed
            raise StorageError("a change could not be stored; try again")

    def _queue(
        self,
        pool: Pool,
        outcome: Outcome,
        sealed: dict[str, bytes] | None = None,
        extra: Sequence[Write] = (),
        more_events: Sequence[tuple[Payload, Audience]] = (),
    ):
        """Apply an outcome to the pool and queue its rows with one `memory.changed` per entry
        changed (plus `more_events`); events are published once the transaction commits."""
        writes = [*self.store.outcome_writes(pool.stored, outcome, sealed), *extra]
        bot = pool.id[4:] if pool.id.startswith("bot:") else None
        before = {
            i: entry_audience(bot, i, pool.entries)
            for i in [*(m.id for m in outcome.upserts), *outcome.deletes]
            if i in pool.entries
        }
        pool.apply(outcome, sealed)
        writes += self._term_rows(pool, outcome, sealed)
        changes = {row.entry: row.change for row in outcome.log}
        items: list[tuple[Payload, Audience]] = []
        for meta in outcome.upserts:
            audience = union(
                [before.get(meta.id, NOBODY), entry_audience(bot, meta.id, pool.entries)]
            )
            change = changes.get(meta.id, "updated")
            items.append(
                (
                    MemoryChanged(
                        pool=pool.id, bot=bot, entry=meta.id, version=outcome.version, change=change
                    ),
                    audience,
                )
            )
        for entry_id in outcome.deletes:
            data = MemoryChanged(
                pool=pool.id, bot=bot, entry=entry_id, version=outcome.version, change="purged"
            )
            items.append((data, before.get(entry_id, NOBODY)))
        return self._submit(pool, writes, [*items, *more_events])

    def _submit(
        self,
        pool: Pool | None,
        writes: list,
        items: Sequence[tuple[Payload, Audience]] = (),
        on_failure: Callable[[], None] | None = None,
    ):
        """Queue a batch. On commit its events are published and new pool keys count as stored.
        If it fails, the memory state that was built on it is dropped (`pool`, `on_failure`), so
        nothing answers from a change that is not on disk; later reads reload from the file."""
        events, event_rows = self.events.stage(items, self.clock())
        writes = [*writes, *event_rows]
        keyed = self.store.take_keyed()
        if not writes:
            return pool.pending if pool is not None else None
        fut = self.committer.submit(writes)

        def settled(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is None:
                for stored in keyed:
                    stored.persisted = True
                self.events.publish(events)
                return
            if pool is not None:
                self._poison(pool)
            if on_failure is not None:
                on_failure()

        fut.add_done_callback(settled)
        if pool is not None:
            pool.pending = fut
            self._resident(pool)  # its size changed
        return fut

    def _poison(self, pool: Pool) -> None:
        pool.poisoned = True
        if self._pools.get(pool.id) is pool:
            del self._pools[pool.id]
            self.residency.forget("pool:" + pool.id)

    async def emit(self, items: Sequence[tuple[Payload, Audience]]) -> int:
        """Write events that go with no memory change (for other parts of the engine); returns
        the last seq once they are durable and published."""
        fut = self._submit(None, [], items)
        if fut is not None:
            await fut
        return self.events.published

    async def event_head(self) -> ShardHead:
        return self.events.head()

    # --- chats and the memory bot (seed 000 §3-§5) ---

    async def start_turn(self, start: TurnStart) -> Turn:
        self._ensure_started()
        return await self.conversations.start_turn(start)

    async def wait_turn(self, chat: str, turn: str, timeout: float = 180.0) -> TurnResult:
        return await self.conversations.wait_turn(chat, turn, timeout)

    async def run_step(
        self, step: StepInput, mirror: tuple[Mirrored, ...] = (), learn_upto: int = 0
    ) -> StepOutcome:
        """A bot's step for a chat kept on another shard (a group round, a delivery)."""
        self._ensure_started()
        return await self.conversations.run_step(step, mirror, learn_upto)

    async def schedule_learning(
        self, bot: Bot, chat: Chat, turn: str, upto: int, grant: str, org: Org, deferred: bool
    ) -> str | None:
        """A group turn's learning for one of its bots, on that bot's shard (CO-2: once)."""
        self._ensure_started()
        return await self.conversations.schedule_learning(
            bot, chat, turn, upto, grant, org, deferred
        )

    async def memory_jobs(
        self, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> list[LearningJob]:
        """Learning jobs of these pools whose turn the user was part of (their own person
        turns, or their channels')."""
        out = []
        for pool in pools:
            stored = None
            for job in await self.learning.store.jobs(pool):
                if not _job_for(job, user, channels):
                    continue
                stored = stored or (await self._pool(pool)).stored
                # Every attempt that reached the model, from the sealed call log (LRN-4).
                records = await self.learning.store.attempt_records(stored, job.id)
                out.append(msgspec.structs.replace(job, attemptRecords=records))
        return out

    async def retry_memory_job(
        self, job_id: str, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> LearningJob | None:
        for pool in pools:
            for job in await self.learning.store.jobs(pool):
                if job.id == job_id and _job_for(job, user, channels):
                    return await self.learning.retry(job)
        return None

    async def release_learning(self, job_id: str, upto: int) -> bool:
        return await self.learning.release(job_id, upto)

    async def chat_item(self, chat: str, seq: int) -> ItemView | None:
        self._ensure_started()
        return await self.conversations.one_item(chat, seq)

    async def post_item(self, chat: Chat, author: str, text: str) -> ItemView:
        """A bot's `workspace_post_to_group` message in a group chat homed here."""
        item = await self.conversations.say(chat, None, "bot", author, text)
        log = await self.conversations.log(chat.id)
        return self.conversations._view(log, item)

    async def collaborations(self, user: str, channels: frozenset[str]) -> list[ChainView]:
        self._ensure_started()
        return await self.conversations.chains.listing(user, channels)

    async def stop_collaboration(
        self, chain_id: str, user: str, channels: frozenset[str]
    ) -> ChainView | None:
        """Stop a chain homed here that `user` may see; None when it is not here."""
        chains = self.conversations.chains
        chain = await chains.find(chain_id)
        if chain is None or not chains.may_see(chain, user, channels):
            return None
        return await chains.stop(chain_id, user)

    # --- requests (approvals, ENR-3) ---

    async def requests_of(
        self, user: str, channels: frozenset[str], status: str | None = None
    ) -> list[RequestView]:
        return await self.requests.listing(user, channels, status)

    async def request(self, request_id: str, user: str, channels: frozenset[str]):
        """The request if it is on this shard and `user` may see it, else None."""
        found = await self.requests.find(request_id, user, channels)
        return None if found is None else await self.requests.view(found)

    async def decide_request(
        self, request_id: str, user: str, channels: frozenset[str], approved: bool, note: str
    ) -> RequestView | None:
        return await self.requests.decide(request_id, user, channels, approved, note)

    async def notify(self, chat: Chat, author: str, text: str) -> ItemView:
        """A system notification in a chat homed here (a request's decision)."""
        item = await self.conversations.say(chat, None, "notification", author, text)
        return self.conversations._view(await self.conversations.log(chat.id), item)

    async def attach_review(self, request_id: str, chat: str) -> RequestView:
        return await self.requests.attach_review(request_id, chat)

    async def verdict(self, chat: str, turn: str, user: str, accepted: bool, note: str) -> Turn:
        return await self.conversations.verdict(chat, turn, user, accepted, note)

    async def chat_busy(self, chat: str) -> bool:
        """Whether a turn or a collaboration of this chat is under way."""
        return await self.conversations.busy(chat)

    async def switch_group_mode(
        self, chat: str, channel: str, mode: str, leader: str | None
    ) -> Channel:
        """WS-6's mode switch, done by the shard that keeps the group's chat so that it is
        atomic with respect to the group's turns (Conversations.switch_mode)."""
        self._ensure_started()
        return await self.conversations.switch_mode(chat, channel, mode, leader)

    async def bot_node(self, model_name: str | None) -> NodeInfo:
        """Where a bot's model runs and whether memory reaches it there (ND-2, ND-3)."""
        model = self.memory_bot.model(model_name)
        if not isinstance(model, NodeModel):
            return BUILTIN_NODE
        info = await model.hub.info(model.node)
        return info or NodeInfo(
            id=model.node,
            memory_isolation=False,
            memory_extraction=False,
            connected=False,
            hint=UPGRADE_HINT,
        )

    async def chains_idle(self) -> None:
        await self.conversations.chains.idle()

    async def chat_items(self, chat: str) -> list[ItemView]:
        self._ensure_started()
        return await self.conversations.items(chat)

    async def delete_chat_items(self, chat: str, record: Chat | None = None) -> int:
        """Delete a chat's history here; with its `record` (on its home shard) announce it."""
        return await self.conversations.delete_items(chat, record)

    async def confessions(self, chat: str) -> list[Confession]:
        return await self.conversations.confessions(chat)

    async def enrichments(self, chat: str) -> list[Enrichment]:
        return await self.conversations.enrichments(chat)

    async def learning_jobs(self, pool_id: str) -> list[LearningJob]:
        return await self.learning.store.jobs(pool_id)

    async def learning_idle(self) -> int:
        """Wait until no learning job runs; returns how many model steps were made so far."""
        self._ensure_started()
        if self._started is not None:
            await self._started
        await self.learning.idle()
        return self.learning.model_steps

    async def events_after(
        self, seq: int, limit: int = 1000, wait: float = 0.0
    ) -> tuple[ShardHead, list[Event]]:
        """Published events after `seq` (long-polls up to `wait` s when there are none yet)."""
        # Gateways poll this continuously: after Ray restarts this actor, the first poll starts
        # the recovery of open jobs and chains even if no other call comes.
        self._ensure_started()
        events = await self.events.after(seq, limit=limit, wait=wait)
        return self.events.head(), events

    # --- seed-000 memory API -------------------------------------------------------------------

    async def read_memory(
        self, pool_id: str, reader: Reader, tags: Sequence[str] = ()
    ) -> MemoryPage:
        """Every entry the reader may see (history included), in memory order (API-1)."""
        return (await self._read(pool_id, reader, tags))[0]

    async def _read(
        self, pool_id: str, reader: Reader, tags: Sequence[str]
    ) -> tuple[MemoryPage, int]:
        """The page, and the last event seq its state reflects (for the gateway's cache). A
        bot's workspace records are part of it (one memory per bot, engine/bot_memory.py)."""
        want = set(tags)
        async with self.bot_memory.read(pool_id, reader) as snap:
            views = tuple(_seed_view(snap, m) for m in snap.visible() if want.issubset(m.tags))
            version = snap.pool.version
            staged = self.events.staged
        return MemoryPage(entries=views, version=version), staged

    async def _receipt(self, pool: Pool, key: str | None, print_: str) -> EntryView | None:
        """The answer already given to this request, if any (call under the exclusive lock)."""
        if key is None:
            return None
        answer = pool.receipts.get(key)
        if answer is not None:
            if answer[0] != print_:
                raise Conflict(
                    "this requestId was already used for a different request",
                    code="request_id_reused",
                )
            return _view_dec.decode(answer[1])
        if pool.stored_receipts is None:
            pool.stored_receipts = await self.receipts.keys(pool.id)
        if key not in pool.stored_receipts:
            return None  # a new request id: nothing to read
        raw = await self.receipts.find(key, print_, pool.stored.cipher, pool.id)
        return None if raw is None else _view_dec.decode(raw)

    def _receipt_rows(self, pool: Pool, key: str | None, print_: str, answer: EntryView):
        if key is None:
            return ()
        raw = msgspec.json.encode(answer)
        pool.receipts[key] = (print_, raw)
        return (Receipts.row(key, print_, raw, pool.stored.cipher, pool.id, self.clock()),)

    async def read_memory_json(
        self, pool_id: str, reader: Reader, tags: Sequence[str] = ()
    ) -> tuple[str, int, bytes]:
        """`read_memory` encoded as the HTTP body: one bytes object crosses Ray instead of a
        hundred pickled Structs that the gateway would encode again (measured: half the cost).
        With the shard's epoch and the last event seq the page reflects, so the gateway can keep
        it until a later `memory.changed` for this pool reaches it."""
        page, staged = await self._read(pool_id, reader, tags)
        return self.events.epoch, staged, _json.encode(page)

    async def search_memory_json(self, pool_id: str, reader: Reader, q: str, limit: int) -> bytes:
        """`GET /v1/bots/{bot}/memory?q=`: the `limit` best keyword (BM25) hits among the
        active entries the reader may see, best first, as the HTTP body."""
        return _json.encode(await self.search_memory_page(pool_id, reader, q, limit))

    async def search_memory_page(
        self, pool_id: str, reader: Reader, q: str, limit: int
    ) -> SearchPage:
        if limit < 1:
            raise InvalidInput("limit must be at least 1", code="invalid_limit")
        hits = await self.bot_memory.ranked(pool_id, reader, q, limit)
        views = tuple(
            SearchHitView(
                **msgspec.structs.asdict(view(meta, text)), score=score, foundBy=("keyword",)
            )
            for meta, text, score in hits
        )
        pool = await self._pool(pool_id)
        return SearchPage(entries=views, version=pool.version)

    async def memory_log_json(self, pool_id: str, reader: Reader) -> bytes:
        return _json.encode(await self.memory_log(pool_id, reader))

    async def remember(
        self,
        pool_id: str,
        reader: Reader,
        content: str,
        topics: Sequence[str] = (),
        request_id: str | None = None,
    ) -> EntryView:
        """Add a pinned entry (API-2). With a `request_id` a retry returns the first answer."""
        commands.validate_content(content)
        key = None if request_id is None else receipt_key(pool_id, reader.user, request_id)
        print_ = fingerprint(("remember", reader.org, content, tuple(topics)))
        pool = await self._pool(pool_id)
        entry_id = self.new_id()
        async with pool.lock.exclusive():
            done = await self._receipt(pool, key, print_)
            if done is not None:
                pending = pool.pending
            else:
                outcome = commands.remember(
                    pool=pool_id,
                    entry_id=entry_id,
                    reader=reader,
                    topics=topics,
                    now=self.clock(),
                    version=pool.version,
                )
                sealed = {entry_id: self.store.seal_content(pool.stored, entry_id, content)}
                done = view(outcome.upserts[0], content)
                extra = self._receipt_rows(pool, key, print_, done)
                pending = self._queue(pool, outcome, sealed, extra)
        await self._settle(pool, pending, reads_state=False)
        return done

    async def forget(
        self,
        pool_id: str,
        reader: Reader,
        entry_id: str,
        request_id: str | None = None,
        expected_revision: int | None = None,
    ) -> EntryView:
        key = None if request_id is None else receipt_key(pool_id, reader.user, request_id)
        print_ = fingerprint(("forget", reader.org, entry_id))
        pool, ws = await self.bot_memory.pools(pool_id)
        async with pool.lock.exclusive():
            done = await self._receipt(pool, key, print_)
            if done is not None:
                pending = pool.pending
            else:
                if entry_id not in pool.entries:  # a workspace record: forgotten through its route
                    raise Conflict("this entry is not yours to forget", code="not_yours")
                outcome = commands.forget(
                    # Visibility over the bot's one memory (an observation may rest on a record).
                    entries=self.bot_memory.learning_state(pool, ws),
                    entry_id=entry_id,
                    reader=reader,
                    now=self.clock(),
                    version=pool.version,
                )  # raises for an entry the reader may not see
                current = pool.entries[entry_id].revision
                if expected_revision is not None and current != expected_revision:
                    # Under the lock: a concurrent change makes this request stale.
                    raise Conflict(
                        f"the entry is at revision {current}, not {expected_revision}",
                        code="stale_revision",
                        details={"currentRevision": current},
                    )
                content = self.store.open_content(pool.stored, entry_id)
                meta = outcome.upserts[0] if outcome.upserts else pool.entries[entry_id]
                done = view(meta, content)
                extra = self._receipt_rows(pool, key, print_, done)
                pending = self._queue(pool, outcome, None, extra)
        await self._settle(pool, pending, reads_state=False)
        return done

    async def purge(self, pool_id: str, tag: str) -> int:
        pool = await self._pool(pool_id)
        async with pool.lock.exclusive():
            outcome = commands.purge(entries=pool.entries, tag=tag, version=pool.version)
            extra: list[Write] = []
            if outcome.deletes:
                # Stored answers may quote what was just deleted: a purge ends their replay.
                extra.append(DeleteWhere(RECEIPTS.name, "scope", (pool_id,)))
                pool.receipts.clear()
                pool.stored_receipts = set()
            pending = self._queue(pool, outcome, None, extra)
        await self._settle(pool, pending, reads_state=False)
        return len(outcome.deletes)

    async def memory_log(self, pool_id: str, reader: Reader) -> LogPage:
        pool = await self._pool(pool_id)
        async with pool.lock.shared():
            rows = commands.visible_log(pool.stored.log, pool.entries, reader)
            version, pending = pool.version, pool.pending
        await self._settle(pool, pending)
        return LogPage(changes=tuple(rows), version=version)

    async def context(self, pool_id: str, reader: Reader, limit: int) -> Context:
        """Visible valid entries in memory order until the first that does not fit (ENR-5)."""
        parts, has = await self.context_parts(pool_id, reader, limit)
        return Context(
            text="\n".join(t for _, t in parts), entries=tuple(i for i, _ in parts), hasEntries=has
        )

    async def context_parts(
        self, pool_id: str, reader: Reader, limit: int
    ) -> tuple[list[tuple[str, str]], bool]:
        """(id, text) of the entries `context` uses, and `hasEntries` (ENR-7). Stops at the first
        entry that does not fit, without decrypting any later one (ENR-5)."""
        if limit < 0:
            raise InvalidInput("limit must be >= 0")
        async with self.bot_memory.read(pool_id, reader) as snap:
            usable = snap.usable()
            parts: list[tuple[str, str]] = []
            size = 0
            for meta in usable:
                text = snap.open(meta.id)
                extra = len(text) + (1 if parts else 0)
                if size + extra > limit:
                    break
                parts.append((meta.id, text))
                size += extra
        return parts, bool(usable)

    async def has_entries(self, pool_id: str, reader: Reader) -> bool:
        """Whether the reader has visible valid entries, fitting a limit or not (ENR-7)."""
        pool, ws = await self.bot_memory.pools(pool_id)
        async with pool.lock.shared():
            snap = self.bot_memory.snapshot(pool, ws, reader)
            return bool(snap.visible_seeds(active=True) or snap.visible_records(active=True))

    async def validate_references(
        self, pool_id: str, reader: Reader, entry_ids: Sequence[str]
    ) -> bool:
        """Whether a stored answer's entry references are all still allowed for the reader,
        from tags and sources only (ENR-8): entries pushed out of a text limit still count,
        lost access does not."""
        pool, ws = await self.bot_memory.pools(pool_id)
        async with pool.lock.shared():
            vis = self.bot_memory.snapshot(pool, ws, reader).visibility
            return all(vis.usable(i) for i in entry_ids)

    async def memory_texts(self, pool_id: str, reader: Reader) -> list[tuple[str, str]]:
        """(id, text) of every usable entry of the pool the reader may see, in memory order:
        the one visibility-checked enumeration a search index serves a reader from (ENR-5)."""
        return await self.bot_memory.texts(pool_id, reader)

    async def search_memory(
        self, pool_id: str, reader: Reader, query: str, limit: int = 10
    ) -> list[tuple[str, str]]:
        """(id, text) of the best keyword hits among the usable entries the reader may see."""
        return await self.bot_memory.search(pool_id, reader, query, limit)

    async def widen(
        self, pool_id: str, entry_id: str, grant: str, requester: str
    ) -> dict[str, object]:
        """A person's request to widen an entry (ACL-4): passes every source's rule or raises
        Conflict `widen_refused`, the same for an id that is not in the pool (so a refusal does
        not tell whether an entry exists). Tags only: the ciphertext is kept (LRN-8)."""
        widening.check_grant(grant)
        pool, ws = await self.bot_memory.pools(pool_id)
        async with pool.lock.exclusive():
            if entry_id not in pool.entries:
                raise widening.refused("no such entry in this memory")
            state = self.bot_memory.learning_state(pool, ws)
            now = self.clock()
            changed = widening.widen(state, entry_id, grant, requester=requester, now=now)
            pending = None
            version = pool.version
            if changed is not None:
                version += 1
                row = LogRow(
                    version=version, at=now, who=Who.PERSON, entry=entry_id, change=Change.UPDATED
                )
                pending = self._queue(
                    pool, Outcome(version=version, upserts=(changed,), log=(row,))
                )
        await self._settle(pool, pending, reads_state=False)
        return {"id": entry_id, "to": grant, "widened": changed is not None, "version": version}

    # --- memory-bot settings (MB-2) ------------------------------------------------------------

    async def memory_bot_settings(self, pool_id: str) -> MemoryBotSettings:
        pool = await self._pool(pool_id)
        async with pool.lock.shared():
            settings, pending = pool.stored.settings, pool.pending
        await self._settle(pool, pending)
        return settings

    async def patch_memory_bot_settings(
        self, pool_id: str, patch: SettingsPatch
    ) -> MemoryBotSettings:
        pool = await self._pool(pool_id)
        async with pool.lock.exclusive():
            settings = apply_patch(pool.stored.settings, patch)
            pool.stored.settings = settings
            row = self.store.pool_row(pool.stored, pool.version, settings)
            pending = self._submit(pool, [row])
        await self._settle(pool, pending, reads_state=False)
        self.learning.wake(pool_id)  # a new budget may let waiting learning run (MB-3)
        return settings

    # --- entries written by the memory bot (facts, observations) ---------------------------------

    async def add_entries(
        self, pool_id: str, entries: Iterable[tuple[EntryMeta, str]], who: Who = Who.MEMORY_BOT
    ) -> int:
        """Store entries the memory bot learned (validated by its caller); returns the version."""
        pool = await self._pool(pool_id)
        async with pool.lock.exclusive():
            now = self.clock()
            version = pool.version + 1
            metas: list[EntryMeta] = []
            sealed: dict[str, bytes] = {}
            for meta, content in entries:
                if meta.pool != pool_id or meta.id in pool.entries or meta.id in sealed:
                    raise InvalidInput(f"entry {meta.id} does not fit pool {pool_id}")
                metas.append(meta)
                sealed[meta.id] = self.store.seal_content(pool.stored, meta.id, content)
            log = tuple(
                LogRow(version=version, at=now, who=who, entry=m.id, change=Change.CREATED)
                for m in metas
            )
            outcome = Outcome(version=version, upserts=tuple(metas), log=log)
            pending = self._queue(pool, outcome, sealed)
        await self._settle(pool, pending, reads_state=False)
        return version

    async def set_status(self, pool_id: str, entry_id: str, status: Status) -> int:
        """Invalidate (or otherwise re-status) an entry as the memory bot: tags and ciphertext are
        untouched (LRN-8)."""
        pool = await self._pool(pool_id)
        async with pool.lock.exclusive():
            meta = pool.entries.get(entry_id)
            if meta is None:
                raise NotFound(f"no entry {entry_id}")
            now = self.clock()
            changed = msgspec.structs.replace(
                meta,
                status=status,
                updated_at=now,
                invalidated_at=now if status == Status.INVALIDATED else meta.invalidated_at,
                revision=meta.revision + 1,
            )
            version = pool.version + 1
            change = Change.INVALIDATED if status == Status.INVALIDATED else Change.UPDATED
            row = LogRow(version=version, at=now, who=Who.MEMORY_BOT, entry=entry_id, change=change)
            pending = self._queue(pool, Outcome(version=version, upserts=(changed,), log=(row,)))
        await self._settle(pool, pending, reads_state=False)
        return version

    # --- lifecycle ---

    async def ping(self) -> int:
        self._ensure_started()
        return self.index

    async def lock_violations(self) -> list[str]:
        """What the pool-lock guard caught in this process (actors/runtime/lock_guard.py; tests)."""
        return list(lock_guard.violations)

    async def metrics(self) -> dict:
        """This process's figures for `GET /metrics` (storage/stats.py)."""
        return STATS.snapshot()

    async def stats(self) -> dict[str, int]:
        return {
            "pools": len(self._pools),
            "workspace_pools": len(self.workspace._pools),
            "chats": len(self.conversations._logs),
            "resident_records": self.residency.total,
            "evictions": self.residency.evictions,
            "transactions": self.committer.transactions,
            "batches": self.committer.batches,
        }

    async def backup(self, dest_dir: str) -> str:
        """A consistent copy of this shard's file in `dest_dir` (everything committed so far)."""
        await self.committer.drain()
        dest = Path(dest_dir) / f"shard-{self.index}.duckdb"
        await self.db.snapshot(dest, [MARK_RESTORED])
        return str(dest)

    async def flush(self) -> None:
        await self.committer.drain()

    async def close(self) -> None:
        if self.workspace.semantic is not None:
            await self.workspace.semantic.close()
        await self.committer.close()
        self.db.close()

    # --- workspace (issue 5) ---

    async def ws_projects(self, user: str) -> list[ProjectView]:
        return await self.workspace.projects_of(user)

    async def ws_save_project(
        self, actor: str, org: str, request: ProjectCreate | ProjectChange, project_id: str
    ) -> ProjectView:
        return await self.workspace.save_project(actor, org, request, project_id)

    async def search_idle(self) -> None:
        """Wait until the background has embedded what was written (benchmarks, tests)."""
        if self.workspace.semantic is not None:
            await self.workspace.semantic.idle()

    async def ws_entries(self, access: WsAccess, query: WsQuery) -> WsListing:
        return await self.workspace.entries(access, query)

    async def ws_create_memory(self, access: WsAccess, body: WsMemoryCreate) -> WsEntryView:
        return await self.workspace.create_memory(access, body)

    async def ws_change_memory(
        self, access: WsAccess, body: WsMemoryChange | WsForget
    ) -> WsEntryView:
        return await self.workspace.change_memory(access, body)

    async def ws_has_entry(self, entry_id: str) -> bool:
        return await self.workspace.has_entry(entry_id)

    async def ws_revisions(self, access: WsAccess, entry_id: str) -> list[RevisionView]:
        return await self.workspace.revisions(access, entry_id)

    async def ws_barriers(self, pool_id: str) -> list[ForgetBarrier]:
        return await self.workspace.barriers(pool_id)

    async def ws_blocked(
        self, pool_id: str, content: str, evidence: Sequence[str] = ()
    ) -> ForgetBarrier | None:
        return await self.workspace.blocked(pool_id, content, evidence)

    async def ws_extract(
        self,
        pool_id: str,
        contributor: str,
        proposals: Sequence[Extraction],
        sources: Sequence[SourceItem],
        request_id: str,
        now: int | None = None,
    ) -> list[Decision]:
        return await self.workspace.extract(
            pool_id, contributor, proposals, sources, request_id, now
        )
