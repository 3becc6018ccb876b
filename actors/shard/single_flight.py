"""Load a thing once however many callers ask for it at the same time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """A cache of loaded values by key: concurrent callers for a key share one load, and a
    failed load is raised to every one of them and not kept (the next call tries again)."""

    def __init__(self) -> None:
        self.loaded: dict[str, T] = {}
        self._loading: dict[str, asyncio.Future[T]] = {}

    async def get(self, key: str, load: Callable[[], Awaitable[T]]) -> T:
        value = self.loaded.get(key)
        if value is not None:
            return value
        loading = self._loading.get(key)
        if loading is not None:
            return await asyncio.shield(loading)
        loading = asyncio.get_running_loop().create_future()
        self._loading[key] = loading
        try:
            value = await load()
        except BaseException as e:
            loading.set_exception(e)
            loading.exception()  # retrieved: later waiters re-raise it
            raise
        finally:
            del self._loading[key]
        self.loaded[key] = value
        loading.set_result(value)
        return value
