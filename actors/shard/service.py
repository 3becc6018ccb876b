"""The shard actor's RPC surface: one DuckDB file and the accounts, chats and pools it hosts.

A thin facade. `ShardKernel` (actors/shard/kernel.py) owns the file, the commit pipeline, the
event log, the keys and the loaded pools with their locks; each feature is built here with the
kernel and the collaborators it names, and every method below hands a call to one of them:

- the seed-000 memory API (actors/shard/memory_ops.py) over a bot's one memory (bot_memory.py);
- chats: logs (actors/chats/chat_logs.py), direct and group turns (conversations.py,
  group_turns.py), bot steps (bot_step.py), collaboration chains (chains.py), requests;
- learning executions (actors/learning/runs.py) with the memory-bot runtime;
- the workspace: pools, projects, receipts, scoped memory, semantic search (actors/workspace/).

`ShardService` is a plain class (tests drive it without Ray); `ShardActor` wraps it for Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from actors.chats.bot_step import BotStepper
from actors.chats.chains import ChainRunner
from actors.chats.chat_logs import ChatLogs
from actors.chats.conversations import Conversations
from actors.chats.group_turns import GroupTurns
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
    WorkspaceAccess,
    WorkspaceListing,
    WorkspaceQuery,
)
from actors.learning.jobs import find_job, jobs_for
from actors.learning.memory_bot_runtime import MemoryBotRuntime
from actors.learning.runs import LearningRunner
from actors.models.embeddings import Embedder, search_settings
from actors.models.node_hub import where_runs
from actors.models.registry import Model, load_models
from actors.runtime import lock_guard
from actors.runtime.node_hub_handle import RayNodeHub
from actors.runtime.peers import Peers
from actors.shard.agent_lookup import AgentChatLookup
from actors.shard.kernel import ShardKernel, new_entry_id, now_ms
from actors.shard.memory_ops import MemoryOps
from actors.shard.memory_reader import MemoryReader
from actors.shard.workspace_writes import WorkspaceWrites
from actors.workspace.access import WorkspaceRules
from actors.workspace.listing import WorkspaceListings
from actors.workspace.pools import WorkspacePools
from actors.workspace.projects import Projects
from actors.workspace.receipts import WorkspaceReceipts
from actors.workspace.semantic import semantic_search
from actors.workspace.service import Workspace
from engine.chat_records import Confession, Enrichment, ItemView, LearningJob, Turn
from engine.directory import Bot, Channel, Chat, Org
from engine.events import Audience, Event, Payload, ShardHead
from engine.memory_bot_settings import MemoryBotSettings, SettingsPatch
from engine.memory_entries import (
    Context,
    EntryMeta,
    EntryView,
    LogPage,
    MemoryPage,
    Reader,
    SearchPage,
    Status,
    Who,
)
from engine.projects import ProjectChange, ProjectCreate, ProjectView
from engine.requests import RequestView
from engine.scoped_memory import (
    Decision,
    Extraction,
    ForgetBarrier,
    SourceItem,
    WorkspaceEntryView,
    WorkspaceForget,
    WorkspaceMemoryChange,
)
from engine.turns import ANSWER_WAIT
from storage.chat_store import ChatStore
from storage.stats import STATS
from storage.workspace_store import WorkspaceStore

__all__ = ["ShardService", "TurnStart"]


class ShardService(WorkspaceWrites, AgentChatLookup):
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
        kernel = self.kernel = ShardKernel(
            data_dir,
            index,
            group_commit=group_commit,
            clock=clock,
            new_id=new_id,
            db_path=db_path,
            event_retain=event_retain,
            cache_records=cache_records,
        )
        self.db, self.committer, self.events = kernel.db, kernel.committer, kernel.events
        self.store, self.receipts, self.residency = kernel.store, kernel.receipts, kernel.residency
        self.peers = peers = Peers(
            self, index, prefix=prefix, count=shard_count, namespace=namespace
        )
        if models is None:
            base = Path(config_dir) if config_dir else Path(".")
            models = load_models(
                models_config or {}, base_dir=base, hub=RayNodeHub(prefix or "openbot")
            )
        fusion = search_settings(search, models_config)
        # The workspace's pools first: a bot's one memory reads its records through them.
        self.workspace_pools = WorkspacePools(
            kernel,
            WorkspaceStore(kernel.db, kernel.master),
            peers,
            context_window_ms=int(fusion.context_window_s * 1000),
        )
        self.semantic = semantic_search(
            kernel,
            self.workspace_pools,
            search,
            models_config,
            base_dir=Path(config_dir or "."),
            embedder=embedder,
        )
        self.memory_reader = MemoryReader(kernel, self.workspace_pools)
        self.memory = MemoryOps(kernel, self.memory_reader)
        receipts = WorkspaceReceipts(kernel)
        self.projects = Projects(kernel, self.workspace_pools.store, receipts, peers)
        rules = WorkspaceRules(self.workspace_pools, self.projects, peers, index)
        self.workspace = Workspace(
            kernel, self.workspace_pools, self.projects, receipts, self.memory, rules, self.semantic
        )
        self.listings = WorkspaceListings(
            kernel, self.workspace_pools, self.projects, rules, self.memory_reader, self.semantic
        )
        self.chats = chats = ChatStore(kernel.store)
        self.memory_bot = MemoryBotRuntime(
            models, chats, kernel.committer, kernel.clock, answer_wait=answer_wait
        )
        self.chat_logs = ChatLogs(kernel, chats)
        self.learning = LearningRunner(
            kernel, chats, self.memory_bot, self.memory_reader, self.chat_logs, peers
        )
        self.requests = Requests(kernel, peers)
        self.chains = ChainRunner(kernel, self.chat_logs, peers)
        self.conversations = Conversations(
            kernel,
            self.chat_logs,
            self.memory_bot,
            self.learning,
            BotStepper(kernel, self.memory_bot, chats, self.memory, self.requests, peers),
            GroupTurns(self.chat_logs, self.chains, peers),
            self.chains,
            self.requests,
            peers,
        )
        # After a (re)start: open learning jobs (LRN-4), then collaboration chains.
        kernel.on_start(self.learning.recover)
        kernel.on_start(self.chains.resume)

    # --- events ---

    async def emit(self, items: Sequence[tuple[Payload, Audience]]) -> int:
        return await self.kernel.emit(items)

    async def event_head(self) -> ShardHead:
        return self.kernel.events.head()

    # --- chats and the memory bot (seed 000 §3-§5) ---

    async def start_turn(self, start: TurnStart, wait: bool = False) -> Turn | TurnResult:
        self.kernel.ensure_started()  # with `wait` (?wait=true): the ended turn, in one call
        return await self.conversations.start_turn(start, wait)

    async def wait_turn(self, chat: str, turn: str, timeout: float = 180.0) -> TurnResult:
        return await self.conversations.wait_turn(chat, turn, timeout)

    async def run_step(
        self, step: StepInput, mirror: tuple[Mirrored, ...] = (), learn_upto: int = 0
    ) -> StepOutcome:
        self.kernel.ensure_started()
        return await self.conversations.run_step(step, mirror, learn_upto)

    async def schedule_learning(
        self, bot: Bot, chat: Chat, turn: str, upto: int, grant: str, org: Org, deferred: bool
    ) -> str | None:
        self.kernel.ensure_started()
        return await self.conversations.schedule_learning(
            bot, chat, turn, upto, grant, org, deferred
        )

    async def memory_jobs(
        self, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> list[LearningJob]:
        return await jobs_for(self.kernel, self.chats, pools, user, channels)

    async def retry_memory_job(
        self, job_id: str, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> LearningJob | None:
        job = await find_job(self.chats, job_id, pools, user, channels)
        return None if job is None else await self.learning.retry(job)

    async def release_learning(self, job_id: str, upto: int) -> bool:
        return await self.learning.release(job_id, upto)

    async def chat_item(self, chat: str, seq: int) -> ItemView | None:
        self.kernel.ensure_started()
        return await self.chat_logs.one_item(chat, seq)

    async def post_item(self, chat: Chat, author: str, text: str) -> ItemView:
        return await self.chat_logs.say_view(chat, "bot", author, text)

    async def collaborations(self, user: str, channels: frozenset[str]) -> list[ChainView]:
        self.kernel.ensure_started()
        return await self.chains.listing(user, channels)

    async def stop_collaboration(
        self, chain_id: str, user: str, channels: frozenset[str]
    ) -> ChainView | None:
        return await self.chains.stop_visible(chain_id, user, channels)

    # --- requests (approvals, ENR-3) ---

    async def requests_of(
        self, user: str, channels: frozenset[str], status: str | None = None
    ) -> list[RequestView]:
        return await self.requests.listing(user, channels, status)

    async def request(self, request_id: str, user: str, channels: frozenset[str]):
        return await self.requests.find_view(request_id, user, channels)

    async def decide_request(
        self, request_id: str, user: str, channels: frozenset[str], approved: bool, note: str
    ) -> RequestView | None:
        return await self.requests.decide(request_id, user, channels, approved, note)

    async def notify(self, chat: Chat, author: str, text: str) -> ItemView:
        return await self.chat_logs.say_view(chat, "notification", author, text)

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
        self.kernel.ensure_started()
        return await self.conversations.switch_mode(chat, channel, mode, leader)

    async def bot_node(self, model_name: str | None) -> NodeInfo:
        return await where_runs(self.memory_bot.model(model_name))

    async def chains_idle(self) -> None:
        await self.chains.idle()

    async def chat_items(self, chat: str) -> list[ItemView]:
        self.kernel.ensure_started()
        return await self.chat_logs.items(chat)

    async def delete_chat_items(self, chat: str, record: Chat | None = None) -> int:
        return await self.chat_logs.delete_items(chat, record)

    async def confessions(self, chat: str) -> list[Confession]:
        return await self.chat_logs.confessions(chat)

    async def enrichments(self, chat: str) -> list[Enrichment]:
        return await self.chat_logs.enrichments(chat)

    async def learning_jobs(self, pool_id: str) -> list[LearningJob]:
        return await self.chats.jobs(pool_id)

    async def learning_idle(self) -> int:
        """Wait until no learning job runs; returns how many model steps were made so far."""
        await self.kernel.started()
        await self.learning.idle()
        return self.learning.model_steps

    async def events_after(
        self, seq: int, limit: int = 1000, wait: float = 0.0
    ) -> tuple[ShardHead, list[Event]]:
        """Published events after `seq` (long-polls up to `wait` s when there are none yet)."""
        # Polled continuously: after a restart the first poll starts recovery (jobs, chains).
        self.kernel.ensure_started()
        events, head = await self.kernel.events.page(seq, limit=limit, wait=wait)
        return head, events

    # --- seed-000 memory API (actors/shard/memory_ops.py) ------------------------------------

    async def read_memory(
        self, pool_id: str, reader: Reader, tags: Sequence[str] = ()
    ) -> MemoryPage:
        return await self.memory.read_memory(pool_id, reader, tags)

    async def read_memory_json(
        self, pool_id: str, reader: Reader, tags: Sequence[str] = ()
    ) -> tuple[str, int, bytes]:
        return await self.memory.read_memory_json(pool_id, reader, tags)

    async def search_memory_json(self, pool_id: str, reader: Reader, q: str, limit: int) -> bytes:
        return await self.memory.search_memory_json(pool_id, reader, q, limit)

    async def search_memory_page(
        self, pool_id: str, reader: Reader, q: str, limit: int
    ) -> SearchPage:
        return await self.memory.search_memory_page(pool_id, reader, q, limit)

    async def memory_log_json(self, pool_id: str, reader: Reader) -> bytes:
        return await self.memory.memory_log_json(pool_id, reader)

    async def remember(
        self,
        pool_id: str,
        reader: Reader,
        content: str,
        topics: Sequence[str] = (),
        request_id: str | None = None,
    ) -> EntryView:
        return await self.memory.remember(pool_id, reader, content, topics, request_id)

    async def remember_packed(self, call: bytes) -> bytes:  # a RememberCall in, JSON out
        return await self.memory.remember_packed(call)

    async def forget(
        self,
        pool_id: str,
        reader: Reader,
        entry_id: str,
        request_id: str | None = None,
        expected_revision: int | None = None,
    ) -> EntryView:
        return await self.memory.forget(pool_id, reader, entry_id, request_id, expected_revision)

    async def purge(self, pool_id: str, tag: str) -> int:
        return await self.memory.purge(pool_id, tag)

    async def memory_log(self, pool_id: str, reader: Reader) -> LogPage:
        return await self.memory.memory_log(pool_id, reader)

    async def context(self, pool_id: str, reader: Reader, limit: int) -> Context:
        return await self.memory.context(pool_id, reader, limit)

    async def context_parts(
        self, pool_id: str, reader: Reader, limit: int
    ) -> tuple[list[tuple[str, str]], bool]:
        return await self.memory.context_parts(pool_id, reader, limit)

    async def has_entries(self, pool_id: str, reader: Reader) -> bool:
        return await self.memory.has_entries(pool_id, reader)

    async def validate_references(
        self, pool_id: str, reader: Reader, entry_ids: Sequence[str]
    ) -> bool:
        return await self.memory.validate_references(pool_id, reader, entry_ids)

    async def memory_texts(self, pool_id: str, reader: Reader) -> list[tuple[str, str]]:
        return await self.memory.memory_texts(pool_id, reader)

    async def search_memory(
        self, pool_id: str, reader: Reader, query: str, limit: int = 10
    ) -> list[tuple[str, str]]:
        return await self.memory.search_memory(pool_id, reader, query, limit)

    async def widen(
        self, pool_id: str, entry_id: str, grant: str, requester: str
    ) -> dict[str, object]:
        return await self.memory.widen(pool_id, entry_id, grant, requester)

    async def memory_bot_settings(self, pool_id: str) -> MemoryBotSettings:
        return await self.memory.memory_bot_settings(pool_id)

    async def add_entries(
        self, pool_id: str, entries: Iterable[tuple[EntryMeta, str]], who: Who = Who.MEMORY_BOT
    ) -> int:
        return await self.memory.add_entries(pool_id, entries, who)

    async def set_status(self, pool_id: str, entry_id: str, status: Status) -> int:
        return await self.memory.set_status(pool_id, entry_id, status)

    async def patch_memory_bot_settings(
        self, pool_id: str, patch: SettingsPatch
    ) -> MemoryBotSettings:
        settings = await self.memory.patch_memory_bot_settings(pool_id, patch)
        self.learning.wake(pool_id)  # a new budget may let waiting learning run (MB-3)
        return settings

    # --- lifecycle ---

    async def ping(self) -> int:
        self.kernel.ensure_started()
        return self.index

    async def lock_violations(self) -> list[str]:
        """What the pool-lock guard caught in this process (actors/runtime/lock_guard.py; tests)."""
        return list(lock_guard.violations)

    async def metrics(self) -> dict:
        """This process's figures for `GET /metrics` (storage/stats.py)."""
        return STATS.snapshot()

    async def stats(self) -> dict[str, int]:
        counts = {"workspace_pools": len(self.workspace_pools), "chats": len(self.chat_logs)}
        return counts | self.kernel.stats()

    async def backup(self, dest_dir: str) -> str:
        return await self.kernel.backup(dest_dir)

    async def flush(self) -> None:
        await self.committer.drain()

    async def close(self) -> None:
        if self.semantic is not None:
            await self.semantic.close()
        await self.kernel.close()

    # --- workspace (issue 5) ---

    async def workspace_projects(self, user: str) -> list[ProjectView]:
        return await self.projects.projects_of(user)

    async def workspace_save_project(
        self, actor: str, org: str, request: ProjectCreate | ProjectChange, project_id: str
    ) -> ProjectView:
        return await self.projects.save_project(actor, org, request, project_id)

    async def search_idle(self) -> None:
        """Wait until the background has embedded what was written (benchmarks, tests)."""
        if self.semantic is not None:
            await self.semantic.idle()

    async def workspace_entries(
        self, access: WorkspaceAccess, query: WorkspaceQuery
    ) -> WorkspaceListing:
        return await self.listings.entries(access, query)

    async def workspace_change_memory(
        self, access: WorkspaceAccess, body: WorkspaceMemoryChange | WorkspaceForget
    ) -> WorkspaceEntryView:
        return await self.workspace.change_memory(access, body)

    async def workspace_has_entry(self, entry_id: str) -> bool:
        return await self.workspace.has_entry(entry_id)

    async def workspace_revisions(
        self, access: WorkspaceAccess, entry_id: str
    ) -> list[RevisionView]:
        return await self.workspace.revisions(access, entry_id)

    async def workspace_barriers(self, pool_id: str) -> list[ForgetBarrier]:
        return await self.workspace.barriers(pool_id)

    async def workspace_blocked(
        self, pool_id: str, content: str, evidence: Sequence[str] = ()
    ) -> ForgetBarrier | None:
        return await self.workspace.blocked(pool_id, content, evidence)

    async def workspace_extract(
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
