"""Response envelopes and websocket messages that exist on the wire only as dicts, written down as
msgspec Structs so that `/openapi.json` can describe them (gateway/openapi.py). Nothing decodes
with these; a handler that changes its answer's shape changes the Struct here too (the
schemathesis run in tests/test_openapi.py checks answers against the document)."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from actors.contracts import NodeInfo, RevisionView
from engine.chat_records import Confession, Enrichment, ItemView, LearningJob, Turn
from engine.directory import Permission
from engine.projects import ProjectView
from engine.requests import RequestView
from engine.scoped_memory import WorkspaceEntryView


class _Doc(msgspec.Struct, frozen=True, kw_only=True):
    pass


class GrantView(_Doc):
    bot: str
    user: str
    permission: Permission


class GrantRevoked(_Doc):
    bot: str
    user: str
    revoked: bool


class TokenIssued(_Doc):
    id: str
    token: str


class BackupDone(_Doc):
    dir: str
    files: list[str]


class ExportTree(_Doc):
    files: dict[str, str]  # path inside the tree → UTF-8 text


class ImportDone(_Doc):
    accounts: list[str]
    records: int
    projects: int
    skippedReceipts: int
    skippedEntries: int
    skippedRequests: int
    tokens: dict[str, str]  # each new user's token (user id → token), shown once


class Count(_Doc):
    count: int


class Widened(_Doc):
    id: str
    to: str
    widened: bool
    version: int


class TurnAccepted(_Doc):
    turn: Turn


class VerdictDone(_Doc):
    turn: Turn
    next: Turn | None = None  # the leader's new turn after a rejection


class Items(_Doc):
    items: list[ItemView]


class ChatSearchHit(ItemView, frozen=True, kw_only=True):
    """A chat item found by a chat history search: its chat, fused score and retrievers."""

    chat: str
    score: float
    foundBy: list[str]


class ChatSearchPage(_Doc):
    items: list[ChatSearchHit]
    nextCursor: str | None


class Confessions(_Doc):
    confessions: list[Confession]


class Enrichments(_Doc):
    enrichments: list[Enrichment]


class CapabilitiesView(_Doc):
    capabilities: list[str]
    unavailable: list[str]
    nodes: list[NodeInfo]


class BotNode(_Doc):
    bot: str
    node: NodeInfo
    memoryInjected: bool
    extraction: bool


class Health(_Doc):
    ok: bool


class RulesView(_Doc):
    id: str
    name: str
    kind: str
    rules: dict[str, Any]
    revision: int


class MemoryJobs(_Doc):
    jobs: list[LearningJob]


class Projects(_Doc):
    projects: list[ProjectView]


class WorkspaceEntries(_Doc):
    entries: list[WorkspaceEntryView]


class Revisions(_Doc):
    revisions: list[RevisionView]


class OpenApiDocument(_Doc):
    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]
    components: dict[str, Any]


# --- websocket messages (gateway/events.py, gateway/nodes.py) ---


class EventsAuth(_Doc):
    """`/v1/events`, client → server: the first message when no Authorization header was sent."""

    type: Literal["auth"]
    token: str


class EventFrame(_Doc):
    """`/v1/events`, server → client: one event. `type` is the event type (memory.changed,
    memory.job.changed, project.changed, collaboration.changed, chat.item.created,
    chat.items.deleted, chat.updated, request.changed); `cursor` resumes after it (`?cursor=`).

    The server closes the socket with: 4400 bad frame, unknown message type or bad cursor;
    4401 missing or bad token; 4403 the token stopped working while connected (replaced or
    revoked; the socket is closed by the time the replacement returns): connect with the new
    one; 4408 no auth message in time; 4409 cursor fell out of the kept window while catching
    up: reconnect; 4429 too slow: resume with the last cursor; 1009 frame too large; 1011
    server error, or access changed and could not be re-checked: reconnect. A removed grant
    does not close it: by the time the removal returns, the bot's events stop."""

    type: str
    cursor: str
    at: int
    data: dict[str, Any] | None = None


class NodeWelcome(_Doc):
    """`/v1/nodes`, server → node: the answer to `hello`; node messages are gateway/nodes.py's."""

    type: Literal["welcome"]
    node: str
    session: int


class NodeRequest(_Doc):
    """`/v1/nodes`, server → node: a model call for a bot whose model is `kind = "node"`."""

    type: Literal["request"]
    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]


class Requests(_Doc):
    requests: list[RequestView]


class ProfilePatch(_Doc):
    """`PATCH /api/app/workspace/bots/{bot}`: the one switch a bot's owner has; the legacy
    per-bot toggles are accepted and ignored (WS-1)."""

    autoRecord: bool | None = None
    team: bool | None = None
    collaboration: bool | None = None
