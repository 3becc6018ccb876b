"""The semantic half of workspace search on a shard (SC-7, docs/design.md §6).

`Workspace.entries` hands this the records it already found readable for the caller (pools the
caller may not read are never candidates) and gets back the nearest by cosine; keyword hits and
these are merged by `engine.workspace_search.merge_hits`, so a semantic hit need not contain the
query text, and both kinds are kept.

Vectors:

- computed when a person's change commits (in the background, batched, never delaying the
  write), and lazily for whatever a search finds without one (records that were imported,
  written while the model was down, or embedded by another model): at most `inline_max` inline,
  the rest queued for the background;
- kept in the `ws_vectors` table (sealed with the pool's key, see storage/vector_store.py) and in
  memory per pool as one float32 matrix of unit vectors, loaded on the pool's first search;
- valid only for the content fingerprint and the model they were made from: an edited record,
  or another model, means a new vector.

The model is never awaited under a pool's search lock (ACL-9; the pool-lock guard counts these
locks too): what to embed is chosen under the lock, the model is called without it, and the
vectors are kept under the lock again only for records whose content is still the one embedded
(`_pick`, `_keep`), so a slow provider delays the records waiting for it, never a search.

When the embedding model fails, search answers with keyword hits (and semantic hits from the
vectors it already has, for queries it has seen) and stops calling the model for `retry_after`
seconds, so a dead endpoint does not add its timeout to every search.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from actors.models.embeddings import (
    DEFAULT_MIN_SCORE,
    Embedder,
    EmbeddingError,
    load_embedder,
    search_settings,
)
from actors.runtime.lock_guard import assert_no_pool_lock
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, durable
from actors.shard.residency import unused
from actors.shard.rwlock import PoolMutex
from actors.workspace.pools import UPKEEP_SLICE, WorkspacePool, WorkspacePools
from actors.workspace.vectors import PoolVectors, unit_vector, widened
from engine.errors import OpenBotError
from engine.scoped_memory import WorkspaceEntry
from engine.workspace_search import Hit
from storage.bulk import paused_gc
from storage.search_index import ranked
from storage.vector_store import Loaded, VectorStore
from storage.workspace_store import content_fp

log = logging.getLogger("openbot.semantic")
INLINE_MAX = 256  # records one search embeds before answering; the rest go to the background
BACKGROUND_BATCH = 128  # records the background embeds per model call round
RETRY_AFTER = 30.0  # seconds without model calls after a failure
QUERY_CACHE = 512
LEARNED = "#learned"  # a bot pool's learned entries' vectors: `<pool>#learned`


class SemanticSearch:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        pools: WorkspacePools,
        embedder: Embedder,
        min_score: float = DEFAULT_MIN_SCORE,
        inline_max: int = INLINE_MAX,
        retry_after: float = RETRY_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kernel = kernel
        self.pools = pools
        pools.keepers.append(self.evict)  # its vectors go when (and only when) it can
        self.embedder = embedder
        self.min_score = min_score
        self.inline_max = inline_max
        self.retry_after = retry_after
        self.clock = clock
        self.store = VectorStore(kernel.db)
        self._pools: dict[str, PoolVectors] = {}
        self._loading: dict[str, asyncio.Future[Loaded]] = {}
        self._locks: dict[str, PoolMutex] = {}
        self._queries: OrderedDict[str, np.ndarray] = OrderedDict()
        self._backlog: dict[str, dict[str, None]] = {}  # pool -> record ids, in arrival order
        self._task: asyncio.Task[None] | None = None
        self._down_until = 0.0
        self.embedded = 0  # records embedded (tests and benchmarks)
        self._seq = 0  # the last vector block's sequence number

    # --- the model, with a circuit breaker ---------------------------------------------------

    def _down(self) -> bool:
        return self.clock() < self._down_until

    def _trip(self, e: EmbeddingError) -> None:
        if not self._down():
            log.warning("semantic search paused for %.0f s: %s", self.retry_after, e)
        self._down_until = self.clock() + self.retry_after

    async def _query(self, query: str) -> np.ndarray | None:
        cached = self._queries.get(query)
        if cached is not None:
            self._queries.move_to_end(query)
            return cached
        if self._down():
            return None
        try:
            (vector,) = await self._embed([query])
        except EmbeddingError as e:
            self._trip(e)
            return None
        unit = unit_vector(vector)
        self._queries[query] = unit
        if len(self._queries) > QUERY_CACHE:
            self._queries.popitem(last=False)
        return unit

    # --- vectors -------------------------------------------------------------------------------

    async def _vectors(self, pool: WorkspacePool) -> PoolVectors:
        """The pool's vectors, loaded from the file on first use (call under the pool's lock)."""
        vectors = self._pools.get(pool.id)
        if vectors is None:
            vectors = PoolVectors()
            task = self._loading.pop(pool.id, None)
            if task is not None:
                ids, fps, mat, row, scale = await task
            else:
                ids, fps, mat, row, scale = await self.store.load_all(
                    pool.id, self.embedder.ident, pool.keyed.cipher
                )
            vectors.load_matrix(ids, fps, mat, unit=True, row=row, scale=scale)
            self._pools[pool.id] = vectors
            # After this search: a walk of every record, for what only the background needs.
            self.pools.later(pool, self._queue_all_missing)
        return vectors

    def prefetch(self, pool_id: str) -> None:
        """Start reading a pool's vectors now: a search of the pool is about to need them, and
        they decrypt on another thread while its records load (the first search after a shard
        opens waits for the slower of the two, not for both)."""
        self._prefetch(pool_id, pool_id)
        if pool_id.startswith("bot:"):  # its learned entries' too (`learned`, same search)
            self._prefetch(pool_id + LEARNED, pool_id)

    def _prefetch(self, key: str, pool_id: str) -> None:
        if key in self._pools or key in self._loading:
            return

        model = self.embedder.ident
        rows = asyncio.ensure_future(self.store.read(key, model))  # the key not needed yet
        rows.add_done_callback(_ignore)

        async def load() -> Loaded:
            keyed = (await self.kernel.pool(pool_id)).stored
            return await self.store.assemble(key, model, keyed.cipher, await rows)

        task = asyncio.ensure_future(load())
        task.add_done_callback(_ignore)  # its error, if any, is raised where it is awaited
        self._loading[key] = task

    def _lock(self, pool_id: str) -> PoolMutex:
        return self._locks.setdefault(pool_id, PoolMutex())

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        assert_no_pool_lock("the embedding model")
        return await self.embedder.embed(texts)

    def evict(self, pool_id: str) -> bool:
        """Drop a pool's vectors and lock as its workspace pool leaves memory (they are loaded
        again on its next search); False while they are in use. Its queued records stay
        queued."""
        lock = self._locks.get(pool_id)
        if lock is not None and (lock.locked() or not unused(lock, 1)):
            return False
        self._locks.pop(pool_id, None)
        self._pools.pop(pool_id, None)
        self._pools.pop(pool_id + LEARNED, None)
        self._locks.pop(pool_id + LEARNED, None)
        for key in (pool_id, pool_id + LEARNED):
            task = self._loading.pop(key, None)
            if task is not None:
                task.cancel()
        return True

    def _pick(
        self, pool: WorkspacePool, vectors: PoolVectors, entries: Iterable[WorkspaceEntry]
    ) -> list[tuple[str, str, str]]:
        """(record, content fingerprint, text) of the records among `entries` whose vector is
        missing or stale (call under the pool's lock: the texts are of their current content)."""
        todo: list[tuple[str, str, str]] = []
        for e in entries:
            current = pool.stored.entries.get(e.id)
            if current is None or vectors.fp(e.id) == current.content_fp:
                continue
            todo.append((e.id, current.content_fp, self.pools.open(pool, e.id)))
        return todo

    async def _keep(
        self,
        pool: WorkspacePool,
        vectors: PoolVectors,
        todo: Sequence[tuple[str, str, str]],
        found: Sequence[Sequence[float]],
    ) -> None:
        """Keep the vectors the model made for `todo` (picked by `_pick`, embedded without the
        lock) and queue their rows; call under the pool's lock. Only records whose content is
        still the one embedded: one edited meanwhile is queued again by its change, and a
        vector of its old content must not replace the new one's."""
        if self._pools.get(pool.id) is not vectors or pool.poisoned:
            return  # evicted or reloaded meanwhile: its next load queues what is missing
        entries = pool.stored.entries
        items = []
        for (entry_id, fp, _), vector in zip(todo, found, strict=True):
            current = entries.get(entry_id)
            if current is not None and current.content_fp == fp:
                items.append((entry_id, fp, vector))
        if not items:
            return
        await _widen(vectors)
        for entry_id, fp, vector in items:
            vectors.put(entry_id, fp, vector)
        self._seq = max(self._seq + 1, time.time_ns())
        cipher, model = pool.keyed.cipher, self.embedder.ident
        rows = [self.store.block(pool.id, model, self._seq, items, cipher)]
        self.embedded += len(items)
        # A cache of derived data: nothing waits for the commit, and a failure only means the
        # vectors are computed again after a restart.
        fut = self.kernel.stage(Batch().key(pool.keyed).extend(rows))
        if fut is not None:
            fut.add_done_callback(_log_failure)

    # --- a bot's learned entries (one memory per bot) -------------------------------

    async def learned(self, pool: WorkspacePool) -> PoolVectors:
        """The vectors of bot pool `pool`'s learned entries, loaded on first use and kept apart
        from its records' (their rows are stored under `<pool>#learned`); a vector is current
        while its fingerprint is that of the entry's sealed content."""
        key = pool.id + LEARNED
        async with self._lock(key):
            vectors = self._pools.get(key)
            if vectors is None:
                vectors = PoolVectors()
                task = self._loading.pop(key, None)
                if task is not None:  # (`prefetch`)
                    ids, fps, mat, row, scale = await task
                else:
                    ids, fps, mat, row, scale = await self.store.load_all(
                        key, self.embedder.ident, pool.keyed.cipher
                    )
                vectors.load_matrix(ids, fps, mat, unit=True, row=row, scale=scale)
                self._pools[key] = vectors
        return vectors

    async def embed_learned(
        self, pool: WorkspacePool, vectors: PoolVectors, todo: Sequence[tuple[str, str, str]]
    ) -> None:
        """Embed (entry, fingerprint, text) of learned entries a search met without a current
        vector, keep the vectors and store them (no lock held: the caller opened the texts)."""
        if not todo or self._down():
            return
        try:
            found = await self._embed([text for _, _, text in todo])
        except EmbeddingError as e:
            self._trip(e)
            return
        items = []
        for (entry_id, fp, _), vector in zip(todo, found, strict=True):
            vectors.put(entry_id, fp, vector)
            items.append((entry_id, fp, vector))
        self.embedded += len(todo)
        self._seq = max(self._seq + 1, time.time_ns())
        model, cipher = self.embedder.ident, pool.keyed.cipher
        rows = [self.store.block(pool.id + LEARNED, model, self._seq, items, cipher)]
        fut = self.kernel.stage(Batch().key(pool.keyed).extend(rows))
        if fut is not None:
            fut.add_done_callback(_log_failure)

    async def embed_texts(self, texts: Sequence[str]) -> list[list[float]] | None:
        """Vectors of `texts` (chat items, which keep theirs in memory only), or None while the
        model is unavailable (the same breaker as every search's)."""
        if not texts or self._down():
            return None
        try:
            found = await self._embed(list(texts))
        except EmbeddingError as e:
            self._trip(e)
            return None
        self.embedded += len(texts)
        return found

    async def query_vector(self, query: str) -> np.ndarray | None:
        """The query's unit vector (cached), or None when the model is unavailable."""
        return await self._query(query) if query.strip() else None

    # --- search --------------------------------------------------------------------------------

    async def search(
        self, query: str, pools: Sequence[tuple[WorkspacePool, Callable[[str], bool]]], depth: int
    ) -> list[Hit]:
        """Up to `depth` records of `pools` nearest to `query`, best first, none below
        `min_score`; only ids the pool's `allowed` accepts (the caller's reading rights and
        filters). [] when the model is unavailable.

        Every vector of a pool is scored (one matrix product) and the ranking walked best
        first. Records written in the last moments whose vectors the background has not made
        yet are embedded here first, up to `inline_max` of them; older ones are always done."""
        if depth <= 0 or not pools or not query.strip():
            return []
        unit = await self._query(query)
        if unit is None:
            return []
        budget = self.inline_max
        hits: list[Hit] = []
        for pool, allowed in pools:
            try:
                async with self._lock(pool.id):
                    vectors = await self._vectors(pool)
                    if vectors.n and vectors.dim != unit.size:
                        vectors.clear()  # the model now answers in another space
                        self._queue_missing(pool, vectors)
                    waiting = self._backlog.get(pool.id, {})
                    stale = [
                        e
                        for i in (list(waiting) if len(waiting) <= 4 * budget else ())
                        if (e := pool.stored.entries.get(i)) is not None and allowed(i)
                    ]
                    todo: list[tuple[str, str, str]] = []
                    if stale and len(stale) <= budget and not self._down():
                        budget -= len(stale)
                        todo = self._pick(pool, vectors, stale)
                        for e in stale:
                            waiting.pop(e.id, None)
                    if not todo:
                        hits.extend(self._top(pool, vectors, unit, depth, allowed))
                        continue
                try:
                    found = await self._embed([text for _, _, text in todo])
                except EmbeddingError as e:
                    self._trip(e)
                    for entry_id, _, _ in todo:  # still without a vector: queued again
                        self._backlog.setdefault(pool.id, {})[entry_id] = None
                    found = None
                async with self._lock(pool.id):
                    if found is not None:
                        await self._keep(pool, vectors, todo, found)
                    vectors = await self._vectors(pool)  # (the same, unless evicted meanwhile)
                    hits.extend(self._top(pool, vectors, unit, depth, allowed))
            except OpenBotError as e:  # a pool whose vectors cannot be read: keywords only
                log.warning("semantic search skipped %s: %s", pool.id, e)
        hits.sort(key=lambda h: (-h.score, h.id))
        return hits[:depth]

    def _top(
        self,
        pool: WorkspacePool,
        vectors: PoolVectors,
        unit: np.ndarray,
        depth: int,
        allowed: Callable[[str], bool],
    ) -> list[Hit]:
        if not vectors.n or unit.size != vectors.dim:
            return []
        scores = vectors.scores(unit)
        entries, ids, fps = pool.stored.entries, vectors.ids, vectors.fps

        def current(r: int) -> bool:  # row r's vector is of its record's content
            e = entries.get(ids[r])
            return e is not None and fps[r] == e.content_fp

        floor = np.nextafter(np.float32(self.min_score), np.float32(-np.inf))
        found = ranked(scores, ids, depth, allowed, floor=float(floor), row_ok=current)
        return [Hit(id=i, score=x, kinds=("semantic",)) for i, x in found]

    async def _queue_all_missing(self, pool: WorkspacePool) -> None:
        """`_queue_missing` for every record, once the pool's vectors have loaded: in slices,
        the event loop free between them (a large pool's walk at once would keep the searches
        that came meanwhile waiting for it)."""
        vectors = self._pools.get(pool.id)
        ids = list(pool.stored.entries)
        for at in range(0, len(ids), UPKEEP_SLICE):
            if at:
                await asyncio.sleep(0)
            if vectors is None or self._pools.get(pool.id) is not vectors or pool.poisoned:
                return  # evicted or reloaded meanwhile: its next load queues what is missing
            self._queue_missing(pool, vectors, ids[at : at + UPKEEP_SLICE])

    def _queue_missing(
        self, pool: WorkspacePool, vectors: PoolVectors, ids: Iterable[str] | None = None
    ) -> None:
        """Queue for the background the records of the pool (`ids`, all by default) without a
        current vector: searches then never wait for them."""
        if self._pools.get(pool.id) is not vectors or pool.poisoned:
            return  # evicted or reloaded meanwhile: its next load queues what is missing
        row, fps, entries = vectors.row, vectors.fps, pool.stored.entries
        with paused_gc():
            for entry_id in list(entries) if ids is None else ids:
                r = row.get(entry_id)
                if r is None or fps[r] != content_fp(entries, entry_id):
                    self._queue(pool.id, entry_id)

    # --- background ----------------------------------------------------------------------------

    def written(self, pool_id: str, entry_id: str) -> None:
        """A record's content may have changed: embed it once its change has committed."""
        self._queue(pool_id, entry_id)

    def _queue(self, pool_id: str, entry_id: str) -> None:
        self._backlog.setdefault(pool_id, {})[entry_id] = None
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while self._backlog:
            if self._down():
                self._backlog.clear()  # later searches catch up on what is missing
                return
            pool_id, ids = next(iter(self._backlog.items()))
            batch = list(ids)[:BACKGROUND_BATCH]
            for entry_id in batch:
                del ids[entry_id]
            if not ids:
                del self._backlog[pool_id]
            try:
                pool = await self.pools.pool(pool_id)
                await durable(pool.pending)  # only what is on disk
                await _widen(self._pools.get(pool_id))  # (searches go on meanwhile: no lock)
                async with self._lock(pool_id):
                    if pool.poisoned:
                        continue
                    vectors = await self._vectors(pool)
                    entries = [pool.stored.entries[i] for i in batch if i in pool.stored.entries]
                    todo = self._pick(pool, vectors, entries)
                if not todo:
                    continue
                found = await self._embed([text for _, _, text in todo])  # no lock held
                async with self._lock(pool_id):
                    await self._keep(pool, vectors, todo, found)
            except EmbeddingError as e:
                self._trip(e)
            except OpenBotError as e:
                log.warning("embedding records of %s skipped: %s", pool_id, e)
            except Exception:
                log.exception("embedding records of %s failed", pool_id)

    async def idle(self) -> None:
        """Wait until the background has embedded what was queued (tests and benchmarks)."""
        await self.pools.upkept()  # what a pool's load queues, a moment later
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.embedder.close()


async def _widen(vectors: PoolVectors | None) -> None:
    """A pool's rows as loaded (int8) widened to float32 for its first new vector, once, on
    another thread."""
    codes = None if vectors is None else vectors.codes
    if vectors is not None and codes is not None:
        mat = await asyncio.to_thread(widened, codes)
        if vectors.codes is codes:  # (not cleared or widened meanwhile)
            vectors.widen(mat)


def _ignore(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


def _log_failure(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("storing vectors failed (they are recomputed later): %s", fut.exception())


def semantic_search(
    kernel: ShardKernel,
    pools: WorkspacePools,
    search: Mapping[str, object] | None,
    models: Mapping[str, Mapping] | None,
    *,
    base_dir: Path,
    embedder: Embedder | None = None,
) -> SemanticSearch | None:
    """The shard's semantic search from the config's `[search]` and `[models.*]` tables (or a
    given embedder, for in-process use); None when no embedding model is chosen."""
    settings = search_settings(search, models)
    if embedder is None:
        embedder = load_embedder(settings, models or {}, base_dir=base_dir)
    if embedder is None:
        return None
    return SemanticSearch(
        kernel=kernel, pools=pools, embedder=embedder, min_score=settings.min_score
    )
