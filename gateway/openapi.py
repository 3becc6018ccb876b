"""The OpenAPI 3.1 document served at `/openapi.json`, built from the wire Structs themselves so
that it cannot drift from what the server decodes and encodes."""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from actors.chains import ChainView
from actors.conversations import TurnResult
from engine.directory import Bot, Channel, Chat, Org, User
from engine.listing import BotEntry, ChannelEntry, ChatEntry, Me, Page
from engine.memory import EntryView, LogPage, MemoryPage
from engine.memory_bot import MemoryBotSettings, SettingsPatch
from engine.projects import ProjectCreate, ProjectView
from engine.scoped_memory import WsEntryView, WsForget, WsMemoryCreate
from engine.self_rules import RulesUpdate
from gateway import wire
from storage.chat_store import ItemView

# (method, path, summary, request body type, response type, success status)
ROUTES: list[tuple[str, str, str, Any, Any, int]] = [
    ("post", "/v1/admin/orgs", "Create an org (admin)", wire.CreateOrg, Org, 201),
    ("patch", "/v1/admin/orgs/{id}", "Change org settings (admin)", wire.PatchOrg, Org, 200),
    (
        "post",
        "/v1/admin/users",
        "Create a user and its token (admin)",
        wire.CreateUser,
        wire.UserCreated,
        201,
    ),
    ("post", "/v1/admin/bots", "Create a bot (admin)", wire.CreateBot, Bot, 201),
    (
        "post",
        "/v1/admin/grants",
        "Grant read or write on a bot (admin)",
        wire.CreateGrant,
        None,
        201,
    ),
    (
        "post",
        "/v1/admin/channels",
        "Create a channel group (admin)",
        wire.CreateChannel,
        Channel,
        201,
    ),
    (
        "post",
        "/v1/admin/backup",
        "Consistent snapshot of the data directory (admin)",
        wire.Backup,
        None,
        201,
    ),
    (
        "get",
        "/v1/admin/export",
        "The seed-002 file tree, {files: {path: text}}; ?account=ID for one (admin)",
        None,
        None,
        200,
    ),
    ("post", "/v1/chats", "Start a direct or group chat", wire.CreateChat, Chat, 201),
    (
        "post",
        "/v1/chats/{chat}/turns",
        "A turn (202; ?wait=true: 200 once it ended)",
        wire.TurnBody,
        TurnResult,
        202,
    ),
    ("get", "/v1/chats/{chat}/items", "The chat's items (owner only)", None, None, 200),
    (
        "delete",
        "/v1/chats/{chat}/items",
        "Delete the chat's history (what was learned stays)",
        None,
        None,
        200,
    ),
    (
        "get",
        "/v1/chats/{chat}/confessions",
        "What the bot confided and the answers",
        None,
        None,
        200,
    ),
    (
        "get",
        "/v1/chats/{chat}/enrichments",
        "Input rewrites: text, original, entries used",
        None,
        None,
        200,
    ),
    (
        "get",
        "/v1/bots/{bot}/memory",
        "The caller's entries of this bot's memory (?tags=a,b); with ?q=&limit= a ranked search "
        "whose entries also carry score and foundBy (SearchPage)",
        None,
        MemoryPage,
        200,
    ),
    ("post", "/v1/bots/{bot}/memory", "Remember or Forget", wire.MemoryCommand, EntryView, 200),
    (
        "get",
        "/v1/bots/{bot}/memory/log",
        "Changes to entries the caller can see",
        None,
        LogPage,
        200,
    ),
    (
        "post",
        "/v1/bots/{bot}/memory/{id}/widen",
        "Ask to widen an entry's visibility (ACL-4): 409 unless every source allows it",
        wire.Widen,
        None,
        200,
    ),
    (
        "post",
        "/v1/bots/{bot}/memory/purge",
        "Delete entries by one system tag",
        wire.Purge,
        None,
        200,
    ),
    ("get", "/v1/bots/{bot}/memory/bot", "Memory-bot settings", None, MemoryBotSettings, 200),
    (
        "patch",
        "/v1/bots/{bot}/memory/bot",
        "Change memory-bot settings",
        SettingsPatch,
        MemoryBotSettings,
        200,
    ),
    ("get", "/v1/capabilities", "Features this server offers", None, None, 200),
    (
        "post",
        "/v1/chats/{chat}/turns/{turn}/verdict",
        "Accept or reject a delivery group's result (once)",
        wire.Verdict,
        None,
        200,
    ),
    (
        "get",
        "/api/app/workspace/collaboration",
        "Collaboration chains the caller may see",
        None,
        None,
        200,
    ),
    (
        "post",
        "/api/app/workspace/collaboration/{id}/stop",
        "Stop a whole collaboration chain",
        None,
        ChainView,
        200,
    ),
    ("get", "/api/app/workspace/bots/{bot}/rules", "A bot's rules and revision", None, None, 200),
    (
        "patch",
        "/api/app/workspace/bots/{bot}/rules",
        "Change a bot's rules (write; expectedRevision)",
        RulesUpdate,
        None,
        200,
    ),
    (
        "post",
        "/api/app/workspace/groups/{channel}/mode",
        "Switch a group between discussion and delivery (when idle)",
        wire.GroupMode,
        Channel,
        200,
    ),
]

# Workspace projects and memories (issue 5).
ROUTES += [
    ("get", "/api/app/workspace/projects", "The caller's projects", None, None, 200),
    (
        "post",
        "/api/app/workspace/projects",
        "Create a project (201), or change one: {requestId, id, expectedRevision, ...fields}",
        ProjectCreate,
        ProjectView,
        201,
    ),
    (
        "get",
        "/api/app/workspace/memories",
        "Memories by ?scope=bot|user|project&bot=&project=&q=&status=&limit=&using=; with q "
        "ranked (keyword, semantic, hybrid), each entry with score and foundBy",
        None,
        None,
        200,
    ),
    (
        "post",
        "/api/app/workspace/memories",
        "Create a memory (201), or change one: {requestId, id, expectedRevision, ...fields}",
        WsMemoryCreate,
        WsEntryView,
        201,
    ),
    (
        "post",
        "/api/app/workspace/memories/forget",
        "Forget a memory by expectedRevision",
        WsForget,
        WsEntryView,
        200,
    ),
    (
        "get",
        "/api/app/workspace/memories/{id}/revisions",
        "A memory's revisions: operator, time, before and after",
        None,
        None,
        200,
    ),
    ("get", "/api/app/workspace/memory-export", "Markdown export (text/markdown)", None, None, 200),
    # Listings (engine/listing.py): ?cursor=&limit= (1-200, default 50) → {items, nextCursor}.
    ("get", "/v1/me", "Who the token is", None, Me, 200),
    ("get", "/v1/chats", "The caller's chats (?kind=)", None, Page[ChatEntry], 200),
    ("get", "/v1/bots", "Bots the caller may use", None, Page[BotEntry], 200),
    ("get", "/v1/channels", "The caller's channel groups", None, Page[ChannelEntry], 200),
    ("get", "/v1/chats/{chat}/items/{item}", "One item of a chat", None, ItemView, 200),
    ("get", "/v1/admin/orgs", "Orgs (admin; ?org=)", None, Page[Org], 200),
    ("get", "/v1/admin/users", "Users (admin; ?org=)", None, Page[User], 200),
    ("get", "/v1/admin/bots", "Bots (admin; ?org=)", None, Page[Bot], 200),
    ("get", "/v1/admin/channels", "Channels (admin; ?org=)", None, Page[Channel], 200),
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


@functools.cache
def openapi_document() -> dict[str, Any]:
    types = [t for _, _, _, req, resp, _ in ROUTES for t in (req, resp) if t is not None]
    schemas, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    by_type = dict(zip(types, schemas, strict=True))
    paths: dict[str, dict[str, Any]] = {}
    for method, path, summary, req, resp, status in ROUTES:
        op: dict[str, Any] = {
            "summary": summary,
            "security": [{"bearer": []}],
            "responses": {
                str(status): {
                    "description": "success",
                    "content": {"application/json": {"schema": by_type.get(resp, {})}},
                },
                "default": {
                    "description": "error",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            },
        }
        params = [p.strip("{}") for p in path.split("/") if p.startswith("{")]
        if params:
            op["parameters"] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                for p in params
            ]
        if req is not None:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": by_type[req]}},
            }
        paths.setdefault(path, {})[method] = op
    components["Error"] = _ERROR
    return {
        "openapi": "3.1.0",
        "info": {"title": "OpenBot Engine", "version": "0.1.0"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
