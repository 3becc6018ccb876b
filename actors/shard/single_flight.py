"""Load a thing once however many callers ask for it at the same time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """A cache of loaded values by key: concurrent callers for a key share one load, and a
    failed load is raised to every one of them and not kept (the next call tries again)."""

    def __init__(self, on_loaded: Callable[[T], object] | None = None) -> None:
        self.loaded: dict[str, T] = {}
        self._loading: dict[str, asyncio.Future[T]] = {}  # loads under way
        # Run in the load's own task once the value is kept (its residency): a load whose
        # every caller was cancelled still completes, and what it keeps must be counted.
        self._on_loaded = on_loaded

    async def get(self, key: str, load: Callable[[], Awaitable[T]]) -> T:
        value = self.loaded.get(key)
        if value is not None:
            return value
        loading = self._loading.get(key)
        if loading is None:
            # A task of its own, not the first caller's: a caller cancelled while it waits (a
            # timeout) must not cancel the load the others wait for, nor fail them with it.
            loading = asyncio.ensure_future(self._load(key, load))
            loading.add_done_callback(lambda f: f.cancelled() or f.exception())  # (retrieved)
            self._loading[key] = loading
        return await asyncio.shield(loading)

    async def _load(self, key: str, load: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await load()
        finally:
            del self._loading[key]
        self.loaded[key] = value
        if self._on_loaded is not None:
            self._on_loaded(value)
        return value

    async def close(self) -> None:
        """Wait for the loads under way (their callers may be gone): none reads a closed file."""
        while self._loading:
            await asyncio.gather(*list(self._loading.values()), return_exceptions=True)
