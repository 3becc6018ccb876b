"""One transaction-to-be: the rows, events and new pool keys that commit together.

A feature builds a `Batch` (a turn, a step, a write with its receipt) and hands it to
`ShardKernel.stage`. Everything the batch needs on commit travels in it: its events are
published, the pools whose wrapped keys it stores count as stored (`keys`), and on failure its
hooks drop the memory state built on it. Nothing is taken from process-wide lists, so two
batches built side by side (across awaits) never pick up each other's keys.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.events import Audience, Payload
from storage.group_commit import Write
from storage.memory_store import StoredPool, pool_row


@dataclass(eq=False)
class Batch:
    writes: list[Write] = field(default_factory=list)
    events: list[tuple[Payload, Audience]] = field(default_factory=list)
    # Pools whose key row is in `writes`; marked stored once the batch commits (never before:
    # a failed commit must not leave a key that was never written). The kernel adds every pool
    # whose row it finds in `writes`, so rows built by storage need no bookkeeping by callers.
    keys: list[StoredPool] = field(default_factory=list)
    on_failure: list[Callable[[], None]] = field(default_factory=list)
    on_commit: list[Callable[[], None]] = field(default_factory=list)
    # The memory bot's model calls made while building it (become call-log rows, SEC-1).
    calls: list = field(default_factory=list)
    # An earlier commit this one depends on: stored with it or before it, never without it
    # (GroupCommitter.submit), so the batch may be staged before that commit is durable.
    after: asyncio.Future[None] | None = None
    # Set by the kernel when the batch is staged: a batch is submitted once, and code holding
    # one it may or may not have submitted asks this (not whether it has failure hooks).
    staged: bool = False
    # A batch held to commit at the end of what builds it (a direct turn answered at its end):
    # `release()` commits what it holds so far and makes that commit its `after`, for work
    # that must not happen before it is durable (a tool that writes elsewhere at once).
    release: Callable[[], asyncio.Future[None] | None] | None = None

    def durable_before(self) -> asyncio.Future[None] | None:
        """The commit that must be durable before anything outside this batch is written."""
        if self.release is not None:
            release, self.release = self.release, None
            self.after = release()
        return self.after

    def add(self, *writes: Write) -> Batch:
        self.writes.extend(writes)
        return self

    def extend(self, writes: Iterable[Write]) -> Batch:
        self.writes.extend(writes)
        return self

    def emit(self, payload: Payload, audience: Audience) -> Batch:
        self.events.append((payload, audience))
        return self

    def key(self, stored: StoredPool) -> Batch:
        """Carry the pool's wrapped key while none has committed: needed with anything sealed
        with the pool's key, or a restart could not open it again."""
        if not stored.persisted and not any(k is stored for k in self.keys):
            self.writes.append(pool_row(stored, stored.version, stored.settings))
            self.keys.append(stored)
        return self

    def fail(self, hook: Callable[[], None]) -> Batch:
        """Run `hook` if the batch does not commit (drop state that is ahead of the disk)."""
        self.on_failure.append(hook)
        return self

    def done(self, hook: Callable[[], None]) -> Batch:
        """Run `hook` once the batch has committed (state that waits to know it is stored)."""
        self.on_commit.append(hook)
        return self
