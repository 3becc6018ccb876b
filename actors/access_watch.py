"""The directory's access revision, watched by the gateways that cache who may do what.

Every change to what a token or a user may reach (orgs, users, tokens, bots and their grants,
channels) bumps one revision, and names what it touched (contracts.py `access_key`: the bot, the
principals whose bots or channels changed, a token's hash). Each gateway long-polls `watch` with the
revision it has applied; answers come at once when the revision moved, with the keys changed since,
so a gateway drops only those entries about one actor call after the change (everything when it is
further behind than the kept log, or the directory restarted). A change that takes access away (a
revoked token, a removed grant) is answered only once every live gateway has acknowledged its
revision (`settled`): when the revocation returns, no gateway serves the old access any more. A
gateway that stops says so (`leave`) and is not waited for; one that vanishes without a word and
does not acknowledge in time is dropped from the live set, and stops trusting its cache on its own
once its polls stop coming back (gateway/auth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable

from actors.contracts import ACCESS_POLL_WAIT

POLL_WAIT = ACCESS_POLL_WAIT  # seconds a watch waits for a change before answering
# Seconds a revocation waits for the gateways' acknowledgements: longer than a gateway trusts
# its cache after the watch last answered (gateway/auth.py TRUST), so one that did not answer
# has stopped using its cache by the time the revocation returns.
ACK_WAIT = POLL_WAIT + 1.0
LIVE = POLL_WAIT + 2.0  # a watcher not heard from for longer is not waited for
KEPT = 4096  # changes whose keys are kept: a gateway further behind drops everything


class AccessWatch:
    def __init__(
        self, clock: Callable[[], float] = time.monotonic, start: int | None = None
    ) -> None:
        # Counted from the wall clock in microseconds, not 0: a restarted directory's revisions
        # are above any its predecessor reached, so a gateway's `since` from before the restart
        # is older than this log and it drops everything (`changes`).
        self.revision = time.time_ns() // 1000 if start is None else start
        self.clock = clock
        self._changed: asyncio.Event | None = None
        self._acked: asyncio.Event | None = None
        self._watchers: dict[str, tuple[int, float]] = {}  # watcher → (revision applied, when)
        # (revision, the keys it changed; None: anything may have changed), oldest first
        self._log: deque[tuple[int, frozenset[str] | None]] = deque(maxlen=KEPT)

    def bump(self, keys: Iterable[str] | None = None) -> int:
        """A change to access was stored: the revision moves on and every watch answers.
        `keys`: what it touched (None: anything)."""
        self.revision += 1
        self._log.append((self.revision, None if keys is None else frozenset(keys)))
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        return self.revision

    async def watch(self, watcher: str, since: int, wait: float = POLL_WAIT) -> int:
        """Called by a gateway that applied `since`: answers the current revision as soon as it
        is newer, or after `wait` seconds."""
        self._watchers[watcher] = (since, self.clock())
        if self._acked is not None:
            self._acked.set()
            self._acked = None
        if since >= self.revision:
            if self._changed is None:
                self._changed = asyncio.Event()
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), wait)
        return self.revision

    def leave(self, watcher: str) -> None:
        """A gateway that stops: no revocation waits for it any more (a pending one re-counts
        the live watchers at once)."""
        if self._watchers.pop(watcher, None) is not None and self._acked is not None:
            self._acked.set()
            self._acked = None

    def watchers(self) -> int:
        """How many gateways have watched (live or not yet dropped)."""
        return len(self._watchers)

    def changes(self, since: int) -> tuple[str, ...] | None:
        """The keys changed after revision `since`; None when they are not all known (the log
        no longer reaches back to it, a change named none, or `since` is ahead: a restart)."""
        if since > self.revision or (since < self.revision and not self._log):
            return None
        if since < self.revision and self._log[0][0] > since + 1:
            return None
        changed: set[str] = set()
        for revision, keys in self._log:
            if revision > since:
                if keys is None:
                    return None
                changed |= keys
        return tuple(sorted(changed))

    async def watch_changes(
        self, watcher: str, since: int, wait: float = POLL_WAIT
    ) -> tuple[int, tuple[str, ...] | None]:
        """`watch`, with the keys changed after `since` (`changes`)."""
        revision = await self.watch(watcher, since, wait)
        return revision, self.changes(since)

    async def settled(self, revision: int, timeout: float = ACK_WAIT) -> None:
        """Wait until every live watcher has applied `revision` (or `timeout` passed: the late
        ones are no longer counted as live)."""
        deadline = self.clock() + timeout
        while True:
            now = self.clock()
            pending = [
                w
                for w, (applied, at) in self._watchers.items()
                if applied < revision and now - at < LIVE
            ]
            if not pending:
                return
            if now >= deadline:
                for w in pending:
                    self._watchers.pop(w, None)
                return
            if self._acked is None:
                self._acked = asyncio.Event()
            acked = self._acked
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(acked.wait(), max(0.0, deadline - now))
