"""The pool-lock guard (ACL-9: never hold a pool lock across an actor or model call).

A debug guard (`OPENBOT_LOCK_GUARD=1`; the test suite turns it on): the pool locks
(actors/shard/rwlock.py) and the semantic-search locks (actors/workspace/semantic.py) count
which asyncio task holds them, and `assert_no_pool_lock` — called where the engine awaits
another actor (every port, actors/runtime/shard_proxy.py and peers.py) or a model (chat and
embedding) — fails when the current task holds one. Here, below the shard, so that the runtime's
calls check it without importing the shard.
"""

from __future__ import annotations

import asyncio
import logging
import os
import weakref

GUARD = os.environ.get("OPENBOT_LOCK_GUARD") == "1"
_held: weakref.WeakKeyDictionary[asyncio.Task, int] = weakref.WeakKeyDictionary()
violations: list[str] = []  # what the guard caught in this process (tests read it)


class PoolLockHeld(RuntimeError):
    """A pool lock was held across an actor or model call (a bug; only with the guard on)."""


def lock_taken() -> None:
    task = asyncio.current_task()
    if task is not None:
        _held[task] = _held.get(task, 0) + 1


def lock_released() -> None:
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
