"""Workspace projects and scoped memory on a shard (issue 5; SPEC WS-7, SC-1..SC-3, WA-1, WA-2).

A `ShardService` owns one `Workspace`. It holds:

- the projects whose owner's account lives on this shard (all of them, loaded once: they are
  few and small), with their members and linked channels;
- the workspace memory records of the pools hosted here — `bot:<id>` (the bot's owner's shard),
  `user:<accountId>` (the account's shard) and `project:<id>` (the project owner's shard) —
  loaded per pool on first use, content sealed with the pool's data key.

Every write takes a `requestId`: its receipt (the request's fingerprint and the sealed answer)
goes into the same group-commit batch as the change, so a repeat returns the first answer and
changes nothing, and the same id with another body is a conflict. Receipts are kept per shard,
keyed by the account and the requestId; writes queued but not yet committed are remembered in
memory so that a repeat arriving meanwhile waits for the first instead of doing it again.

Edits carry `expectedRevision` (engine/projects.py, engine/scoped_memory.py decide); nothing is
written when they refuse. Events (`project.changed`, `memory.changed`) go into the same batch and
are published after commit, with audiences that admit only who may read: a project's members,
the account itself for user memory, whoever uses the bot for bot memory.

Access: the gateway passes the caller's account and the bots they use (`WsAccess`); project
membership is checked here, where the project is. A pool the caller may not read is "not found".
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from actors.shard.residency import POOL_WEIGHT, unused
from actors.shard.rwlock import PoolMutex
from actors.shard.single_flight import SingleFlight
from actors.workspace.search import search as ranked_search
from engine import bot_memory as bm
from engine import projects as projmod
from engine import scoped_memory as sm
from engine import tags as tagmod
from engine.directory import check_id
from engine.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    OpenBotError,
    StorageError,
)
from engine.events import NOBODY, Audience, MemoryChanged, Payload, ProjectChanged
from engine.memory import Reader, Scope
from engine.projects import Project, ProjectChange, ProjectCreate, ProjectView
from engine.scoped_memory import (
    ForgetBarrier,
    WsEntry,
    WsEntryView,
    WsForget,
    WsMemoryChange,
    WsMemoryCreate,
)
from engine.visibility import directly_visible
from engine.workspace_search import Hit
from storage.bulk import paused_gc
from storage.crypto import load_master_key
from storage.group_commit import Write
from storage.memory_store import StoredPool
from storage.receipts import Receipts, fingerprint, receipt_key
from storage.search_index import Analyzer, TermIndex
from storage.term_store import TermStore, terms_key
from storage.workspace_store import StoredWsPool, WorkspaceStore

if TYPE_CHECKING:
    from actors.shard.service import ShardService
    from actors.workspace.semantic import SemanticSearch

RECEIPT_SCOPE = "ws"  # receipts of workspace writes: one requestId space per account and shard
MAX_LIST = 1_000
USING = ("all", "keyword", "semantic")
CONTEXT_WINDOW_MS = 120_000  # a new record this soon after the last is read in its context
_project_view_dec = msgspec.json.Decoder(ProjectView)
_entry_view_dec = msgspec.json.Decoder(WsEntryView)
_decisions_dec = msgspec.json.Decoder(list[sm.Decision])


def new_memory_id() -> str:
    return "mem_" + secrets.token_hex(12)


class WsAccess(msgspec.Struct, frozen=True, kw_only=True):
    """Who is asking: the signed-in account and the bots it uses (owner or grant).

    `orgs` (the org the request names first) and `channels` make the seed-000 reader of a bot's
    one memory (engine/bot_memory.py): a bot pool's entries are listed under its visibility rule.
    """

    account: str
    bots: frozenset[str] = frozenset()
    orgs: tuple[str, ...] = ()
    channels: frozenset[str] = frozenset()


class WsQuery(msgspec.Struct, frozen=True, kw_only=True):
    """What to list on one shard. `pools` are bot and user pools the gateway routed here;
    `projects` names projects to include, or None for every project here the account is a
    member of. `contributor` keeps one bot's contributions; `q` searches the bodies."""

    pools: tuple[str, ...] = ()
    projects: tuple[str, ...] | None = ()
    contributor: str | None = None
    q: str | None = None
    status: str = "active"  # active | forgotten | all
    limit: int = 200
    using: str = "all"  # with q: all (hybrid when semantic search is on) | keyword | semantic


class WsListing(msgspec.Struct, frozen=True, kw_only=True):
    """Records found on one shard; with a query, `hits` rank them. `names` are display names
    of the project pools listed (for the export's headings)."""

    entries: list[WsEntryView]
    hits: list[Hit] = []  # keyword hits among `fused` (with their BM25 scores)
    semantic: list[Hit] = []  # semantic hits among `fused` (with their cosines)
    fused: list[Hit] = []  # the ranking, best first; `entries` are in this order
    names: dict[str, str] = {}


class RevisionView(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `GET /memories/:id/revisions`: who (a user or a bot), when, before/after."""

    entry: str
    revision: int
    operator: str
    at: int
    change: str
    before: str | None = None
    after: str | None = None


@dataclass
class WsPool:
    stored: StoredWsPool
    keyed: StoredPool  # the seed-000 pool state that holds this pool's data key
    fp_key: bytes
    lock: asyncio.Lock
    pending: asyncio.Future[None] | None = None
    poisoned: bool = False
    index: TermIndex = field(default_factory=TermIndex)  # keyword search, in memory only
    # The last new record's contributor, time and own term keys (context for the next one).
    last_written: tuple[str | None, int, np.ndarray] | None = None
    bot_org: str | None = None  # a bot pool's bot's home org (its records' `org:` tag)
    # Records as bot-memory entries (actors/shard/bot_memory.py), per record state.
    metas: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.stored.pool


class Workspace:
    def __init__(self, shard: ShardService, data_dir: str | Path, *, new_id=new_memory_id) -> None:
        self.shard = shard
        master = load_master_key(Path(data_dir))
        self.store = WorkspaceStore(shard.db, master)
        self.analyzer = Analyzer(terms_key(master))
        self.terms = TermStore(shard.db)
        self.weights = (1.0, 1.0)  # keyword, semantic: reciprocal rank fusion (issue 11)
        self.context_window_ms = CONTEXT_WINDOW_MS  # [search] context_window_s; 0: off
        self.new_id: Callable[[], str] = new_id
        self._loader: SingleFlight[WsPool] = SingleFlight()
        self._pools: dict[str, WsPool] = self._loader.loaded
        self._projects: dict[str, Project] | None = None
        self._projects_loading: asyncio.Future[dict[str, Project]] | None = None
        self._projects_lock = asyncio.Lock()
        self._projects_pending: asyncio.Future[None] | None = None
        # Receipts queued but not yet committed: key -> (fingerprint, answer, commit).
        self._inflight: dict[str, tuple[str, bytes, asyncio.Future[None]]] = {}
        self._request_locks: dict[str, list] = {}
        # Workspace receipt keys on disk (None: not read yet) and those queued before the read.
        self._known_receipts: set[str] | None = None
        self._known_loading: asyncio.Future[set[str]] | None = None
        self._queued_receipts: set[str] = set()
        self.semantic: SemanticSearch | None = None  # set by the shard when configured (SC-7)

    # --- loading --------------------------------------------------------------------------------

    async def _pool(self, pool_id: str) -> WsPool:
        async def load() -> WsPool:
            keyed = (await self.shard._pool(pool_id)).stored
            stored = await self.store.load_pool(pool_id)
            bot_org = await self._link(stored) if pool_id.startswith("bot:") else None
            pool = WsPool(
                stored=stored,
                keyed=keyed,
                fp_key=self.store.fingerprint_key(pool_id),
                lock=PoolMutex(),
                bot_org=bot_org,
            )
            await self._index(pool)
            return pool

        pool = await self._loader.get(pool_id, load)
        self._resident(pool)
        return pool

    def _resident(self, pool: WsPool) -> None:
        """Count the pool as used now, at its current size."""
        pool_id, stored = pool.id, pool.stored
        if self._pools.get(pool_id) is pool:
            self.shard.residency.touch(
                "ws:" + pool_id,
                POOL_WEIGHT + len(stored.entries) + len(stored.barriers),
                lambda: self._evict(pool_id),
            )

    def _evict(self, pool_id: str) -> bool:
        """Drop a workspace pool (and what hooks keep for it) unless it is in use."""
        pool = self._pools.get(pool_id)
        if pool is None:
            return True
        if pool.lock.locked() or (pool.pending is not None and not pool.pending.done()):
            return False
        if not unused(pool, 1):  # a coroutine or a search still holds it
            return False
        if self.semantic is not None and not self.semantic.evict(pool_id):
            return False
        del self._pools[pool_id]
        for hook in self.shard.on_evict:
            hook(pool_id)
        return True

    async def _index(self, pool: WsPool) -> None:
        """Build the pool's keyword index from the stored term keys (read in bulk); records
        without current ones (written before migration 8, or imported) are tokenized now and
        their keys stored for next time."""
        ids, fps, lengths, flat = await self.terms.load_flat(pool.id)
        current = pool.stored.entries
        with paused_gc():
            have = set(ids)
            if not have <= current.keys():  # rows of records gone since: not indexed
                keep = np.fromiter((i in current for i in ids), dtype=bool, count=len(ids))
                flat = flat[np.repeat(keep, lengths)]
                lengths = lengths[keep]
                ids = [i for i in ids if i in current]
                fps = [fp for fp, k in zip(fps, keep, strict=True) if k]
            missing = current.keys() - have if len(have) != len(current) else set()
            extra_ids = sorted(missing)
            extra = [self.analyzer.keys(self._open(pool, i)) for i in extra_ids]
            rows = [
                self.terms.row(pool.id, i, current[i].content_fp, keys)
                for i, keys in zip(extra_ids, extra, strict=True)
            ]
            if extra:
                ids = [*ids, *extra_ids]
                lengths = np.concatenate((lengths, [k.size for k in extra])).astype(np.int64)
                flat = np.concatenate((flat, *extra))
            pool.index.build_flat(ids, lengths, flat)
        self._store_terms(rows)
        # A record's terms row commits with the record, so a row made from other content
        # than the record's is all but impossible; still, check once the search that loaded
        # the pool is answered (a walk of every record).
        asyncio.get_running_loop().call_soon(self._check_terms, pool, ids[: len(fps)], fps)

    def _check_terms(self, pool: WsPool, ids: list[str], fps: list[str]) -> None:
        """Index again the records whose stored terms were not made from their content."""
        if self._pools.get(pool.id) is not pool or pool.poisoned:
            return  # evicted or reloaded meanwhile: done again by its next load
        get, row_of = pool.stored.entries.get, pool.index.row_of
        rows = []
        for row, (entry_id, fp) in enumerate(zip(ids, fps, strict=True)):
            e = get(entry_id)
            # Not indexed again since the load (a write re-indexes: its row changes).
            if e is not None and e.content_fp != fp and row_of(entry_id) == row:
                keys = self.analyzer.keys(self._open(pool, entry_id))
                pool.index.put(entry_id, keys)
                rows.append(self.terms.row(pool.id, entry_id, e.content_fp, keys))
        self._store_terms(rows)

    def _store_terms(self, rows: list[Write]) -> None:
        if rows:
            # Derived data: nothing waits for it, and a failure only means doing it again.
            fut = self.shard._submit(None, rows)
            if fut is not None:
                fut.add_done_callback(_ignore_failure)

    def _indexed(self, pool: WsPool, entry: WsEntry, content: str, *, new: bool) -> Write:
        """Index a record's new content; the row that stores its term keys.

        A new record written right after another of the same contributor in the same pool
        (within `context_window_ms`: the turns of one conversation, a batch of notes) is indexed
        with that one's words too, as its context: "Yes! I made a bowl" is found by a question
        about the pottery workshop the turn before asked about. Only keywords: the record's
        vector and text are its own."""
        own = self.analyzer.keys(content)
        keys = own
        now = self.shard.clock()
        last = pool.last_written
        if (
            new
            and last is not None
            and last[0] == entry.contributor
            and 0 <= now - last[1] <= self.context_window_ms
        ):
            keys = np.sort(np.concatenate((own, last[2])))
        if new:
            pool.last_written = (entry.contributor, now, own)
        pool.index.put(entry.id, keys)
        return self.terms.row(pool.id, entry.id, entry.content_fp, keys)

    async def _link(self, stored: StoredWsPool) -> str | None:
        """A bot pool's records as part of the bot's one memory (engine/bot_memory.py): records
        stored before migration 7 read as written by the bot's owner for everyone who uses the
        bot, and every record without an `org:` gets the bot's home org. Returns that org (None
        when the bot is unknown: its records then stay hidden)."""
        try:
            bot = await self.shard.peers.directory("get_bot", sm.pool_owner(stored.pool))
        except OpenBotError:
            return None
        linked: dict[tuple[str, ...], tuple[str, ...]] = {}  # a pool's records share few tag sets
        entries = stored.entries
        with paused_gc():
            for entry_id in stored.unlinked:  # those without `org:` (most pools: none)
                entry = entries.get(entry_id)
                if entry is None:
                    continue
                new = linked.get(entry.tags)
                if new is None:
                    tags = entry.tags or (tagmod.author(bot.owner), tagmod.FOR_BOT)
                    new = linked[entry.tags] = bm.link_tags(tags, bot.org)
                if new != entry.tags:
                    entries[entry_id] = msgspec.structs.replace(entry, tags=new)
        return bot.org

    async def _load_projects(self) -> dict[str, Project]:
        if self._projects is not None:
            return self._projects
        if self._projects_loading is None:
            self._projects_loading = asyncio.get_running_loop().create_future()
            try:
                projects, legacy = await self.store.load_projects(self.shard.store.keyring)
                for pid in legacy:  # stored plain by an older version: seal them now
                    keyed = (await self.shard._pool(projmod.pool(pid))).stored
                    rows = [*self.shard.store.key_rows(keyed)]
                    rows.append(self.store.project_row(projects[pid], keyed.cipher))
                    fut = self.shard._submit(None, rows)
                    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            except BaseException as e:
                self._projects_loading.set_exception(e)
                self._projects_loading.exception()
                self._projects_loading = None
                raise
            self._projects = projects
            self._projects_loading.set_result(projects)
            self._projects_loading = None
            return projects
        return await asyncio.shield(self._projects_loading)

    def _drop_pool(self, pool: WsPool) -> None:
        pool.poisoned = True
        if self._pools.get(pool.id) is pool:
            del self._pools[pool.id]
            self.shard.residency.forget("ws:" + pool.id)

    def _drop_projects(self) -> None:
        self._projects = None  # reloaded from the file by the next call
        self._projects_pending = None

    async def _settle(self, fut: asyncio.Future[None] | None) -> None:
        if fut is not None:
            await asyncio.shield(fut)

    async def _settle_read(self, pool: WsPool) -> None:
        """A read waits for the commit of the state it saw; a failed one fails the read."""
        await self._settle(pool.pending)
        if pool.poisoned:
            raise StorageError("a change could not be stored; try again")

    # --- requestId receipts -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _request(self, key: str):
        """Requests with one receipt key run one at a time (whatever pool they touch), so two
        different bodies under one requestId cannot both pass the receipt check."""
        slot = self._request_locks.setdefault(key, [asyncio.Lock(), 0])
        slot[1] += 1
        try:
            async with slot[0]:
                yield
        finally:
            slot[1] -= 1
            if slot[1] == 0:
                del self._request_locks[key]

    async def _replay(self, key: str, print_: str, keyed: StoredPool) -> bytes | None:
        """The first answer to this request, or None when it is new (call under `_request`)."""
        hit = self._inflight.get(key)
        if hit is not None:
            if hit[0] != print_:
                raise Conflict(
                    "this requestId was already used for a different request",
                    code="request_id_reused",
                )
            await asyncio.shield(hit[2])
            return hit[1]
        if key not in await self._receipt_keys():
            return None  # a new request id: nothing to read (the common case, ~1 ms saved)
        return await self.shard.receipts.find(key, print_, keyed.cipher, keyed.pool)

    async def _receipt_keys(self) -> set[str]:
        """Every workspace receipt key stored on this shard, read once; keys of answers
        queued since are added as they are queued (`_commit`)."""
        if self._known_receipts is None:
            if self._known_loading is None:
                self._known_loading = asyncio.ensure_future(
                    self.shard.receipts.keys_with_prefix(receipt_key(RECEIPT_SCOPE, "", "x")[:3])
                )
            try:
                found = await asyncio.shield(self._known_loading)
            except BaseException:
                self._known_loading = None
                raise
            if self._known_receipts is None:
                self._known_receipts = found | self._queued_receipts
        return self._known_receipts

    def _commit(
        self,
        writes: list[Write],
        events: Sequence[tuple[Payload, Audience]],
        receipt: tuple[str, str, bytes, StoredPool],
        on_failure: Callable[[], None],
    ) -> asyncio.Future[None]:
        key, print_, answer, keyed = receipt
        rows = [
            *self.shard.store.key_rows(keyed),
            *writes,
            Receipts.row(key, print_, answer, keyed.cipher, keyed.pool, self.shard.clock()),
        ]
        fut = self.shard._submit(None, rows, events, on_failure=on_failure)
        assert fut is not None  # the receipt row is always there
        self._inflight[key] = (print_, answer, fut)
        (self._known_receipts if self._known_receipts is not None else self._queued_receipts).add(
            key
        )

        def done(f: asyncio.Future[None]) -> None:
            if self._inflight.get(key, (None, None, None))[2] is f:
                del self._inflight[key]

        fut.add_done_callback(done)
        return fut

    # --- access ---------------------------------------------------------------------------------

    def _readable(self, pool_id: str, access: WsAccess) -> bool:
        scope, owner = sm.scope_of(pool_id), sm.pool_owner(pool_id)
        if scope == Scope.PROJECT:
            project = (self._projects or {}).get(owner)
            return project is not None and projmod.can_read(project, access.account)
        if scope == Scope.USER and self.shard.peers.index_of(owner) != self.shard.index:
            return False  # not hosted here: the gateway routed it wrong
        return sm.may_access(pool_id, account=access.account, bots=access.bots, projects=())

    def _require(self, pool_id: str, access: WsAccess) -> None:
        if not self._readable(pool_id, access):
            raise NotFound("no such memory", code="memory_not_found")

    def _audience(self, pool_id: str) -> Audience:
        """Who may hear of a change in `pool_id` (never more than who may read it)."""
        scope, owner = sm.scope_of(pool_id), sm.pool_owner(pool_id)
        if scope == Scope.BOT:
            # The records' `org:` tag (engine/bot_memory.py): users of the bot in its org.
            pool = self._pools.get(pool_id)
            org = pool.bot_org if pool is not None else None
            return Audience(bot=owner) if org is None else Audience(org=org, bot=owner)
        if scope == Scope.USER:
            return Audience(users=(owner,))
        project = (self._projects or {}).get(owner)
        if project is None:
            return NOBODY
        return Audience(org=project.org, users=project.members)

    async def _locate(self, entry_id: str) -> str | None:
        for pool in self._pools.values():
            if entry_id in pool.stored.entries:
                return pool.id
        for seed in list(self.shard._pools.values()):  # a bot's learned entries, maybe queued
            if seed.id.startswith("bot:") and entry_id in seed.entries:
                return seed.id
        return await self.store.entry_pool(entry_id)

    async def has_entry(self, entry_id: str) -> bool:
        """Whether a workspace record with this id is kept on this shard (for routing only)."""
        return await self._locate(entry_id) is not None

    # --- projects -------------------------------------------------------------------------------

    async def projects_of(self, user: str) -> list[ProjectView]:
        projects = await self._load_projects()
        found = [projmod.view(p) for p in projects.values() if projmod.can_read(p, user)]
        await self._settle(self._projects_pending)
        return found

    async def project_names(self, user: str) -> dict[str, str]:
        return {f"project:{p.id}": p.name for p in await self.projects_of(user)}

    async def _people(
        self, org: str, users: Iterable[str], channels: Iterable[str]
    ) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        users, channels = sorted(set(users)), sorted(set(channels))
        if not users and not channels:
            return [], {}
        return await self.shard.peers.directory("workspace_people", org, users, channels)

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
            projmod.require_read((await self._load_projects()).get(pid), actor)
        keyed = (await self.shard._pool(projmod.pool(pid))).stored
        await self._load_projects()
        async with self._request(key), self._projects_lock:
            raw = await self._replay(key, print_, keyed)
            if raw is not None:
                return _project_view_dec.decode(raw)
            projects = await self._load_projects()
            if isinstance(request, ProjectCreate):
                project, change = await self._create(projects, actor, org, request, pid), "created"
            else:
                project, change = await self._change(projects, actor, request), "updated"
            answer = projmod.view(project)
            raw = msgspec.json.encode(answer)
            writes: list[Write] = []
            events: list[tuple[Payload, Audience]] = []
            if project is not projects.get(pid):
                writes.append(self.store.project_row(project, keyed.cipher))
                events.append(
                    (
                        ProjectChanged(project=pid, revision=project.revision, change=change),
                        Audience(org=project.org, users=project.members),
                    )
                )
                projects[pid] = project
            fut = self._commit(writes, events, (key, print_, raw, keyed), self._drop_projects)
            if writes:
                self._projects_pending = fut
        await self._settle(fut)
        return answer

    async def _create(
        self, projects: dict[str, Project], actor: str, org: str, request: ProjectCreate, pid: str
    ) -> Project:
        if self.shard.peers.index_of(actor) != self.shard.index:
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
            now=self.shard.clock(),
        )
        _no_outsiders(outsiders)
        await self.shard.peers.directory("register_project", pid, actor)
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
            project, request, actor=actor, channel_people=people, now=self.shard.clock()
        )
        _no_outsiders(outsiders)
        return changed

    # --- memory ---------------------------------------------------------------------------------

    async def create_memory(self, access: WsAccess, body: WsMemoryCreate) -> WsEntryView:
        projmod.check_request_id(body.requestId)
        if body.bot not in access.bots:
            raise Forbidden("you have no access to this bot", code="no_access")
        pool_id = sm.pool_of(body.scope, bot=body.bot, account=access.account, project=body.project)
        await self._load_projects()
        self._require(pool_id, access)
        key = receipt_key(RECEIPT_SCOPE, access.account, body.requestId)
        print_ = fingerprint(("memory.create", body))
        pool = await self._pool(pool_id)
        async with self._request(key), pool.lock:
            raw = await self._replay(key, print_, pool.keyed)
            if raw is not None:
                return _entry_view_dec.decode(raw)
            self._require(pool_id, access)  # membership may have changed while waiting
            entry_id = self.new_id()
            if entry_id in pool.stored.entries:
                raise Conflict(f"new id {entry_id!r} is already taken", code="id_taken")
            tags: tuple[str, ...] = ()
            if body.scope == Scope.BOT:
                if pool.bot_org is None:
                    raise NotFound("no such bot", code="bot_not_found")
                tags = bm.record_tags(access.account, pool.bot_org)
            edit = sm.user_create(
                entry_id=entry_id,
                pool=pool_id,
                contributor=body.bot,
                content=body.content,
                operator=access.account,
                now=self.shard.clock(),
                tier=body.tier,
                topics=body.topics,
                key=pool.fp_key,
                tags=tags,
            )
            answer = sm.view(edit.entry, body.content)
            fut = self._apply(pool, edit, body.content, "created", (key, print_, answer), new=True)
        await self._settle(fut)
        return answer

    async def change_memory(self, access: WsAccess, body: WsMemoryChange | WsForget) -> WsEntryView:
        """A person's edit (content, tier, topics) or forgetting, by `expectedRevision`."""
        projmod.check_request_id(body.requestId)
        pool_id = await self._locate(body.id)
        await self._load_projects()
        if pool_id is None or not self._readable(pool_id, access):
            raise NotFound("no such memory", code="memory_not_found")
        forgetting = isinstance(body, WsForget)
        key = receipt_key(RECEIPT_SCOPE, access.account, body.requestId)
        print_ = fingerprint(("memory.forget" if forgetting else "memory.change", body))
        pool = await self._pool(pool_id)
        if body.id not in pool.stored.entries and pool_id.startswith("bot:"):
            return await self._change_learned(pool, access, body)
        async with self._request(key), pool.lock:
            raw = await self._replay(key, print_, pool.keyed)
            if raw is not None:
                return _entry_view_dec.decode(raw)
            self._require(pool_id, access)
            entry = pool.stored.entries.get(body.id)
            if entry is None or not self._sees(pool, access, entry):
                # Reloaded without it (a failed commit), or a bot record outside the caller's org.
                raise NotFound("no such memory", code="memory_not_found")
            old = self._open(pool, entry.id)
            now = self.shard.clock()
            if isinstance(body, WsForget):
                edit = sm.forget(
                    entry, body.expectedRevision, operator=access.account, old_content=old, now=now
                )
                content, change = old, "forgotten"
            else:
                edit = sm.user_edit(
                    entry,
                    body.content,
                    body.expectedRevision,
                    operator=access.account,
                    old_content=old,
                    now=now,
                    tier=body.tier,
                    topics=body.topics,
                    key=pool.fp_key,
                )
                content = old if body.content is None else body.content
                change = "edited"
            answer = sm.view(edit.entry, content)
            fut = self._apply(pool, edit, content, change, (key, print_, answer), new=False)
        await self._settle(fut)
        return answer

    async def _change_learned(
        self, pool: WsPool, access: WsAccess, body: WsMemoryChange | WsForget
    ) -> WsEntryView:
        """A learned entry of the bot's one memory, through the workspace routes: forgetting it
        is the seed-000 Forget (the caller's part: retracted when it is only theirs, API-2) by
        `expectedRevision`; its words are the memory bot's to change, not an edit's."""
        reader = self.bot_reader(pool, access)
        if isinstance(body, WsMemoryChange):
            seed = await self.shard._pool(pool.id)
            if body.id in seed.entries and self.shard.bot_memory.snapshot(
                seed, pool, reader
            ).visibility.visible(body.id):
                raise Conflict(
                    "a learned entry is kept by the memory bot; forget it instead",
                    code="learned_entry",
                )
            raise NotFound("no such memory", code="memory_not_found")
        try:
            await self.shard.forget(
                pool.id,
                reader,
                body.id,
                request_id=f"ws\x00{body.requestId}",
                expected_revision=body.expectedRevision,
            )
        except Conflict as e:
            if e.code == "not_yours":  # not visible to the caller: not found, as elsewhere
                raise NotFound("no such memory", code="memory_not_found") from e
            raise
        seed = await self.shard._pool(pool.id)
        meta = seed.entries[body.id]
        content = self.shard.store.open_content(seed.stored, body.id)
        return bm.as_record_view(meta, content, sm.pool_owner(pool.id))

    def _apply(
        self,
        pool: WsPool,
        edit: sm.Edit,
        content: str,
        change: str,
        receipt: tuple[str, str, WsEntryView],
        *,
        new: bool,
    ) -> asyncio.Future[None]:
        """Queue one person's change (under the pool's lock) and make it the pool's state."""
        stored, keyed = pool.stored, pool.keyed
        entry = edit.entry
        writes: list[Write] = []
        events: list[tuple[Payload, Audience]] = []
        audience = self._audience(pool.id)
        if edit.revision is not None:  # something changed
            sealed = (
                self.store.seal(keyed.cipher, pool.id, entry.id, content)
                if new or edit.revision.after is not None
                else stored.sealed[entry.id]
            )
            writes.append(self.store.entry_row(entry, sealed, new=new))
            if new or edit.revision.after is not None:
                writes.append(self._indexed(pool, entry, content, new=new))
            writes.append(self.store.revision_row(pool.id, edit.revision, keyed.cipher))
            if edit.barrier is not None:
                writes.append(self.store.barrier_row(edit.barrier, entry.revision))
            events.append(
                (
                    MemoryChanged(
                        pool=pool.id,
                        entry=entry.id,
                        version=entry.revision,
                        change=change,
                        bot=entry.contributor,
                    ),
                    audience,
                )
            )
            stored.entries[entry.id] = entry
            stored.sealed[entry.id] = sealed
            if self.semantic is not None:
                self.semantic.written(pool.id, entry.id)
            if edit.barrier is not None:
                stored.barriers.append(edit.barrier)
            # Records flagged for review whose rival is gone settle (metadata only). A new
            # record takes no rival away: only edits and forgetting need the walk of the pool.
            for settled in () if new else sm.settled_reviews(stored.entries):
                writes.append(self.store.entry_row(settled, stored.sealed[settled.id], new=False))
                stored.entries[settled.id] = settled
                events.append(
                    (
                        MemoryChanged(
                            pool=pool.id,
                            entry=settled.id,
                            version=settled.revision,
                            change="reviewed",
                            bot=settled.contributor,
                        ),
                        audience,
                    )
                )
        key, print_, answer = receipt
        raw = msgspec.json.encode(answer)
        fut = self._commit(writes, events, (key, print_, raw, keyed), lambda: self._drop_pool(pool))
        if writes:
            pool.pending = fut
            self._resident(pool)  # its size changed
        return fut

    async def extract(
        self,
        pool_id: str,
        contributor: str,
        proposals: Sequence[sm.Extraction],
        sources: Sequence[sm.SourceItem],
        request_id: str,
        now: int | None = None,
    ) -> list[sm.Decision]:
        """Store what the memory bot of bot `contributor` learned for a user or project pool
        hosted here (SC-1..SC-3): each proposal goes through `propose_extraction` against the
        pool's latest records and forget barriers, in order, under the pool's lock. Created,
        updated and review-flagged records are stored as people's writes are (records,
        revisions, `memory.changed` events to who may read). `request_id` (the learning job's)
        makes a repeat return the first decisions and store nothing again."""
        scope = sm.scope_of(pool_id)
        if scope == Scope.BOT:
            raise InvalidInput("bot memory is kept in the bot's pool", code="invalid_pool")
        projects = await self._load_projects()
        if scope == Scope.PROJECT and sm.pool_owner(pool_id) not in projects:
            return [
                sm.Decision(outcome="refused", code="not_found", reason="no such project here")
                for _ in proposals
            ]
        if scope == Scope.USER and self.shard.peers.index_of(sm.pool_owner(pool_id)) != (
            self.shard.index
        ):
            raise InvalidInput("a user pool is kept on the account's shard", code="wrong_shard")
        proposals = list(proposals)
        for p in proposals:
            if p.pool != pool_id or p.contributor != contributor:
                raise InvalidInput("every proposal must be for this pool and bot", code="invalid")
        by_marker = {s.marker: s for s in sources}
        key = receipt_key(RECEIPT_SCOPE, f"bot:{contributor}", request_id)
        print_ = fingerprint(("memory.extract", pool_id, contributor, proposals, sources))
        pool = await self._pool(pool_id)
        async with self._request(key), pool.lock:
            raw = await self._replay(key, print_, pool.keyed)
            if raw is not None:
                return _decisions_dec.decode(raw)
            stored = pool.stored
            at = self.shard.clock() if now is None else now
            contents = {
                e.id: self._open(pool, e.id)
                for p in proposals
                if p.replaces is not None and (e := stored.entries.get(p.replaces)) is not None
            }

            def new_id() -> str:
                while (fresh := self.new_id()) in stored.entries:
                    pass
                return fresh

            decisions, records, texts = sm.propose_all(
                stored.entries,
                proposals,
                list(stored.barriers),
                at,
                new_id,
                sources=by_marker,
                contents=contents,
                key=pool.fp_key,
            )
            fut = self._apply_extraction(pool, decisions, records, texts, (key, print_, decisions))
        await self._settle(fut)
        return decisions

    def _apply_extraction(
        self,
        pool: WsPool,
        decisions: Sequence[sm.Decision],
        records: dict[str, WsEntry],
        texts: dict[str, str],
        receipt: tuple[str, str, Sequence[sm.Decision]],
    ) -> asyncio.Future[None]:
        """Queue what an extraction created, updated or flagged (under the pool's lock)."""
        stored, keyed = pool.stored, pool.keyed
        audience = self._audience(pool.id)
        writes: list[Write] = []
        events: list[tuple[Payload, Audience]] = []
        for entry_id, entry in records.items():
            new = entry_id not in stored.entries
            if entry_id in texts:
                sealed = self.store.seal(keyed.cipher, pool.id, entry_id, texts[entry_id])
                writes.append(self._indexed(pool, entry, texts[entry_id], new=new))
            else:  # flagged for review only: the content stays as it is
                sealed = stored.sealed[entry_id]
            writes.append(self.store.entry_row(entry, sealed, new=new))
            change = "reviewed" if entry_id not in texts else ("extracted" if new else "updated")
            events.append(
                (
                    MemoryChanged(
                        pool=pool.id,
                        entry=entry_id,
                        version=entry.revision,
                        change=change,
                        bot=entry.contributor,
                    ),
                    audience,
                )
            )
            stored.entries[entry_id] = entry
            stored.sealed[entry_id] = sealed
            if entry_id in texts and self.semantic is not None:
                self.semantic.written(pool.id, entry_id)
        for d in decisions:
            if d.accepted and d.revision is not None:
                writes.append(self.store.revision_row(pool.id, d.revision, keyed.cipher))
        key, print_, answer = receipt
        raw = msgspec.json.encode(list(answer))
        fut = self._commit(writes, events, (key, print_, raw, keyed), lambda: self._drop_pool(pool))
        if writes:
            pool.pending = fut
            self._resident(pool)  # its size changed
        return fut

    def _open(self, pool: WsPool, entry_id: str) -> str:
        return self.store.open(pool.keyed.cipher, pool.id, entry_id, pool.stored.sealed[entry_id])

    async def entries(self, access: WsAccess, query: WsQuery) -> WsListing:
        """The records of the asked pools that `access` may read (others are skipped; a named
        project the caller is not a member of is not found)."""
        if query.status not in ("active", "forgotten", "all"):
            raise InvalidInput("status must be active, forgotten or all", code="invalid_status")
        if query.using not in USING:
            raise InvalidInput("using must be all, keyword or semantic", code="invalid_using")
        projects = await self._load_projects()
        pool_ids = [p for p in dict.fromkeys(query.pools) if self._readable(p, access)]
        if query.projects is None:
            names = {
                projmod.pool(p.id): p.name
                for p in projects.values()
                if projmod.can_read(p, access.account)
            }
        else:
            names = {}
            for pid in dict.fromkeys(query.projects):
                project = projmod.require_read(projects.get(pid), access.account)
                names[projmod.pool(pid)] = project.name
        pool_ids += sorted(names)
        if query.q and self.semantic is not None and query.using != "keyword":
            for pool_id in pool_ids:  # their vectors load while their records do
                self.semantic.prefetch(pool_id)
        pools: list[WsPool] = []
        for pool_id in pool_ids:
            pool = await self._pool(pool_id)
            pools.append(pool)
        if query.q:
            listing = await ranked_search(self, access, query, pools, names)
        else:
            listing = await self._listing(access, query, pools, names)
        for pool in pools:
            await self._settle_read(pool)
        return listing

    async def _listing(
        self, access: WsAccess, query: WsQuery, pools: list[WsPool], names: dict[str, str]
    ) -> WsListing:
        """Every record of `pools` (and learned entry of their bots) the caller may read."""
        found: list[tuple[WsPool, WsEntry]] = []
        learned: list[WsEntryView] = []  # seed-000 entries of bot pools (one memory per bot)
        for pool in pools:
            if pool.id.startswith("bot:"):
                records, seeds = await self._bot_memory(pool, access)
                learned += [
                    v
                    for v in seeds
                    if (query.status == "all" or v.status == query.status)
                    and (query.contributor is None or v.contributor == query.contributor)
                ]
            else:
                records = list(pool.stored.entries.values())
            for entry in records:
                if query.status != "all" and entry.status != query.status:
                    continue
                if query.contributor is not None and entry.contributor != query.contributor:
                    continue
                found.append((pool, entry))
        views = {entry.id: sm.view(entry, self._open(pool, entry.id)) for pool, entry in found}
        views.update((v.id, v) for v in learned)
        return WsListing(entries=list(views.values()), names=names)

    def _sees(self, pool: WsPool, access: WsAccess, entry: WsEntry) -> bool:
        """A bot record is the caller's to read or change only when its tags admit them."""
        if entry.scope != Scope.BOT:
            return True
        return directly_visible(self.bot_reader(pool, access), bm.as_meta(entry))

    def bot_reader(self, pool: WsPool, access: WsAccess) -> Reader:
        """The seed-000 reader of a bot pool for a workspace caller: in the bot's home org when
        the caller belongs to it (else the org the request named)."""
        org = pool.bot_org if pool.bot_org in access.orgs or not access.orgs else access.orgs[0]
        return Reader(user=access.account, org=org or "", channels=access.channels, uses_bot=True)

    async def _bot_memory(
        self, pool: WsPool, access: WsAccess
    ) -> tuple[list[WsEntry], list[WsEntryView]]:
        """A bot pool's records and learned entries that `access` may see (its one memory)."""
        bot = sm.pool_owner(pool.id)
        records: list[WsEntry] = []
        seeds: list[WsEntryView] = []
        async with self.shard.bot_memory.read(pool.id, self.bot_reader(pool, access)) as snap:
            records = snap.visible_records()
            seeds = [bm.as_record_view(m, snap.open(m.id), bot) for m in snap.visible_seeds()]
        return records, seeds

    async def revisions(self, access: WsAccess, entry_id: str) -> list[RevisionView]:
        pool_id = await self._locate(entry_id)
        await self._load_projects()
        if pool_id is None or not self._readable(pool_id, access):
            raise NotFound("no such memory", code="memory_not_found")
        pool = await self._pool(pool_id)
        await self._settle_read(pool)
        rows = await self.store.revisions(pool_id, entry_id, pool.keyed.cipher)
        return [RevisionView(**msgspec.structs.asdict(r)) for r in rows]

    # --- forget barriers (SC-3): what extraction will check ----------------------------------

    async def barriers(self, pool_id: str) -> list[ForgetBarrier]:
        pool = await self._pool(pool_id)
        await self._settle_read(pool)
        return list(pool.stored.barriers)

    async def blocked(
        self, pool_id: str, content: str, evidence: Sequence[str] = ()
    ) -> ForgetBarrier | None:
        """The barrier that keeps `content` (or anything citing `evidence`) out of the pool."""
        pool = await self._pool(pool_id)
        fp = sm.content_fingerprint(content, pool.fp_key)
        return sm.blocked_by(pool_id, fp, evidence, pool.stored.barriers)


def _no_outsiders(outsiders: Sequence[str]) -> None:
    if outsiders:
        raise NotFound(
            f"not people of this org: {', '.join(sorted(outsiders))}",
            code="user_not_found",
            details={"people": sorted(outsiders)},
        )


def _ignore_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()  # stored search terms are a cache: they are made again next load
