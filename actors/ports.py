"""The ports: what one actor (or a gateway) asks of another, as typed Protocols over the
messages of actors/contracts.py. A port is the one declaration of an actor's calls: its local
implementation is the service class (what a test or the actor itself calls), and its Ray proxy
(what another process calls) is derived from it (actors/runtime/proxy.py). Adding a call is a
line here and its implementation in the feature that answers it (named in the service's table,
actors/facade.py). A gateway holds an `EnginePort` and never sees an actor handle. Imports
engine/, actors.contracts and stdlib only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from actors.contracts import (
    ACCESS_POLL_WAIT,
    ChainView,
    ChatFound,
    DecisionWake,
    Mirrored,
    NodeInfo,
    RevisionView,
    SentRef,
    StepInput,
    StepOutcome,
    TurnResult,
    TurnStart,
    Work,
    WorkspaceAccess,
    WorkspaceListing,
    WorkspaceQuery,
)
from engine.chat_records import Confession, Enrichment, ItemView, LearningJob, Turn
from engine.directory import (
    Bot,
    BotRules,
    Channel,
    Chat,
    ChatContext,
    Org,
    OrgSettings,
    Permission,
    Principal,
    User,
)
from engine.events import Event, ShardHead
from engine.listing import Page
from engine.memory_bot_settings import MemoryBotSettings, MemoryBotView, SettingsPatch
from engine.memory_entries import EntryView, Reader
from engine.models import Completion, Message, ToolSpec
from engine.projects import ProjectChange, ProjectCreate, ProjectView
from engine.requests import Proposal, RequestView
from engine.scoped_memory import (
    Decision,
    Extraction,
    SourceItem,
    WorkspaceEntryView,
    WorkspaceForget,
    WorkspaceMemoryChange,
    WorkspaceMemoryCreate,
)
from engine.self_rules import Editor, RulesUpdate

# --- ports: what one actor (or a gateway) asks of another ----------------------------------------


class NodeHubPort(Protocol):
    """The node hub (actors/models/node_hub.py): gateways register the nodes connected to them
    and pull their work; shards put work in and await the answer. `NodeHubService` is the local
    implementation; actors/runtime/node_hub_proxy.py reaches the one named hub actor."""

    async def register(self, node: str, memory_isolation: bool, memory_extraction: bool) -> int: ...

    async def unregister(self, node: str, session: int) -> None: ...

    async def next_work(self, node: str, session: int, wait: float = 10.0) -> Work | None: ...

    async def complete(
        self, work_id: str, completion: Completion | None, error: str | None
    ) -> bool: ...

    async def run(
        self, node: str, messages: Sequence[Message], tools: Sequence[ToolSpec], timeout: float
    ) -> Completion: ...

    async def info(self, node: str) -> NodeInfo | None: ...

    async def nodes(self) -> list[NodeInfo]: ...


class ShardPort(Protocol):
    """What a shard asks of another shard (docs/design.md §3: an account's pools live on one
    shard, so a bot's step, its learning and a pool's records are served where they are kept),
    and what a gateway asks of a shard (below the first block). `ShardService` is the local
    implementation; actors/runtime/shard_proxy.py's `RayShard` reaches a shard actor."""

    async def run_step(
        self, step: StepInput, mirror: tuple[Mirrored, ...] = (), learn_upto: int = 0
    ) -> StepOutcome: ...

    async def schedule_learning(
        self, bot: Bot, chat: Chat, turn: str, upto: int, grant: str, org: Org, deferred: bool
    ) -> str | None: ...

    async def release_learning(self, job_id: str, upto: int) -> bool: ...

    async def send_stored(self, ref: SentRef) -> bool: ...

    async def notify(self, chat: Chat, author: str, text: str) -> ItemView: ...

    async def wake_on_decision(self, wake: DecisionWake) -> bool: ...

    async def post_item(self, chat: Chat, author: str, text: str) -> ItemView: ...

    async def workspace_entries(
        self, access: WorkspaceAccess, query: WorkspaceQuery, reader: Reader | None = None
    ) -> WorkspaceListing: ...

    async def workspace_extract(
        self,
        pool_id: str,
        contributor: str,
        proposals: Sequence[Extraction],
        sources: Sequence[SourceItem],
        request_id: str,
        now: int | None = None,
    ) -> list[Decision]: ...

    # --- what a gateway asks of a shard (gateway/: routes, the event hub, metrics) ---
    # turns and chat logs
    async def start_turn(self, start: TurnStart, wait: bool = False) -> Turn | TurnResult: ...
    async def verdict(
        self, chat: str, turn_id: str, user: str, accepted: bool, note: str
    ) -> Turn: ...
    async def chat_items(self, chat: str) -> list[ItemView]: ...
    async def chat_item(self, chat: str, seq: int) -> ItemView | None: ...
    async def search_chats(
        self, chats: Sequence[str], q: str, limit: int, using: str = "all"
    ) -> ChatFound: ...
    async def delete_chat_items(self, chat: str, record: Chat | None = None) -> int: ...
    async def chat_updated(self, chat: Chat, change: str) -> int: ...
    async def confessions(self, chat: str) -> list[Confession]: ...
    async def enrichments(self, chat: str) -> list[Enrichment]: ...
    async def switch_group_mode(
        self, chat: str, channel: str, mode: str, leader: str | None
    ) -> Channel: ...
    async def bot_node(self, model_name: str | None) -> NodeInfo: ...

    # events and figures
    async def event_head(self) -> ShardHead: ...
    async def events_after(
        self, seq: int, limit: int = 1000, wait: float = 0.0
    ) -> tuple[ShardHead, list[Event]]: ...
    async def metrics(self) -> dict: ...
    async def backup(self, dest_dir: str) -> str: ...

    # a bot's bot memory (the `_json` reads answer the HTTP body itself)
    async def read_memory_json(
        self, pool_id: str, reader: Reader, tags: Sequence[str] = ()
    ) -> tuple[str, int, bytes]: ...
    async def search_memory_json(
        self, pool_id: str, reader: Reader, q: str, limit: int
    ) -> bytes: ...
    async def memory_log_json(self, pool_id: str, reader: Reader) -> bytes: ...
    async def remember_packed(self, call: bytes) -> bytes: ...  # a RememberCall in, JSON out
    async def remember(
        self,
        pool_id: str,
        reader: Reader,
        content: str,
        topics: Sequence[str] = (),
        request_id: str | None = None,
    ) -> EntryView: ...
    async def forget(
        self,
        pool_id: str,
        reader: Reader,
        entry_id: str,
        request_id: str | None = None,
        expected_revision: int | None = None,
    ) -> EntryView: ...
    async def widen(
        self, pool_id: str, entry_id: str, grant: str, requester: str
    ) -> dict[str, object]: ...
    async def purge(self, pool_id: str, tag: str) -> int: ...
    async def memory_bot_settings(self, pool_id: str) -> MemoryBotSettings: ...
    async def memory_bot_view(self, pool_id: str, orgs: tuple[str, ...] = ()) -> MemoryBotView: ...
    async def patch_memory_bot_settings(
        self, pool_id: str, patch: SettingsPatch
    ) -> MemoryBotSettings: ...

    # rows an import into the running server made for this shard (`POST /v1/admin/import`)
    async def import_rows(
        self, rows: list[tuple[str, list[tuple]]], removed: list[tuple[str, str, tuple]] = ()
    ) -> int: ...

    # requests, collaborations, learning jobs
    async def requests_of(
        self, user: str, channels: frozenset[str], status: str | None = None
    ) -> list[RequestView]: ...
    async def request(
        self, request_id: str, user: str, channels: frozenset[str]
    ) -> RequestView | None: ...
    async def decide_request(
        self,
        request_id: str,
        user: str,
        channels: frozenset[str],
        approved: bool,
        note: str,
        wait: bool = False,
    ) -> RequestView | None: ...
    async def open_request(
        self, chat: Chat, bot: str, user: str, proposal: Proposal
    ) -> RequestView: ...
    async def attach_review(self, request_id: str, chat: str) -> RequestView: ...
    async def collaborations(
        self, user: str, channels: frozenset[str], after: str | None = None, limit: int = 200
    ) -> list[ChainView]: ...
    async def find_agent_chat(self, chat_id: str) -> Chat | None: ...
    async def stop_collaboration(
        self, chain_id: str, user: str, channels: frozenset[str]
    ) -> ChainView | None: ...
    async def memory_jobs(
        self, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> list[LearningJob]: ...
    async def retry_memory_job(
        self, job_id: str, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> LearningJob | None: ...

    # the workspace: projects and scoped memories
    async def workspace_projects(self, user: str) -> list[ProjectView]: ...
    async def workspace_save_project(
        self, actor: str, org: str, request: ProjectCreate | ProjectChange, project_id: str
    ) -> ProjectView: ...
    async def workspace_has_entry(self, entry_id: str) -> bool: ...
    # Deletes the user and project facts bot `bot` learned from `chat` (a purge of `chat:`).
    async def workspace_purge_learned(self, bot: str, chat: str) -> int: ...
    async def workspace_create_memory(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> WorkspaceEntryView: ...
    # The same answer as its JSON body (the HTTP answer as it is).
    async def workspace_create_memory_json(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> bytes: ...
    async def workspace_change_memory(
        self, access: WorkspaceAccess, body: WorkspaceMemoryChange | WorkspaceForget
    ) -> WorkspaceEntryView: ...
    async def workspace_revisions(
        self, access: WorkspaceAccess, entry_id: str
    ) -> list[RevisionView]: ...


class DirectoryPort(Protocol):
    """What a shard asks of the directory, and what a gateway asks of it (below the first
    block). `DirectoryService` is the local implementation; actors/runtime/directory_proxy.py's
    `RayDirectory` reaches the directory actor."""

    async def get_org(self, org_id: str) -> Org: ...

    async def get_chat(self, chat_id: str) -> Chat: ...

    async def get_channel(self, channel_id: str) -> Channel: ...

    async def get_bot(self, bot_id: str) -> Bot: ...

    async def find_bot(self, org: str, name_or_id: str) -> Bot: ...

    async def group_chat(self, channel_id: str) -> Chat: ...

    async def agent_chat(self, root: Chat, peer: str, chain: str, link: str) -> Chat: ...

    async def delivery_chat(
        self, root_id: str, peer: str, asker: str, chain: str, link: str
    ) -> tuple[Chat, Bot, Bot]: ...

    async def register_chats(self, chats: list[Chat], durable: bool = True) -> int: ...

    async def set_mode(self, channel_id: str, mode: str, leader: str | None) -> Channel: ...

    async def update_rules(self, bot_id: str, update: RulesUpdate, editor: Editor) -> Bot: ...

    async def create_member(
        self,
        creator_id: str,
        name: str,
        prompt: str | None,
        rules: dict | None,
        bot_id: str | None = None,
    ) -> Bot: ...

    async def archive_bot(self, bot_id: str, archived: bool, editor: Editor) -> Bot: ...

    async def project_owner(self, project_id: str) -> str | None: ...

    async def register_project(self, project_id: str, owner: str) -> str: ...

    async def workspace_people(
        self, org: str, users: list[str], channels: list[str]
    ) -> tuple[list[str], dict[str, tuple[str, ...]]]: ...

    # --- what a gateway asks of the directory (gateway/: auth, admin, chats, listings) ---
    # who is asking (gateway/auth.py's cache, kept at the access revision)
    async def authenticate_at(self, token_hash: str) -> tuple[int, Principal | None]: ...
    async def bot_at(self, bot_id: str) -> tuple[int, Bot]: ...
    async def chat_context_at(self, chat_id: str) -> tuple[int, ChatContext]: ...
    async def watch_access(
        self, watcher: str, since: int, wait: float = ACCESS_POLL_WAIT
    ) -> tuple[int, tuple[str, ...] | None]: ...  # (the keys changed since; None: all)
    async def unwatch_access(self, watcher: str) -> None: ...  # a gateway that stops

    # admin
    async def create_org(
        self, name: str, id: str | None = None, settings: OrgSettings | None = None
    ) -> Org: ...
    async def patch_org(self, org_id: str, settings: dict) -> Org: ...
    async def create_user(
        self, name: str, orgs: list[str], id: str | None = None
    ) -> tuple[User, str]: ...
    async def create_bot(
        self,
        *,
        name: str,
        org: str,
        owner: str,
        id: str | None = None,
        kind: str = "persistent",
        linked: bool = False,
        model: str | None = None,
        rules: BotRules | None = None,
        avatar: str | None = None,
    ) -> Bot: ...
    async def patch_bot(self, bot_id: str, changes: dict) -> Bot: ...
    async def grant(self, bot_id: str, user_id: str, permission: Permission) -> Bot: ...
    async def revoke_grant(self, bot_id: str, user_id: str) -> Bot: ...
    async def share_bot(self, bot_id: str, org_id: str) -> Bot: ...
    async def unshare_bot(self, bot_id: str, org_id: str) -> Bot: ...
    async def new_token(self, user_id: str) -> str: ...
    async def create_channel(
        self,
        *,
        org: str,
        people: list[str],
        bots: list[str],
        id: str | None = None,
        name: str = "",
        mode: str = "discussion",
        leader: str | None = None,
    ) -> Channel: ...
    async def backup(self, dest_dir: str) -> str: ...
    # the directory rows of an import into the running server (its commit point)
    async def import_records(self, rows: list[tuple[str, list[tuple]]]) -> int: ...

    # chats, bots and listings for a person
    async def create_chat(
        self,
        user_id: str,
        org: str | None,
        *,
        bot: str | None = None,
        channel: str | None = None,
        project: str | None = None,
        kind: str | None = None,
        project_org: str | None = None,
    ) -> Chat: ...
    async def chat_context(self, chat_id: str) -> ChatContext: ...
    async def set_chat_project(
        self, chat_id: str, user_id: str, project: str | None, project_org: str | None
    ) -> Chat: ...
    async def review_chat(self, request_id: str, user_id: str, org: str, bot_id: str) -> Chat: ...
    async def pause_auto_record(self, bot_id: str, paused: bool, user: str) -> Bot: ...
    async def list_chats(
        self, user_id: str, cursor: str | None, limit: int, kind: str | None = None
    ) -> Page: ...
    async def list_user_bots(self, user_id: str, cursor: str | None, limit: int) -> Page: ...
    async def list_user_channels(self, user_id: str, cursor: str | None, limit: int) -> Page: ...
    async def list_records(
        self, table: str, cursor: str | None, limit: int, org: str | None = None
    ) -> Page: ...


# --- the engine as a gateway holds it ---------------------------------------------------------


class EnginePort(Protocol):
    """What a gateway holds (gateway/app.py `create_app`): the engine's actors as ports and
    which shard keeps an account. actors/runtime/engine.py's `Engine` is the Ray
    implementation; the gateway never sees an actor handle."""

    @property
    def directory_port(self) -> DirectoryPort: ...
    @property
    def shard_ports(self) -> Sequence[ShardPort]: ...  # by shard index
    @property
    def node_hub(self) -> NodeHubPort: ...
    @property
    def data_dir(self) -> Path | None: ...
    @property
    def models(self) -> frozenset[str] | None: ...  # configured model names; None: not known

    def shard_index(self, account_id: str) -> int: ...
    def shard_port(self, account_id: str) -> ShardPort: ...
    async def backup(self, dest_dir: str | Path, *, with_key: bool = False) -> list[str]: ...
