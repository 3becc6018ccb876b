"""Ranked search of the workspace memory on one shard (SC-7, MEM-1, ACL-9).

`GET /api/app/workspace/memories?q=` on a shard: BM25 keyword hits (storage/search_index.py)
and semantic hits (actors/workspace/semantic.py) of the pools the caller may read, fused by
weighted reciprocal rank (engine/workspace_search.py) and cut at `limit`. A bot pool's
learned entries (one memory per bot) are ranked with its records.

Checked lazily, never listed: nothing here walks a pool's records to find what the caller may
read (in a large pool that walk alone would be most of a search's time). Each ranking covers
the whole pool and is walked best first, every id checked by the caller's filter (status,
contributor, and for a bot pool the record's visibility to the caller) until enough pass. The
scores do not depend on who reads — BM25's document frequencies and average length are over
the whole pool, a cosine is the record's own — so the hits are exactly those of filtering first
and ranking after: a record the caller may not read is never a hit and never moves a readable
one. (What the hidden records do reveal is nothing: a score is never shown for them, and the
statistics they feed are their own pool's, the same for every reader, never combined with
another pool's: `keyword_stats`.)

Locking: a bot pool's learned entries are checked under that pool's shared lock (ACL-9), once
for the keyword walk and again when the top ones are opened (the semantic search awaited the
model in between, and an entry may have changed). Workspace records are checked and opened in
synchronous stretches; their writes happen under the workspace pool's lock without an await
between the change and the state, so a check never sees half a change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from actors.contracts import WorkspaceAccess, WorkspaceListing, WorkspaceQuery
from actors.shard.kernel import ShardKernel
from actors.shard.memory_reader import MemoryReader, Snapshot
from actors.shard.pool import Pool
from actors.workspace.access import WorkspaceRules
from actors.workspace.pools import WorkspacePool, WorkspacePools
from actors.workspace.semantic import SemanticSearch
from engine import memory_union as bm
from engine import scoped_memory as sm
from engine.memory_entries import Reader, Status
from engine.scoped_memory import WorkspaceEntryView, WorkspaceStatus
from engine.visibility import Visibility
from engine.workspace_search import FUSION_DEPTH, Hit, fusion_depth, merge_hits
from storage.memory_store import sealed_fp
from storage.search_index import Stats


class Searcher(Protocol):
    """What a ranked search reads (actors/workspace/listing.py's `WorkspaceListings`)."""

    kernel: ShardKernel
    pools: WorkspacePools
    rules: WorkspaceRules
    memory: MemoryReader  # a bot's one memory: its records and learned entries (MEM-1)
    semantic: SemanticSearch | None
    weights: tuple[float, float]


def _yes(_: str) -> bool:
    return True


def bot_reader(
    ws: Searcher, pool: WorkspacePool, access: WorkspaceAccess, reader: Reader | None = None
) -> Reader:
    """Whose view of a bot pool a search ranks: `reader` when the caller already has one (a
    bot's step, the bot memory route), else the workspace caller's."""
    return reader if reader is not None else ws.rules.bot_reader(pool, access)


def record_filter(
    ws: Searcher,
    pool: WorkspacePool,
    access: WorkspaceAccess,
    query: WorkspaceQuery,
    reader: Reader | None = None,
) -> Callable[[str], bool]:
    """Whether a record id of `pool` is one the query may return to the caller (the pool
    itself is readable: checked before)."""
    who = bot_reader(ws, pool, access, reader) if pool.id.startswith("bot:") else None
    return _record_check(pool, query, who)


def _record_check(
    pool: WorkspacePool, query: WorkspaceQuery, who: Reader | None
) -> Callable[[str], bool]:
    """`record_filter` with the reader of a bot pool given (`who`; None for other pools)."""
    entries = pool.stored.entries
    status, contributor = query.status, query.contributor
    visible = bm.record_check(who) if who is not None else None

    def ok(entry_id: str) -> bool:
        e = entries.get(entry_id)
        return (
            e is not None
            and (status == "all" or e.status == status)
            and (contributor is None or e.contributor == contributor)
            and (visible is None or visible(e))
        )

    return ok


def learned_filter(pool: Pool, reader: Reader, query: WorkspaceQuery, vis: Visibility):
    """The same for a bot pool's learned entries (call under the pool's lock; `vis` is of the
    union of its entries and records, for observations resting on a record)."""
    entries, bot = pool.entries, sm.pool_owner(pool.id)
    status, contributor = query.status, query.contributor

    def ok(entry_id: str) -> bool:
        m = entries.get(entry_id)
        if m is None or not vis.visible(entry_id):
            return False
        if status != "all":
            active = m.status == Status.ACTIVE
            if active != (status == WorkspaceStatus.ACTIVE):
                return False
        return contributor is None or (m.contributor or bot) == contributor

    return ok


async def search(
    ws: Searcher,
    access: WorkspaceAccess,
    query: WorkspaceQuery,
    pools: Sequence[WorkspacePool],
    names: dict[str, str],
    reader: Reader | None = None,
) -> WorkspaceListing:
    """The one ranking of every memory search (docs/search.md): the workspace routes, a bot's
    memory route, its `workspace_memory_search` tool, enrichment and the prompt beyond its
    budget all come here. `reader`, when given, is whose view of a bot pool is ranked."""
    assert query.q is not None
    hybrid = ws.semantic is not None and query.using == "all"
    # One list alone is cut at `limit`; fused lists go as deep as fusion needs.
    depth = fusion_depth(query.limit, ws.weights, floor=FUSION_DEPTH) if hybrid else query.limit
    # Each pool hashes terms with its own key: the query is hashed once per pool searched.
    keys_of = {p.id: ws.kernel.analyzer(p.id).query(query.q) for p in pools}
    allow = {p.id: record_filter(ws, p, access, query, reader) for p in pools}
    owner: dict[str, WorkspacePool] = {}
    learned: dict[str, WorkspacePool] = {}  # learned entry id -> its bot pool
    keyword: list[Hit] = []
    # One bot pool and no semantic search: nothing awaits between the keyword walk and the
    # answer, so its learned hits are opened in the walk's own locked stretch, not read again.
    alone = len(pools) == 1 and (ws.semantic is None or query.using == "keyword")
    views: dict[str, WorkspaceEntryView] = {}
    if query.using != "semantic" and any(keys_of.values()):
        shared = keyword_stats(pools, keys_of)
        for pool in pools:
            keys = keys_of[pool.id]
            if not pool.id.startswith("bot:"):
                hits = pool.index.search(keys, depth, allow[pool.id], shared.get(pool.id))
                for entry_id, score in hits:
                    owner[entry_id] = pool
                    keyword.append(Hit(id=entry_id, score=score, kinds=("keyword",)))
                continue
            # A bot pool: its records and learned entries (MEM-1) under the pool's own
            # statistics, the same for every reader (see `keyword_stats`). Both are keyed
            # with the pool's one term key.
            who = bot_reader(ws, pool, access, reader)
            async with ws.memory.read(pool.id, who) as snap:
                ok = learned_filter(snap.pool, who, query, snap.visibility)
                records, found = bot_keyword(snap, pool, keys, depth, allow[pool.id], ok)
                for entry_id, score in records:
                    owner[entry_id] = pool
                    keyword.append(Hit(id=entry_id, score=score, kinds=("keyword",)))
                for entry_id, score in found:
                    learned[entry_id] = pool
                    keyword.append(Hit(id=entry_id, score=score, kinds=("keyword",)))
                if alone:
                    views.update(_learned_views(snap, pool, [i for i, _ in found]))
        keyword.sort(key=lambda h: -h.score)
        keyword = keyword[:depth]
    semantic: list[Hit] = []
    if ws.semantic is not None and query.using != "keyword":
        semantic = await ws.semantic.search(query.q, [(p, allow[p.id]) for p in pools], depth)
        for h in semantic:
            if h.id not in owner:
                for pool in pools:
                    if h.id in pool.stored.entries:
                        owner[h.id] = pool
                        break
        for pool in pools:
            if pool.id.startswith("bot:"):
                for h in await _learned_semantic(ws, access, query, pool, depth, reader):
                    learned[h.id] = pool
                    semantic.append(h)
        semantic.sort(key=lambda h: (-h.score, h.id))
        semantic = semantic[:depth]
    # Every hit passed its filter when its list was walked. The semantic search awaited since:
    # a record may have changed meanwhile, so the fused ranking is walked best first, each
    # record checked again in the same synchronous stretch as its content is opened.
    fused: list[Hit] = []
    everything = len(keyword) + len(semantic)
    for h in merge_hits(keyword, semantic, _yes, everything, weights=ws.weights):
        if len(fused) == query.limit:
            break
        pool = owner.get(h.id)
        if h.id in learned:
            fused.append(h)  # checked and opened under its pool's lock, below
        elif pool is not None and allow[pool.id](h.id):
            fused.append(h)
            views[h.id] = sm.view(pool.stored.entries[h.id], ws.pools.open(pool, h.id))
    again = {} if alone else {learned[h.id].id: learned[h.id] for h in fused if h.id in learned}
    for pool in again.values():
        who = bot_reader(ws, pool, access, reader)
        async with ws.memory.read(pool.id, who) as snap:
            ok = learned_filter(snap.pool, who, query, snap.visibility)
            found = [h.id for h in fused if learned.get(h.id) is pool and ok(h.id)]
            views.update(_learned_views(snap, pool, found))
    fused = [h for h in fused if h.id in views]  # a learned entry gone while we waited: dropped
    top = {h.id for h in fused}
    return WorkspaceListing(
        entries=[views[h.id] for h in fused],
        hits=[h for h in keyword if h.id in top],
        semantic=[h for h in semantic if h.id in top],
        fused=fused,
        names=names,
    )


def bot_keyword(
    snap: Snapshot,
    pool: WorkspacePool,
    keys: list[int],
    depth: int,
    allow: Callable[[str], bool],
    ok: Callable[[str], bool],
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """A bot pool's keyword hits, its records' (`allow`) and its learned entries' (`ok`), each
    best first, both under the pool's own statistics (see `keyword_stats`): call under the
    pool's read lock (`snap`, of `pool`'s id)."""
    stats = Stats.of([pool.index.stats(keys), snap.pool.terms.stats(keys)])
    records = pool.index.search(keys, depth, allow, stats)
    return records, snap.pool.terms.search(keys, depth, ok, stats)


def context_first(
    snap: Snapshot,
    keys: list[int],
    limit: int,
    weights: tuple[float, float],
    usable: Callable[[str], bool] | None = None,
) -> list[str]:
    """The ids `search` ranks first, at most `limit`, for a query of the bot pool `snap` reads
    alone, for its reader, on a shard without semantic search (`keys`: the query's, by the
    pool's analyzer): found in the caller's locked stretch of that read, so that an enrichment
    or confessor context ranks and takes its entries in one read, with no listing made.
    `usable`: whether the reader may use a learned entry, when the read holds that answer
    already (the reader's kept view); else each hit is checked as `search` checks it."""
    pool = snap.ws
    if not keys or pool is None:
        return []
    query = WorkspaceQuery(pools=(pool.id,), projects=(), limit=limit)
    allow = _record_check(pool, query, snap.reader)
    ok = (
        usable
        if usable is not None
        else learned_filter(snap.pool, snap.reader, query, snap.visibility)
    )
    records, found = bot_keyword(snap, pool, keys, limit, allow, ok)
    # As `search` lists them: records first, then learned entries, ordered by score alone
    # (a stable sort) and cut at the depth, then fused as one list.
    keyword = [Hit(id=i, score=score, kinds=("keyword",)) for i, score in (*records, *found)]
    keyword.sort(key=lambda h: -h.score)
    keyword = keyword[:limit]
    fused = merge_hits(keyword, [], _yes, len(keyword), weights=weights)
    return [h.id for h in fused[:limit]]


def _learned_views(
    snap: Snapshot, pool: WorkspacePool, ids: Sequence[str]
) -> dict[str, WorkspaceEntryView]:
    """Learned entries of bot pool `pool` as records (call under its read lock, with `ids`
    checked in the same stretch); kept per entry state (`Pool.derive`): a turn's next
    searches find most of the same hits."""
    bot = sm.pool_owner(pool.id)
    metas = [snap.pool.entries[i] for i in ids]
    made = snap.pool.derive(
        "record", metas, lambda m, text: bm.as_record_view(m, text, bot), snap.open
    )
    return {v.id: v for v in made}


def keyword_stats(
    pools: Sequence[WorkspacePool], keys_of: dict[str, list[int]]
) -> dict[str, Stats]:
    """The BM25 statistics the user and project pools of a search are scored under: those of
    one index holding all their records, in each pool's keys (none for one pool). Hits of several
    pools are merged by score, and scores only compare under the same statistics: with each
    pool's own, a conversation kept in its own project ranked by its own document frequencies
    (the speakers' names in every turn count for nothing), and keyword recall with one project
    per conversation fell well below that of one pool; with these statistics it is close to it
    (docs/benchmarks.md, "Design measurements").

    Only pools whose every record the caller may read are combined: whoever searches a user or
    project pool reads all of it. A bot pool's records and learned entries may be hidden from
    the caller (`for:`/`from:` tags, visibility), so it keeps its own statistics, as it did
    alone: were they added in, any record the caller can write (in their own user pool) would
    rank differently as hidden bot records hold a word or not, and the order of its hits would
    tell how many of those the caller may not read contain it (access is decided from tags,
    never leaked by a ranking). Within a bot pool the hidden rows shift scores as before, the
    same for every reader; they move nothing outside it."""
    combined = [p for p in pools if not p.id.startswith("bot:")]
    if len(combined) < 2:
        return {}
    parts = [(p.index.stats(keys_of[p.id]), keys_of[p.id]) for p in combined]
    return {p.id: s for p, s in zip(combined, Stats.across(parts), strict=True)}


async def _learned_semantic(
    ws: Searcher,
    access: WorkspaceAccess,
    query: WorkspaceQuery,
    pool: WorkspacePool,
    depth: int,
    reader: Reader | None = None,
) -> list[Hit]:
    """Semantic hits among the learned entries of bot pool `pool` the caller may read: those
    without a current vector (learned since, or never searched) are embedded first, up to the
    semantic search's inline budget. Checked under the pool's lock, embedded without it."""
    semantic = ws.semantic
    assert semantic is not None and query.q is not None
    unit = await semantic.query_vector(query.q)
    if unit is None:
        return []
    vectors = await semantic.learned(pool)
    who = bot_reader(ws, pool, access, reader)
    async with ws.memory.read(pool.id, who) as snap:
        ok = learned_filter(snap.pool, who, query, snap.visibility)
        sealed = snap.pool.stored.sealed
        found = [(i, sealed_fp(sealed[i])) for i in snap.pool.entries if i in sealed and ok(i)]
        todo = [(i, fp, snap.open(i)) for i, fp in found if vectors.fp(i) != fp]
    await semantic.embed_learned(pool, vectors, todo[: semantic.inline_max])
    if vectors.n and vectors.dim != unit.size:
        return []
    rows = [vectors.row[i] for i, fp in found if vectors.fp(i) == fp]
    return vectors.top(unit, rows, depth, semantic.min_score)
