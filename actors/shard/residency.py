"""What a shard keeps loaded: least-recently-used eviction under a budget.

A shard loads memory pools, workspace pools and chat logs on first use and would otherwise keep them
for good: memory would grow with every account ever touched. Each loaded thing is registered here
with a weight in records (a fixed part for the object itself, plus the entries, log rows and items
it holds: an empty pool weighs about as much as a few records), touched on every use, and, while the
total is over the budget, the least recently used are offered for eviction, oldest first, until the
total is back under 90% of the budget.

Eviction is asked, never forced: the owner's `evict` callback says no while the thing is in use
(a lock held or awaited, a commit pending, a coroutine holding a reference; see `unused`) and it
stays, to be offered again later. Everything a loaded thing holds is on disk (writes commit
before memory answers), so a later use simply loads it again.

The budget counts records per shard: `[server] cache_records` in the config, env
`OPENBOT_CACHE_RECORDS`, default `DEFAULT_BUDGET`.
"""

from __future__ import annotations

import os
import sys
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_BUDGET = 50_000  # records kept loaded per shard
POOL_WEIGHT = 3  # what a loaded pool costs before its records, in records
CHAT_WEIGHT = 2
SCAN = 64  # things offered per eviction round at most (the rest wait for the next touch)


def budget_from(value: int | None) -> int:
    """The budget: the given value, else the environment's, else the default."""
    if value is None:
        env = os.environ.get("OPENBOT_CACHE_RECORDS")
        value = int(env) if env else DEFAULT_BUDGET
    if value < 1:
        raise ValueError("cache_records must be at least 1")
    return value


def unused(obj: object, holders: int) -> bool:
    """Whether nothing but its `holders` known containers (plus the caller's one local name)
    refers to `obj`. A coroutine suspended with the object in a local variable, a callback that
    closes over it, or another cache holding it all count as uses (CPython reference counts:
    exact, no bookkeeping at the many call sites that fetch a pool and await)."""
    # The caller's local variable, this function's parameter and getrefcount's own argument
    # add three (tests/test_residency.py checks both sides of this line).
    return sys.getrefcount(obj) <= holders + 3


class Residency:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._things: OrderedDict[str, tuple[int, Callable[[], bool]]] = OrderedDict()
        self.total = 0
        self.evictions = 0
        self._shrinking = False

    def __len__(self) -> int:
        return len(self._things)

    def touch(self, key: str, weight: int, evict: Callable[[], bool]) -> None:
        """`key` was used (and weighs `weight` now); `evict()` drops it when unused and says
        whether it did."""
        old = self._things.pop(key, None)
        if old is not None:
            self.total -= old[0]
        self._things[key] = (weight, evict)
        self.total += weight
        if self.total > self.budget:
            self.shrink()

    def forget(self, key: str) -> None:
        """`key` was dropped by its owner (a failed write, a reload)."""
        old = self._things.pop(key, None)
        if old is not None:
            self.total -= old[0]

    def shrink(self, target: int | None = None) -> int:
        """Offer the least recently used things for eviction until the total is at `target`
        (default: 90% of the budget); returns how many went."""
        if self._shrinking:  # an evict callback touched something: no nested rounds
            return 0
        goal = int(self.budget * 0.9) if target is None else target
        gone = 0
        self._shrinking = True
        try:
            offered = 0
            for key in list(self._things):
                if self.total <= goal or offered >= SCAN:
                    break
                found = self._things.get(key)
                if found is None:  # dropped by an earlier callback of this round
                    continue
                _, evict = found
                offered += 1
                if evict():
                    self.forget(key)
                    gone += 1
                else:
                    self._things.move_to_end(key)  # in use: asked again after the others
        finally:
            self._shrinking = False
        self.evictions += gone
        return gone
