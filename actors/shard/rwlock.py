"""An asyncio shared/exclusive lock (ACL-9), one per memory pool.

Readers share it; a writer holds it alone. Writers are preferred: once a writer waits, new readers
queue behind it, so a stream of reads cannot starve a change. Uncontended acquisition does not
await at all, which keeps reads of a quiet pool cheap.

A debug guard (`OPENBOT_LOCK_GUARD=1`; the test suite turns it on) records which asyncio task
holds pool locks, and `assert_no_pool_lock` — called where the engine awaits another actor or a
model — fails when the current task holds one (ACL-9: never hold a pool lock across such a
call). Off, it costs one attribute test per acquisition.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from storage.stats import STATS

WAIT = "openbot_pool_lock_wait_seconds"
WAIT_HELP = "Time a pool lock (ACL-9) was waited for, by mode"
GUARD = os.environ.get("OPENBOT_LOCK_GUARD") == "1"
_held: weakref.WeakKeyDictionary[asyncio.Task, int] = weakref.WeakKeyDictionary()
violations: list[str] = []  # what the guard caught in this process (tests read it)


class PoolLockHeld(RuntimeError):
    """A pool lock was held across an actor or model call (a bug; only with the guard on)."""


def _enter() -> None:
    task = asyncio.current_task()
    if task is not None:
        _held[task] = _held.get(task, 0) + 1


def _exit() -> None:
    task = asyncio.current_task()
    if task is not None:
        left = _held.get(task, 0) - 1
        if left > 0:
            _held[task] = left
        else:
            _held.pop(task, None)


def held() -> int:
    """Pool locks the current task holds (counted only with the guard on)."""
    task = asyncio.current_task()
    return 0 if task is None else _held.get(task, 0)


def assert_no_pool_lock(what: str) -> None:
    """Call before awaiting another actor or a model: with the guard on, fail if the current
    task holds a pool lock."""
    if GUARD and held():
        message = f"a pool lock is held across {what}"
        violations.append(message)
        logging.getLogger("openbot.locks").error(message, stack_info=True)
        raise PoolLockHeld(message)


class PoolMutex(asyncio.Lock):
    """An asyncio.Lock the guard counts (the workspace's per-pool lock)."""

    async def acquire(self) -> bool:
        await super().acquire()
        if GUARD:
            _enter()
        return True

    def release(self) -> None:
        if GUARD:
            _exit()
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
        STATS.observe(WAIT, time.perf_counter() - started, help=WAIT_HELP, mode="shared")
        self._readers += 1
        if GUARD:
            _enter()
        try:
            yield
        finally:
            if GUARD:
                _exit()
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
        STATS.observe(WAIT, time.perf_counter() - started, help=WAIT_HELP, mode="exclusive")
        if GUARD:
            _enter()
        try:
            yield
        finally:
            if GUARD:
                _exit()
            self._writer = False
            if self._waiting:
                async with self._cond:
                    self._cond.notify_all()
