"""The hub's per-client bookkeeping and its outlets, without a server: who is offered an event,
cursors, and what a slow client costs the others."""

from __future__ import annotations

import asyncio

import msgspec

from engine.events import (
    Audience,
    Event,
    Listener,
    MemoryChanged,
    Position,
    ShardHead,
    decode_cursor,
)
from gateway.events import Subscriber
from gateway.metrics import EVENTS_DROPPED
from gateway.outlet import Outlet


class Socket:
    """An ASGI send that takes frames at once, or waits until `opened` while `blocked`."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.blocked = False
        self.opened = asyncio.Event()

    async def send(self, message: dict) -> None:
        if self.blocked:
            await self.opened.wait()
        self.texts.append(message["text"])


def _event(seq, users=("u1",), org="o1"):
    data = MemoryChanged(pool="bot:b", entry=f"m{seq}", version=seq, change="created", bot="b")
    return Event(seq=seq, at=seq, data=data, audience=Audience(org=org, users=users))


def _sub(socket: Socket) -> Subscriber:
    listener = Listener(user="u1", orgs=frozenset({"o1"}))
    sub = Subscriber(listener, [Position("e0", 0), Position("e1", 0)], Outlet(socket.send))
    sub.live = [True, True]
    return sub


def test_only_admitted_events_are_sent_but_positions_advance():
    async def scenario():
        socket = Socket()
        sub = _sub(socket)
        sub.offer(0, _event(1, users=("u2",)))
        sub.offer(0, _event(2, org="o2"))
        assert socket.texts == [] and sub.positions[0].seq == 2
        assert sub.offer(0, _event(3)) is True  # written at once, no task
        assert sub.offer(0, _event(3)) is False  # the same event twice: once
        assert len(socket.texts) == 1

    asyncio.run(scenario())


def test_a_frame_brings_the_other_shards_position_up_to_what_was_dispatched():
    async def scenario():
        socket = Socket()
        sub = _sub(socket)
        heads = [ShardHead(epoch="e0", oldest=1, head=5), ShardHead(epoch="e1", oldest=1, head=40)]
        sub.offer(0, _event(6), heads)
        frame = msgspec.json.decode(socket.texts[-1])
        assert decode_cursor(frame["cursor"]) == [Position("e0", 6), Position("e1", 40)]
        sub.live[1] = False  # still catching up there: its position must not jump
        sub.positions[1] = Position("e1", 3)
        sub.offer(0, _event(7), heads)
        frame = msgspec.json.decode(socket.texts[-1])
        assert decode_cursor(frame["cursor"])[1] == Position("e1", 3)

    asyncio.run(scenario())


def test_a_send_that_waits_keeps_order_and_a_full_backlog_ends_the_outlet():
    async def scenario():
        socket = Socket()
        outlet = Outlet(socket.send, limit=3)
        assert outlet.deliver("a") is True
        socket.blocked = True
        assert outlet.deliver("b") is False  # suspended: its rest runs in a task
        for text in ("c", "d", "e"):
            outlet.deliver(text)  # queued behind it, in order
        assert outlet.backlog == 4 and not outlet.ended.is_set()
        socket.blocked = False
        socket.opened.set()
        await asyncio.sleep(0.05)
        assert socket.texts == ["a", "b", "c", "d", "e"] and outlet.backlog == 0
        assert outlet.deliver("f") is True  # the socket takes frames at once again

        socket.blocked, socket.opened = True, asyncio.Event()
        before = EVENTS_DROPPED._value.get()
        for text in "ghijk":
            outlet.deliver(text)
        # g waits in the send, h i j fill the backlog, k does not fit: the client must go
        assert outlet.ended.is_set() and outlet.code == 4429
        assert EVENTS_DROPPED._value.get() - before == 1
        assert outlet.deliver("l") is False
        outlet.close()
        await asyncio.sleep(0)
        assert socket.texts == ["a", "b", "c", "d", "e", "f"]

    asyncio.run(scenario())


def test_a_send_that_fails_ends_the_outlet_without_a_close_code():
    async def scenario():
        async def broken(message: dict) -> None:
            raise OSError("connection reset")

        outlet = Outlet(broken)
        assert outlet.deliver("a") is False
        assert outlet.ended.is_set() and outlet.code is None

    asyncio.run(scenario())
