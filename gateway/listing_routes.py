"""Listing routes: a client that lost an id can find it again.

`GET /v1/me` (who the token is), `GET /v1/chats` (the caller's chats; `?kind=` for one kind),
`GET /v1/bots` (the bots the caller may use), `GET /v1/channels` (the caller's groups) and the
admin lists `GET /v1/admin/orgs`, `/users`, `/bots`, `/channels` (`?org=` for one org). Every
listing answers
`{"items": [...], "nextCursor": str | null}`, `?limit=` 1-200 (default 50) per page and
`?cursor=<nextCursor>` for the next (engine/listing.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from actors.ports import EnginePort
from engine.errors import InvalidInput
from engine.listing import Me, parse_limit
from gateway.auth import Auth
from gateway.json_response import json

CHAT_KINDS = ("direct", "group", "review", "agent")


def _paging(request: Request) -> tuple[str | None, int]:
    return request.query_params.get("cursor") or None, parse_limit(
        request.query_params.get("limit")
    )


class ListingApi:
    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth

    async def _user_id(self, request: Request) -> str:
        principal = await self.auth.user(request)
        assert principal.user is not None
        return principal.user.id

    async def me(self, request: Request) -> Response:
        """Who the token is: a client shows it and tells its own entries from others'."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        u = principal.user
        return json(Me(id=u.id, name=u.name, orgs=list(u.orgs)))

    async def chats(self, request: Request) -> Response:
        user = await self._user_id(request)
        cursor, limit = _paging(request)
        kind = request.query_params.get("kind") or None
        if kind is not None and kind not in CHAT_KINDS:
            raise InvalidInput(f"kind must be one of {', '.join(CHAT_KINDS)}", code="invalid_kind")
        return json(await self.engine.directory_port.list_chats(user, cursor, limit, kind))

    async def bots(self, request: Request) -> Response:
        user = await self._user_id(request)
        cursor, limit = _paging(request)
        return json(await self.engine.directory_port.list_user_bots(user, cursor, limit))

    async def channels(self, request: Request) -> Response:
        user = await self._user_id(request)
        cursor, limit = _paging(request)
        return json(await self.engine.directory_port.list_user_channels(user, cursor, limit))

    def admin_list(self, table: str):
        async def handler(request: Request) -> Response:
            await self.auth.admin(request)
            cursor, limit = _paging(request)
            org = request.query_params.get("org") or None
            return json(await self.engine.directory_port.list_records(table, cursor, limit, org))

        return handler
