"""How a shard reaches the other actors: its sibling shards and the directory.

A group chat's home shard runs the rounds, but each bot's step runs on the shard that holds
the bot's memory (DESIGN §3: an account's pools live on one shard). Handles are found by name,
lazily, so an actor restarted by Ray is found again. Calls to this shard itself stay local: an
actor awaiting its own handle would queue behind itself.
"""

from __future__ import annotations

from typing import Any

from actors.runtime.placement import shard_of
from actors.shard.rwlock import assert_no_pool_lock
from engine.errors import OpenBotError, Unavailable


class Peers:
    def __init__(
        self, local: Any, *, index: int, prefix: str | None, count: int, namespace: str
    ) -> None:
        # This shard's own RPC surface (its `ShardService`): calls to itself stay in-process.
        self.local = local
        self.index = index
        self.prefix = prefix
        self.count = count
        self.namespace = namespace
        self._handles: dict[str, Any] = {}

    def index_of(self, key: str) -> int:
        return shard_of(key, self.count)

    def _handle(self, name: str) -> Any:
        handle = self._handles.get(name)
        if handle is None:
            import ray

            handle = ray.get_actor(name, namespace=self.namespace)
            self._handles[name] = handle
        return handle

    async def shard_call(self, index: int, method: str, *args: Any) -> Any:
        assert_no_pool_lock(f"a call to shard {index} ({method})")
        if index == self.index:
            return await getattr(self.local, method)(*args)
        if self.prefix is None:
            raise Unavailable(f"shard {index} is not reachable from here", code="no_peers")
        return await remote(getattr(self._handle(f"{self.prefix}-shard-{index}"), method), *args)

    async def directory(self, method: str, *args: Any) -> Any:
        assert_no_pool_lock(f"a call to the directory ({method})")
        if self.prefix is None:
            local = getattr(self.local, "directory_service", None)
            if local is None:
                raise Unavailable("the directory is not reachable from here", code="no_peers")
            return await getattr(local, method)(*args)
        return await remote(getattr(self._handle(f"{self.prefix}-directory"), method), *args)


async def remote(method: Any, *args: Any, **kwargs: Any) -> Any:
    """Await an actor method; the engine's own errors come back as themselves, Ray's failures
    as `Unavailable`."""
    import ray

    assert_no_pool_lock("an actor call")
    try:
        return await method.remote(*args, **kwargs)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause
        if isinstance(cause, OpenBotError):
            raise cause from None
        import logging

        logging.getLogger("openbot").error("actor call failed: %s", e)
        raise Unavailable("the engine failed to handle the request", code="engine_error") from e
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
        raise Unavailable("the engine is restarting; try again", code="engine_unavailable") from e
