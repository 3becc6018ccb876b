"""How a shard reaches the other actors: its sibling shards and the directory.

A group chat's home shard runs the rounds, but each bot's step runs on the shard that holds the
bot's memory (docs/design.md §3: an account's pools live on one shard). Every call goes through a
typed port (actors/ports.py): `shard(i)` and `directory()` give the port, and asking for it is where
the pool-lock guard (ACL-9) checks that no pool lock is held across the call.

Calls to this shard itself stay local: an actor awaiting its own handle would queue behind
itself. Other actors are found by name, lazily (actors/runtime/shard_proxy.py), so an actor
restarted by Ray is found again; `connect` wires local services instead (tests, benchmarks, a
shard run without Ray), which the features then call directly.
"""

from __future__ import annotations

from collections.abc import Mapping

from actors.ports import DirectoryPort, ShardPort
from actors.runtime.directory_proxy import RayDirectory
from actors.runtime.lane import LanedRayShard
from actors.runtime.lock_guard import assert_no_pool_lock
from actors.runtime.placement import shard_of
from engine.errors import Unavailable


class Peers:
    def __init__(
        self, own: ShardPort, index: int, *, prefix: str | None, count: int, namespace: str
    ) -> None:
        self.index = index
        self.prefix = prefix  # None: no actors by name (only what `connect` wired)
        self.count = count
        self.namespace = namespace
        self._shards: dict[int, ShardPort] = {index: own}
        self._directory: DirectoryPort | None = None

    def connect(
        self,
        *,
        directory: DirectoryPort | None = None,
        shards: Mapping[int, ShardPort] | None = None,
    ) -> None:
        """Use these local services instead of actors found by name."""
        if directory is not None:
            self._directory = directory
        self._shards.update(shards or {})

    def index_of(self, key: str) -> int:
        return shard_of(key, self.count)

    def shard(self, index: int) -> ShardPort:
        assert_no_pool_lock(f"a call to shard {index}")
        port = self._shards.get(index)
        if port is None:
            if self.prefix is None:
                raise Unavailable(f"shard {index} is not reachable from here", code="no_peers")
            # A sibling: its steps over the direct lane where it can (actors/runtime/lane.py).
            port = self._shards[index] = LanedRayShard(
                f"{self.prefix}-shard-{index}", self.namespace
            )
        return port

    def directory(self) -> DirectoryPort:
        assert_no_pool_lock("a call to the directory")
        if self._directory is None:
            if self.prefix is None:
                raise Unavailable("the directory is not reachable from here", code="no_peers")
            self._directory = RayDirectory(f"{self.prefix}-directory", self.namespace)
        return self._directory
