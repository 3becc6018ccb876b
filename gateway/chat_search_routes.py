"""Chat history search: `GET /v1/chats/{chat}/items?q=` (one chat) and `GET /v1/search?q=` (every
chat the caller is in).

Only chats the caller may read are searched, each admitted by the chat routes' one read rule
(`ChatsApi.readable`: a direct, review or agent chat's owner; a person of a group chat's channel;
never another org's chat). Each chat's home shard ranks its items like every memory search
(actors/chats/chat_search.py) and several shards' rankings are combined as the workspace search
combines them (`engine.workspace_search.combine`).

Answers `{"items": [...], "nextCursor": str | null}`: each item as `GET /v1/chats/{chat}/items`
lists it, with `chat`, its fused `score` and `foundBy`. Bounded: `q` 1-`MAX_QUERY` characters,
`limit` 1-`MAX_LIMIT` (default `DEFAULT_LIMIT`), pages up to `MAX_DEPTH` hits deep.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from actors.contracts import USING, ChatFound, ChatHit
from actors.ports import EnginePort, ShardPort
from engine.directory import Principal
from engine.errors import InvalidInput, OpenBotError
from engine.listing import MAX_LIMIT as MAX_CHATS_PAGE
from engine.numbers import query_number
from engine.workspace_search import combine
from gateway.auth import Auth
from gateway.chat_access import ChatAccess
from gateway.json_response import json

MAX_QUERY = 1_000  # characters of `q`
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_DEPTH = 500  # hits a search pages through (`cursor` + `limit`)


class Chats(Protocol):
    """What chat search needs of the chat routes (gateway/chat_routes.py)."""

    async def readable(
        self, principal: Principal, chat_id: str, *, owner_only: bool = False
    ) -> ChatAccess: ...

    async def shown(self, item): ...


class Asked(msgspec.Struct, frozen=True):
    q: str
    using: str
    offset: int
    limit: int


def _asked(request: Request) -> Asked:
    params = request.query_params
    offset, limit = paging(params)
    q = params.get("q") or ""
    if not q.strip():
        raise InvalidInput("q must not be empty", code="invalid_query")
    if len(q) > MAX_QUERY:
        raise InvalidInput(f"q over {MAX_QUERY} characters", code="query_too_long")
    using = params.get("using") or "all"
    if using not in USING:
        raise InvalidInput("using must be all, keyword or semantic", code="invalid_using")
    return Asked(q=q, using=using, offset=offset, limit=limit)


def paging(params) -> tuple[int, int]:
    """`cursor` and `limit` of a search page, each within its bounds (422 naming it)."""
    limit = query_number(
        params.get("limit"), field="limit", low=1, high=MAX_LIMIT, default=DEFAULT_LIMIT
    )
    offset = query_number(
        params.get("cursor"), field="cursor", low=0, high=MAX_DEPTH - limit, default=0
    )
    return offset, limit


class ChatSearchApi:
    def __init__(self, engine: EnginePort, auth: Auth, chats: Chats) -> None:
        self.engine = engine
        self.auth = auth
        self.chats = chats

    async def in_chat(self, request: Request, access: ChatAccess) -> Response:
        """`GET /v1/chats/{chat}/items?q=`: the chat already passed the read rule."""
        asked = _asked(request)
        return await self._answer(asked, {id(access.home): (access.home, [access.chat.id])})

    async def everywhere(self, request: Request) -> Response:
        """`GET /v1/search?q=`: every chat the caller is in and may read."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        asked = _asked(request)
        homes: dict[int, tuple[ShardPort, list[str]]] = {}
        for chat_id in await self._chat_ids(principal.user.id):
            try:
                access = await self.chats.readable(principal, chat_id)
            except OpenBotError:  # listed, but not readable by the chat routes' rule
                continue
            homes.setdefault(id(access.home), (access.home, []))[1].append(chat_id)
        return await self._answer(asked, homes)

    async def _chat_ids(self, user: str) -> list[str]:
        ids: list[str] = []
        cursor: str | None = None
        while True:
            page = await self.engine.directory_port.list_chats(user, cursor, MAX_CHATS_PAGE)
            ids.extend(c.id for c in page.items)
            cursor = page.nextCursor
            if cursor is None:
                return ids

    async def _answer(
        self, asked: Asked, homes: dict[int, tuple[ShardPort, list[str]]]
    ) -> Response:
        depth = asked.offset + asked.limit + 1  # one more: is there a next page?
        found: list[ChatFound] = await asyncio.gather(
            *(
                home.search_chats(chats, asked.q, depth, asked.using)
                for home, chats in homes.values()
            )
        )
        hits = {h.chat + "/" + h.item.id: h for part in found for h in part.items}
        ranked = combine([(x.hits, x.semantic, x.fused) for x in found], depth)
        page = [hits[h.id] for h in ranked if h.id in hits]
        more = len(page) > asked.offset + asked.limit
        page = page[asked.offset : asked.offset + asked.limit]
        following = asked.offset + asked.limit
        return json(
            {
                "items": [await self._shown(h) for h in page],
                "nextCursor": str(following) if more and following < MAX_DEPTH else None,
            }
        )

    async def _shown(self, hit: ChatHit) -> dict:
        item = msgspec.structs.asdict(await self.chats.shown(hit.item))
        return {**item, "chat": hit.chat, "score": hit.score, "foundBy": hit.foundBy}
