"""The hub's per-client bookkeeping, without a server: who is offered an event, and cursors."""

from __future__ import annotations

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


def _event(seq, users=("u1",), org="o1"):
    data = MemoryChanged(pool="bot:b", entry=f"m{seq}", version=seq, change="created", bot="b")
    return Event(seq=seq, at=seq, data=data, audience=Audience(org=org, users=users))


def _sub():
    listener = Listener(user="u1", orgs=frozenset({"o1"}))
    sub = Subscriber(listener, [Position("e0", 0), Position("e1", 0)])
    sub.live = [True, True]
    return sub


def test_only_admitted_events_are_queued_but_positions_advance():
    sub = _sub()
    sub.offer(0, _event(1, users=("u2",)))
    sub.offer(0, _event(2, org="o2"))
    assert sub.queue.qsize() == 0 and sub.positions[0].seq == 2
    sub.offer(0, _event(3))
    sub.offer(0, _event(3))  # the same event twice: once
    assert sub.queue.qsize() == 1


def test_a_frame_brings_the_other_shards_position_up_to_what_was_dispatched():
    sub = _sub()
    heads = [ShardHead(epoch="e0", oldest=1, head=5), ShardHead(epoch="e1", oldest=1, head=40)]
    sub.offer(0, _event(6), heads)
    frame = msgspec.json.decode(sub.queue.get_nowait())
    assert decode_cursor(frame["cursor"]) == [Position("e0", 6), Position("e1", 40)]
    sub.live[1] = False  # still catching up there: its position must not jump
    sub.positions[1] = Position("e1", 3)
    sub.offer(0, _event(7), heads)
    frame = msgspec.json.decode(sub.queue.get_nowait())
    assert decode_cursor(frame["cursor"])[1] == Position("e1", 3)
