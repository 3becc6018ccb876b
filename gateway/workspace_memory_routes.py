"""Workspace projects and memories for the signed-in account (docs/requirements.md §11 WA-1, WA-2).

    GET|POST /api/app/workspace/projects              list · create · change by expectedRevision
    GET|POST /api/app/workspace/memories              by scope / search · create · change
    POST     /api/app/workspace/memories/forget       forget by expectedRevision
    GET      /api/app/workspace/memories/{id}/revisions
    GET      /api/app/workspace/memory-export         Markdown, `- (YYYY-MM-DD) content`

Where things are: a project and its memory pool live on the shard of the project's owner (the
directory keeps project id → owner); a bot's pool on its owner's shard; a user's pool on the
user's shard. A record is found by asking the shards which one keeps its id. Every shard checks
access again itself; what the caller may not read is "not found".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from actors.contracts import USING, WorkspaceAccess, WorkspaceListing, WorkspaceQuery
from actors.ports import EnginePort, ShardPort
from engine import projects as projmod
from engine.directory import Principal, User, check_id, require_use, resolve_org, work_org
from engine.errors import InvalidInput, NotFound
from engine.memory_entries import Scope
from engine.memory_export import render
from engine.numbers import query_number
from engine.projects import ProjectCreate
from engine.scoped_memory import (
    WorkspaceEntryView,
    WorkspaceForget,
    WorkspaceMemoryChange,
    WorkspaceMemoryCreate,
)
from engine.workspace_search import Hit, combine
from gateway import wire
from gateway.auth import Auth, org_header
from gateway.json_response import json, read_body

SCOPES = ("bot", "user", "project")
STATUSES = ("active", "forgotten", "all")
DEFAULT_SEARCH_LIMIT = 50
MAX_SEARCH_LIMIT = 500
_SCOPE_ORDER = {s: i for i, s in enumerate(SCOPES)}
_TIER_ORDER = {"profile": 0, "log": 1, "note": 2}


def derived_project_id(owner: str, request_id: str) -> str:
    """The id of a project created without one: the same for a repeated request, so a retry
    finds the first one's receipt (and directory entry) instead of making another."""
    digest = hashlib.sha256(f"{owner}\x00{request_id}".encode()).hexdigest()
    return "p_" + digest[:20]


def account_project_id(owner: str, given: str) -> str:
    """The id of a project created with an explicit `id`: that id is the account's own key,
    namespaced by the account. Two accounts giving the same id get two projects,
    so creating one never answers "already exists" for another account's (or org's) project:
    a probe cannot tell a taken id from a free one. The same account and id always give the
    same project (a second create with a new requestId is 409 `exists`)."""
    check_id(given, "project id")
    digest = hashlib.sha256(f"{owner}\x00id\x00{given}".encode()).hexdigest()
    return "p_" + digest[:20]


_create_dec = msgspec.json.Decoder(WorkspaceMemoryCreate)


def decode_memory_write(body: bytes) -> WorkspaceMemoryCreate | WorkspaceMemoryChange:
    """`POST /memories` takes a create or a change; `expectedRevision` makes it a change."""
    try:  # a well-formed creation in one pass (unknown keys are refused: a change never is one)
        return _create_dec.decode(body)
    except msgspec.DecodeError:
        pass  # anything else as before: its own error, or a change, or old snake_case names
    raw = wire.decode_any(body)
    if not isinstance(raw, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_body")
    kind: type[WorkspaceMemoryCreate | WorkspaceMemoryChange] = (
        WorkspaceMemoryChange if "expectedRevision" in raw else WorkspaceMemoryCreate
    )
    return wire.convert(raw, kind)


def _one_line_param(request: Request, name: str) -> str | None:
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    return value


class WorkspaceMemoryApi:
    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth

    async def _caller(self, request: Request) -> tuple[Principal, WorkspaceAccess]:
        principal = await self.auth.user(request)
        assert principal.user is not None
        user = principal.user
        header = org_header(request)
        orgs = ((resolve_org(user, header),) if header or user.orgs else ()) + tuple(user.orgs)
        # The org the caller works in with each bot (a shared bot works in several): its
        # records of the other orgs are read in none of this request's listings.
        works = {b: work_org(await self.auth.bot(b), user, header) for b in sorted(principal.bots)}
        access = WorkspaceAccess(
            account=user.id,
            bots=principal.bots,
            orgs=tuple(dict.fromkeys(orgs)),
            channels=principal.channels,
            bot_orgs={b: org for b, org in works.items() if org is not None},
        )
        return principal, access

    async def _project_shard(self, project_id: str) -> ShardPort:
        check_id(project_id, "project id")
        owner = await self.engine.directory_port.project_owner(project_id)
        if owner is None:
            raise NotFound("no such project", code="project_not_found")
        return self.engine.shard_port(owner)

    async def _entry_shard(self, entry_id: str) -> ShardPort:
        check_id(entry_id, "memory id")
        found = await asyncio.gather(
            *(s.workspace_has_entry(entry_id) for s in self.engine.shard_ports)
        )
        for shard, has in zip(self.engine.shard_ports, found, strict=True):
            if has:
                return shard
        raise NotFound("no such memory", code="memory_not_found")

    # --- projects ---

    async def projects(self, request: Request) -> Response:
        principal, access = await self._caller(request)
        me = access.account
        if request.method == "GET":
            found = await asyncio.gather(
                *(s.workspace_projects(me) for s in self.engine.shard_ports)
            )
            projects = sorted(
                (p for part in found for p in part), key=lambda p: (p.createdAt, p.id)
            )
            return json({"projects": projects})
        change = projmod.decode_request(await read_body(request))
        projmod.check_request_id(change.requestId)
        if isinstance(change, ProjectCreate):
            assert principal.user is not None
            org = resolve_org(principal.user, org_header(request))
            if change.id is not None:
                pid = account_project_id(me, change.id)
                change = msgspec.structs.replace(change, id=None)
            else:
                pid = derived_project_id(me, change.requestId)
            shard = self.engine.shard_port(me)
            project = await shard.workspace_save_project(me, org, change, pid)
            return json(project, 201)
        shard = await self._project_shard(change.id)
        project = await shard.workspace_save_project(me, "", change, change.id)
        return json(project)

    # --- memories ---

    async def _collect(
        self,
        access: WorkspaceAccess,
        request: Request,
        user: User,
        *,
        status: str | None = None,
        search: bool = True,
    ) -> tuple[list[WorkspaceEntryView], dict[str, str], list[Hit] | None]:
        """The records the query names that the caller may read, in listing or hit order,
        display names of pools and bots, and with a query the ranking (score, retrievers)."""
        params = request.query_params
        scope = _one_line_param(request, "scope")
        if scope is not None and scope not in SCOPES:
            raise InvalidInput("scope must be bot, user or project", code="invalid_scope")
        bot_id = _one_line_param(request, "bot")
        project_id = _one_line_param(request, "project")
        q = _one_line_param(request, "q") if search else None
        using = _one_line_param(request, "using") or "all"
        if using not in USING:
            raise InvalidInput("using must be all, keyword or semantic", code="invalid_using")
        status = status or params.get("status") or "active"
        if status not in STATUSES:
            raise InvalidInput("status must be active, forgotten or all", code="invalid_status")
        limit = query_number(
            params.get("limit"),
            field="limit",
            low=1,
            high=MAX_SEARCH_LIMIT,
            default=DEFAULT_SEARCH_LIMIT,
        )
        if project_id is not None and scope not in (None, "project"):
            raise InvalidInput("project is for project scope", code="invalid_query")
        me = access.account
        names: dict[str, str] = {}
        if bot_id is not None:
            bot = await self.auth.bot(bot_id)
            require_use(bot, user)
            names[bot.id] = bot.name
        shards = self.engine.shard_ports
        pools: dict[int, list[str]] = {}
        projects: dict[int, tuple[str, ...] | None] = {}
        if scope in (None, "bot"):
            for b in [bot_id] if bot_id is not None else sorted(access.bots):
                bot = await self.auth.bot(b)
                names[bot.id] = names[f"bot:{bot.id}"] = bot.name
                pools.setdefault(self.engine.shard_index(bot.owner), []).append(f"bot:{bot.id}")
        if scope in (None, "user"):
            pools.setdefault(self.engine.shard_index(me), []).append(f"user:{me}")
        if scope in (None, "project"):
            if project_id is not None:
                shard = await self._project_shard(project_id)
                projects[shards.index(shard)] = (project_id,)
            else:
                projects = dict.fromkeys(range(len(shards)))
        asks = sorted(set(pools) | set(projects))
        listings: list[WorkspaceListing] = await asyncio.gather(
            *(
                shards[k].workspace_entries(
                    access,
                    WorkspaceQuery(
                        pools=tuple(pools.get(k, ())),
                        projects=projects.get(k, ()),
                        contributor=bot_id,
                        q=q,
                        status=status,
                        limit=limit,
                        using=using,
                    ),
                )
                for k in asks
            )
        )
        views = {e.id: e for listing in listings for e in listing.entries}
        for listing in listings:
            names.update(listing.names)
        if q is not None:
            hits = combine([(x.hits, x.semantic, x.fused) for x in listings], limit)
            return [views[h.id] for h in hits], names, hits
        ordered = sorted(
            views.values(),
            key=lambda e: (
                _SCOPE_ORDER[e.scope],
                e.pool,
                _TIER_ORDER.get(e.tier, 9),
                -e.updatedAt,
                e.id,
            ),
        )
        return ordered, names, None

    async def memories(self, request: Request) -> Response:
        principal, access = await self._caller(request)
        assert principal.user is not None
        if request.method == "GET":
            entries, _, hits = await self._collect(access, request, principal.user)
            if hits is None:
                return json({"entries": entries})
            # Search results carry their fused score and the retrievers that found them.
            return json(
                {
                    "entries": [
                        {**msgspec.structs.asdict(e), "score": h.score, "foundBy": h.kinds}
                        for e, h in zip(entries, hits, strict=True)
                    ]
                }
            )
        body = decode_memory_write(await read_body(request))
        if isinstance(body, WorkspaceMemoryChange):
            shard = await self._entry_shard(body.id)
            return json(await shard.workspace_change_memory(access, body))
        projmod.check_request_id(body.requestId)
        bot = await self.auth.bot(body.bot)
        require_use(bot, principal.user)
        if body.scope == Scope.BOT:
            shard = self.engine.shard_port(bot.owner)
        elif body.scope == Scope.USER:
            shard = self.engine.shard_port(access.account)
        else:
            if not body.project:
                raise InvalidInput("project scope needs a project", code="project_required")
            shard = await self._project_shard(body.project)
        # The shard's answer is the body (as a Remember's): no decoding and encoding again here.
        created = await shard.workspace_create_memory_json(access, body)
        return Response(created, 201, media_type="application/json")

    async def forget(self, request: Request) -> Response:
        _, access = await self._caller(request)
        body = wire.decode(await read_body(request), WorkspaceForget)
        projmod.check_request_id(body.requestId)
        shard = await self._entry_shard(body.id)
        return json(await shard.workspace_change_memory(access, body))

    async def revisions(self, request: Request) -> Response:
        _, access = await self._caller(request)
        entry_id = request.path_params["id"]
        shard = await self._entry_shard(entry_id)
        return json({"revisions": await shard.workspace_revisions(access, entry_id)})

    async def export(self, request: Request) -> Response:
        principal, access = await self._caller(request)
        assert principal.user is not None
        entries, names, _ = await self._collect(
            access, request, principal.user, status="active", search=False
        )
        bot_names = {k: v for k, v in names.items() if ":" not in k}
        for contributor in {e.contributor for e in entries} - set(bot_names):
            with contextlib.suppress(NotFound):  # a contributor bot removed since
                bot_names[contributor] = (await self.auth.bot(contributor)).name
        pool_names = {k: v for k, v in names.items() if ":" in k}
        text = render(entries, account=access.account, pool_names=pool_names, bot_names=bot_names)
        return Response(text, media_type="text/markdown; charset=utf-8")
