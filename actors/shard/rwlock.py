"""An asyncio shared/exclusive lock (ACL-9), one per memory pool.

Readers share it; a writer holds it alone. Writers are preferred: once a writer waits, new readers
queue behind it, so a stream of reads cannot starve a change. Uncontended acquisition does not
await at all, which keeps reads of a quiet pool cheap.

With the pool-lock guard on (actors/runtime/lock_guard.py) these locks count which task holds
them, so that an actor or model call made while holding one fails. Off, it costs one attribute
test per acquisition.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from actors.runtime.lock_guard import GUARD, lock_released, lock_taken
from storage.stats import STATS

WAIT = "openbot_pool_lock_wait_seconds"
WAIT_HELP = "Time a pool lock (ACL-9) was waited for, by mode"
_SHARED_WAIT = STATS.histogram(WAIT, help=WAIT_HELP, mode="shared")
_EXCLUSIVE_WAIT = STATS.histogram(WAIT, help=WAIT_HELP, mode="exclusive")


class PoolMutex(asyncio.Lock):
    """An asyncio.Lock the guard counts (the workspace's per-pool lock)."""

    async def acquire(self) -> bool:
        await super().acquire()
        if GUARD:
            lock_taken()
        return True

    def release(self) -> None:
        if GUARD:
            lock_released()
        super().release()


class RWLock:
    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0
        self._waiting = 0
        self._cond = asyncio.Condition()
        self._wakers: set[asyncio.Task[None]] = set()

    @property
    def readers(self) -> int:
        return self._readers

    @property
    def writing(self) -> bool:
        return self._writer

    @property
    def waiting(self) -> int:
        """Tasks waiting to take it (shared or exclusive)."""
        return self._waiting

    async def _wake(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        started = time.perf_counter()
        if self._writer or self._waiting_writers:
            self._waiting += 1
            try:
                async with self._cond:
                    await self._cond.wait_for(
                        lambda: not self._writer and not self._waiting_writers
                    )
            finally:
                self._waiting -= 1
        _SHARED_WAIT.observe(time.perf_counter() - started)
        self._readers += 1
        if GUARD:
            lock_taken()
        try:
            yield
        finally:
            if GUARD:
                lock_released()
            self._readers -= 1
            if self._readers == 0 and self._waiting:
                async with self._cond:
                    self._cond.notify_all()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        started = time.perf_counter()
        if self._writer or self._readers or self._waiting_writers:
            self._waiting += 1
            self._waiting_writers += 1
            acquired = False
            try:
                async with self._cond:
                    await self._cond.wait_for(lambda: not self._writer and not self._readers)
                    self._writer = acquired = True
            finally:
                self._waiting -= 1
                self._waiting_writers -= 1
                if not acquired and not self._waiting_writers and self._waiting:
                    # Cancelled while waiting: readers queued behind us may go now.
                    task = asyncio.get_running_loop().create_task(self._wake())
                    self._wakers.add(task)  # a reference, so the task is not collected early
                    task.add_done_callback(self._wakers.discard)
        else:
            self._writer = True
        _EXCLUSIVE_WAIT.observe(time.perf_counter() - started)
        if GUARD:
            lock_taken()
        try:
            yield
        finally:
            if GUARD:
                lock_released()
            self._writer = False
            if self._waiting:
                async with self._cond:
                    self._cond.notify_all()
