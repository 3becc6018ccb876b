"""Chat routes (API-1..API-6): create a chat, start a turn, give a verdict, read and delete a
chat's items, and its confessions and enrichments. `_chat` decides who may read a chat and where it
lives (the home shard); a group chat's records are also kept on its members' shards."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from actors.contracts import TurnStart
from actors.ports import EnginePort, ShardPort
from engine.directory import Principal, chat_home, check_id, require_use, resolve_org
from engine.errors import Forbidden, InvalidInput, NotFound, OpenBotError
from gateway import wire
from gateway.auth import Auth, org_header
from gateway.chat_access import ChatAccess, require_chat_owner
from gateway.chat_search_routes import ChatSearchApi, paging
from gateway.json_response import json, read_body


class ChatsApi:
    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth
        self.search = ChatSearchApi(engine, auth, self)

    async def create_chat(self, request: Request) -> Response:
        principal = await self.auth.user(request)
        body = wire.decode(await read_body(request), wire.CreateChat)
        assert principal.user is not None
        project_org = None
        if body.project is not None:
            project_org = await self._require_project_member(body.project, principal.user.id)
        # The directory decides the chat's org (the bot's or the channel's) and checks the
        # header against it.
        requested = org_header(request) or None
        if requested is not None and body.channel is not None:
            resolve_org(principal.user, requested)
        chat = await self.engine.directory_port.create_chat(
            principal.user.id,
            requested,
            bot=body.bot,
            channel=body.channel,
            project=body.project,
            kind=body.kind,
            project_org=project_org,
        )
        self.auth.know_chat(chat)  # its first turn asks the directory nothing more
        return json(chat, 201)

    async def patch_chat(self, request: Request) -> Response:
        """`PATCH /v1/chats/{chat}` with `{"project": id | null}`: set, change or clear the
        current project of the caller's direct (or review) chat (WS-7), under the rule of
        creation: only a project the person is a member of, of the chat's org; anything else
        is "not found". Who may read the chat hears `chat.updated` with the new revision."""
        access = await self._chat(request, owner_only=True)
        body = wire.decode(await read_body(request), wire.PatchChat)
        user = access.principal.user
        assert user is not None
        project_org = None
        if body.project is not None:
            check_id(body.project, "project id")
            project_org = await self._require_project_member(body.project, user.id)
        before = access.chat.revision
        chat = await self.engine.directory_port.set_chat_project(
            access.chat.id, user.id, body.project, project_org
        )
        self.auth.know_chat(chat)
        if chat.revision != before:
            await access.home.chat_updated(chat, "project")
        return json(chat)

    async def _require_project_member(self, project: str, user: str) -> str:
        """A chat may select only a project its person is a member of (WS-7): its memory is
        packed into prompts and learned facts are written to it. Returns the project's org."""
        owner = await self.engine.directory_port.project_owner(project)
        mine = [] if owner is None else await self.engine.shard_port(owner).workspace_projects(user)
        for p in mine:
            if p.id == project:
                return p.org
        raise NotFound(f"no project {project}", code="project_not_found")

    async def _chat(self, request: Request, *, owner_only: bool = False) -> ChatAccess:
        principal = await self.auth.user(request)
        return await self.readable(principal, request.path_params["chat"], owner_only=owner_only)

    async def readable(
        self, principal: Principal, chat_id: str, *, owner_only: bool = False
    ) -> ChatAccess:
        """The chat and where it lives, for who may read it: a direct, review or agent chat's
        owner (API-6); any person of a group chat's channel (confessions and enrichments stay
        with the owner). The one read rule of every chat route, chat search included."""
        assert principal.user is not None
        user = principal.user.id
        # One directory call: the chat with its org and its bot or channel and bots.
        ctx = await self.auth.context(chat_id)
        chat = ctx.chat
        if chat.org not in principal.user.orgs:
            # Another org's chat answers like an id nobody has.
            raise NotFound(f"no chat {chat.id!r}", code="chat_not_found")
        if chat.kind == "group":
            if chat.channel not in principal.channels:
                raise Forbidden("you are not a member of this group", code="not_member")
            if owner_only:
                require_chat_owner(chat, user)
            assert ctx.channel is not None
            home = self.engine.shard_port(chat_home(chat))
            return ChatAccess(principal, chat, None, ctx.channel, home, ctx.org, ctx.members)
        require_chat_owner(chat, user)
        bot = ctx.bot
        if bot is None:
            raise InvalidInput("this chat has no bot", code="invalid_chat")
        if chat.kind != "agent":
            require_use(bot, principal.user, chat.org)
        home = self.engine.shard_port(chat_home(chat, bot.owner))
        return ChatAccess(principal, chat, bot, None, home, ctx.org)

    async def access(self, request: Request) -> ChatAccess:
        """Who may act in the chat and where it lives, as for posting a turn."""
        return await self._chat(request)

    async def post_turn(self, request: Request) -> Response:
        access = await self._chat(request)
        chat, principal = access.chat, access.principal
        body = wire.decode(await read_body(request), wire.TurnBody)
        if chat.kind == "agent":
            raise InvalidInput("agent chats are for bots", code="invalid_chat")
        assert principal.user is not None and access.org is not None
        # The bots came fresh with the chat: rules a bot changed apply from the next turn (WS-2).
        start = TurnStart(
            chat=chat,
            bot=access.bot,
            org=access.org,
            operator=principal.user.id,
            text=body.text,
            request_id=body.requestId,
            channel=access.channel,
            members=access.members,
            rounds=body.rounds,
            mentions=None if body.mentions is None else tuple(body.mentions),
        )
        if request.query_params.get("wait") in ("true", "1"):
            return json(await access.home.start_turn(start, True))  # one shard call
        turn = await access.home.start_turn(start)
        return json({"turn": turn}, 202)

    async def verdict(self, request: Request) -> Response:
        """A person of a delivery group accepts or rejects the delivered result (WS-6); a
        rejection goes back to the leader as the person's next message."""
        access = await self._chat(request)
        body = wire.decode(await read_body(request), wire.Verdict)
        if len(body.note) > 4000:
            raise InvalidInput("note over 4000 characters", code="note_too_long")
        user = access.principal.user
        assert user is not None
        turn = await access.home.verdict(
            access.chat.id,
            request.path_params["turn"],
            user.id,
            body.accepted,
            body.note,
        )
        answer: dict = {"turn": turn}
        if not body.accepted and access.channel is not None:
            assert access.org is not None
            text = "The result was rejected." + (f" {body.note}" if body.note else "")
            start = TurnStart(
                chat=access.chat,
                bot=None,
                org=access.org,
                operator=user.id,
                text=text,
                channel=access.channel,
                members=access.members,
            )
            answer["next"] = await access.home.start_turn(start)
        return json(answer)

    async def chat_items(self, request: Request) -> Response:
        access = await self._chat(request)
        if request.method == "DELETE":
            require_chat_owner(access.chat, access.principal.user.id)  # type: ignore[union-attr]
            count = await access.home.delete_chat_items(access.chat.id, access.chat)
            # The copies the members' shards keep for learning go too (API-5: what was
            # learned stays; the history does not).
            for shard in await self._member_shards(access):
                await shard.delete_chat_items(access.chat.id)
            return json({"count": count})
        if request.query_params.get("q") is not None:
            return await self.search.in_chat(request, access)  # `?q=`: a ranked search
        paging(request.query_params)  # the whole history; page numbers still must be in bounds
        items = await access.home.chat_items(access.chat.id)
        return json({"items": [await self._shown(i) for i in items]})

    async def chat_item(self, request: Request) -> Response:
        """One item, as a `chat.item.created` event names it (clients fetch what they are told
        about instead of reading the whole chat again)."""
        access = await self._chat(request)
        wanted = request.path_params["item"]
        number = wanted.removeprefix("i-")
        item = None
        if wanted.startswith("i-") and number.isdigit() and len(number) < 19:
            item = await access.home.chat_item(access.chat.id, int(number))
        if item is None:
            raise NotFound(f"no item {wanted} in this chat", code="item_not_found")
        return json(await self._shown(item))

    async def shown(self, item):
        return await self._shown(item)

    async def _shown(self, item):
        """A delivery's communication record names its peer as clients show it (UI-1)."""
        c = item.communication
        if c is None:
            return item
        try:
            peer = await self.auth.bot(c.peer)
        except OpenBotError:
            return item
        shown = msgspec.structs.replace(c, name=peer.name, avatar=peer.avatar)
        return msgspec.structs.replace(item, communication=shown)

    async def _records(
        self, request: Request, method: Callable[[ShardPort], Callable[[str], Awaitable[list]]]
    ) -> list:
        """Confessions or enrichments: kept where each bot's memory is, so a group chat's come
        from every member's shard."""
        access = await self._chat(request, owner_only=True)
        records = []
        for shard in [access.home, *await self._member_shards(access)]:
            records.extend(await method(shard)(access.chat.id))
        return sorted(records, key=lambda r: (r.at, r.turn))

    async def _member_shards(self, access: ChatAccess) -> list[ShardPort]:
        """The shards of a group's bots other than the chat's home."""
        seen = {id(access.home)}
        out = []
        if access.channel is not None:
            for b in access.members:
                shard = self.engine.shard_port(b.owner)
                if id(shard) not in seen:
                    seen.add(id(shard))
                    out.append(shard)
        return out

    async def confessions(self, request: Request) -> Response:
        return json({"confessions": await self._records(request, lambda shard: shard.confessions)})

    async def enrichments(self, request: Request) -> Response:
        return json({"enrichments": await self._records(request, lambda shard: shard.enrichments)})
