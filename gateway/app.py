"""The Starlette application: directory (admin) routes, the seed-000 memory routes, capabilities
and the OpenAPI document (DESIGN §9)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from actors.contracts import TurnStart
from actors.runtime.engine import Engine, call
from actors.runtime.node_hub_handle import RayNodeHub
from engine import tags as tagmod
from engine import widening
from engine.directory import (
    Bot,
    Principal,
    bot_org,
    bot_pool,
    chat_home,
    require_use,
    require_write,
    resolve_org,
)
from engine.errors import Forbidden, InvalidInput, NotFound, OpenBotError, Unprocessable
from engine.memory import Reader
from engine.memory_bot import SettingsPatch
from gateway import wire
from gateway.auth import Auth, TokenRequired
from gateway.chat_access import ChatAccess, require_chat_owner
from gateway.console_routes import console_routes
from gateway.errors import HANDLERS, ContainErrors
from gateway.events import EventsEndpoint, Hub
from gateway.file_export_route import FileExportApi
from gateway.json_response import BodyLimits, json, read_body
from gateway.listing_routes import ListingApi
from gateway.metrics import MetricsApi, RequestLog
from gateway.nodes import NodesEndpoint
from gateway.openapi import openapi_document
from gateway.read_cache import ReadCache
from gateway.request_routes import RequestsApi
from gateway.workspace_memory_routes import WorkspaceMemoryApi
from gateway.workspace_routes import WorkspaceApi

# ND-1's capabilities, each announced once the issue that builds it landed.
CAPABILITIES = (
    "bot-memory-v1",
    "bot-collaboration-v1",
    "bot-discussion-v1",
    "bot-projects-v1",
    "bot-file-memory-v1",  # the seed-002 file tree: memory export, openbot export/import
)
PLANNED: tuple[str, ...] = ()
WS = "/api/app/workspace"

_enc = msgspec.json.Encoder()


class Api:
    def __init__(self, engine: Engine, auth: Auth, hub: Hub) -> None:
        self.engine = engine
        self.auth = auth
        self.hub = hub
        self.cache = ReadCache(hub)

    # --- admin: the directory ---

    def _check_model(self, name: object) -> None:
        """A model is named in the server's config; a typo fails here, not at the first turn."""
        known = self.engine.models
        if known is None or not isinstance(name, str) or name in known:
            return
        choices = ", ".join(sorted(known)) or "none configured"
        raise Unprocessable(f"unknown model {name!r} (models: {choices})", code="unknown_model")

    async def create_org(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateOrg)
        if body.settings is not None:
            self._check_model(body.settings.botMemoryModel)
        org = await call(self.engine.directory.create_org, body.name, body.id, body.settings)
        return json(org, 201)

    async def patch_org(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.PatchOrg)
        self._check_model(body.settings.get("botMemoryModel"))
        org = await call(self.engine.directory.patch_org, request.path_params["id"], body.settings)
        return json(org)

    async def create_user(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateUser)
        user, token = await call(self.engine.directory.create_user, body.name, body.orgs, body.id)
        return json(wire.UserCreated(id=user.id, name=user.name, orgs=user.orgs, token=token), 201)

    async def create_bot(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateBot)
        self._check_model(body.model)
        bot = await call(
            self.engine.directory.create_bot,
            name=body.name,
            org=body.org,
            owner=body.owner,
            id=body.id,
            kind=body.kind,
            linked=body.linked,
            model=body.model,
            rules=body.rules,
            avatar=body.avatar,
        )
        self.auth.directory_changed(bot.id)  # the owner's principal now lists this bot
        return json(bot, 201)

    async def patch_bot(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.PatchBot)
        changes = {
            f: getattr(body, f) for f in body.__struct_fields__ if getattr(body, f) is not UNSET
        }
        self._check_model(changes.get("model"))
        bot = await call(self.engine.directory.patch_bot, request.path_params["id"], changes)
        self.auth.directory_changed(bot.id)
        return json(bot)

    async def create_grant(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateGrant)
        await call(self.engine.directory.grant, body.bot, body.user, body.permission)
        self.auth.directory_changed(body.bot)
        return json({"bot": body.bot, "user": body.user, "permission": body.permission}, 201)

    async def create_channel(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateChannel)
        channel = await call(
            self.engine.directory.create_channel,
            org=body.org,
            people=body.people,
            bots=body.bots,
            id=body.id,
            name=body.name,
            mode=body.mode,
            leader=body.leader,
        )
        self.auth.directory_changed()
        return json(channel, 201)

    async def backup(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.Backup)
        files = await self.engine.backup(body.dir, with_key=body.withKey)
        return json({"dir": body.dir, "files": files}, 201)

    # --- chats ---

    async def create_chat(self, request: Request) -> Response:
        principal = await self.auth.user(request)
        body = wire.decode(await read_body(request), wire.CreateChat)
        assert principal.user is not None
        project_org = None
        if body.project is not None:
            project_org = await self._require_project_member(body.project, principal.user.id)
        # The directory decides the chat's org (the bot's or the channel's) and checks the
        # header against it.
        requested = request.headers.get("openbot-org") or None
        if requested is not None and body.channel is not None:
            resolve_org(principal.user, requested)
        chat = await call(
            self.engine.directory.create_chat,
            principal.user.id,
            requested,
            bot=body.bot,
            channel=body.channel,
            project=body.project,
            kind=body.kind,
            project_org=project_org,
        )
        return json(chat, 201)

    async def _require_project_member(self, project: str, user: str) -> str:
        """A chat may select only a project its person is a member of (WS-7): its memory is
        packed into prompts and learned facts are written to it. Returns the project's org."""
        owner = await call(self.engine.directory.project_owner, project)
        mine = [] if owner is None else await call(self.engine.shard_for(owner).ws_projects, user)
        for p in mine:
            if p.id == project:
                return p.org
        raise NotFound(f"no project {project}", code="project_not_found")

    async def _chat(self, request: Request, *, owner_only: bool = False) -> ChatAccess:
        """The chat and where it lives, for who may read it: a direct, review or agent chat's
        owner (API-6); any person of a group chat's channel (confessions and enrichments stay
        with the owner)."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        user = principal.user.id
        chat = await call(self.engine.directory.get_chat, request.path_params["chat"])
        if chat.org not in principal.user.orgs:
            # Another org's chat answers like an id nobody has (issue 12).
            raise NotFound(f"no chat {chat.id!r}", code="chat_not_found")
        if chat.kind == "group":
            if chat.channel not in principal.channels:
                raise Forbidden("you are not a member of this group", code="not_member")
            if owner_only:
                require_chat_owner(chat, user)
            channel = await call(self.engine.directory.get_channel, chat.channel)
            home = self.engine.shard_for(chat_home(chat))
            return ChatAccess(principal, chat, None, channel, home)
        require_chat_owner(chat, user)
        if chat.bot is None:
            raise InvalidInput("this chat has no bot", code="invalid_chat")
        bot = await self.auth.bot(chat.bot)
        if chat.kind != "agent":
            require_use(bot, principal.user)
        return ChatAccess(
            principal, chat, bot, None, self.engine.shard_for(chat_home(chat, bot.owner))
        )

    async def post_turn(self, request: Request) -> Response:
        access = await self._chat(request)
        chat, principal = access.chat, access.principal
        body = wire.decode(await read_body(request), wire.TurnBody)
        if chat.kind == "agent":
            raise InvalidInput("agent chats are for bots", code="invalid_chat")
        org = await call(self.engine.directory.get_org, chat.org)
        assert principal.user is not None
        # Bots are read fresh: rules a bot changed apply from the next turn (WS-2).
        directory = self.engine.directory
        members: tuple = ()
        bot = None
        if access.channel is not None:
            members = tuple([await call(directory.get_bot, b) for b in access.channel.bots])
        else:
            assert access.bot is not None
            bot = await call(directory.get_bot, access.bot.id)
        start = TurnStart(
            chat=chat,
            bot=bot,
            org=org,
            operator=principal.user.id,
            text=body.text,
            request_id=body.requestId,
            channel=access.channel,
            members=members,
            rounds=body.rounds,
            mentions=None if body.mentions is None else tuple(body.mentions),
        )
        turn = await call(access.home.start_turn, start)
        if request.query_params.get("wait") in ("true", "1"):
            result = await call(access.home.wait_turn, chat.id, turn.id)
            return json(result)
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
        turn = await call(
            access.home.verdict,
            access.chat.id,
            request.path_params["turn"],
            user.id,
            body.accepted,
            body.note,
        )
        answer: dict = {"turn": turn}
        if not body.accepted and access.channel is not None:
            org = await call(self.engine.directory.get_org, access.chat.org)
            members = tuple(
                [await call(self.engine.directory.get_bot, b) for b in access.channel.bots]
            )
            text = "The result was rejected." + (f" {body.note}" if body.note else "")
            start = TurnStart(
                chat=access.chat,
                bot=None,
                org=org,
                operator=user.id,
                text=text,
                channel=access.channel,
                members=members,
            )
            answer["next"] = await call(access.home.start_turn, start)
        return json(answer)

    async def chat_items(self, request: Request) -> Response:
        access = await self._chat(request)
        if request.method == "DELETE":
            require_chat_owner(access.chat, access.principal.user.id)  # type: ignore[union-attr]
            count = await call(access.home.delete_chat_items, access.chat.id, access.chat)
            # The copies the members' shards keep for learning go too (API-5: what was
            # learned stays; the history does not).
            for shard in await self._member_shards(access):
                await call(shard.delete_chat_items, access.chat.id)
            return json({"count": count})
        items = await call(access.home.chat_items, access.chat.id)
        return json({"items": [await self._shown(i) for i in items]})

    async def chat_item(self, request: Request) -> Response:
        """One item, as a `chat.item.created` event names it (clients fetch what they are told
        about instead of reading the whole chat again)."""
        access = await self._chat(request)
        wanted = request.path_params["item"]
        number = wanted.removeprefix("i-")
        item = None
        if wanted.startswith("i-") and number.isdigit() and len(number) < 19:
            item = await call(access.home.chat_item, access.chat.id, int(number))
        if item is None:
            raise NotFound(f"no item {wanted} in this chat", code="item_not_found")
        return json(await self._shown(item))

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

    async def _records(self, request: Request, method: Callable[[Any], Any]) -> list:
        """Confessions or enrichments: kept where each bot's memory is, so a group chat's come
        from every member's shard."""
        access = await self._chat(request, owner_only=True)
        records = []
        for shard in [access.home, *await self._member_shards(access)]:
            records.extend(await call(method(shard), access.chat.id))
        return sorted(records, key=lambda r: (r.at, r.turn))

    async def _member_shards(self, access: ChatAccess) -> list:
        """The shards of a group's bots other than the chat's home."""
        shards = {id(access.home): None}
        out = []
        if access.channel is not None:
            for b in access.channel.bots:
                shard = self.engine.shard_for((await self.auth.bot(b)).owner)
                if id(shard) not in shards:
                    shards[id(shard)] = shard
                    out.append(shard)
        return out

    async def confessions(self, request: Request) -> Response:
        return json({"confessions": await self._records(request, lambda shard: shard.confessions)})

    async def enrichments(self, request: Request) -> Response:
        return json({"enrichments": await self._records(request, lambda shard: shard.enrichments)})

    # --- seed-000 memory ---

    async def _memory_call(self, request: Request, *, write: bool = False):
        """Caller, bot, the bot's shard and the caller's reader for a memory route."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        bot = await self.auth.bot(request.path_params["bot"])
        (require_write if write else require_use)(bot, principal.user)
        reader = _reader(principal, request, bot)
        return bot, self.engine.shard_for(bot.owner), reader

    async def get_memory(self, request: Request) -> Response:
        bot, shard, reader = await self._memory_call(request)
        q = request.query_params.get("q")
        if q is not None and q.strip():
            # Ranked keyword search (issue 11): never cached, the ranking is per query.
            limit = _limit(request.query_params.get("limit"))
            body = await call(shard.search_memory_json, bot_pool(bot.id), reader, q, limit)
            return Response(body, media_type="application/json")
        raw = request.query_params.get("tags")
        wanted = tuple(sorted({t.strip() for t in raw.split(",") if t.strip()})) if raw else ()
        pool = bot_pool(bot.id)
        key = ReadCache.key(pool, reader, wanted)
        body = self.cache.get(key)
        if body is None:
            generation = self.cache.generation(pool)
            await self.hub.start()
            epoch, fill, body = await call(shard.read_memory_json, pool, reader, wanted)
            shard_index = self.engine.shard_index(bot.owner)
            self.cache.put(key, shard_index, epoch, fill, body, generation)
        return Response(body, media_type="application/json")

    @contextlib.asynccontextmanager
    async def _writing(self, pool: str):
        """Around a write: this gateway's cached pages of the pool go, before and after, so its
        clients read their own writes even before the change's event arrives."""
        self.cache.forget_pool(pool)
        try:
            yield
        finally:
            self.cache.forget_pool(pool)

    async def post_memory(self, request: Request) -> Response:
        bot, shard, reader = await self._memory_call(request)
        body = wire.decode(await read_body(request), wire.MemoryCommand)
        command = body.command
        pool = bot_pool(bot.id)
        async with self._writing(pool):
            if isinstance(command, wire.Remember):
                entry = await call(
                    shard.remember,
                    pool,
                    reader,
                    command.content,
                    tuple(command.tags),
                    body.requestId,
                )
                return json(entry, 201)
            entry = await call(shard.forget, pool, reader, command.id, body.requestId)
            return json(entry)

    async def widen(self, request: Request) -> Response:
        """ACL-4: anyone who uses the bot may ask; every source's rule decides (409 when not)."""
        bot, shard, reader = await self._memory_call(request)
        body = wire.decode(await read_body(request), wire.Widen)
        widening.check_grant(body.to)
        pool = bot_pool(bot.id)
        async with self._writing(pool):
            done = await call(shard.widen, pool, request.path_params["id"], body.to, reader.user)
        return json(done)

    async def memory_log(self, request: Request) -> Response:
        bot, shard, reader = await self._memory_call(request)
        body = await call(shard.memory_log_json, bot_pool(bot.id), reader)
        return Response(body, media_type="application/json")

    async def purge(self, request: Request) -> Response:
        bot, shard, _ = await self._memory_call(request, write=True)
        body = wire.decode(await read_body(request), wire.Purge)
        tagmod.validate_purge_tag(body.tag)
        async with self._writing(bot_pool(bot.id)):
            count = await call(shard.purge, bot_pool(bot.id), body.tag)
        return json({"count": count})

    async def get_memory_bot(self, request: Request) -> Response:
        bot, shard, _ = await self._memory_call(request)
        return json(await call(shard.memory_bot_settings, bot_pool(bot.id)))

    async def patch_memory_bot(self, request: Request) -> Response:
        bot, shard, _ = await self._memory_call(request, write=True)
        patch = wire.decode(await read_body(request), SettingsPatch)
        return json(await call(shard.patch_memory_bot_settings, bot_pool(bot.id), patch))

    # --- discovery ---

    async def capabilities(self, request: Request) -> Response:
        await self.auth.caller(request)  # node ids and their flags are not for strangers
        nodes = await RayNodeHub(self.engine.prefix).nodes()
        return json(
            {
                "capabilities": list(CAPABILITIES),
                "unavailable": list(PLANNED),
                "nodes": nodes,
            }
        )

    async def bot_node(self, request: Request) -> Response:
        """Where this bot's model runs; memory is used only where it is isolated (ND-2), and a
        node that cannot isolate gets an upgrade hint, never a claim (ND-3)."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        bot = await self.auth.bot(request.path_params["bot"])
        require_use(bot, principal.user)
        info = await call(self.engine.shard_for(bot.owner).bot_node, bot.model)
        return json(
            {
                "bot": bot.id,
                "node": info,
                "memoryInjected": info.memory_isolation,
                "extraction": info.memory_extraction,
            }
        )

    async def openapi(self, request: Request) -> Response:
        await self.auth.caller(request)
        doc = openapi_document()  # already camelCase; json() would rename its own keys
        return Response(msgspec.json.encode(doc), media_type="application/json")

    async def health(self, request: Request) -> Response:
        return json({"ok": True})


MEMORY_SEARCH_LIMIT = 20
MAX_MEMORY_SEARCH_LIMIT = 500


def _limit(raw: str | None) -> int:
    try:
        limit = int(raw) if raw else MEMORY_SEARCH_LIMIT
    except ValueError as e:
        raise InvalidInput("limit must be a number", code="invalid_limit") from e
    if not 1 <= limit <= MAX_MEMORY_SEARCH_LIMIT:
        raise InvalidInput(f"limit must be 1-{MAX_MEMORY_SEARCH_LIMIT}", code="invalid_limit")
    return limit


def _reader(principal: Principal, request: Request, bot: Bot) -> Reader:
    """The caller reading or writing through `bot`: in the bot's org (issue 12: a Remember is
    tagged `org:<the bot's org>`, never with an org the bot does not work in)."""
    assert principal.user is not None
    org = bot_org(bot, principal.user, request.headers.get("openbot-org"))
    return Reader(user=principal.user.id, org=org, channels=principal.channels, uses_bot=True)


def create_app(
    engine: Engine, admin_token: str, *, cache_ttl: float = 2.0, listener_refresh: float = 30.0
) -> Starlette:
    if not admin_token:
        raise InvalidInput("an admin token is required")
    auth = Auth(engine, admin_token, ttl=cache_ttl)
    hub = Hub(engine)
    api = Api(engine, auth, hub)
    ws = WorkspaceApi(engine, auth)
    wm = WorkspaceMemoryApi(engine, auth)
    lists = ListingApi(engine, auth)
    rq = RequestsApi(engine, auth)
    r: Callable[..., Route] = Route
    routes = [
        r("/v1/admin/orgs", lists.admin_list("orgs"), methods=["GET"]),
        r("/v1/admin/users", lists.admin_list("users"), methods=["GET"]),
        r("/v1/admin/bots", lists.admin_list("bots"), methods=["GET"]),
        r("/v1/admin/channels", lists.admin_list("channels"), methods=["GET"]),
        r("/v1/me", lists.me, methods=["GET"]),
        r("/v1/chats", lists.chats, methods=["GET"]),
        r("/v1/bots", lists.bots, methods=["GET"]),
        r("/v1/channels", lists.channels, methods=["GET"]),
        r("/v1/chats/{chat}/items/{item}", api.chat_item, methods=["GET"]),
        r("/v1/admin/orgs", api.create_org, methods=["POST"]),
        r("/v1/admin/orgs/{id}", api.patch_org, methods=["PATCH"]),
        r("/v1/admin/users", api.create_user, methods=["POST"]),
        r("/v1/admin/bots", api.create_bot, methods=["POST"]),
        r("/v1/admin/bots/{id}", api.patch_bot, methods=["PATCH"]),
        r("/v1/admin/grants", api.create_grant, methods=["POST"]),
        r("/v1/admin/channels", api.create_channel, methods=["POST"]),
        r("/v1/admin/backup", api.backup, methods=["POST"]),
        r("/v1/admin/export", FileExportApi(engine, auth).export, methods=["GET"]),
        r("/v1/chats", api.create_chat, methods=["POST"]),
        r("/v1/chats/{chat}/turns", api.post_turn, methods=["POST"]),
        r("/v1/chats/{chat}/items", api.chat_items, methods=["GET", "DELETE"]),
        r("/v1/chats/{chat}/turns/{turn}/verdict", api.verdict, methods=["POST"]),
        r("/v1/chats/{chat}/confessions", api.confessions, methods=["GET"]),
        r("/v1/chats/{chat}/enrichments", api.enrichments, methods=["GET"]),
        r("/v1/requests", rq.listing, methods=["GET"]),
        r("/v1/requests/{id}", rq.get, methods=["GET"]),
        r("/v1/requests/{id}/decision", rq.decide, methods=["POST"]),
        r("/v1/requests/{id}/review", rq.review, methods=["POST"]),
        r("/v1/bots/{bot}/memory", api.get_memory, methods=["GET"]),
        r("/v1/bots/{bot}/memory", api.post_memory, methods=["POST"]),
        r("/v1/bots/{bot}/memory/log", api.memory_log, methods=["GET"]),
        r("/v1/bots/{bot}/memory/{id}/widen", api.widen, methods=["POST"]),
        r("/v1/bots/{bot}/memory/purge", api.purge, methods=["POST"]),
        r("/v1/bots/{bot}/memory/bot", api.get_memory_bot, methods=["GET"]),
        r("/v1/bots/{bot}/memory/bot", api.patch_memory_bot, methods=["PATCH"]),
        r("/v1/capabilities", api.capabilities, methods=["GET"]),
        r("/v1/bots/{bot}/node", api.bot_node, methods=["GET"]),
        r(f"{WS}/collaboration", ws.collaborations, methods=["GET"]),
        r(f"{WS}/collaboration/{{id}}/stop", ws.stop_collaboration, methods=["POST"]),
        r(f"{WS}/bots/{{bot}}/rules", ws.bot_rules, methods=["GET", "PATCH"]),
        r(f"{WS}/bots/{{bot}}", ws.bot_profile, methods=["GET", "PATCH"]),
        r(f"{WS}/bots/{{bot}}/archive", ws.archive_bot, methods=["POST"]),
        r(f"{WS}/groups/{{channel}}/mode", ws.group_mode, methods=["POST"]),
        r(f"{WS}/memory-jobs", ws.memory_jobs, methods=["GET"]),
        r(f"{WS}/memory-jobs/{{id}}/retry", ws.retry_memory_job, methods=["POST"]),
        r(f"{WS}/projects", wm.projects, methods=["GET", "POST"]),
        r(f"{WS}/memories", wm.memories, methods=["GET", "POST"]),
        r(f"{WS}/memories/forget", wm.forget, methods=["POST"]),
        r(f"{WS}/memories/{{id}}/revisions", wm.revisions, methods=["GET"]),
        r(f"{WS}/memory-export", wm.export, methods=["GET"]),
        r("/openapi.json", api.openapi, methods=["GET"]),
        r("/healthz", api.health, methods=["GET"]),
        r("/metrics", MetricsApi(engine, auth).metrics, methods=["GET"]),
        WebSocketRoute("/v1/events", EventsEndpoint(hub, auth, listener_refresh).handle),
        WebSocketRoute("/v1/nodes", NodesEndpoint(auth, engine.prefix).handle),
        *console_routes(),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        await hub.stop()

    app = Starlette(
        routes=routes,
        exception_handlers=HANDLERS,
        lifespan=lifespan,
        # Outermost first: errors contained (the connection survives them); no token → 401
        # before a body is even read; then the body limits.
        middleware=[
            Middleware(RequestLog),  # every answer logged and counted, with its request id
            Middleware(ContainErrors),
            Middleware(TokenRequired, auth=auth),
            Middleware(BodyLimits),
        ],
    )
    app.state.api = api
    app.state.hub = hub
    return app
