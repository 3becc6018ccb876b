"""An actor port over a Ray actor handle, derived from the port itself.

A port (actors/ports.py) is the one declaration of what an actor answers. Its Ray proxy is a
class that names the port among its bases; every call the port declares and the class does not
define becomes `remote(actor.<call>, ...)`, with the port's signature:

    class RayDirectory(NamedActor, DirectoryPort):
        pass  # every call of the port, over the actor

A proxy defines a call itself only where it does more than hand it on (a shard's coalesced
writes, its event poll, the node hub's `run`); a subclass may override a call again (the
shard's lane, actors/runtime/lane.py). Type checkers see the port's typed declarations.

Errors are mapped as every actor call maps them (`remote`): the engine's own errors come back
as themselves, Ray's failures as `Unavailable`.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from actors.runtime.lock_guard import assert_no_pool_lock
from engine.errors import OpenBotError, Unavailable
from storage.stats import STATS

log = logging.getLogger("openbot")


async def remote(method: Any, *args: Any, **kwargs: Any) -> Any:
    """Await an actor method; the engine's own errors come back as themselves, Ray's failures
    as `Unavailable`."""
    import ray

    STATS.inc("openbot_actor_calls_total", help="Actor calls this process made")
    assert_no_pool_lock("an actor call")
    try:
        return await method.remote(*args, **kwargs)
    except ray.exceptions.RayTaskError as e:
        cause = e.cause
        if isinstance(cause, OpenBotError):
            raise cause from None
        log.error("actor call failed: %s", e)
        raise Unavailable("the engine failed to handle the request", code="engine_error") from e
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
        raise Unavailable("the engine is restarting; try again", code="engine_unavailable") from e


def _is_port(klass: type) -> bool:
    return bool(klass.__dict__.get("_is_protocol", False))


def port_calls(port: type) -> list[str]:
    """The calls a port declares: its coroutine methods."""
    return [n for n, v in vars(port).items() if inspect.iscoroutinefunction(v)]


def _forward(cls: type, call: str, declared: Callable[..., Any]) -> Callable[..., Any]:
    async def forwarded(self: ActorProxy, *args: Any, **kwargs: Any) -> Any:
        return await remote(getattr(self._actor(), call), *args, **kwargs)

    forwarded.__name__ = call
    forwarded.__qualname__ = f"{cls.__name__}.{call}"
    forwarded.__module__ = cls.__module__
    forwarded.__doc__ = declared.__doc__
    forwarded.__signature__ = inspect.signature(declared)  # type: ignore[attr-defined]
    return forwarded


class ActorProxy:
    """The base of every Ray proxy: a subclass that names a port among its bases gets a method
    for each call of the port it does not define (see the module's docstring)."""

    def _actor(self) -> Any:
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for port in [k for k in cls.__mro__ if _is_port(k)]:
            for call in port_calls(port):
                owner = next(k for k in cls.__mro__ if call in vars(k))
                if _is_port(owner):  # only declared so far: hand it to the actor
                    setattr(cls, call, _forward(cls, call, vars(port)[call]))


class NamedActor(ActorProxy):
    """An actor found by name on first use, or over the handle its creator already holds
    (`Engine`: a gateway's ports). A named actor that Ray restarts keeps its handle valid."""

    def __init__(self, name: str, namespace: str, handle: Any = None) -> None:
        self.name = name
        self.namespace = namespace
        self._handle: Any = handle

    def _actor(self) -> Any:
        if self._handle is None:
            import ray

            self._handle = ray.get_actor(self.name, namespace=self.namespace)
        return self._handle
