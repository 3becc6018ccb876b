"""The actor ports (actors/contracts.py) over Ray actor handles: typed methods that name the
remote method as an attribute, never as a string, and map Ray's failures as every actor call
does (`remote`: the engine's own errors come back as themselves, Ray's as `Unavailable`).

Handles are found by name on first use and kept: a named actor that Ray restarts keeps its
handle valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.contracts import (
    Mirrored,
    StepInput,
    StepOutcome,
    WsAccess,
    WsListing,
    WsQuery,
)
from actors.runtime.lock_guard import assert_no_pool_lock
from engine.chat_records import ItemView
from engine.directory import Bot, Channel, Chat, Org
from engine.errors import OpenBotError, Unavailable
from engine.scoped_memory import Decision, Extraction, SourceItem
from engine.self_rules import Editor, RulesUpdate
from storage.stats import STATS


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


class _Named:
    def __init__(self, name: str, namespace: str) -> None:
        self.name = name
        self.namespace = namespace
        self._handle: Any = None

    def _actor(self) -> Any:
        if self._handle is None:
            import ray

            self._handle = ray.get_actor(self.name, namespace=self.namespace)
        return self._handle


class RayShard(_Named):
    """`ShardPort` over the shard actor named `name`."""

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


class RayDirectory(_Named):
    """`DirectoryPort` over the directory actor named `name`."""

    async def get_org(self, org_id: str) -> Org:
        return await remote(self._actor().get_org, org_id)

    async def get_chat(self, chat_id: str) -> Chat:
        return await remote(self._actor().get_chat, chat_id)

    async def get_channel(self, channel_id: str) -> Channel:
        return await remote(self._actor().get_channel, channel_id)

    async def get_bot(self, bot_id: str) -> Bot:
        return await remote(self._actor().get_bot, bot_id)

    async def find_bot(self, org: str, name_or_id: str) -> Bot:
        return await remote(self._actor().find_bot, org, name_or_id)

    async def group_chat(self, channel_id: str) -> Chat:
        return await remote(self._actor().group_chat, channel_id)

    async def agent_chat(self, root: Chat, peer: str, chain: str, link: str) -> Chat:
        return await remote(self._actor().agent_chat, root, peer, chain, link)

    async def delivery_chat(
        self, root_id: str, peer: str, asker: str, chain: str, link: str
    ) -> tuple[Chat, Bot, Bot]:
        return await remote(self._actor().delivery_chat, root_id, peer, asker, chain, link)

    async def register_chats(self, chats: list[Chat], durable: bool = True) -> int:
        return await remote(self._actor().register_chats, chats, durable)

    async def set_mode(self, channel_id: str, mode: str, leader: str | None) -> Channel:
        return await remote(self._actor().set_mode, channel_id, mode, leader)

    async def update_rules(self, bot_id: str, update: RulesUpdate, editor: Editor) -> Bot:
        return await remote(self._actor().update_rules, bot_id, update, editor)

    async def create_member(
        self, creator_id: str, name: str, prompt: str | None, rules: dict | None
    ) -> Bot:
        return await remote(self._actor().create_member, creator_id, name, prompt, rules)

    async def archive_bot(self, bot_id: str, archived: bool, editor: Editor) -> Bot:
        return await remote(self._actor().archive_bot, bot_id, archived, editor)

    async def project_owner(self, project_id: str) -> str | None:
        return await remote(self._actor().project_owner, project_id)

    async def register_project(self, project_id: str, owner: str) -> str:
        return await remote(self._actor().register_project, project_id, owner)

    async def workspace_people(
        self, org: str, users: list[str], channels: list[str]
    ) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        return await remote(self._actor().workspace_people, org, users, channels)
