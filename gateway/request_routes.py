"""Requests (approvals) over HTTP (ENR-3): list, read, decide once, and open a review chat.

A request lives on the shard of the bot that proposed it; the routes ask every shard, which
answers only for requests the caller may see (the person of the turn, or a person of the group).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from actors.ports import EnginePort, ShardPort
from engine.errors import InvalidInput, NotFound
from engine.requests import STATUSES, RequestView
from gateway import wire
from gateway.auth import Auth
from gateway.json_response import json, read_body


class RequestsApi:
    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth

    async def _caller(self, request: Request) -> tuple[str, frozenset[str]]:
        principal = await self.auth.user(request)
        assert principal.user is not None
        return principal.user.id, principal.channels

    async def listing(self, request: Request) -> Response:
        user, channels = await self._caller(request)
        status = request.query_params.get("status")
        if status is not None and status not in STATUSES:
            raise InvalidInput(f"status must be one of {', '.join(STATUSES)}", code="bad_status")
        found = []
        for shard in self.engine.shard_ports:
            found.extend(await shard.requests_of(user, channels, status))
        found.sort(key=lambda r: (r.createdAt, r.id))
        return json({"requests": found})

    async def _find(self, request: Request) -> tuple[RequestView, ShardPort, str]:
        user, channels = await self._caller(request)
        request_id = request.path_params["id"]
        for shard in self.engine.shard_ports:
            view = await shard.request(request_id, user, channels)
            if view is not None:
                return view, shard, user
        raise NotFound(f"no request {request_id}", code="request_not_found")

    async def get(self, request: Request) -> Response:
        view, _, _ = await self._find(request)
        return json(view)

    async def decide(self, request: Request) -> Response:
        """Approve or reject, once (409 `already_decided` after)."""
        user, channels = await self._caller(request)
        body = wire.decode(await read_body(request), wire.Decision)
        request_id = request.path_params["id"]
        for shard in self.engine.shard_ports:
            decided = await shard.decide_request(
                request_id, user, channels, body.approved, body.note
            )
            if decided is not None:
                return json(decided)
        raise NotFound(f"no request {request_id}", code="request_not_found")

    async def review(self, request: Request) -> Response:
        """Open (or reopen) the caller's review chat of a request: no enrichment, no confide;
        the bot sees the proposal as it made it."""
        view, shard, user = await self._find(request)
        chat = await self.engine.directory_port.review_chat(view.id, user, view.org, view.bot)
        await shard.attach_review(view.id, chat.id)
        return json(chat, 201)
