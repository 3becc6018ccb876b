"""Listing and searching the workspace records on a shard (SC-7).

What a caller may read of the asked pools, with a bot pool's learned entries (its one memory,
MEM-1) beside its records; with a query, BM25 keyword hits and semantic hits fused by reciprocal
rank. Reads wait for the commit of the state they saw.
"""

from __future__ import annotations

import msgspec

from actors.contracts import USING, WorkspaceAccess, WorkspaceListing, WorkspaceQuery
from actors.shard.kernel import ShardKernel
from actors.shard.memory_reader import MemoryReader
from actors.workspace.access import WorkspaceRules
from actors.workspace.pools import WorkspacePool, WorkspacePools
from actors.workspace.projects import Projects
from actors.workspace.search import search as ranked_search
from actors.workspace.semantic import SemanticSearch
from engine import memory_union as bm
from engine import projects as projmod
from engine import scoped_memory as sm
from engine.errors import InvalidInput
from engine.memory_entries import Reader, SearchHitView, SearchPage, view
from engine.scoped_memory import WorkspaceEntry, WorkspaceEntryView
from engine.workspace_search import FUSION_WEIGHTS

_json = msgspec.json.Encoder()


class WorkspaceListings:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        pools: WorkspacePools,
        projects: Projects,
        rules: WorkspaceRules,
        memory: MemoryReader,
        semantic: SemanticSearch | None,
    ) -> None:
        self.kernel = kernel
        self.pools = pools
        self.projects = projects
        self.rules = rules
        self.memory = memory
        self.semantic = semantic  # None: keyword search only
        self.weights = FUSION_WEIGHTS  # keyword, semantic: reciprocal rank fusion

    async def entries(
        self, access: WorkspaceAccess, query: WorkspaceQuery, reader: Reader | None = None
    ) -> WorkspaceListing:
        """The records of the asked pools that `access` may read (others are skipped; a named
        project the caller is not a member of is not found). `reader`, when given, is whose
        view of a bot pool is searched (a bot's step: the person or the group it works for)."""
        if query.status not in ("active", "forgotten", "all"):
            raise InvalidInput("status must be active, forgotten or all", code="invalid_status")
        if query.using not in USING:
            raise InvalidInput("using must be all, keyword or semantic", code="invalid_using")
        projects = await self.projects.load()
        pool_ids = [p for p in dict.fromkeys(query.pools) if self.rules.readable(p, access)]
        if query.projects is None:
            names = {
                projmod.pool(p.id): p.name
                for p in projects.values()
                if projmod.can_read(p, access.account)
                and (query.linked is None or query.linked in p.channels)
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
        pools: list[WorkspacePool] = []
        for pool_id in pool_ids:
            pools.append(await self.pools.pool(pool_id))
        if query.q:
            listing = await ranked_search(self, access, query, pools, names, reader)
        else:
            listing = await self._listing(access, query, pools, names)
        for pool in pools:
            await self.pools.settle_read(pool)
        return listing

    async def search_memory_page(
        self, pool_id: str, reader: Reader, q: str, limit: int
    ) -> SearchPage:
        """`GET /v1/bots/{bot}/memory?q=`: the bot's one memory as `reader` may use it (active
        entries only), ranked by the one memory search; each hit checked again when opened."""
        if limit < 1:
            raise InvalidInput("limit must be at least 1", code="invalid_limit")
        bot = sm.pool_owner(pool_id)
        access = WorkspaceAccess(
            account=reader.user, bots=frozenset({bot}), orgs=(reader.org,), channels=reader.channels
        )
        query = WorkspaceQuery(pools=(pool_id,), projects=(), q=q, limit=limit)
        listing = await self.entries(access, query, reader)
        views: list[SearchHitView] = []
        async with self.memory.read(pool_id, reader) as snap:
            for h in listing.fused:
                if snap.usable_id(h.id):
                    found = view(snap.entries[h.id], snap.open(h.id))
                    fields = msgspec.structs.asdict(found)
                    views.append(SearchHitView(**fields, score=h.score, foundBy=h.kinds))
            version = snap.pool.version
        return SearchPage(entries=tuple(views), version=version)

    async def search_memory_json(self, pool_id: str, reader: Reader, q: str, limit: int) -> bytes:
        """`search_memory_page` as the HTTP body."""
        return _json.encode(await self.search_memory_page(pool_id, reader, q, limit))

    async def _listing(
        self,
        access: WorkspaceAccess,
        query: WorkspaceQuery,
        pools: list[WorkspacePool],
        names: dict[str, str],
    ) -> WorkspaceListing:
        """Every record of `pools` (and learned entry of their bots) the caller may read."""
        found: list[tuple[WorkspacePool, WorkspaceEntry]] = []
        learned: list[WorkspaceEntryView] = []  # memory entries of bot pools (one memory per bot)
        for pool in pools:
            if pool.id.startswith("bot:"):
                records, memory_entries = await self._bot_memory(pool, access)
                learned += [
                    v
                    for v in memory_entries
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
        views = {entry.id: sm.view(entry, self.pools.open(pool, entry.id)) for pool, entry in found}
        views.update((v.id, v) for v in learned)
        return WorkspaceListing(entries=list(views.values()), names=names)

    async def _bot_memory(
        self, pool: WorkspacePool, access: WorkspaceAccess
    ) -> tuple[list[WorkspaceEntry], list[WorkspaceEntryView]]:
        """A bot pool's records and learned entries that `access` may see (its one memory)."""
        bot = sm.pool_owner(pool.id)
        records: list[WorkspaceEntry] = []
        memory_entries: list[WorkspaceEntryView] = []
        async with self.memory.read(pool.id, self.rules.bot_reader(pool, access)) as snap:
            records = snap.visible_records()
            memory_entries = [
                bm.as_record_view(m, snap.open(m.id), bot) for m in snap.visible_entries()
            ]
        return records, memory_entries
