"""Listing and searching the workspace records on a shard (issue 5, issue 11; SC-7).

What a caller may read of the asked pools, with a bot pool's learned entries (its one memory,
MEM-1) beside its records; with a query, BM25 keyword hits and semantic hits fused by reciprocal
rank. Reads wait for the commit of the state they saw.
"""

from __future__ import annotations

from collections.abc import Callable

from actors.contracts import USING, WsAccess, WsListing, WsQuery
from actors.shard.bot_memory import BotMemory
from actors.shard.kernel import ShardKernel
from actors.workspace.access import WsRules
from actors.workspace.pools import WsPool, WsPools
from actors.workspace.projects import Projects
from actors.workspace.semantic import SemanticSearch
from engine import bot_memory as bm
from engine import projects as projmod
from engine import scoped_memory as sm
from engine.errors import InvalidInput
from engine.scoped_memory import WsEntry, WsEntryView
from engine.workspace_search import FUSION_DEPTH, Hit, fusion_depth, merge_hits


class WsListings:
    def __init__(
        self,
        kernel: ShardKernel,
        pools: WsPools,
        projects: Projects,
        rules: WsRules,
        memory: BotMemory,
        semantic: SemanticSearch | None,
    ) -> None:
        self.kernel = kernel
        self.pools = pools
        self.projects = projects
        self.rules = rules
        self.memory = memory
        self.semantic = semantic  # None: keyword search only
        self.weights = (1.0, 1.0)  # keyword, semantic: reciprocal rank fusion (issue 11)

    async def entries(self, access: WsAccess, query: WsQuery) -> WsListing:
        """The records of the asked pools that `access` may read (others are skipped; a named
        project the caller is not a member of is not found)."""
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
            }
        else:
            names = {}
            for pid in dict.fromkeys(query.projects):
                project = projmod.require_read(projects.get(pid), access.account)
                names[projmod.pool(pid)] = project.name
        pool_ids += sorted(names)
        found: list[tuple[WsPool, WsEntry]] = []
        learned: list[WsEntryView] = []  # seed-000 entries of bot pools (one memory per bot)
        pools: list[WsPool] = []
        for pool_id in pool_ids:
            pool = await self.pools.pool(pool_id)
            pools.append(pool)
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
        if query.q:
            listing = await self._search(query, pools, names, found, learned)
        else:
            views = {
                entry.id: sm.view(entry, self.pools.open(pool, entry.id)) for pool, entry in found
            }
            views.update((v.id, v) for v in learned)
            listing = WsListing(entries=list(views.values()), names=names)
        for pool in pools:
            await self.pools.settle_read(pool)
        return listing

    async def _search(
        self,
        query: WsQuery,
        pools: list[WsPool],
        names: dict[str, str],
        found: list[tuple[WsPool, WsEntry]],
        learned: list[WsEntryView],
    ) -> WsListing:
        """Ranked search (issue 11): BM25 keyword hits and semantic hits among the records the
        caller may read (`found`, already filtered) and the bot pools' learned entries
        (`learned`), each list as deep as fusion needs, fused by reciprocal rank, cut at
        `limit`."""
        assert query.q is not None
        readable = {e.id for _, e in found}
        seeds = {v.id: v for v in learned}

        def allow(pool: WsPool) -> Callable[[str], bool]:
            entries = pool.stored.entries
            return lambda entry_id: entry_id in readable and entry_id in entries

        depth = fusion_depth(query.limit, self.weights, floor=FUSION_DEPTH)
        keys = self.kernel.analyzer.query(query.q)
        owner: dict[str, WsPool] = {}
        keyword: list[Hit] = []
        for pool in pools if query.using != "semantic" else ():
            for entry_id, score in pool.index.search(keys, depth, allow(pool)):
                owner[entry_id] = pool
                keyword.append(Hit(id=entry_id, score=score, kinds=("keyword",)))
            if seeds and pool.id.startswith("bot:"):  # the bot's learned entries (MEM-1)
                seed_pool = await self.kernel.pool(pool.id)
                for entry_id, score in seed_pool.terms.search(keys, depth, seeds.__contains__):
                    keyword.append(Hit(id=entry_id, score=score, kinds=("keyword",)))
        keyword.sort(key=lambda h: -h.score)
        keyword = keyword[:depth]
        semantic: list[Hit] = []
        if self.semantic is not None and query.using != "keyword":
            semantic = await self.semantic.search(query.q, [(p, allow(p)) for p in pools], depth)
            for pool in pools:
                for h in semantic:
                    if h.id in pool.stored.entries:
                        owner.setdefault(h.id, pool)
        # The semantic search awaited: a record may have changed meanwhile, so check again.
        fused = merge_hits(
            keyword,
            semantic,
            lambda i: i in seeds or (i in owner and allow(owner[i])(i)),
            query.limit,
            weights=self.weights,
        )
        views = [
            seeds[h.id]
            if h.id in seeds
            else sm.view(owner[h.id].stored.entries[h.id], self.pools.open(owner[h.id], h.id))
            for h in fused
        ]
        top = {h.id for h in fused}
        return WsListing(
            entries=views,
            hits=[h for h in keyword if h.id in top],
            semantic=[h for h in semantic if h.id in top],
            fused=fused,
            names=names,
        )

    async def _bot_memory(
        self, pool: WsPool, access: WsAccess
    ) -> tuple[list[WsEntry], list[WsEntryView]]:
        """A bot pool's records and learned entries that `access` may see (its one memory)."""
        bot = sm.pool_owner(pool.id)
        records: list[WsEntry] = []
        seeds: list[WsEntryView] = []
        async with self.memory.read(pool.id, self.rules.bot_reader(pool, access)) as snap:
            records = snap.visible_records()
            seeds = [bm.as_record_view(m, snap.open(m.id), bot) for m in snap.visible_seeds()]
        return records, seeds
