"""Workspace projects on a shard (WS-7): those whose owner's account lives here.

All of them are loaded once (they are few and small), with their members and linked channels.
Edits carry `expectedRevision` (engine/projects.py decides); nothing is written when it refuses.
A `project.changed` event goes into the same batch as the change and its receipt, to the
project's members only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import msgspec

from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, durable, ignore_failure
from actors.workspace.receipts import RECEIPT_SCOPE, WorkspaceReceipts
from engine import projects as projmod
from engine.directory import check_id
from engine.errors import Conflict, InvalidInput, NotFound
from engine.events import Audience, ProjectChanged
from engine.projects import Project, ProjectChange, ProjectCreate, ProjectView
from storage.receipts import fingerprint, receipt_key
from storage.workspace_store import WorkspaceStore

_project_view_dec = msgspec.json.Decoder(ProjectView)

log = logging.getLogger("openbot.workspace")


class Projects:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        store: WorkspaceStore,
        receipts: WorkspaceReceipts,
        peers: Peers,
    ) -> None:
        self.kernel = kernel
        self.store = store
        self.receipts = receipts
        self.peers = peers
        self._loaded: dict[str, Project] | None = None
        self._loading: asyncio.Future[dict[str, Project]] | None = None
        self._lock = asyncio.Lock()
        self._pending: asyncio.Future[None] | None = None
        kernel.on_start(self._warm)

    async def _warm(self) -> None:
        """Read the projects at start (the first use after a (re)start), not in the first
        turn that packs a prompt (it would be a large share of a chain's first step). A
        failure only leaves it to that turn."""
        try:
            await self.load()
        except Exception:
            log.warning(
                "reading the projects at start failed; read when first needed", exc_info=True
            )

    def known(self) -> dict[str, Project]:
        """The projects as last loaded ({} before the first load)."""
        return self._loaded or {}

    async def load(self) -> dict[str, Project]:
        if self._loaded is not None:
            return self._loaded
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_future()
            try:
                projects, legacy = await self.store.load_projects(self.kernel.keyring)
                for pid in legacy:  # stored plain by an older version: seal them now
                    keyed = (await self.kernel.pool(projmod.pool(pid))).stored
                    batch = Batch().key(keyed)
                    batch.add(self.store.project_row(projects[pid], keyed.cipher))
                    fut = self.kernel.stage(batch)
                    if fut is not None:
                        ignore_failure(fut)
            except BaseException as e:
                self._loading.set_exception(e)
                self._loading.exception()
                self._loading = None
                raise
            self._loaded = projects
            self._loading.set_result(projects)
            self._loading = None
            return projects
        return await asyncio.shield(self._loading)

    def drop(self) -> None:
        self._loaded = None  # reloaded from the file by the next call
        self._pending = None

    async def projects_of(self, user: str) -> list[ProjectView]:
        projects = await self.load()
        found = [projmod.view(p) for p in projects.values() if projmod.can_read(p, user)]
        await durable(self._pending)
        return found

    async def project_names(self, user: str) -> dict[str, str]:
        return {f"project:{p.id}": p.name for p in await self.projects_of(user)}

    async def _people(
        self, org: str, users: Iterable[str], channels: Iterable[str]
    ) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        users, channels = sorted(set(users)), sorted(set(channels))
        if not users and not channels:
            return [], {}
        return await self.peers.directory().workspace_people(org, users, channels)

    async def save_project(
        self, actor: str, org: str, request: ProjectCreate | ProjectChange, project_id: str
    ) -> ProjectView:
        """Create (owner `actor`, in `org`, id `project_id` unless the request names one) or
        change a project held here."""
        projmod.check_request_id(request.requestId)
        key = receipt_key(RECEIPT_SCOPE, actor, request.requestId)
        if isinstance(request, ProjectCreate):
            pid = check_id(request.id if request.id is not None else project_id, "project id")
            print_ = fingerprint(("project.create", org, pid, request))
        else:
            pid = request.id
            print_ = fingerprint(("project.change", request))
            # Outsiders learn nothing, not even whether the id exists.
            projmod.require_read((await self.load()).get(pid), actor)
        keyed = (await self.kernel.pool(projmod.pool(pid))).stored
        await self.load()
        async with self.receipts.request(key), self._lock:
            raw = await self.receipts.replay(key, print_, keyed)
            if raw is not None:
                return _project_view_dec.decode(raw)
            projects = await self.load()
            if isinstance(request, ProjectCreate):
                project, change = await self._create(projects, actor, org, request, pid), "created"
            else:
                project, change = await self._change(projects, actor, request), "updated"
            answer = projmod.view(project)
            raw = msgspec.json.encode(answer)
            batch = Batch().fail(self.drop)
            if project is not projects.get(pid):
                batch.add(self.store.project_row(project, keyed.cipher))
                batch.emit(
                    ProjectChanged(project=pid, revision=project.revision, change=change),
                    Audience(org=project.org, users=project.members),
                )
                projects[pid] = project
            changed = bool(batch.writes)
            fut = self.receipts.stage(batch, (key, print_, raw, keyed))
            if changed:
                self._pending = fut
        await durable(fut)
        return answer

    async def _create(
        self, projects: dict[str, Project], actor: str, org: str, request: ProjectCreate, pid: str
    ) -> Project:
        if self.peers.index_of(actor) != self.kernel.index:
            raise InvalidInput("a project is kept on its owner's shard", code="wrong_shard")
        if pid in projects:
            raise Conflict(f"project {pid!r} already exists", code="exists")
        outsiders, people = await self._people(org, [actor, *request.members], request.channels)
        people = {c: p for c, p in people.items() if actor in p}  # only your own channels
        project = projmod.create_project(
            request,
            new_id=pid,
            org=org,
            owner=actor,
            channel_people=people,
            now=self.kernel.clock(),
        )
        no_outsiders(outsiders)
        await self.peers.directory().register_project(pid, actor)
        return project

    async def _change(
        self, projects: dict[str, Project], actor: str, request: ProjectChange
    ) -> Project:
        project = projmod.require_read(projects.get(request.id), actor)
        if request.expectedRevision != project.revision:
            # Before any lookup, so that a stale client learns only that (and keeps its draft).
            raise Conflict(
                f"the project is at revision {project.revision}, not {request.expectedRevision}",
                code="stale_revision",
                details={"currentRevision": project.revision},
            )
        new_members = set(request.members or ()) - set(project.members)
        newly_linked = set(request.channels or ()) - set(project.channels)
        keeps = set(project.channels) if request.members is not None else set()
        outsiders, people = await self._people(project.org, new_members, newly_linked | keeps)
        # A channel is linked only by one of its people; those already linked stay as they are.
        people = {c: p for c, p in people.items() if c not in newly_linked or actor in p}
        changed = projmod.change_project(
            project, request, actor=actor, channel_people=people, now=self.kernel.clock()
        )
        no_outsiders(outsiders)
        return changed


def no_outsiders(outsiders: list[str]) -> None:
    if outsiders:
        raise NotFound(
            f"not people of this org: {', '.join(sorted(outsiders))}",
            code="user_not_found",
            details={"people": sorted(outsiders)},
        )
