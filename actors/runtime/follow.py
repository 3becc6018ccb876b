"""A gateway's view of one shard's event log on one event loop: the events come from
two places, the event pump's long poll and the replies of this gateway's coalesced writes.

Under a load of writes each group commit would otherwise cost two Ray calls per gateway: the
coalesced write call, and one answer to the pump's long poll (`events_packed`) carrying that
commit's events. So a coalesced write says which events its gateway has (`seen`) and its reply
brings the ones published after that (`remember_many_followed`, actors/shard/packed.py); the shard
notes that this follower has them, and its poll then waits on for events it was not handed
(storage/event_log.py). The pump asks `after` as it would of the shard alone; what it gets is the
same published log, in order, each event once.

Every batch, from a poll or a reply, is the complete published log in (since, to], so it is
merged only where it joins what is known. When the follower cannot be sure the shard's notes
match what it holds (it starts over from another seq, the epoch changed, a write call failed
and its reply may have carried events, a poll answered from past `hi`), it takes a new id: the
shard has no notes for that one, so its next poll answers at once; replies to calls sent under
the old id are dropped.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

from actors.contracts import EventBatch
from engine.events import Event, ShardHead

KEPT = 10_000  # events held for a pump that does not come for them: then stop following

Poll = Callable[[int, int, float, str], Awaitable[EventBatch]]


class Follower:
    """One shard's published events as this loop knows them: every event in (lo, hi] is in
    `events` (the ones after the pump's position; seqs may have gaps)."""

    def __init__(self, poll: Poll) -> None:
        self._poll = poll  # (since, limit, wait, follower id) → the shard's EventBatch
        self.id = secrets.token_hex(8)
        self.head: ShardHead | None = None
        self.lo = self.hi = -1
        self.events: list[Event] = []
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[None] | None = None
        self._busy = False
        self._reset_to: ShardHead | None = None  # a new epoch the pump has not been told of
        self._following = False  # a pump asks here (until it stops)
        self.handed = 0  # events that came with write replies (figures for tests)

    @property
    def seen(self) -> int:
        """What a write's call says this loop has (-1: nobody follows here, send no events)."""
        return self.hi if self._following else -1

    def lost(self) -> None:
        """A write call that may have carried events failed: go on under a new id (the shard
        has no notes for it, so its next poll answers for everything after `hi`)."""
        self._new_id()

    def merge(self, since: int, batch: EventBatch, to: int) -> bool:
        """Take the shard's log in (since, to] (`to`: its head, or the last event of a full
        batch) where it joins what is known; False if it does not join."""
        if self.head is not None and batch.head.epoch != self.head.epoch:
            # The shard's data were replaced: the pump resets its clients and goes on from the
            # new head; nothing of this batch is kept (its seqs count from an old `since`).
            self._restart(batch.head.head)
            self.head = self._reset_to = batch.head
            self._set_wake()
            return True
        if since > self.hi:
            return False  # does not join
        new = [e for e in batch.events if e.seq > self.hi]
        self.events.extend(new)
        self.hi = max(self.hi, to)
        if self.head is None or batch.head.head >= self.head.head:
            self.head = batch.head
        if len(self.events) > KEPT and not self._busy:
            # Nobody takes them (the pump stopped): stop asking for them. (Not while the pump
            # waits in `after`: it takes them now, and forgetting would restart its poll.)
            self._forget()
        elif new:
            self._set_wake()
        return True

    def take_reply(self, asked: str, seen: int, batch: EventBatch, upto: int) -> None:
        """A write's reply to a call sent under the id `asked` with `seen`: the log in
        (seen, upto]. Dropped if the id changed since (a restart, a new epoch, a lost call):
        the new id's poll answers for everything after `hi`, and a reply from before a new
        epoch is not another one."""
        if asked != self.id:
            return
        before = len(self.events)
        self.merge(seen, batch, upto)
        self.handed += max(0, len(self.events) - before)

    async def after(
        self, seq: int, limit: int, wait: float
    ) -> tuple[ShardHead, list[Event]] | None:
        """The published events after `seq` (up to `limit`), as the shard's poll answers them;
        None if another caller follows this shard on this loop already (then poll directly)."""
        if self._busy:
            return None
        self._busy = True
        try:
            if not self._following or not self.lo <= seq <= self.hi:
                self._restart(seq)
            self._following = True
            self.lo = seq
            if self.events and self.events[0].seq <= seq:
                self.events = [e for e in self.events if e.seq > seq]
            while True:
                if self._reset_to is not None:
                    head, self._reset_to = self._reset_to, None
                    return head, []
                if self.events:
                    assert self.head is not None
                    return self.head, self.events[:limit]
                task = self._task
                if task is None:
                    task = self._task = asyncio.create_task(self._run(self.hi, limit, wait))
                    # The poll's end wakes the pump as a reply's events do: one future, so a
                    # reply's events reach the pump in one step of the loop, ahead of the
                    # answers to the writes that brought them.
                    task.add_done_callback(self._poll_done)
                if not task.done():
                    self._wake = asyncio.get_running_loop().create_future()
                    try:
                        await self._wake
                    except BaseException:
                        self._forget()  # the pump stops: so do its poll and the replies' events
                        raise
                if not task.done():
                    continue  # a write's reply brought events; the poll waits on
                self._task = None
                if task.cancelled():
                    continue  # a restart dropped the poll of the old id
                error = task.exception()
                if error is not None:
                    self._new_id()
                    raise error
                if not self.events and self._reset_to is None and self.head is not None:
                    return self.head, []  # the poll's wait ran out
        finally:
            self._busy = False

    async def _run(self, since: int, limit: int, wait: float) -> None:
        asked = self.id
        batch = await self._poll(since, limit, wait, asked)
        if self.id != asked:
            return  # a restart dropped this poll
        if batch.since is not None:
            since = batch.since  # the shard answered from what it handed us since we asked
        to = batch.events[-1].seq if len(batch.events) >= limit else batch.head.head
        if not self.merge(since, batch, to):
            # The shard handed this id events we do not have yet (a reply still on its way):
            # the next poll goes under a new id, which the shard answers from `hi` at once.
            self.id = secrets.token_hex(8)

    def _new_id(self) -> None:
        self.id = secrets.token_hex(8)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _restart(self, seq: int) -> None:
        self._new_id()
        self.lo = self.hi = seq
        self.events = []

    def _forget(self) -> None:
        """Know nothing (writes send no `seen` until the pump asks again)."""
        self._restart(-1)
        self.head = None
        self._following = False

    def _poll_done(self, _task: asyncio.Task[None]) -> None:
        self._set_wake()

    def _set_wake(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
