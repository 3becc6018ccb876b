"""The hub's per-client bookkeeping and its outlets, without a server: who is offered an event,
cursors, and what a slow client costs the others."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

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
from gateway.metrics import REGISTRY
from gateway.subscriber import Outlet
from tests.waiting import until


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


async def _dispatched(hub, *shards) -> None:
    """Until the hub's pumps have handed out every event the shards hold."""

    def level() -> bool:
        return all(hub.heads[s.k] is not None and hub.heads[s.k].head == len(s.log) for s in shards)

    await until(level, "the pumps dispatched every event")


def _event(seq, users=("u1",), org="o1"):
    data = MemoryChanged(pool="bot:b", entry=f"m{seq}", version=seq, change="created", bot="b")
    return Event(seq=seq, at=seq, data=data, audience=Audience(org=org, users=users))


def _sub(socket: Socket) -> Subscriber:
    listener = Listener(user="u1", orgs=frozenset({"o1"}))
    sub = Subscriber(listener, [Position("e0", 0), Position("e1", 0)], Outlet(socket.send))
    sub.live = [True, True]
    return sub


@pytest.mark.anyio
async def test_only_admitted_events_are_sent_but_positions_advance():
    socket = Socket()
    sub = _sub(socket)
    sub.offer(0, _event(1, users=("u2",)))
    sub.offer(0, _event(2, org="o2"))
    assert socket.texts == [] and sub.positions[0].seq == 2
    assert sub.offer(0, _event(3)) is True  # written at once, no task
    assert sub.offer(0, _event(3)) is False  # the same event twice: once
    assert len(socket.texts) == 1


@pytest.mark.anyio
async def test_a_frame_brings_the_other_shards_position_up_to_what_was_dispatched():
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


@pytest.mark.anyio
async def test_a_send_that_waits_keeps_order_and_a_full_backlog_ends_the_outlet():
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
    await until(lambda: outlet.backlog == 0, "the backlog sent")
    assert socket.texts == ["a", "b", "c", "d", "e"] and outlet.backlog == 0
    assert outlet.deliver("f") is True  # the socket takes frames at once again

    socket.blocked, socket.opened = True, asyncio.Event()
    before = REGISTRY.get_sample_value("openbot_events_dropped_total")
    for text in "ghijk":
        outlet.deliver(text)
    # g waits in the send, h i j fill the backlog, k does not fit: the client must go
    assert outlet.ended.is_set() and outlet.code == 4429
    assert REGISTRY.get_sample_value("openbot_events_dropped_total") - before == 1
    assert outlet.deliver("l") is False
    outlet.close()
    await asyncio.sleep(0)
    assert socket.texts == ["a", "b", "c", "d", "e", "f"]


@pytest.mark.anyio
async def test_a_send_that_fails_ends_the_outlet_without_a_close_code():
    async def broken(message: dict) -> None:
        raise OSError("connection reset")

    outlet = Outlet(broken)
    assert outlet.deliver("a") is False
    assert outlet.ended.is_set() and outlet.code is None


class FakeShard:
    """A shard's event log as the hub reads it through its port (`event_head`,
    `events_after`); a replay (`wait == 0`) can be held until released."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.log: list[Event] = []
        self.grew = asyncio.Event()
        self.hold: asyncio.Future[None] | None = None
        self.pump_hold: asyncio.Future[None] | None = None
        self.replays = 0  # catch-up calls (`wait == 0`)

    def append(self, user: str = "u1") -> None:
        seq = len(self.log) + 1
        data = MemoryChanged(
            pool="bot:b", entry=f"s{self.k}-{seq}", version=seq, change="created", bot="b"
        )
        self.log.append(Event(seq=seq, at=seq, data=data, audience=Audience(users=(user,))))
        self.grew.set()

    def head(self) -> ShardHead:
        return ShardHead(epoch=f"e{self.k}", oldest=1, head=len(self.log))

    async def event_head(self) -> ShardHead:
        return self.head()

    async def events_after(self, after: int, limit: int = 1000, wait: float = 0.0):
        self.replays += wait == 0
        if wait == 0 and self.hold is not None:
            await self.hold
        if wait and self.pump_hold is not None:
            await self.pump_hold
        while wait and len(self.log) <= after:
            self.grew.clear()
            await self.grew.wait()
        return self.head(), self.log[after : after + limit]


@pytest.mark.anyio
async def test_a_client_joins_the_shared_frames_only_once_live_on_every_shard():
    """While a client still replays one shard, events the hub dispatches there must not reach
    it as shared frames (they would overtake the replay: out of order, then again)."""
    from types import SimpleNamespace

    from gateway.fanout import Hub

    shards = [FakeShard(0), FakeShard(1)]
    for shard in shards:
        for _ in range(3):
            shard.append()
    hub = Hub(SimpleNamespace(shard_ports=shards))
    socket = Socket()
    listener = Listener(user="u1", orgs=frozenset())
    start = "W1siZTAiLDBdLFsiZTEiLDBdXQ"  # positions e0:0, e1:0
    assert decode_cursor(start) == [Position("e0", 0), Position("e1", 0)]
    sub, reset = await hub.subscribe(listener, start, Outlet(socket.send))
    assert not reset
    shards[1].hold = asyncio.get_running_loop().create_future()
    catch_up = asyncio.create_task(hub.catch_up(sub))
    await until(lambda: sub.live[0], "shard 0 replayed and live")  # shard 1's replay held
    assert sub.live == [True, False]
    shards[0].append()  # a pump batch on shard 0 ends: the hub tries to step the client in
    await _dispatched(hub, shards[0])
    shards[1].append()  # dispatched on shard 1 while the client still replays there
    await _dispatched(hub, shards[1])
    shards[1].hold.set_result(None)
    await catch_up
    assert sub.in_step
    shards[1].append()  # now a shared frame
    await _dispatched(hub, shards[1])
    await hub.stop()
    entries = [msgspec.json.decode(t)["data"]["entry"] for t in socket.texts]
    assert [e for e in entries if e.startswith("s0")] == [f"s0-{i}" for i in range(1, 5)]
    assert [e for e in entries if e.startswith("s1")] == [f"s1-{i}" for i in range(1, 6)]
    last = msgspec.json.decode(socket.texts[-1])["cursor"]
    assert decode_cursor(last) == [Position("e0", 4), Position("e1", 5)]


@pytest.mark.anyio
async def test_a_cursor_from_a_faster_gateway_joins_the_shared_frames_once_the_hub_is_level():
    """A client whose cursor is ahead of this hub (another gateway sent it further) must not be
    handed the hub's position (a step back: what lies between would come again)."""
    from types import SimpleNamespace

    from engine.events import encode_cursor
    from gateway.fanout import Hub

    shards = [FakeShard(0), FakeShard(1)]
    for shard in shards:
        for _ in range(3):
            shard.append()
    hold = asyncio.get_running_loop().create_future()
    for shard in shards:
        shard.pump_hold = hold  # this hub's pumps lag
    hub = Hub(SimpleNamespace(shard_ports=shards))
    await hub.start()
    shards[1].append()
    shards[1].append()  # seq 4 and 5: another gateway's client already has them
    socket = Socket()
    cursor = encode_cursor([Position("e0", 3), Position("e1", 5)])
    listener = Listener(user="u1", orgs=frozenset())
    sub, reset = await hub.subscribe(listener, cursor, Outlet(socket.send))
    assert not reset
    await hub.catch_up(sub)
    assert sub.live == [True, True] and not sub.in_step
    hold.set_result(None)  # the pumps dispatch 4 and 5: not again to this client
    await _dispatched(hub, *shards)
    assert sub.in_step
    shards[1].append()
    await _dispatched(hub, shards[1])
    await hub.stop()
    assert [msgspec.json.decode(t)["data"]["entry"] for t in socket.texts] == ["s1-6"]


@pytest.mark.anyio
async def test_a_client_going_live_while_a_batch_is_handed_out_misses_none_of_it(monkeypatch):
    """The pump lets other tasks run within a big batch; a client that goes live in such a
    pause must start from what was handed out so far, not from the batch's start."""
    from types import SimpleNamespace

    import gateway.fanout
    from gateway.fanout import Hub

    monkeypatch.setattr(gateway.fanout, "YIELD_EVERY", 1)

    shard = FakeShard(0)
    for _ in range(3):
        shard.append()
    shard.pump_hold = asyncio.get_running_loop().create_future()
    hub = Hub(SimpleNamespace(shard_ports=[shard]))
    listener = Listener(user="u1", orgs=frozenset())
    early, late = Socket(), Socket()
    joined: list[asyncio.Task[None]] = []
    waiting: list[Subscriber] = []

    async def send_then_let_b_join(message: dict) -> None:
        await early.send(message)
        if not joined:  # b goes live in the pump's first pause
            joined.append(asyncio.ensure_future(hub.catch_up(waiting[0])))

    a, _ = await hub.subscribe(listener, None, Outlet(send_then_let_b_join))
    await hub.catch_up(a)
    b, _ = await hub.subscribe(listener, None, Outlet(late.send))
    waiting.append(b)
    for _ in range(5):
        shard.append()  # seq 4..8, one batch
    shard.pump_hold.set_result(None)
    await _dispatched(hub, shard)
    await joined[0]
    await hub.stop()
    got = [msgspec.json.decode(t)["data"]["entry"] for t in late.texts]
    assert got == [f"s0-{i}" for i in range(4, 9)]
    assert [msgspec.json.decode(t)["data"]["entry"] for t in early.texts] == got


@pytest.mark.anyio
async def test_a_client_that_stops_reading_holds_up_no_one(monkeypatch):
    """Its sends wait, its backlog fills and it is told to go (4429, resume by cursor); every
    other client of the same audience gets every frame meanwhile, at once."""
    from types import SimpleNamespace

    import gateway.subscriber
    from gateway.fanout import Hub

    monkeypatch.setattr(gateway.subscriber, "QUEUE_LIMIT", 5)

    shard = FakeShard(0)
    hub = Hub(SimpleNamespace(shard_ports=[shard]))
    listener = Listener(user="u1", orgs=frozenset())
    slow, fast = Socket(), Socket()
    slow.blocked = True
    subs = []
    for socket in (slow, fast):
        sub, _ = await hub.subscribe(listener, None, Outlet(socket.send))
        await hub.catch_up(sub)
        subs.append(sub)
    for _ in range(20):
        shard.append()
        await _dispatched(hub, shard)
    await hub.stop()
    assert len(fast.texts) == 20 and not subs[1].outlet.ended.is_set()
    assert subs[0].outlet.ended.is_set() and subs[0].outlet.code == 4429
    assert slow.texts == []
    subs[0].outlet.close()


class Writer:
    """A ready-made frame writer (gateway/socket_frames.py) answering what it is told to."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.answer: bool | None = True

    def write(self, frame: bytes) -> bool | None:
        if self.answer:
            self.frames.append(frame)
        return self.answer


@pytest.mark.anyio
async def test_an_outlet_with_a_writer_writes_frames_past_asgi_until_the_socket_is_full():
    from gateway.socket_frames import text_frame

    socket, writer = Socket(), Writer()
    outlet = Outlet(socket.send, writer=writer)  # type: ignore[arg-type]
    shared = text_frame("a")
    assert outlet.deliver("a", shared) is True  # the caller's bytes, as they are
    assert outlet.deliver("b") is True  # built here when not given
    assert writer.frames == [shared, text_frame("b")] and socket.texts == []
    writer.answer = False  # full: the ASGI send (which waits for room) takes over
    socket.blocked = True
    assert outlet.deliver("c", text_frame("c")) is False
    writer.answer = True
    assert outlet.deliver("d", text_frame("d")) is False  # behind "c", not past it
    pair = [("d1", text_frame("d1")), ("d2", text_frame("d2"))]
    assert outlet.deliver_all(pair) == 0  # behind them too, one by one
    socket.blocked = False
    socket.opened.set()
    await until(lambda: outlet.backlog == 0, "the backlog sent")
    assert socket.texts == ["c", "d", "d1", "d2"] and outlet.backlog == 0
    assert outlet.deliver("e") is True and writer.frames[-1] == text_frame("e")
    assert outlet.deliver_all(pair) == 2  # the socket takes them: one write of both
    assert writer.frames[-1] == text_frame("d1") + text_frame("d2")
    writer.answer = None  # the connection is going: the outlet ends, as on a failed send
    assert outlet.deliver("f") is False
    assert outlet.ended.is_set() and outlet.code is None


@pytest.mark.anyio
async def test_a_client_resuming_from_a_recent_cursor_replays_from_the_hub(monkeypatch):
    """What the pump handed out lately is replayed from the hub (no shard call), each event
    once, in order, only those of the client's audience, then live frames; a cursor older than
    what the hub holds (before it started, or trimmed since) replays from the shard."""
    from types import SimpleNamespace

    import gateway.recent
    from engine.events import encode_cursor
    from gateway.fanout import Hub

    monkeypatch.setattr(gateway.recent, "KEEP", 4)  # held: the last 4 to 8 events

    shard = FakeShard(0)
    for _ in range(3):
        shard.append()  # before the hub started: never held by it
    hub = Hub(SimpleNamespace(shard_ports=[shard]))
    await hub.start()
    listener = Listener(user="u1", orgs=frozenset())

    async def resume(after: int) -> tuple[Socket, Subscriber]:
        socket = Socket()
        cursor = encode_cursor([Position("e0", after)])
        sub, reset = await hub.subscribe(listener, cursor, Outlet(socket.send))
        assert not reset
        await hub.catch_up(sub)
        assert sub.in_step
        return socket, sub

    for user in ("u1", "u2", "u1", "u1", "u2"):
        shard.append(user)  # seq 4..8, handed out by the pump
    await _dispatched(hub, shard)

    def entries(socket: Socket) -> list[str]:
        return [msgspec.json.decode(t)["data"]["entry"] for t in socket.texts]

    recent, _ = await resume(4)
    assert shard.replays == 0
    assert entries(recent) == ["s0-6", "s0-7"]  # u2's 5 and 8 are not u1's to hear of
    old, _ = await resume(2)  # from before the hub started
    assert shard.replays == 1
    assert entries(old) == ["s0-3", "s0-4", "s0-6", "s0-7"]
    for _ in range(6):
        shard.append()  # seq 9..14: the hub trims what it holds to the last 4 (11..14)
    await _dispatched(hub, shard)
    trimmed, _ = await resume(8)
    assert shard.replays == 2
    assert entries(trimmed) == [f"s0-{i}" for i in range(9, 15)]
    held, _ = await resume(11)
    assert shard.replays == 2
    assert entries(held) == ["s0-12", "s0-13", "s0-14"]
    shard.append()  # live: one frame each, after the replay
    await _dispatched(hub, shard)
    await hub.stop()
    for socket in (recent, old, trimmed, held):
        assert entries(socket)[-1] == "s0-15"
        assert len(entries(socket)) == len(set(entries(socket)))


def test_a_long_replay_from_the_hub_lets_others_run_and_misses_nothing(monkeypatch):
    from types import SimpleNamespace

    import gateway.fanout
    from engine.events import encode_cursor
    from gateway.fanout import Hub

    monkeypatch.setattr(gateway.fanout, "REPLAY_BATCH", 3)

    async def scenario():
        shard = FakeShard(0)
        hub = Hub(SimpleNamespace(shard_ports=[shard]))
        await hub.start()
        for _ in range(10):
            shard.append()
        await _dispatched(hub, shard)
        socket = Socket()
        sub, _ = await hub.subscribe(
            Listener(user="u1", orgs=frozenset()),
            encode_cursor([Position("e0", 0)]),
            Outlet(socket.send),
        )
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        await hub.catch_up(sub)
        other.cancel()
        await hub.stop()
        got = [msgspec.json.decode(t)["data"]["entry"] for t in socket.texts]
        assert got == [f"s0-{i}" for i in range(1, 11)] and shard.replays == 0
        assert ticks >= 3  # the loop ran others between the batches of 3

    asyncio.run(scenario())


def _writes(writer: Writer) -> list[list[str]]:
    """The entries of the frames in each write (a write may hold several frames)."""
    out = []
    for data in writer.frames:
        entries = []
        while data:
            n, at = data[1], 2
            if n == 126:
                n, at = int.from_bytes(data[2:4]), 4
            entries.append(msgspec.json.decode(data[at : at + n])["data"]["entry"])
            data = data[at + n :]
        out.append(entries)
    return out


def test_several_frames_for_a_client_in_one_batch_go_out_in_one_write(monkeypatch):
    """A batch with three events for u1 and one for u2: u1's clients get the first frame at
    once and the other two in one write, in order; u2's client its one frame. With a pause
    inside the batch, frames before the pause are written before it."""
    from types import SimpleNamespace

    import gateway.fanout
    from gateway.fanout import Hub

    async def scenario(yield_every: int) -> list[list[list[str]]]:
        monkeypatch.setattr(gateway.fanout, "YIELD_EVERY", yield_every)
        shard = FakeShard(0)
        shard.pump_hold = asyncio.get_running_loop().create_future()
        hub = Hub(SimpleNamespace(shard_ports=[shard]))
        writers = []
        for user in ("u1", "u1", "u2"):
            writer = Writer()
            sub, _ = await hub.subscribe(
                Listener(user=user, orgs=frozenset()), None, Outlet(Socket().send, writer=writer)
            )
            await hub.catch_up(sub)
            assert sub.in_step
            writers.append(writer)
        for user in ("u1", "u2", "u1", "u1"):
            shard.append(user)  # seq 1..4, one batch
        shard.pump_hold.set_result(None)
        await _dispatched(hub, shard)
        await hub.stop()
        return [_writes(writer) for writer in writers]

    together = [["s0-1"], ["s0-3", "s0-4"]]
    assert asyncio.run(scenario(2000)) == [together, together, [["s0-2"]]]
    # A pause once 5 frames are handed out (after event 3): u1's frame of event 3 is written
    # before it, and event 4 starts a new stretch.
    apart = [["s0-1"], ["s0-3"], ["s0-4"]]
    assert asyncio.run(scenario(5)) == [apart, apart, [["s0-2"]]]


@pytest.mark.anyio
async def test_a_big_batch_never_holds_the_loop_for_more_than_a_few_hundred_frames():
    """While the pump hands out a big batch, requests waiting on the same loop get it back
    every few hundred frames (a few ms): the next POSTs of a closed loop, say, are read while
    the previous commit's frames still go out, not after all of them."""
    from types import SimpleNamespace

    from gateway.fanout import YIELD_EVERY, Hub

    clients, events = 20, 1000  # 2,000 frames in one poll (2 clients for each of 10 users)

    shard = FakeShard(0)
    shard.pump_hold = asyncio.get_running_loop().create_future()
    hub = Hub(SimpleNamespace(shard_ports=[shard]))
    writers = []
    for i in range(clients):
        writer = Writer()
        sub, _ = await hub.subscribe(
            Listener(user=f"u{i % 10}", orgs=frozenset()),
            None,
            Outlet(Socket().send, writer=writer),
        )
        await hub.catch_up(sub)
        writers.append(writer)
    for i in range(events):
        shard.append(f"u{i % 10}")
    written = lambda: sum(len(e) for w in writers for e in _writes(w))  # noqa: E731
    held: list[int] = []  # frames written between two turns of another task

    async def other() -> None:
        last = 0  # the pump may run first: what it wrote before counts as held too
        while last < 2 * events:
            await asyncio.sleep(0)
            now = written()
            held.append(now - last)
            last = now

    watcher = asyncio.create_task(other())
    shard.pump_hold.set_result(None)
    await asyncio.wait_for(watcher, 5)
    await hub.stop()
    assert sum(held) == 2 * events  # each event to its user's 2 clients
    # (the first turn may come after the pump's first two stretches: it was woken first)
    assert YIELD_EVERY <= 300 and len(held) >= 6 and max(held[1:]) <= YIELD_EVERY + 2


@pytest.mark.anyio
async def test_one_persons_event_reaches_exactly_their_clients_in_its_org():
    """An event naming one user (most of a memory's) is heard by that user's clients whose
    orgs admit it, and no one else's; one naming a channel too still reaches its members."""
    from types import SimpleNamespace

    from gateway.fanout import Hub

    shard = FakeShard(0)
    hub = Hub(SimpleNamespace(shard_ports=[shard]))
    sockets = {}
    for name, user, orgs, channels in (
        ("u1 in o1", "u1", {"o1"}, set()),
        ("u1 in o1 again", "u1", {"o1"}, set()),
        ("u1 in o2", "u1", {"o2"}, set()),
        ("u2 in o1, channel c", "u2", {"o1"}, {"c"}),
    ):
        listener = Listener(user=user, orgs=frozenset(orgs), channels=frozenset(channels))
        socket = sockets[name] = Socket()
        sub, _ = await hub.subscribe(listener, None, Outlet(socket.send))
        await hub.catch_up(sub)
    data = MemoryChanged(pool="bot:b", entry="m1", version=1, change="created", bot="b")
    shard.log.append(Event(seq=1, at=1, data=data, audience=Audience(org="o1", users=("u1",))))
    data = MemoryChanged(pool="bot:b", entry="m2", version=2, change="created", bot="b")
    both = Audience(org="o1", users=("u1",), channels=("c",))
    shard.log.append(Event(seq=2, at=2, data=data, audience=both))
    shard.grew.set()
    await _dispatched(hub, shard)
    await hub.stop()
    heard = {
        name: [msgspec.json.decode(t)["data"]["entry"] for t in socket.texts]
        for name, socket in sockets.items()
    }
    assert heard == {
        "u1 in o1": ["m1", "m2"],
        "u1 in o1 again": ["m1", "m2"],
        "u1 in o2": [],
        "u2 in o1, channel c": ["m2"],
    }
