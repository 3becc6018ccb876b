"""The actor ports (actors/ports.py) over Ray actor handles: typed methods that name the
remote method as an attribute, never as a string, and map Ray's failures as every actor call
does (`remote`: the engine's own errors come back as themselves, Ray's as `Unavailable`).
`RayShard` is here; `RayDirectory` in directory_port.py, `RayNodeHub` in node_hub_handle.py.

Handles are found by name on first use and kept: a named actor that Ray restarts keeps its
handle valid.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import Raw

from actors.contracts import (
    EVENT_BATCH,
    FOLLOWED,
    WS_ENTRY_VIEW,
    ChainView,
    EventBatch,
    FollowingCall,
    Mirrored,
    NodeInfo,
    RevisionView,
    SentRef,
    StepInput,
    StepOutcome,
    TurnResult,
    TurnStart,
    WsAccess,
    WsCreateCall,
    WsListing,
    WsQuery,
)
from actors.runtime.coalesce import Coalescer
from actors.runtime.follow import Follower
from actors.runtime.lock_guard import assert_no_pool_lock
from engine.chat_records import Confession, Enrichment, ItemView, LearningJob, Turn
from engine.directory import Bot, Channel, Chat, Org
from engine.errors import OpenBotError, Unavailable
from engine.events import Event, ShardHead
from engine.memory import EntryView, Reader
from engine.memory_bot import MemoryBotSettings, SettingsPatch
from engine.projects import ProjectChange, ProjectCreate, ProjectView
from engine.requests import RequestView
from engine.scoped_memory import (
    Decision,
    Extraction,
    SourceItem,
    WsEntryView,
    WsForget,
    WsMemoryChange,
    WsMemoryCreate,
)
from storage.stats import STATS

_packer = msgspec.msgpack.Encoder()


async def remote(method: Any, *args: Any, **kwargs: Any) -> Any:
    """Await an actor method; the engine's own errors come back as themselves, Ray's failures
    as `Unavailable`."""
    import ray

    STATS.inc("openbot_actor_calls_total", help="Actor calls this process made")
    assert_no_pool_lock("an actor call")
    try:
        return await method.remote(*args, **kwargs)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause
        if isinstance(cause, OpenBotError):
            raise cause from None
        import logging

        logging.getLogger("openbot").error("actor call failed: %s", e)
        raise Unavailable("the engine failed to handle the request", code="engine_error") from e
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
        raise Unavailable("the engine is restarting; try again", code="engine_unavailable") from e


class NamedActor:
    """An actor found by name on first use, or over the handle its creator already holds
    (`Engine`: a gateway's ports)."""

    def __init__(self, name: str, namespace: str, handle: Any = None) -> None:
        self.name = name
        self.namespace = namespace
        self._handle: Any = handle

    def _actor(self) -> Any:
        if self._handle is None:
            import ray

            self._handle = ray.get_actor(self.name, namespace=self.namespace)
        return self._handle


class _Writes:
    """A gateway's coalesced writes to one shard, on one event loop (actors/runtime/coalesce.py):
    Remembers, and workspace memory creations, go many to a call while one is in flight; and
    its view of the shard's events, which their replies feed (actors/runtime/follow.py)."""

    def __init__(self, remember: Coalescer, ws_create: Coalescer, follow: Follower) -> None:
        self.remember = remember
        self.ws_create = ws_create
        self.follow = follow


class RayShard(NamedActor):
    """`ShardPort` over the shard actor named `name`."""

    coalesce = True  # False: one call per write (benchmarks compare the two)
    follow = True  # False: events by the pump's poll only (one more Ray call per commit)

    def __init__(self, name: str, namespace: str, handle: Any = None) -> None:
        super().__init__(name, namespace, handle)
        # Per event loop: a coalescer's futures belong to the loop it runs on.
        self._writes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Writes] = (
            weakref.WeakKeyDictionary()
        )

    def writes(self) -> _Writes:
        """This loop's coalescers (their `calls` and `requests` say how well they coalesce)."""
        loop = asyncio.get_running_loop()
        found = self._writes.get(loop)
        if found is None:
            found = _Writes(
                Coalescer(self._remember_many),
                Coalescer(self._ws_create_many),
                Follower(self._poll),
            )
            self._writes[loop] = found
        return found

    async def _remember_many(self, call: bytes) -> bytes:
        actor = self._actor()
        return await self._followed(call, actor.remember_many, actor.remember_many_followed)

    async def _ws_create_many(self, call: bytes) -> bytes:
        actor = self._actor()
        return await self._followed(
            call, actor.ws_create_memory_many, actor.ws_create_memory_many_followed
        )

    async def _followed(self, call: bytes, plain: Any, followed: Any) -> bytes:
        """A coalesced write call; where this loop follows the shard's events, the reply brings
        the ones published since (actors/runtime/follow.py)."""
        follow = self.writes().follow
        seen = follow.seen if self.follow else -1
        if seen < 0:
            return await remote(plain, call)
        follower = follow.id
        try:
            asked = _packer.encode(FollowingCall(follower=follower, seen=seen, call=Raw(call)))
            reply = FOLLOWED.decode(await remote(followed, asked))
        except BaseException:
            follow.lost()  # its reply may have carried events the shard thinks we have
            raise
        follow.take_reply(follower, seen, reply.events, reply.upto)
        return reply.replies  # type: ignore[return-value]  (Raw: bytes-like for the decoder)

    async def _poll(self, since: int, limit: int, wait: float, follower: str) -> EventBatch:
        return EVENT_BATCH.decode(
            await remote(self._actor().events_packed, since, limit, wait, follower)
        )

    async def run_step(
        self, step: StepInput, mirror: tuple[Mirrored, ...] = (), learn_upto: int = 0
    ) -> StepOutcome:
        return await remote(self._actor().run_step, step, mirror, learn_upto)

    async def schedule_learning(
        self, bot: Bot, chat: Chat, turn: str, upto: int, grant: str, org: Org, deferred: bool
    ) -> str | None:
        return await remote(
            self._actor().schedule_learning, bot, chat, turn, upto, grant, org, deferred
        )

    async def release_learning(self, job_id: str, upto: int) -> bool:
        return await remote(self._actor().release_learning, job_id, upto)

    async def send_stored(self, ref: SentRef) -> bool:
        return await remote(self._actor().send_stored, ref)

    async def notify(self, chat: Chat, author: str, text: str) -> ItemView:
        return await remote(self._actor().notify, chat, author, text)

    async def post_item(self, chat: Chat, author: str, text: str) -> ItemView:
        return await remote(self._actor().post_item, chat, author, text)

    async def ws_entries(self, access: WsAccess, query: WsQuery) -> WsListing:
        return await remote(self._actor().ws_entries, access, query)

    async def ws_extract(
        self,
        pool_id: str,
        contributor: str,
        proposals: Sequence[Extraction],
        sources: Sequence[SourceItem],
        request_id: str,
        now: int | None = None,
    ) -> list[Decision]:
        return await remote(
            self._actor().ws_extract, pool_id, contributor, proposals, sources, request_id, now
        )

    # --- what a gateway asks ---

    async def start_turn(self, start: TurnStart, wait: bool = False) -> Turn | TurnResult:
        return await remote(self._actor().start_turn, start, wait)

    async def verdict(self, chat: str, turn: str, user: str, accepted: bool, note: str) -> Turn:
        return await remote(self._actor().verdict, chat, turn, user, accepted, note)

    async def chat_items(self, chat: str) -> list[ItemView]:
        return await remote(self._actor().chat_items, chat)

    async def chat_item(self, chat: str, seq: int) -> ItemView | None:
        return await remote(self._actor().chat_item, chat, seq)

    async def delete_chat_items(self, chat: str, record: Chat | None = None) -> int:
        return await remote(self._actor().delete_chat_items, chat, record)

    async def confessions(self, chat: str) -> list[Confession]:
        return await remote(self._actor().confessions, chat)

    async def enrichments(self, chat: str) -> list[Enrichment]:
        return await remote(self._actor().enrichments, chat)

    async def switch_group_mode(
        self, chat: str, channel: str, mode: str, leader: str | None
    ) -> Channel:
        return await remote(self._actor().switch_group_mode, chat, channel, mode, leader)

    async def bot_node(self, model_name: str | None) -> NodeInfo:
        return await remote(self._actor().bot_node, model_name)

    async def event_head(self) -> ShardHead:
        return await remote(self._actor().event_head)

    async def events_after(
        self, seq: int, limit: int = 1000, wait: float = 0.0
    ) -> tuple[ShardHead, list[Event]]:
        # Over Ray the poll comes back as one msgpack `EventBatch` (actors/shard/packed.py):
        # Ray would pickle the list of Events on both sides of every poll. A long poll goes
        # through this loop's follower, which write replies feed too (actors/runtime/follow.py).
        if wait > 0 and self.follow:
            got = await self.writes().follow.after(seq, limit, wait)
            if got is not None:
                return got
        batch = EVENT_BATCH.decode(await remote(self._actor().events_packed, seq, limit, wait))
        return batch.head, batch.events

    async def metrics(self) -> dict:
        return await remote(self._actor().metrics)

    async def backup(self, dest_dir: str) -> str:
        return await remote(self._actor().backup, dest_dir)

    async def read_memory_json(
        self, pool_id: str, reader: Reader, tags: Sequence[str] = ()
    ) -> tuple[str, int, bytes]:
        return await remote(self._actor().read_memory_json, pool_id, reader, tags)

    async def search_memory_json(self, pool_id: str, reader: Reader, q: str, limit: int) -> bytes:
        return await remote(self._actor().search_memory_json, pool_id, reader, q, limit)

    async def memory_log_json(self, pool_id: str, reader: Reader) -> bytes:
        return await remote(self._actor().memory_log_json, pool_id, reader)

    async def remember_packed(self, call: bytes) -> bytes:
        if self.coalesce:
            return await self.writes().remember.call(call)
        return await remote(self._actor().remember_packed, call)

    async def remember(
        self,
        pool_id: str,
        reader: Reader,
        content: str,
        topics: Sequence[str] = (),
        request_id: str | None = None,
    ) -> EntryView:
        return await remote(self._actor().remember, pool_id, reader, content, topics, request_id)

    async def forget(
        self,
        pool_id: str,
        reader: Reader,
        entry_id: str,
        request_id: str | None = None,
        expected_revision: int | None = None,
    ) -> EntryView:
        return await remote(
            self._actor().forget, pool_id, reader, entry_id, request_id, expected_revision
        )

    async def widen(
        self, pool_id: str, entry_id: str, grant: str, requester: str
    ) -> dict[str, object]:
        return await remote(self._actor().widen, pool_id, entry_id, grant, requester)

    async def purge(self, pool_id: str, tag: str) -> int:
        return await remote(self._actor().purge, pool_id, tag)

    async def memory_bot_settings(self, pool_id: str) -> MemoryBotSettings:
        return await remote(self._actor().memory_bot_settings, pool_id)

    async def patch_memory_bot_settings(
        self, pool_id: str, patch: SettingsPatch
    ) -> MemoryBotSettings:
        return await remote(self._actor().patch_memory_bot_settings, pool_id, patch)

    async def requests_of(
        self, user: str, channels: frozenset[str], status: str | None = None
    ) -> list[RequestView]:
        return await remote(self._actor().requests_of, user, channels, status)

    async def request(
        self, request_id: str, user: str, channels: frozenset[str]
    ) -> RequestView | None:
        return await remote(self._actor().request, request_id, user, channels)

    async def decide_request(
        self, request_id: str, user: str, channels: frozenset[str], approved: bool, note: str
    ) -> RequestView | None:
        return await remote(
            self._actor().decide_request, request_id, user, channels, approved, note
        )

    async def attach_review(self, request_id: str, chat: str) -> RequestView:
        return await remote(self._actor().attach_review, request_id, chat)

    async def collaborations(self, user: str, channels: frozenset[str]) -> list[ChainView]:
        return await remote(self._actor().collaborations, user, channels)

    async def find_agent_chat(self, chat_id: str) -> Chat | None:
        return await remote(self._actor().find_agent_chat, chat_id)

    async def stop_collaboration(
        self, chain_id: str, user: str, channels: frozenset[str]
    ) -> ChainView | None:
        return await remote(self._actor().stop_collaboration, chain_id, user, channels)

    async def memory_jobs(
        self, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> list[LearningJob]:
        return await remote(self._actor().memory_jobs, pools, user, channels)

    async def retry_memory_job(
        self, job_id: str, pools: Sequence[str], user: str, channels: frozenset[str]
    ) -> LearningJob | None:
        return await remote(self._actor().retry_memory_job, job_id, pools, user, channels)

    async def ws_projects(self, user: str) -> list[ProjectView]:
        return await remote(self._actor().ws_projects, user)

    async def ws_save_project(
        self, actor: str, org: str, request: ProjectCreate | ProjectChange, project_id: str
    ) -> ProjectView:
        return await remote(self._actor().ws_save_project, actor, org, request, project_id)

    async def ws_has_entry(self, entry_id: str) -> bool:
        return await remote(self._actor().ws_has_entry, entry_id)

    async def ws_purge_learned(self, bot: str, chat: str) -> int:
        return await remote(self._actor().ws_purge_learned, bot, chat)

    async def ws_create_memory(self, access: WsAccess, body: WsMemoryCreate) -> WsEntryView:
        return WS_ENTRY_VIEW.decode(await self.ws_create_memory_json(access, body))

    async def ws_create_memory_json(self, access: WsAccess, body: WsMemoryCreate) -> bytes:
        # One bytes each way (actors/shard/packed.py): Ray would pickle both Structs and the reply.
        call = _packer.encode(WsCreateCall(access=access, body=body))
        if self.coalesce:
            return await self.writes().ws_create.call(call)
        return await remote(self._actor().ws_create_memory_packed, call)

    async def ws_change_memory(
        self, access: WsAccess, body: WsMemoryChange | WsForget
    ) -> WsEntryView:
        return await remote(self._actor().ws_change_memory, access, body)

    async def ws_revisions(self, access: WsAccess, entry_id: str) -> list[RevisionView]:
        return await remote(self._actor().ws_revisions, access, entry_id)
