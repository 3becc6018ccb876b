"""The shard actor's RPC surface: one DuckDB file and the accounts, chats and pools it hosts.

A thin facade. `ShardKernel` (actors/shard/kernel.py) owns the file, the commit pipeline, the
event log, the keys and the loaded pools with their locks; each feature is built here with the
kernel and the collaborators it names, and the table at the end of this module says which feature
answers each call (actors/facade.py builds it into methods once):

- a bot's memory (actors/shard/memory_ops.py) over its one visibility-checked read
  (memory_reader.py), and the calls that carry one bytes each way (packed.py);
- chats: logs (actors/chats/chat_logs.py), direct and group turns (conversations.py,
  group_turns.py), bot steps (bot_step.py), collaboration chains (chains.py), requests;
- learning executions (actors/learning/runs.py) with the memory-bot runtime;
- the workspace: pools, projects, receipts, scoped memory, semantic search (actors/workspace/).

`ShardService` is a plain class (tests drive it without Ray); `ShardActor` wraps it for Ray.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from actors.chats.bot_step import BotStepper
from actors.chats.chains import ChainRunner
from actors.chats.chat_logs import ChatLogs
from actors.chats.chat_search import ChatSearch
from actors.chats.conversations import Conversations
from actors.chats.decision_wakes import DecisionWakes
from actors.chats.group_turns import GroupTurns
from actors.chats.requests import Requests
from actors.contracts import (
    NodeInfo,
    TurnStart,
)
from actors.facade import answered_by
from actors.learning.jobs import find_job, jobs_for
from actors.learning.memory_bot_runtime import MemoryBotRuntime
from actors.learning.runs import LearningRunner
from actors.models.embeddings import Embedder, search_settings
from actors.models.node_hub import where_runs
from actors.models.registry import Model, load_models
from actors.ports import ShardPort
from actors.runtime import lock_guard
from actors.runtime.node_hub_proxy import RayNodeHub
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, new_entry_id, now_ms
from actors.shard.memory_ops import MemoryOps
from actors.shard.memory_reader import MemoryReader
from actors.shard.packed import PackedCalls
from actors.workspace.access import WorkspaceRules
from actors.workspace.listing import WorkspaceListings
from actors.workspace.pools import WorkspacePools
from actors.workspace.projects import Projects
from actors.workspace.receipts import WorkspaceReceipts
from actors.workspace.semantic import semantic_search
from actors.workspace.service import Workspace
from engine.chat_records import ItemView, LearningJob
from engine.directory import Chat
from engine.errors import InvalidInput
from engine.events import Event, ShardHead
from engine.memory_bot_settings import (
    MemoryBotSettings,
    MemoryBotView,
    SettingsPatch,
    SpendView,
)
from engine.memory_bot_settings import view as settings_view
from engine.turns import ANSWER_WAIT
from storage.chat_store import ChatStore
from storage.group_commit import DeleteWhere, Insert
from storage.stats import STATS
from storage.workspace_store import WorkspaceStore

__all__ = ["ShardService", "TurnStart"]


class ShardService:
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
            kernel=kernel,
            store=WorkspaceStore(kernel.db, kernel.master),
            peers=peers,
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
        self.projects = Projects(
            kernel=kernel, store=self.workspace_pools.store, receipts=receipts, peers=peers
        )
        rules = WorkspaceRules(
            pools=self.workspace_pools, projects=self.projects, peers=peers, index=index
        )
        self.workspace = Workspace(
            kernel=kernel,
            pools=self.workspace_pools,
            projects=self.projects,
            receipts=receipts,
            memory=self.memory,
            rules=rules,
            semantic=self.semantic,
        )
        self.packed = PackedCalls(kernel=kernel, memory=self.memory, workspace=self.workspace)
        self.listings = WorkspaceListings(
            kernel=kernel,
            pools=self.workspace_pools,
            projects=self.projects,
            rules=rules,
            memory=self.memory_reader,
            semantic=self.semantic,
        )
        self.chats = chats = ChatStore(kernel.store)
        self.memory_bot = MemoryBotRuntime(
            models=models,
            chats=chats,
            committer=kernel.committer,
            clock=kernel.clock,
            answer_wait=answer_wait,
        )
        self.chat_logs = ChatLogs(kernel, chats)
        self.chat_search = ChatSearch(
            kernel=kernel, logs=self.chat_logs, store=chats, semantic=self.semantic
        )
        self.learning = LearningRunner(
            kernel=kernel,
            store=chats,
            runtime=self.memory_bot,
            memory=self.memory_reader,
            logs=self.chat_logs,
            peers=peers,
        )
        self.requests = Requests(kernel, peers)
        self.chains = ChainRunner(kernel=kernel, logs=self.chat_logs, peers=peers)
        self.conversations = Conversations(
            kernel=kernel,
            logs=self.chat_logs,
            runtime=self.memory_bot,
            learning=self.learning,
            stepper=BotStepper(
                kernel=kernel,
                runtime=self.memory_bot,
                store=chats,
                memory=self.memory,
                requests=self.requests,
                peers=peers,
                keyword_only=self.semantic is None,
            ),
            groups=GroupTurns(logs=self.chat_logs, chains=self.chains, peers=peers),
            chains=self.chains,
            requests=self.requests,
            peers=peers,
        )
        self._importing = asyncio.Lock()
        self.decision_wakes = DecisionWakes(logs=self.chat_logs, chains=self.chains)
        # After a (re)start: open learning jobs (LRN-4), collaboration chains, then decided
        # requests whose bot was not woken yet (ENR-3).
        kernel.on_start(self.learning.recover)
        kernel.on_start(self.chains.resume)
        kernel.on_start(self.requests.resume)

    # --- the calls with a body of their own; every other call is in the table below ---

    async def event_head(self) -> ShardHead:
        return self.kernel.events.head()

    async def events_after(
        self, seq: int, limit: int = 1000, wait: float = 0.0
    ) -> tuple[ShardHead, list[Event]]:
        """Published events after `seq` (long-polls up to `wait` s when there are none yet)."""
        # Polled continuously: after a restart the first poll starts recovery (jobs, chains).
        self.kernel.ensure_started()
        events, head = await self.kernel.events.page(seq, limit=limit, wait=wait)
        return head, events

    async def memory_jobs(
        self, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> list[LearningJob]:
        return await jobs_for(self.kernel, self.chats, pools, user, channels)

    async def retry_memory_job(
        self, job_id: str, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> LearningJob | None:
        job = await find_job(self.chats, job_id, pools, user, channels)
        return None if job is None else await self.learning.retry(job)

    async def post_item(self, chat: Chat, author: str, text: str) -> ItemView:
        return await self.chat_logs.say_view(chat, "bot", author, text)

    async def notify(self, chat: Chat, author: str, text: str) -> ItemView:
        return await self.chat_logs.say_view(chat, "notification", author, text)

    async def bot_node(self, model_name: str | None) -> NodeInfo:
        return await where_runs(self.memory_bot.model(model_name))

    async def import_rows(
        self, rows: list[tuple[str, list[tuple]]], removed: list[tuple[str, str, tuple]] = ()
    ) -> int:
        """The rows an import into the running server made for this shard (`POST
        /v1/admin/import`: new ids only, checked before), in one transaction with the deletes
        of what an interrupted import of the same ids left (`removed`: table, key column,
        keys); then what keeps a whole table in memory learns of them. Returns how many rows
        were stored."""
        await self.kernel.started()
        batch = Batch()
        for table, column, keys in removed:
            batch.add(DeleteWhere(table, column, tuple(keys)))
        for table, added in rows:
            batch.extend(Insert(table, tuple(row)) for row in added)
        gone = {k for table, _, keys in removed if table == "pools" for k in keys}
        pools = [
            r[0] for table, added in rows if table == "pools" for r in added if r[0] not in gone
        ]
        async with self._importing:  # the check and the commit with no other import between
            taken = await self.db.run(
                lambda con: con.execute(
                    "SELECT DISTINCT pool FROM pools WHERE pool IN (SELECT unnest($1))", [pools]
                ).fetchall()
            )
            if taken:
                # Two pool keys for one pool would leave one set of rows unreadable.
                raise InvalidInput(
                    f"shard {self.index} already holds {sorted(p for (p,) in taken)[:20]}",
                    code="id_clash",
                )
            await self.kernel.commit(batch)
        for pool in {*gone, *pools}:  # read with the imported keys from now on
            if pool.startswith("chat:"):
                self.chat_logs.forget(pool.removeprefix("chat:"))
            else:
                self.workspace_pools.evict(pool)
                self.kernel.evict(pool)
        self.projects.drop()
        await self.requests.reload()
        chains = [row[0] for table, added in rows if table == "chains" for row in added]
        await self.chains.records.adopt(chains)
        return len(batch.writes)

    async def learning_idle(self) -> int:
        """Wait until no learning job runs; returns how many model steps were made so far."""
        await self.kernel.started()
        await self.learning.idle()
        return self.learning.model_steps

    async def memory_bot_view(self, pool_id: str, orgs: tuple[str, ...] = ()) -> MemoryBotView:
        """The memory bot's settings with its spend this day and month (MB-2, MB-6), and the
        part of it each of `orgs` (the orgs the bot works in) spent."""
        settings = await self.memory.memory_bot_settings(pool_id)
        totals = await self.memory_bot.totals(pool_id)
        by_org = await self.memory_bot.org_totals(pool_id, orgs)
        spend = tuple(
            SpendView(period=p, micros=m, unknownCalls=u, orgs=o)
            for (p, m, u), o in zip(totals, by_org, strict=True)
        )
        return settings_view(settings, spend)

    async def patch_memory_bot_settings(
        self, pool_id: str, patch: SettingsPatch
    ) -> MemoryBotSettings:
        settings = await self.memory.patch_memory_bot_settings(pool_id, patch)
        self.learning.wake(pool_id)  # a new budget may let waiting learning run (MB-3)
        return settings

    async def search_idle(self) -> None:
        """Wait until the background has embedded what was written (benchmarks, tests)."""
        if self.semantic is not None:
            await self.semantic.idle()

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
        return counts | self.chains.records.stats() | self.memory_bot.stats() | self.kernel.stats()

    async def close(self) -> None:
        if self.semantic is not None:
            await self.semantic.close()
        await self.kernel.close()


def _started(shard: ShardService) -> None:
    shard.kernel.ensure_started()  # after a restart, the first such call starts recovery


# Every other shard call, by the feature that answers it (actors/facade.py): `call` is answered
# by the feature's method of the same name, `call:method` by another.
answered_by(
    ShardService,
    {
        "kernel": "emit backup",
        "committer": "flush:drain",
        "chats": "learning_jobs:jobs",
        # a bot's memory (memory_ops.py)
        "memory": "read_memory read_memory_json"
        " memory_log_json remember remember_packed forget purge memory_log context"
        " context_parts has_entries validate_references memory_texts widen"
        " memory_bot_settings add_entries set_status",
        # one bytes each way (packed.py)
        "packed": "events_packed remember_many remember_many_followed"
        " workspace_create_memory_json workspace_create_memory_packed"
        " workspace_create_memory_many workspace_create_memory_many_followed",
        # turns, steps and chat logs
        "conversations": "start_turn wait_turn run_step schedule_learning verdict chat_busy:busy"
        " switch_group_mode:switch_mode",
        "learning": "release_learning:release",
        "chat_search": "search_chats:search",
        "chat_logs": "chat_item:one_item chat_items:items delete_chat_items:delete_items"
        " confessions enrichments chat_updated:announce_update",
        "chains": "collaborations:listing stop_collaboration:stop_visible chains_idle:idle"
        " find_agent_chat send_stored",
        "requests": "requests_of:listing request:find_view decide_request:decide attach_review"
        " open_request:open requests_idle:idle",
        "decision_wakes": "wake_on_decision:wake",
        # the workspace
        "projects": "workspace_projects:projects_of workspace_save_project:save_project",
        "listings": "workspace_entries:entries search_memory_json search_memory_page",
        "workspace": "workspace_create_memory:create_memory"
        " workspace_change_memory:change_memory workspace_has_entry:has_entry"
        " workspace_revisions:revisions workspace_barriers:barriers workspace_blocked:blocked"
        " workspace_extract:extract workspace_purge_learned:purge_learned",
    },
    port=ShardPort,
    before=_started,
    before_calls=[
        "start_turn",
        "run_step",
        "schedule_learning",
        "chat_item",
        "chat_items",
        "search_chats",
        "collaborations",
        "switch_group_mode",
        "decide_request",
        "wake_on_decision",
    ],
)
