"""The OpenAPI 3.1 document served at `/openapi.json`, built from the wire Structs themselves so
that it cannot drift from what the server decodes and encodes.

Every route of gateway/app.py has one `Op` in `ROUTES` (tests/test_openapi.py walks the app's
routes and fails on any route or method missing here). To document a new route add one line:

    Op("get", "/v1/things", "List things", ok=Things, query=(CURSOR, LIMIT)),

`body` is the request Struct (a tuple of Structs for a body that takes several shapes: `oneOf`),
`ok` the success answer (a Struct, `Text(...)` for a non-JSON body, or a dict status → either
when one route answers with several statuses), `query` its query parameters, `auth` who may call
it. Response envelopes that are plain dicts in the handlers are Structs in gateway/openapi_shapes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from actors.contracts import ChainView, TurnResult
from engine.bot_policy import BotProfile
from engine.casing import camel_schema, plain_component_names
from engine.chat_records import ItemView, LearningJob
from engine.directory import Bot, Channel, Chat, Org, User
from engine.listing import BotEntry, ChannelEntry, ChatEntry, Me, Page
from engine.memory_bot_settings import MemoryBotSettings, MemoryBotView, SettingsPatch
from engine.memory_entries import EntryView, LogPage, MemoryPage
from engine.projects import ProjectChange, ProjectCreate, ProjectView
from engine.requests import RequestView
from engine.scoped_memory import (
    WorkspaceEntryView,
    WorkspaceForget,
    WorkspaceMemoryChange,
    WorkspaceMemoryCreate,
)
from engine.self_rules import RulesUpdate
from gateway import openapi_shapes as s
from gateway import wire
from gateway.nodes import Failure as NodeFailure
from gateway.nodes import Hello as NodeHello
from gateway.nodes import Result as NodeResult


@dataclass(frozen=True)
class Text:
    """A success body that is not JSON."""

    media: str


@dataclass(frozen=True)
class Param:
    name: str
    description: str
    schema: dict = field(default_factory=lambda: {"type": "string"})
    required: bool = False


@dataclass(frozen=True)
class Op:
    method: str
    path: str
    summary: str
    body: Any = None  # a Struct, or a tuple of Structs (oneOf)
    ok: Any = None  # a Struct, Text, or {status: Struct | Text}
    status: int = 200  # the success status when `ok` is not a dict
    query: tuple[Param, ...] = ()
    auth: Literal["user", "admin", "none"] = "user"
    websocket: dict | None = None  # {"client": (Structs…), "server": (Structs…)}

    def answers(self) -> dict[int, Any]:
        return dict(self.ok) if isinstance(self.ok, dict) else {self.status: self.ok}


def _q(name: str, description: str, **schema: Any) -> Param:
    return Param(name, description, schema or {"type": "string"})


TAGS = _q("tags", "only entries with all these topics, comma-separated (a,b)")
WAIT = _q("wait", "true: answer 200 once the turn ended instead of 202 at once", type="boolean")
SCOPE = _q("scope", "only this scope", enum=["bot", "user", "project"])
BOT = _q("bot", "only this bot's memory (a bot you use)")
PROJECT = _q("project", "only this project (project scope)")
SEARCH = _q("q", "search words (keyword, and semantic when configured)")
STATUS = _q("status", "entry status (default active)", enum=["active", "forgotten", "all"])
LIMIT = _q("limit", "at most this many (default 50)", type="integer", minimum=1, maximum=500)
CURSOR = _q("cursor", "resume after this cursor (from an earlier page or frame)")
ACCOUNT = _q("account", "only this account (a user id)")
PAGE = _q("limit", "page size (default 50)", type="integer", minimum=1, maximum=200)
PAGED = (CURSOR, PAGE)
KIND = _q("kind", "only chats of this kind", enum=["direct", "group", "review", "agent"])
ORG = _q("org", "only this org's records")
USING = _q("using", "which retrievers (default all)", enum=["all", "keyword", "semantic"])
CHAT_Q = _q("q", "search words (1-1000 characters): a ranked search of the chat's items")
CHAT_SEARCH = Param(
    "q", "search words (1-1000 characters)", {"type": "string", "maxLength": 1000}, True
)
CHAT_LIMIT = _q("limit", "at most this many (default 20)", type="integer", minimum=1, maximum=100)
PROMETHEUS = Text("text/plain; version=0.0.4")  # the Prometheus exposition format
WS = "/api/app/workspace"

ROUTES: list[Op] = [
    # --- admin: the directory ---
    Op("post", "/v1/admin/orgs", "Create an org", wire.CreateOrg, Org, 201, auth="admin"),
    Op("patch", "/v1/admin/orgs/{id}", "Change org settings", wire.PatchOrg, Org, auth="admin"),
    Op(
        "post",
        "/v1/admin/users",
        "Create a user and its token",
        wire.CreateUser,
        wire.UserCreated,
        201,
        auth="admin",
    ),
    Op(
        "post",
        "/v1/admin/bots",
        "Create a bot (model: a configured name)",
        wire.CreateBot,
        Bot,
        201,
        auth="admin",
    ),
    Op(
        "patch",
        "/v1/admin/bots/{id}",
        "Change a bot's model, name or avatar",
        wire.PatchBot,
        Bot,
        auth="admin",
    ),
    Op(
        "post",
        "/v1/admin/grants",
        "Grant read or write on a bot",
        wire.CreateGrant,
        s.GrantView,
        201,
        auth="admin",
    ),
    # Revocations answer once every gateway applied them (actors/access_watch.py).
    Op("delete", "/v1/admin/bots/{bot}/grants/{user}", "Revoke", ok=s.GrantRevoked, auth="admin"),
    Op(
        "post",
        "/v1/admin/bots/{bot}/orgs",
        "Share a bot with another org (again: no change)",
        wire.ShareBot,
        Bot,
        auth="admin",
    ),
    Op("delete", "/v1/admin/bots/{bot}/orgs/{org}", "Stop sharing a bot", ok=Bot, auth="admin"),
    Op("post", "/v1/admin/users/{id}/token", "New token", ok=s.TokenIssued, auth="admin"),
    Op(
        "post",
        "/v1/admin/channels",
        "Create a channel group",
        wire.CreateChannel,
        Channel,
        201,
        auth="admin",
    ),
    Op(
        "post",
        "/v1/admin/backup",
        "Consistent snapshot of the data directory",
        wire.Backup,
        s.BackupDone,
        201,
        auth="admin",
    ),
    Op(
        "get",
        "/v1/admin/export",
        "The account file tree, {files: {path: text}}",
        ok=s.ExportTree,
        query=(ACCOUNT,),
        auth="admin",
    ),
    Op(
        "post",
        "/v1/admin/import",
        "Merge a file tree ({files: {path: text}}, as exported) into this server; id_clash "
        "when an id is taken (an org only joined when joinOrgs names it)",
        wire.TreeImport,
        s.ImportDone,
        201,
        auth="admin",
    ),
    # --- chats ---
    Op("post", "/v1/chats", "Start a direct or group chat", wire.CreateChat, Chat, 201),
    Op(
        "patch",
        "/v1/chats/{chat}",
        "Set, change or clear (null) a direct chat's project (WS-7); announced as chat.updated",
        wire.PatchChat,
        Chat,
    ),
    Op(
        "post",
        "/v1/chats/{chat}/turns",
        "A turn: 202 at once, or 200 once it ended (?wait=true)",
        wire.TurnBody,
        {202: s.TurnAccepted, 200: TurnResult},
        query=(WAIT,),
    ),
    Op(
        "get",
        "/v1/chats/{chat}/items",
        "The chat's items; with ?q= a ranked search whose items also carry chat, score and "
        "foundBy, in pages (ChatSearchPage)",
        ok=s.Items,
        query=(CHAT_Q, CHAT_LIMIT, CURSOR, USING),
    ),
    Op(
        "get",
        "/v1/search",
        "Search the items of every chat the caller may read (ranked, in pages)",
        ok=s.ChatSearchPage,
        query=(CHAT_SEARCH, CHAT_LIMIT, CURSOR, USING),
    ),
    Op(
        "delete",
        "/v1/chats/{chat}/items",
        "Delete the chat's history (what was learned stays)",
        ok=s.Count,
    ),
    Op(
        "post",
        "/v1/chats/{chat}/turns/{turn}/verdict",
        "Accept or reject a delivery group's result (once)",
        wire.Verdict,
        s.VerdictDone,
    ),
    Op(
        "get",
        "/v1/chats/{chat}/confessions",
        "What the bot confided and the answers",
        ok=s.Confessions,
    ),
    Op(
        "get",
        "/v1/chats/{chat}/enrichments",
        "Input rewrites: text, original, entries used",
        ok=s.Enrichments,
    ),
    # --- bot memory ---
    Op(
        "get",
        "/v1/bots/{bot}/memory",
        "The caller's entries of this bot's memory; with ?q= a ranked search whose entries "
        "also carry score and foundBy (SearchPage)",
        ok=MemoryPage,
        query=(TAGS, SEARCH, LIMIT),
    ),
    Op(
        "post",
        "/v1/bots/{bot}/memory",
        "Remember (201) or Forget (200)",
        wire.MemoryCommand,
        {201: EntryView, 200: EntryView},
    ),
    Op("get", "/v1/bots/{bot}/memory/log", "Changes to entries the caller can see", ok=LogPage),
    Op(
        "post",
        "/v1/bots/{bot}/memory/{id}/widen",
        "Ask to widen an entry's visibility (ACL-4): 409 unless every source allows it",
        wire.Widen,
        s.Widened,
    ),
    Op(
        "post",
        "/v1/bots/{bot}/memory/purge",
        "Delete entries by one system tag: learned and pinned entries and the bot's workspace "
        "records; `chat:` also the user and project facts learned from that chat",
        wire.Purge,
        s.Count,
    ),
    Op(
        "get",
        "/v1/bots/{bot}/memory/bot",
        "Memory-bot settings and this day's and month's spend",
        ok=MemoryBotView,
    ),
    Op(
        "patch",
        "/v1/bots/{bot}/memory/bot",
        "Change memory-bot settings",
        SettingsPatch,
        MemoryBotSettings,
    ),
    # --- discovery and operations ---
    Op(
        "get",
        "/v1/capabilities",
        "Features this server offers and its nodes",
        ok=s.CapabilitiesView,
    ),
    Op("get", "/v1/bots/{bot}/node", "Where a bot's model runs (ND-2, ND-3)", ok=s.BotNode),
    Op("get", "/openapi.json", "This document", ok=s.OpenApiDocument),
    Op("get", "/healthz", "Liveness", ok=s.Health, auth="none"),
    Op("get", "/metrics", "Prometheus metrics", ok=PROMETHEUS, auth="admin"),
    # --- workspace ---
    Op("get", f"{WS}/collaboration", "Chains seen, newest first", ok=Page[ChainView], query=PAGED),
    Op("post", f"{WS}/collaboration/{{id}}/stop", "Stop a whole collaboration chain", ok=ChainView),
    Op("get", f"{WS}/bots/{{bot}}/rules", "A bot's rules and revision", ok=s.RulesView),
    Op(
        "patch",
        f"{WS}/bots/{{bot}}/rules",
        "Change a bot's rules (write; expectedRevision)",
        RulesUpdate,
        s.RulesView,
    ),
    Op(
        "post",
        f"{WS}/groups/{{channel}}/mode",
        "Switch a group between discussion and delivery (when idle)",
        wire.GroupMode,
        Channel,
    ),
    Op(
        "get",
        f"{WS}/memory-jobs",
        "Learning jobs of the caller's turns (with rejections)",
        ok=s.MemoryJobs,
    ),
    Op("post", f"{WS}/memory-jobs/{{id}}/retry", "Run a failed learning job again", ok=LearningJob),
    Op("get", f"{WS}/projects", "The caller's projects", ok=s.Projects),
    Op(
        "post",
        f"{WS}/projects",
        "Create a project (201), or change one (expectedRevision: 200)",
        (ProjectCreate, ProjectChange),
        {201: ProjectView, 200: ProjectView},
    ),
    Op(
        "get",
        f"{WS}/memories",
        "Memories by scope, or a search",
        ok=s.WorkspaceEntries,
        query=(SCOPE, BOT, PROJECT, SEARCH, STATUS, LIMIT, USING),
    ),
    Op(
        "post",
        f"{WS}/memories",
        "Create a memory (201), or change one (expectedRevision: 200)",
        (WorkspaceMemoryCreate, WorkspaceMemoryChange),
        {201: WorkspaceEntryView, 200: WorkspaceEntryView},
    ),
    Op(
        "post",
        f"{WS}/memories/forget",
        "Forget a memory by expectedRevision",
        WorkspaceForget,
        WorkspaceEntryView,
    ),
    Op(
        "get",
        f"{WS}/memories/{{id}}/revisions",
        "Revisions: operator, time, before and after",
        ok=s.Revisions,
    ),
    Op(
        "get",
        f"{WS}/memory-export",
        "Markdown export",
        ok=Text("text/markdown"),
        query=(SCOPE, BOT, PROJECT),
    ),
    # --- websockets (GET with 101 Switching Protocols; messages in x-websocket) ---
    Op(
        "get",
        "/v1/events",
        "The live, resumable event stream (websocket)",
        query=(CURSOR,),
        websocket={"client": (s.EventsAuth,), "server": (s.EventFrame,)},
    ),
    Op(
        "get",
        "/v1/nodes",
        "External execution nodes (websocket; admin token)",
        auth="admin",
        websocket={
            "client": (NodeHello, NodeResult, NodeFailure),
            "server": (s.NodeWelcome, s.NodeRequest),
        },
    ),
    # --- listings (engine/listing.py): {items, nextCursor}; ?cursor= from nextCursor ---
    Op("get", "/v1/me", "Who the token is", ok=Me),
    Op("get", "/v1/chats", "The caller's chats", ok=Page[ChatEntry], query=(CURSOR, PAGE, KIND)),
    Op("get", "/v1/bots", "Bots the caller may use", ok=Page[BotEntry], query=(CURSOR, PAGE)),
    Op(
        "get",
        "/v1/channels",
        "The caller's channel groups",
        ok=Page[ChannelEntry],
        query=(CURSOR, PAGE),
    ),
    Op("get", "/v1/chats/{chat}/items/{item}", "One item (as an event names it)", ok=ItemView),
    Op("get", "/v1/admin/orgs", "Orgs", ok=Page[Org], query=(CURSOR, PAGE, ORG), auth="admin"),
    Op("get", "/v1/admin/users", "Users", ok=Page[User], query=(CURSOR, PAGE, ORG), auth="admin"),
    Op("get", "/v1/admin/bots", "Bots", ok=Page[Bot], query=(CURSOR, PAGE, ORG), auth="admin"),
    Op(
        "get",
        "/v1/admin/channels",
        "Channels",
        ok=Page[Channel],
        query=(CURSOR, PAGE, ORG),
        auth="admin",
    ),
    Op("get", "/", "The web console", ok=Text("text/html"), auth="none"),
]

# Requests (approvals) and bot profiles (ENR-3, WS-1, WS-3).
REQUEST_STATUS = _q(
    "status", "only requests in this state", enum=["pending", "approved", "rejected"]
)
DECIDE_WAIT = _q("wait", "true: answer once the woken bot's step is stored", type="boolean")
ROUTES += [
    Op("get", "/v1/requests", "The caller's requests", ok=s.Requests, query=(REQUEST_STATUS,)),
    Op("get", "/v1/requests/{id}", "A request: what the bot proposed", ok=RequestView),
    Op(
        "post",
        "/v1/chats/{chat}/requests",
        "Open a request in a direct chat or a group (201); its decision wakes the bot",
        wire.OpenRequest,
        RequestView,
        201,
    ),
    Op(
        "post",
        "/v1/requests/{id}/decision",
        "Approve or reject a request, once (409 already_decided); wakes the bot in its chat",
        wire.Decision,
        RequestView,
        query=(DECIDE_WAIT,),
    ),
    Op("post", "/v1/requests/{id}/review", "Open the request's review chat", ok={201: Chat}),
    Op("get", f"{WS}/bots/{{bot}}", "A bot's profile and server permissions", ok=BotProfile),
    Op(
        "patch",
        f"{WS}/bots/{{bot}}",
        "Pause or resume autoRecord; old team/collaboration toggles are ignored",
        s.ProfilePatch,
        BotProfile,
    ),
    Op(
        "post",
        f"{WS}/bots/{{bot}}/archive",
        "Archive (or restore with {archived: false}) a bot",
        wire.Archive,
        BotProfile,
    ),
]

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            "required": ["code", "message"],
        }
    },
    "required": ["error"],
}
_ERROR_REF = {"$ref": "#/components/schemas/Error"}


def _types(op: Op) -> list[Any]:
    out: list[Any] = []
    if op.body is not None:
        out.extend(op.body if isinstance(op.body, tuple) else (op.body,))
    out.extend(t for t in op.answers().values() if t is not None and not isinstance(t, Text))
    if op.websocket:
        out.extend(t for side in op.websocket.values() for t in side)
    return out


def _one_of(types: Any, by_type: dict) -> dict:
    if isinstance(types, tuple):
        return {"oneOf": [by_type[t] for t in types]}
    return by_type[types]


def _operation(op: Op, by_type: dict) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    if op.websocket is not None:
        responses["101"] = {"description": "switched to the websocket protocol"}
    for status, kind in sorted(op.answers().items()):
        if kind is None:
            continue
        media = kind.media if isinstance(kind, Text) else "application/json"
        schema = {"type": "string"} if isinstance(kind, Text) else by_type[kind]
        responses[str(status)] = {"description": "success", "content": {media: {"schema": schema}}}
    responses["default"] = {
        "description": "error",
        "content": {"application/json": {"schema": _ERROR_REF}},
    }
    out: dict[str, Any] = {"summary": op.summary, "responses": responses}
    out["security"] = [] if op.auth == "none" else [{"bearer": []}]
    if op.auth == "admin":
        out["description"] = "Needs the admin token."
    params = [
        {"name": p.strip("{}"), "in": "path", "required": True, "schema": {"type": "string"}}
        for p in op.path.split("/")
        if p.startswith("{")
    ]
    params += [
        {
            "name": p.name,
            "in": "query",
            "required": p.required,
            "description": p.description,
            "schema": p.schema,
        }
        for p in op.query
    ]
    if params:
        out["parameters"] = params
    if op.body is not None:
        out["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _one_of(op.body, by_type)}},
        }
    if op.websocket is not None:
        out["x-websocket"] = {
            side: {"oneOf": [by_type[t] for t in types]} for side, types in op.websocket.items()
        }
    return out


@functools.cache
def openapi_document() -> dict[str, Any]:
    types = list(dict.fromkeys(t for op in ROUTES for t in _types(op)))
    schemas, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    by_type = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for op in ROUTES:
        paths.setdefault(op.path, {})[op.method] = _operation(op, by_type)
    components["Error"] = _ERROR
    # As JSON has it (tuple defaults become lists), so the document validates as served.
    return _as_json(
        {
            "openapi": "3.1.0",
            "info": {"title": "OpenBot Engine", "version": "0.1.0"},
            "paths": paths,
            "components": {
                "schemas": components,
                "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            },
        }
    )


def _as_json(doc: dict[str, Any]) -> dict[str, Any]:
    # The wire is camelCase: property names, `required` and defaults as served,
    # component names without msgspec's `_` (`Page_Bot_` → `PageBot`).
    return plain_component_names(camel_schema(msgspec.json.decode(msgspec.json.encode(doc))))
