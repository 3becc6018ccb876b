"""The gateway's cache of memory pages, kept fresh by the event stream.

A page is stored with the shard's epoch and the last event seq its state reflects (`fill`).
It is served again only while this gateway's hub has pumped that shard at least up to `fill`
and has seen no `memory.changed` for the pool after it; any change to the pool, an epoch change
or a broken pump drops it. Writes made through this gateway drop the pool's pages at once, so a
client always reads its own writes. Across gateways a page can lag a change by the time the
change takes to reach this gateway's hub (one long-poll return, about a millisecond).

Keys include everything visibility depends on besides the pool (user, org, channels, whether the
reader uses the bot, the tag filter), and permission checks run before the cache is consulted:
a hit only ever returns what this same reader was shown for the same pool state.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.memory_entries import Reader

MAX_BYTES = 64 * 1024 * 1024

Key = tuple[str, str, str, frozenset[str], bool, tuple[str, ...]]


class ReadCache:
    def __init__(self, hub, *, max_bytes: int = MAX_BYTES) -> None:
        self.hub = hub
        self.max_bytes = max_bytes
        self._pages: OrderedDict[Key, tuple[int, str, int, bytes]] = OrderedDict()
        self._by_pool: dict[str, set[Key]] = {}
        self._bytes = 0
        self._generation: dict[str, int] = {}  # bumped by every local write to a pool
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(pool: str, reader: Reader, tags: tuple[str, ...]) -> Key:
        return (pool, reader.user, reader.org, reader.channels, reader.uses_bot, tags)

    def get(self, key: Key) -> bytes | None:
        found = self._pages.get(key)
        if found is None:
            self.misses += 1
            return None
        shard, epoch, fill, body = found
        if not self.hub.fresh(shard, epoch, key[0], fill):
            self._drop(key)
            self.misses += 1
            return None
        self._pages.move_to_end(key)
        self.hits += 1
        return body

    def generation(self, pool: str) -> int:
        return self._generation.get(pool, 0)

    def put(
        self, key: Key, shard: int, epoch: str, fill: int, body: bytes, generation: int
    ) -> None:
        """Keep a page read since `generation(pool)` returned `generation`."""
        if self.generation(key[0]) != generation:
            return  # a write through this gateway overlapped the read
        if not self.hub.fresh(shard, epoch, key[0], fill):
            return  # the hub is behind this page: it could not tell when it goes stale
        self._drop(key)
        self._pages[key] = (shard, epoch, fill, body)
        self._by_pool.setdefault(key[0], set()).add(key)
        self._bytes += len(body)
        while self._bytes > self.max_bytes and self._pages:
            self._drop(next(iter(self._pages)))

    def forget_pool(self, pool: str) -> None:
        """Called before and after every write through this gateway."""
        self._generation[pool] = self._generation.get(pool, 0) + 1
        keys = self._by_pool.get(pool)
        if keys:
            for key in list(keys):
                self._drop(key)

    def clear(self) -> None:
        self._pages.clear()
        self._by_pool.clear()
        self._bytes = 0

    def _drop(self, key: Key) -> None:
        found = self._pages.pop(key, None)
        if found is None:
            return
        self._bytes -= len(found[3])
        keys = self._by_pool.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_pool[key[0]]
