"""Requests (approvals) over HTTP (ENR-3): list, read, open one in a chat, decide once (the
decision wakes the bot in the request's chat), and open a review chat.

A request lives on the shard of the bot that proposed it (or that a person's request names);
the routes ask every shard, which answers only for requests the caller may see (the person of
the turn, or a person of the group).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from actors.ports import EnginePort, ShardPort
from engine.bot_policy import require_active
from engine.errors import InvalidInput, NotFound
from engine.requests import STATUSES, Proposal, RequestView
from gateway import wire
from gateway.auth import Auth
from gateway.chat_routes import ChatsApi
from gateway.json_response import json, read_body


class RequestsApi:
    def __init__(self, engine: EnginePort, auth: Auth, chats: ChatsApi) -> None:
        self.engine = engine
        self.auth = auth
        self.chats = chats

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

    async def open(self, request: Request) -> Response:
        """A person's own request in a chat, under the bot's tool's rules: in a direct chat
        they may post to, or a group of theirs; never in a review or agent chat (the shard
        refuses those)."""
        access = await self.chats.access(request)
        body = wire.decode(await read_body(request), wire.OpenRequest)
        chat, user = access.chat, access.principal.user
        assert user is not None
        if access.bot is not None:  # a direct chat: its bot
            bot = access.bot
            if body.bot not in (None, bot.id, bot.name):
                raise InvalidInput("a direct chat's request is for its bot", code="not_member")
        else:
            named = [b for b in access.members if body.bot in (None, b.id, b.name)]
            if body.bot is None and len(named) != 1:
                raise InvalidInput("name the group's bot to wake", code="bot_required")
            if not named:
                raise InvalidInput("that bot is not in this group", code="not_member")
            bot = named[0]
        require_active(bot)
        proposal = Proposal(proposal=body.proposal, title=body.title)
        view = await self.engine.shard_port(bot.owner).open_request(chat, bot.id, user.id, proposal)
        return json(view, 201)

    async def decide(self, request: Request) -> Response:
        """Approve or reject, once (409 `already_decided` after); the decision wakes the bot
        in the request's chat, once (`?wait=true`: answered once its step is stored)."""
        user, channels = await self._caller(request)
        body = wire.decode(await read_body(request), wire.Decision)
        request_id = request.path_params["id"]
        wait = request.query_params.get("wait") in ("true", "1")
        for shard in self.engine.shard_ports:
            decided = await shard.decide_request(
                request_id, user, channels, body.approved, body.note, wait
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
