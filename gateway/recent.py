"""What a hub's pumps handed out lately, per shard: a client that comes back with a recent cursor
replays from here instead of asking the shard.

A client that dropped and reconnects is usually a few dozen events behind (its cursor moves only
with the frames it gets, one event in many). Its replay used to be one `events_after` call to the
shard per reconnect: in the fan-out benchmark's fixed phase with drops, those calls were a fifth
of the gateway's event loop. The pump has just seen those same events, in order and with nothing
missing (it reads each shard's log from its head on), so the hub keeps the last `KEEP` of them.

`since[k]` is the position after which every event of shard `k` up to the pump's head is held.
The pump adds a batch before it hands the batch out (it may pause within a batch, and a client
replaying in that pause reads up to the head the pump has moved to, which must be held by then).
The audience is checked again for every replayed event (`Subscriber.offer`), as on a replay from
the shard.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from engine.events import Event, Position, ShardHead

KEEP = 10_000  # events per shard (~5 MB); older cursors replay from the shard's log


def _seq(event: Event) -> int:
    return event.seq


class RecentEvents:
    def __init__(self, shards: int, keep: int | None = None) -> None:
        self.keep = KEEP if keep is None else keep
        self._events: list[list[Event]] = [[] for _ in range(shards)]
        self._since: list[Position | None] = [None] * shards

    def reset(self, k: int, head: ShardHead) -> None:
        """Hold nothing of shard `k` before `head` (the pump starts there, or the epoch changed)."""
        self._events[k] = []
        self._since[k] = Position(head.epoch, head.head)

    def add(self, k: int, events: Sequence[Event]) -> None:
        """The pump's next batch of shard `k`, in order, right after the previous one."""
        held = self._events[k]
        held.extend(events)
        if len(held) > 2 * self.keep:
            cut = len(held) - self.keep
            since = self._since[k]
            assert since is not None
            self._since[k] = Position(since.epoch, held[cut - 1].seq)
            del held[:cut]

    def after(self, k: int, pos: Position, upto: int, limit: int) -> list[Event] | None:
        """Events of shard `k` after `pos` up to seq `upto` (at most `limit`), or None when this
        hub does not hold all of them (another epoch, or older than what it keeps)."""
        since = self._since[k]
        if since is None or pos.epoch != since.epoch or pos.seq < since.seq:
            return None
        held = self._events[k]
        start = bisect.bisect_right(held, pos.seq, key=_seq)
        end = bisect.bisect_right(held, upto, lo=start, key=_seq)
        return held[start : min(end, start + limit)]
