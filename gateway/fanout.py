"""The gateway's side of the event log: one subscription per shard per gateway process, and each
event decided and encoded once for everyone who may hear of it (docs/design.md §8).

Per shard one pump long-polls the shard for published events. Clients are grouped by who they
are (a `Listener`: user, orgs, channels, usable bots) and the groups are indexed by user,
channel and bot, so an event's audience is a few dict look-ups and one `admits` per group, not a
check per client. A client that is live on every shard and not ahead of this hub ("in step")
holds the hub's own position: every frame such clients get is the same text (its cursor is the
hub's dispatch position), encoded once per event, framed once (gateway/socket_frames.py) and written
to each of their sockets inline (gateway/subscriber.py). A client still replaying (it connected
with a cursor) or whose cursor came from a faster gateway is served on its own positions until it
is in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from actors.ports import EnginePort
from engine.events import (
    Event,
    Listener,
    MemoryChanged,
    Position,
    ShardHead,
    admits,
    decode_cursor,
    encode_cursor,
    needs_reset,
)
from gateway.metrics import EVENTS_DELIVERED
from gateway.recent import RecentEvents
from gateway.socket_frames import utf8_frame
from gateway.subscriber import TOO_SLOW, Closed, Outlet, Subscriber, event_json

log = logging.getLogger("openbot.events")

POLL_WAIT = 10.0
YIELD_EVERY = 256  # frames written before the pump lets other tasks run
CATCH_UP_CLOSE = 4409
REPLAY_BATCH = 1000  # events a catch-up replays per step (a shard call, or a slice held here)


class Hub:
    def __init__(self, engine: EnginePort) -> None:
        self.engine = engine
        self.heads: list[ShardHead | None] = [None] * len(engine.shard_ports)
        self.subscribers: set[Subscriber] = set()
        # Clients grouped by who they are, and the groups indexed by what an audience names.
        self._members: dict[Listener, dict[Subscriber, None]] = {}
        self._by_user: dict[str, set[Listener]] = {}
        self._by_channel: dict[str, set[Listener]] = {}
        self._by_bot: dict[str, set[Listener]] = {}
        self._catching_up: set[Subscriber] = set()  # live somewhere but not in step yet
        self._pumps: list[asyncio.Task[None]] = []
        self._ready: asyncio.Future[None] | None = None
        self._pump_ok = [False] * len(engine.shard_ports)
        self.pool_changed: dict[str, int] = {}  # pool → seq of its last memory.changed
        self.recent = RecentEvents(len(engine.shard_ports))  # what resuming clients replay

    def fresh(self, shard: int, epoch: str, pool: str, fill: int) -> bool:
        """Whether a page that reflects `pool` up to event `fill` is still current, as far as
        this hub has seen (the read cache's test)."""
        head = self.heads[shard]
        return (
            self._pump_ok[shard]
            and head is not None
            and head.epoch == epoch
            and head.head >= fill
            and self.pool_changed.get(pool, 0) <= fill
        )

    async def start(self) -> None:
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            try:
                heads = [await s.event_head() for s in self.engine.shard_ports]
            except BaseException as e:
                self._ready.set_exception(e)
                self._ready.exception()
                self._ready = None
                raise
            self.heads = list(heads)
            for k, head in enumerate(heads):
                self.recent.reset(k, head)
            # The heads were just read: this hub is current until a poll says otherwise.
            self._pump_ok = [True] * len(heads)
            self._pumps = [asyncio.create_task(self._pump(k)) for k in range(len(heads))]
            self._ready.set_result(None)
        await self._ready

    async def stop(self) -> None:
        for task in self._pumps:
            task.cancel()
        for task in self._pumps:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _pump(self, k: int) -> None:
        shard = self.engine.shard_ports[k]
        delay = 0.05
        while True:
            head = self.heads[k]
            assert head is not None
            try:
                new_head, events = await shard.events_after(head.head, 1000, POLL_WAIT)
            except Exception:  # whatever Ray raises: the pump must live on, and say it lags
                self._pump_ok[k] = False
                log.warning("event pump for shard %d failed; retrying", k, exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.05
            self._pump_ok[k] = True
            if new_head.epoch != head.epoch:
                # The shard's data were replaced: every client must refetch. Nothing more is
                # written to them (a frame would carry the new epoch and hide the reset).
                self.heads[k] = new_head
                self.recent.reset(k, new_head)
                for sub in list(self.subscribers):
                    sub.in_step = False
                    sub.outlet.end(TOO_SLOW)
                continue
            self.recent.add(k, events)  # before the batch is handed out (gateway/recent.py)
            await self._dispatch(k, events)
            last = events[-1].seq if events else head.head
            self.heads[k] = ShardHead(epoch=new_head.epoch, oldest=new_head.oldest, head=last)
            for sub in list(self._catching_up):
                self._step_in(sub)

    async def _dispatch(self, k: int, events: list[Event]) -> None:
        """Hand each event to its audience: one admission per group of alike clients, one
        encoding per event for every client in step. Writes run inline; after every
        `YIELD_EVERY` of them the head moves to the last event handed out and others get the
        loop (so a huge batch cannot stall it, and a client going live meanwhile starts from
        exactly there)."""
        heads = self.heads
        sent = budget = 0
        # A group's first frame in a stretch (up to a pause) is written at once; its further
        # frames wait for the stretch's end and go to each socket in one write. A client's
        # frames stay in order: nothing else writes to it before the stretch ends (no await),
        # and whether it is in step cannot change within a stretch.
        heard: set[Listener] = set()
        later: dict[Outlet, list[tuple[str, bytes]]] = {}
        # The hub's position, shard `k`'s entry set per event: the other shards' heads move
        # only while this pump waits (its pause below), so the list is made once per stretch.
        positions = self._positions()
        for event in events:
            if isinstance(event.data, MemoryChanged):
                self.pool_changed[event.data.pool] = event.seq
            text: str | None = None
            frame = b""
            for listener in self._audience(event):
                again = listener in heard
                heard.add(listener)
                members = self._members[listener]
                budget += len(members)
                for sub in members:
                    if sub.in_step:
                        if text is None:
                            positions[k] = Position(positions[k].epoch, event.seq)
                            encoded = event_json(event, encode_cursor(positions))
                            text, frame = encoded.decode(), utf8_frame(encoded)
                        if again:
                            later.setdefault(sub.outlet, []).append((text, frame))
                        else:
                            sent += sub.outlet.deliver(text, frame)
                    elif sub.live[k]:
                        sent += sub.offer(k, event, heads)
            if budget >= YIELD_EVERY:
                sent += _write_together(later)
                heard.clear()
                head = heads[k]
                assert head is not None
                heads[k] = ShardHead(epoch=head.epoch, oldest=head.oldest, head=event.seq)
                budget = 0
                await asyncio.sleep(0)
                positions = self._positions()
        sent += _write_together(later)
        if sent:
            EVENTS_DELIVERED.inc(sent)

    def _positions(self) -> list[Position]:
        """Where each shard's pump stands: what it handed out so far (a head moves only once
        its events are handed out). The hub's cursor while shard `k`'s pump dispatches event
        `seq` is this with `k`'s entry at `seq`."""
        return [Position(h.epoch, h.head) for h in self.heads if h is not None]

    def _audience(self, event: Event) -> list[Listener]:
        a = event.audience
        if len(a.users) == 1 and not a.channels and a.bot is None:
            # One person's news (most of a memory's events): their groups as they are.
            return [
                listener for listener in self._by_user.get(a.users[0], ()) if admits(a, listener)
            ]
        named: set[Listener] = set()
        for user in a.users:
            named |= self._by_user.get(user, set())
        for channel in a.channels:
            named |= self._by_channel.get(channel, set())
        if a.bot is not None:
            named |= self._by_bot.get(a.bot, set())
        return [listener for listener in named if admits(a, listener)]

    async def subscribe(
        self, listener: Listener, cursor: str | None, outlet: Outlet
    ) -> tuple[Subscriber, bool]:
        """A subscriber positioned at `cursor` (or at the present); True if it had to be reset.

        Uses the heads this hub already dispatched (no actor call per connection), except for a
        cursor ahead of them (it came from a faster gateway): then the shards are asked."""
        await self.start()
        heads = [h for h in self.heads if h is not None]
        positions = decode_cursor(cursor) if cursor is not None else None
        if (
            positions is not None
            and len(positions) == len(heads)
            and any(p.seq > h.head for p, h in zip(positions, heads, strict=True))
        ):
            heads = [await s.event_head() for s in self.engine.shard_ports]
        here = [Position(h.epoch, h.head) for h in heads]
        reset = False
        if positions is None:
            positions = here
        elif needs_reset(positions, heads):
            positions, reset = here, True
        sub = Subscriber(listener, list(positions), outlet)
        self.subscribers.add(sub)
        self._index(sub)
        return sub, reset

    def _index(self, sub: Subscriber) -> None:
        listener = sub.listener
        members = self._members.get(listener)
        if members is None:
            members = self._members[listener] = {}
            self._by_user.setdefault(listener.user, set()).add(listener)
            for channel in listener.channels:
                self._by_channel.setdefault(channel, set()).add(listener)
            for bot in listener.bots:
                self._by_bot.setdefault(bot, set()).add(listener)
        members[sub] = None

    def relisten(self, sub: Subscriber, listener: Listener) -> None:
        """The client's grants or channels changed: index it under the new ones."""
        self._unindex(sub)
        sub.listener = listener
        self._index(sub)

    async def catch_up(self, sub: Subscriber) -> None:
        """Replay until level with this hub's pump on each shard, then go live: from what the
        pump handed out lately when that holds the client's position, else from the shard."""
        for k, shard in enumerate(self.engine.shard_ports):
            while True:
                pumped = self.heads[k]
                assert pumped is not None
                if sub.positions[k].seq >= pumped.head:
                    sub.live[k] = True  # no await since the check: no gap, no duplicate
                    self._catching_up.add(sub)
                    break
                events = self.recent.after(k, sub.positions[k], pumped.head, REPLAY_BATCH)
                if events is not None:
                    # Everything up to the pump's head is held: nothing between is missing.
                    sent = sum(sub.offer(k, event) for event in events)
                    if sent:
                        EVENTS_DELIVERED.inc(sent)
                    if len(events) < REPLAY_BATCH:
                        pos = sub.positions[k]
                        sub.positions[k] = Position(pos.epoch, max(pos.seq, pumped.head))
                    else:
                        await asyncio.sleep(0)  # a long replay lets others run between batches
                    continue
                head, events = await shard.events_after(sub.positions[k].seq, REPLAY_BATCH, 0.0)
                if sub.positions[k].seq < head.oldest - 1:
                    # Pruned while this client caught up: it must come back and be reset.
                    raise Closed(CATCH_UP_CLOSE, "cursor fell out of the kept window: reconnect")
                if not events:
                    # Nothing is published between here and the pump: level with it.
                    pos = sub.positions[k]
                    sub.positions[k] = Position(pos.epoch, max(pos.seq, pumped.head))
                    continue
                sent = sum(sub.offer(k, event) for event in events)
                if sent:
                    EVENTS_DELIVERED.inc(sent)
        self._step_in(sub)

    def _step_in(self, sub: Subscriber) -> None:
        """From here on `sub` gets the shared frames, if it is live everywhere and nowhere ahead
        of what this hub dispatched (so the hub's position is a cursor it may hold)."""
        if sub not in self.subscribers:
            self._catching_up.discard(sub)
            return
        if not all(sub.live):
            return
        for pos, head in zip(sub.positions, self.heads, strict=True):
            if head is None or pos.epoch != head.epoch or pos.seq > head.head:
                return
        sub.in_step = True
        self._catching_up.discard(sub)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        self._catching_up.discard(sub)
        sub.in_step = False
        self._unindex(sub)

    def _unindex(self, sub: Subscriber) -> None:
        listener = sub.listener
        members = self._members.get(listener)
        if members is None:
            return
        members.pop(sub, None)
        if members:
            return
        del self._members[listener]
        keys = [
            (self._by_user, [listener.user]),
            (self._by_channel, listener.channels),
            (self._by_bot, listener.bots),
        ]
        for index, names in keys:
            for name in names:
                group = index.get(name)
                if group is not None:
                    group.discard(listener)
                    if not group:
                        del index[name]


def _write_together(later: dict[Outlet, list[tuple[str, bytes]]]) -> int:
    sent = sum(outlet.deliver_all(frames) for outlet, frames in later.items())
    later.clear()
    return sent
