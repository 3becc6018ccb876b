"""The Starlette application: every route group's table, the middleware stack, capabilities and
the OpenAPI document (docs/design.md §9). The handlers live in one module per group: admin_routes,
chat_routes, memory_routes, listing_routes, request_routes, workspace_routes and
workspace_memory_routes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from actors.ports import EnginePort
from engine.directory import require_use
from engine.errors import InvalidInput
from gateway.admin_routes import AdminApi
from gateway.auth import Auth, TokenRequired
from gateway.cached_reads import CachedReads
from gateway.chat_routes import ChatsApi
from gateway.console_routes import console_routes
from gateway.errors import HANDLERS
from gateway.events import PATH as EVENTS_PATH
from gateway.events import EventsEndpoint, Hub, StreamFirst
from gateway.file_export_route import FileExportApi
from gateway.json_response import BodyLimits, json
from gateway.listing_routes import ListingApi
from gateway.memory_routes import MemoryApi
from gateway.metrics import MetricsApi, RequestLog
from gateway.nodes import NodesEndpoint
from gateway.openapi import openapi_document
from gateway.request_routes import RequestsApi
from gateway.routing import Endpoint, PrefixRouter
from gateway.workspace_memory_routes import WorkspaceMemoryApi
from gateway.workspace_routes import WorkspaceApi

# ND-1's capabilities, each announced once the issue that builds it landed.
CAPABILITIES = (
    "bot-memory-v1",
    "bot-collaboration-v1",
    "bot-discussion-v1",
    "bot-projects-v1",
    "bot-file-memory-v1",  # the account file tree: memory export, openbot export/import
)
PLANNED: tuple[str, ...] = ()
WS = "/api/app/workspace"


class DiscoveryApi:
    """What a client asks before anything else: capabilities, a bot's node, the API document and
    the health probe."""

    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth

    async def capabilities(self, request: Request) -> Response:
        await self.auth.caller(request)  # node ids and their flags are not for strangers
        nodes = await self.engine.node_hub.nodes()
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
        info = await self.engine.shard_port(bot.owner).bot_node(bot.model)
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


def create_app(
    engine: EnginePort,
    admin_token: str,
    *,
    cache_ttl: float = 60.0,
    listener_refresh: float = 30.0,
    cached_reads: bool = True,
) -> Starlette:
    """The gateway's app. `cached_reads=False` leaves out the shortcut for cached memory pages
    (gateway/cached_reads.py): every read takes the whole stack (benchmarks compare the two)."""
    if not admin_token:
        raise InvalidInput("an admin token is required")
    auth = Auth(engine, admin_token, ttl=cache_ttl)
    hub = Hub(engine)
    events = EventsEndpoint(hub, auth, listener_refresh)
    admin = AdminApi(engine, auth)
    chats = ChatsApi(engine, auth)
    memory = MemoryApi(engine, auth, hub)
    api = DiscoveryApi(engine, auth)
    ws = WorkspaceApi(engine, auth)
    wm = WorkspaceMemoryApi(engine, auth)
    lists = ListingApi(engine, auth)
    rq = RequestsApi(engine, auth, chats)
    trees = FileExportApi(engine, auth)
    r: Callable[..., Route] = Endpoint
    read_memory = r("/v1/bots/{bot}/memory", memory.get_memory, methods=["GET"])
    routes = [
        r("/v1/admin/orgs", lists.admin_list("orgs"), methods=["GET"]),
        r("/v1/admin/users", lists.admin_list("users"), methods=["GET"]),
        r("/v1/admin/bots", lists.admin_list("bots"), methods=["GET"]),
        r("/v1/admin/channels", lists.admin_list("channels"), methods=["GET"]),
        r("/v1/me", lists.me, methods=["GET"]),
        r("/v1/chats", lists.chats, methods=["GET"]),
        r("/v1/search", chats.search.everywhere, methods=["GET"]),
        r("/v1/bots", lists.bots, methods=["GET"]),
        r("/v1/channels", lists.channels, methods=["GET"]),
        r("/v1/chats/{chat}/items/{item}", chats.chat_item, methods=["GET"]),
        r("/v1/admin/orgs", admin.create_org, methods=["POST"]),
        r("/v1/admin/orgs/{id}", admin.patch_org, methods=["PATCH"]),
        r("/v1/admin/users", admin.create_user, methods=["POST"]),
        r("/v1/admin/bots", admin.create_bot, methods=["POST"]),
        r("/v1/admin/bots/{id}", admin.patch_bot, methods=["PATCH"]),
        r("/v1/admin/grants", admin.create_grant, methods=["POST"]),
        r("/v1/admin/bots/{bot}/grants/{user}", admin.revoke_grant, methods=["DELETE"]),
        r("/v1/admin/bots/{bot}/orgs", admin.share_bot, methods=["POST"]),
        r("/v1/admin/bots/{bot}/orgs/{org}", admin.unshare_bot, methods=["DELETE"]),
        r("/v1/admin/users/{id}/token", admin.new_token, methods=["POST"]),
        r("/v1/admin/channels", admin.create_channel, methods=["POST"]),
        r("/v1/admin/backup", admin.backup, methods=["POST"]),
        r("/v1/admin/export", trees.export, methods=["GET"]),
        r("/v1/admin/import", trees.import_tree, methods=["POST"]),
        r("/v1/chats", chats.create_chat, methods=["POST"]),
        r("/v1/chats/{chat}", chats.patch_chat, methods=["PATCH"]),
        r("/v1/chats/{chat}/turns", chats.post_turn, methods=["POST"]),
        r("/v1/chats/{chat}/items", chats.chat_items, methods=["GET", "DELETE"]),
        r("/v1/chats/{chat}/turns/{turn}/verdict", chats.verdict, methods=["POST"]),
        r("/v1/chats/{chat}/confessions", chats.confessions, methods=["GET"]),
        r("/v1/chats/{chat}/enrichments", chats.enrichments, methods=["GET"]),
        r("/v1/chats/{chat}/requests", rq.open, methods=["POST"]),
        r("/v1/requests", rq.listing, methods=["GET"]),
        r("/v1/requests/{id}", rq.get, methods=["GET"]),
        r("/v1/requests/{id}/decision", rq.decide, methods=["POST"]),
        r("/v1/requests/{id}/review", rq.review, methods=["POST"]),
        read_memory,
        r("/v1/bots/{bot}/memory", memory.post_memory, methods=["POST"]),
        r("/v1/bots/{bot}/memory/log", memory.memory_log, methods=["GET"]),
        r("/v1/bots/{bot}/memory/{id}/widen", memory.widen, methods=["POST"]),
        r("/v1/bots/{bot}/memory/purge", memory.purge, methods=["POST"]),
        r("/v1/bots/{bot}/memory/bot", memory.get_memory_bot, methods=["GET"]),
        r("/v1/bots/{bot}/memory/bot", memory.patch_memory_bot, methods=["PATCH"]),
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
        WebSocketRoute(EVENTS_PATH, events.handle),  # (served ahead of the middlewares)
        WebSocketRoute("/v1/nodes", NodesEndpoint(auth, engine.node_hub).handle),
        *console_routes(),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        yield
        await hub.stop()
        await auth.close()

    app = StreamFirst(
        routes=routes,
        exception_handlers=HANDLERS,
        lifespan=lifespan,
        # Outermost first: every answer logged and counted, and errors contained (the
        # connection survives them); a current cached memory page answered at once; no token →
        # 401 before a body is even read; then the body limits.
        middleware=[
            Middleware(RequestLog),  # (with its request id)
            *([Middleware(CachedReads, memory=memory, route=read_memory)] if cached_reads else []),
            Middleware(TokenRequired, auth=auth),
            Middleware(BodyLimits),
        ],
    )
    app.router = PrefixRouter(routes, lifespan=lifespan)  # the same routes, fewer regexes tried
    app.state.hub = hub
    app.events = events
    return app
