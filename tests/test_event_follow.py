"""Events that come with a gateway's write replies (actors/runtime/follow.py,
actors/shard/packed.py, storage/event_log.py): a coalesced write's reply brings the events
published since the gateway's `seen`, and the shard's answer to that gateway's waiting poll waits
on for events it was not handed. In process, against a real shard on a DuckDB file; over Ray and
HTTP at the end."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import msgspec
import pytest

from actors.contracts import (
    EVENT_BATCH,
    FOLLOWED,
    REPLIES,
    EventBatch,
    FollowingCall,
    RememberCall,
)
from actors.runtime.follow import Follower
from actors.shard.service import ShardService
from engine.events import Audience, Event, MemoryChanged, ShardHead
from engine.memory_entries import Reader
from tests.waiting import settle, until

pytestmark = pytest.mark.usefixtures("no_env_key")
POOL = "bot:b_follow"
ANN = Reader(user="u_ann", org="o_1", uses_bot=True)
_enc = msgspec.msgpack.Encoder()


Shard = ShardService  # what `PlacedShardService` is, without Ray's start-up guard


def _call(contents: list[str]) -> bytes:
    return _enc.encode(
        [_enc.encode(RememberCall(pool=POOL, reader=ANN, content=c)) for c in contents]
    )


def _followed(contents: list[str], follower: str, seen: int) -> bytes:
    return _enc.encode(
        FollowingCall(follower=follower, seen=seen, call=msgspec.Raw(_call(contents)))
    )


class Gateway:
    """What `RayShard` does with a follower, over the shard object instead of Ray: polls and
    coalesced writes with the follower's id and `seen`."""

    def __init__(self, svc: Shard) -> None:
        self.svc = svc
        self.polls = 0  # poll answers
        self.follow = Follower(self._poll)

    async def _poll(self, since: int, limit: int, wait: float, follower: str) -> EventBatch:
        batch = EVENT_BATCH.decode(await self.svc.events_packed(since, limit, wait, follower))
        self.polls += 1
        return batch

    async def write(self, contents: list[str], *, drop_reply: bool = False) -> list[bytes]:
        seen = self.follow.seen
        if seen < 0:
            return REPLIES.decode(await self.svc.remember_many(_call(contents)))
        asked = self.follow.id
        reply = FOLLOWED.decode(
            await self.svc.remember_many_followed(_followed(contents, asked, seen))
        )
        if drop_reply:  # as if the call failed after the shard answered it
            self.follow.lost()
        else:
            self.follow.take_reply(asked, seen, reply.events, reply.upto)
        return REPLIES.decode(reply.replies)


async def _pump(follow: Follower, head: int, got: list[Event], stop: asyncio.Event) -> None:
    """The hub's loop (gateway/fanout.py): ask after the last event handed out."""
    while not stop.is_set():
        answer = await follow.after(head, 1000, 5.0)
        assert answer is not None
        _, events = answer
        got.extend(events)
        head = events[-1].seq if events else head


@pytest.mark.anyio
async def test_a_followers_poll_waits_on_for_events_it_was_handed(tmp_path: Path) -> None:
    svc = Shard(tmp_path / "data", 0)
    try:
        await svc.remember(POOL, ANN, "first")
        head = svc.kernel.events.published
        poll = asyncio.create_task(svc.events_packed(head, 1000, 5.0, "f1"))
        await until(lambda: svc.kernel.events.waiting == 1, "f1's poll waits")
        reply = FOLLOWED.decode(await svc.remember_many_followed(_followed(["a", "b"], "f1", head)))
        assert [e.seq for e in reply.events.events] == [head + 1, head + 2]
        assert reply.events.head.head == head + 2
        await settle()
        assert not poll.done()  # everything new went to f1 with its reply
        # Another follower's poll, and a plain one, answer at once for the same events.
        other = EVENT_BATCH.decode(await svc.events_packed(head, 1000, 5.0, "f2"))
        assert [e.seq for e in other.events] == [head + 1, head + 2]
        # An event f1 was not handed: its poll answers, from what f1 was handed (it asked
        # before the reply: it need not get those again), and says so.
        await svc.remember(POOL, ANN, "elsewhere")
        late = EVENT_BATCH.decode(await asyncio.wait_for(poll, 5))
        assert [e.seq for e in late.events] == [head + 3]
        assert late.since == head + 2
        assert other.since is None  # f2 was handed nothing: from the seq it asked
        # Nothing new but what was handed: the poll waits its full wait, answers nothing.
        now = svc.kernel.events.published
        await svc.remember_many_followed(_followed(["c"], "f1", now))
        waits = svc.kernel.events.waits
        timed = EVENT_BATCH.decode(await svc.events_packed(now, 1000, 0.3, "f1"))
        assert (timed.events, timed.since) == ([], now + 1)
        assert svc.kernel.events.waits == waits + 1  # it waited (and answered at its end)
        # A new id (what a follower takes when a reply got lost) is answered at once.
        fresh = EVENT_BATCH.decode(await svc.events_packed(now, 1000, 5.0, "f1b"))
        assert ([e.seq for e in fresh.events], fresh.since) == ([now + 1], None)
    finally:
        await svc.close()


@pytest.mark.anyio
async def test_a_page_read_from_the_file_says_the_head_it_was_read_at(tmp_path: Path) -> None:
    """A poll whose events are read from the file while a commit publishes more: its head is
    where the read stood, not the newer one (the follower takes (since, head] as complete)."""

    svc = Shard(tmp_path / "data", 0)
    try:
        for i in range(5):
            await svc.remember(POOL, ANN, f"n{i}")
        log = svc.kernel.events
        start = log.published - 5
        # private: empties the in-memory ring (else RING writes) so the page is read from the file
        log._ring = []  # older than what is kept in memory: read from the file
        gate, entered = asyncio.Event(), asyncio.Event()
        real_run = log.db.run

        async def held_run(fn):
            entered.set()
            await gate.wait()
            return await real_run(fn)

        log.db.run = held_run  # type: ignore[method-assign]
        try:
            reading = asyncio.create_task(svc.events_packed(start, 1000, 0.0))
            await until(entered.is_set, "the page is being read")
            await svc.remember(POOL, ANN, "published while the page is read")
        finally:
            gate.set()
            log.db.run = real_run  # type: ignore[method-assign]
        page = EVENT_BATCH.decode(await reading)
        assert [e.seq for e in page.events] == list(range(start + 1, start + 6))
        assert page.head.head == start + 5
        assert log.published == start + 6
    finally:
        await svc.close()


@pytest.mark.anyio
async def test_followed_writes_answer_as_the_plain_calls_and_hand_their_events(
    tmp_path: Path,
) -> None:
    """`remember_many_followed` and `ws_create_memory_many_followed` answer each request as
    the plain coalesced calls do (a bad one fails alone) and hand over the events after `seen`;
    a garbled call is invalid input and stores nothing."""
    from actors.contracts import WorkspaceAccess, WorkspaceCreateCall
    from engine.errors import InvalidInput
    from engine.scoped_memory import WorkspaceMemoryCreate

    ann = WorkspaceAccess(account="u_ann", bots=frozenset({"b_follow"}))

    def ws(content: str, rid: str, access: WorkspaceAccess = ann) -> bytes:
        body = WorkspaceMemoryCreate(bot="b_follow", scope="user", content=content, requestId=rid)
        return _enc.encode(WorkspaceCreateCall(access=access, body=body))

    svc = Shard(tmp_path / "data", 0)
    try:
        start = svc.kernel.events.published
        got = FOLLOWED.decode(await svc.remember_many_followed(_followed(["x", ""], "f", start)))
        replies = REPLIES.decode(got.replies)
        assert msgspec.json.decode(replies[0])["content"] == "x"
        assert not isinstance(replies[1], bytes)  # empty content: its own error
        assert [e.seq for e in got.events.events] == [start + 1]
        calls = [ws("fact", "w1"), ws("theirs", "w2", WorkspaceAccess(account="u_eve"))]
        asked = FollowingCall(follower="f", seen=start + 1, call=msgspec.Raw(_enc.encode(calls)))
        got = FOLLOWED.decode(await svc.workspace_create_memory_many_followed(_enc.encode(asked)))
        replies = REPLIES.decode(got.replies)
        assert msgspec.json.decode(replies[0])["content"] == "fact"
        assert not isinstance(replies[1], bytes)  # no use of the bot
        assert [e.seq for e in got.events.events] == list(
            range(start + 2, svc.kernel.events.published + 1)
        )
        before = svc.kernel.events.published
        for junk in (b"", _enc.encode({"follower": 1}), _enc.encode(["f", 0, b"x"])):
            with pytest.raises(InvalidInput):
                await svc.remember_many_followed(junk)
        assert svc.kernel.events.published == before
    finally:
        await svc.close()


@pytest.mark.anyio
async def test_every_event_reaches_the_pump_once_in_order_with_fewer_poll_answers(
    tmp_path: Path,
) -> None:
    """24 concurrent coalesced writers feeding the follower, plain writes in between (their
    events come by the poll only), one lost reply: the pump gets exactly the shard's log."""

    svc = Shard(tmp_path / "data", 0)
    try:
        gw = Gateway(svc)
        start = svc.kernel.events.published
        got: list[Event] = []
        stop = asyncio.Event()
        pump = asyncio.create_task(_pump(gw.follow, start, got, stop))
        # The pump's first poll is out: the writes follow now.
        await until(lambda: svc.kernel.events.waiting == 1, "the pump's poll waits")

        async def writer(i: int) -> None:
            for round_ in range(4):
                replies = await gw.write([f"w{i}.{round_}.{k}" for k in range(2)])
                assert all(isinstance(r, bytes) for r in replies)
                if i == 0 and round_ == 1:
                    await svc.remember(POOL, ANN, "a plain write")

        await asyncio.gather(*(writer(i) for i in range(24)))
        await gw.write(["its reply is lost"], drop_reply=True)
        last = svc.kernel.events.published
        await until(lambda: (got[-1].seq if got else start) >= last, "the pump caught up")
        stop.set()
        await gw.write(["wakes the pump"])
        await asyncio.wait_for(pump, 5)
        _, log = await svc.events_after(start, 10_000, 0.0)
        assert [e.seq for e in got] == [e.seq for e in log][: len(got)]
        assert len({e.seq for e in got}) == len(got)
        assert len(got) >= 24 * 4 * 2 + 2
        assert all(isinstance(e.data, MemoryChanged) for e in got)
        assert gw.follow.handed > 0
        # Most commits' events came with the replies, not with an answer to a poll.
        commits = svc.kernel.committer.transactions
        assert gw.polls < commits / 2, (gw.polls, commits)
    finally:
        await svc.close()


@pytest.mark.anyio
async def test_a_new_epoch_reaches_the_pump_and_nothing_of_it_is_mixed_in() -> None:
    answers: asyncio.Queue[EventBatch] = asyncio.Queue()
    asked: list[tuple[int, str]] = []

    async def poll(since: int, limit: int, wait: float, follower: str) -> EventBatch:
        asked.append((since, follower))
        return await answers.get()

    f = Follower(poll)
    await answers.put(EventBatch(head=ShardHead(epoch="e1", oldest=1, head=5), events=[]))
    head, events = await f.after(5, 1000, 5.0)
    assert (head.epoch, events) == ("e1", [])
    first_id = f.id
    assert f.seen == 5
    # A write's reply from a replaced shard: the pump hears of the new epoch, with no events.
    new = ShardHead(epoch="e2", oldest=1, head=3)
    f.take_reply(first_id, 5, EventBatch(head=new, events=[]), 3)
    head, events = await asyncio.wait_for(f.after(5, 1000, 5.0), 1)
    assert (head, events) == (new, [])
    assert f.id != first_id  # the shard has no notes for the new id: its poll answers
    # The pump goes on from the new head; the next poll asks from there under the new id.
    task = asyncio.create_task(f.after(3, 1000, 5.0))
    await until(lambda: asked[-1] == (3, f.id), "the poll from the new head")
    await answers.put(EventBatch(head=new, events=[]))
    assert await asyncio.wait_for(task, 1) == (new, [])


def _ev(seq: int) -> Event:
    data = MemoryChanged(pool=POOL, entry=f"m{seq}", version=1, change="created")
    return Event(seq=seq, at=0, data=data, audience=Audience(users=("u_ann",)))


class Polls:
    """A shard's poll answers by hand: each poll takes the next answer put."""

    def __init__(self) -> None:
        self.answers: asyncio.Queue[EventBatch] = asyncio.Queue()
        self.asked: list[tuple[int, str]] = []  # (since, follower id) of each poll

    async def __call__(self, since: int, limit: int, wait: float, follower: str) -> EventBatch:
        self.asked.append((since, follower))
        return await self.answers.get()


E1 = ShardHead(epoch="e1", oldest=1, head=5)


async def _following(polls: Polls) -> Follower:
    f = Follower(polls)
    polls.answers.put_nowait(EventBatch(head=E1, events=[]))
    assert await f.after(5, 1000, 5.0) == (E1, [])
    return f


@pytest.mark.anyio
async def test_a_late_reply_from_the_old_epoch_does_not_reset_the_clients_again() -> None:
    """The poll tells of a new epoch; then a write's reply sent before it, from the old epoch,
    arrives: it is dropped (sent under the old id), the pump hears of one epoch change only."""

    polls = Polls()
    f = await _following(polls)
    sent = f.id
    e2 = ShardHead(epoch="e2", oldest=1, head=3)
    polls.answers.put_nowait(EventBatch(head=e2, events=[]))
    assert await asyncio.wait_for(f.after(5, 1000, 5.0), 1) == (e2, [])
    f.take_reply(sent, 5, EventBatch(head=E1, events=[]), 5)
    task = asyncio.create_task(f.after(3, 1000, 5.0))
    await until(lambda: len(polls.asked) == 3, "the poll under e2")
    await settle()
    assert not task.done()  # not told of e1 again: waits for the poll under e2
    polls.answers.put_nowait(EventBatch(head=e2, events=[_ev(4)]))
    assert await asyncio.wait_for(task, 1) == (e2, [_ev(4)])


@pytest.mark.anyio
async def test_many_events_for_a_waiting_pump_do_not_restart_its_poll() -> None:
    """More than KEPT events arrive while the pump waits in `after`: it gets them, and the
    poll goes on from where they end (not from -1: duplicates, the head going back)."""
    from actors.runtime.follow import KEPT

    polls = Polls()
    f = await _following(polls)
    limit = 2 * KEPT
    task = asyncio.create_task(f.after(5, limit, 5.0))
    await until(lambda: len(polls.asked) == 2, "the pump's poll")
    assert polls.asked[-1] == (5, f.id)
    many = [_ev(s) for s in range(6, 6 + KEPT + 1)]
    head = ShardHead(epoch="e1", oldest=1, head=many[-1].seq)
    f.take_reply(f.id, 5, EventBatch(head=head, events=many), head.head)
    assert await asyncio.wait_for(task, 1) == (head, many)
    assert f.seen == head.head
    again = asyncio.create_task(f.after(head.head, limit, 5.0))
    await settle()
    assert not again.done()
    assert [since for since, _ in polls.asked] == [5, 5]  # the first poll waits on
    polls.answers.put_nowait(EventBatch(head=head, events=many))
    assert await asyncio.wait_for(again, 1) == (head, [])  # all known: nothing twice
    again.cancel()


@pytest.mark.anyio
async def test_a_poll_answer_from_past_what_is_known_takes_a_new_id() -> None:
    """The shard answered a poll from what it handed with a reply still on its way: that
    does not join; the next poll goes under a new id (answered from `hi`), the late reply to
    the old id is dropped, and the pump gets each event once."""

    polls = Polls()
    f = await _following(polls)
    old = f.id
    task = asyncio.create_task(f.after(5, 1000, 5.0))
    await until(lambda: len(polls.asked) == 2, "the pump's poll")
    head = ShardHead(epoch="e1", oldest=1, head=8)
    polls.answers.put_nowait(EventBatch(head=head, events=[_ev(8)], since=7))
    assert await asyncio.wait_for(task, 1) == (E1, [])  # not a head past what it has
    task = asyncio.create_task(f.after(5, 1000, 5.0))
    await until(lambda: len(polls.asked) == 3, "the poll under a new id")
    assert polls.asked[-1][0] == 5 and polls.asked[-1][1] != old
    f.take_reply(old, 5, EventBatch(head=head, events=[_ev(6), _ev(7)]), 7)
    assert not task.done()
    polls.answers.put_nowait(EventBatch(head=head, events=[_ev(6), _ev(7), _ev(8)]))
    assert await asyncio.wait_for(task, 1) == (head, [_ev(6), _ev(7), _ev(8)])


@pytest.mark.anyio
async def test_a_reply_says_how_far_its_events_go(tmp_path: Path, monkeypatch) -> None:
    """A reply carries at most the shard's HANDED_LIMIT events and says where they end
    (`upto`): the gateway does not infer it from its own copy of the limit."""
    import actors.shard.packed as packed

    monkeypatch.setattr(packed, "HANDED_LIMIT", 2)

    svc = Shard(tmp_path / "data", 0)
    try:
        gw = Gateway(svc)
        start = svc.kernel.events.published
        got: list[Event] = []
        stop = asyncio.Event()
        pump = asyncio.create_task(_pump(gw.follow, start, got, stop))
        await until(lambda: svc.kernel.events.waiting == 1, "the pump's poll waits")
        seen = gw.follow.seen
        reply = FOLLOWED.decode(
            await svc.remember_many_followed(_followed([f"n{i}" for i in range(5)], "other", seen))
        )
        assert [e.seq for e in reply.events.events] == [start + 1, start + 2]
        assert (reply.upto, reply.events.head.head) == (start + 2, start + 5)
        for i in range(3):
            await gw.write([f"w{i}.{k}" for k in range(3)])
        last = svc.kernel.events.published
        await until(lambda: (got[-1].seq if got else start) >= last, "the pump caught up")
        stop.set()
        await gw.write(["wakes the pump"])
        await asyncio.wait_for(pump, 5)
        assert [e.seq for e in got][: last - start] == list(range(start + 1, last + 1))
        assert len({e.seq for e in got}) == len(got)
    finally:
        await svc.close()


@pytest.mark.anyio
async def test_a_followers_note_keeps_the_most_it_was_handed(tmp_path: Path) -> None:
    """Two concurrent replies to one follower note what they handed out of order: the note
    keeps the higher, so its poll still waits (it has everything)."""

    svc = Shard(tmp_path / "data", 0)
    try:
        start = svc.kernel.events.published
        await svc.remember_many_followed(_followed(["a"], "f", start))
        svc.kernel.events.handed("f", start)  # the slower reply, from before "a"
        waits = svc.kernel.events.waits
        batch = EVENT_BATCH.decode(await svc.events_packed(start, 1000, 0.3, "f"))
        assert svc.kernel.events.waits == waits + 1  # it waited (and answered at its end)
        assert (batch.events, batch.since) == ([], start + 1)
    finally:
        await svc.close()


@pytest.mark.anyio
async def test_remembers_over_http_each_reach_a_live_client_once(world, engine) -> None:
    """Over Ray and HTTP: 24 concurrent Remembers, a websocket client live before them gets
    each entry's `memory.changed` exactly once, in seq order; the gateway's follower took
    events from write replies."""
    from gateway.client import EventClient

    client = EventClient(world.server.url, world.tokens["alice"])
    frames = aiter(client)
    first = asyncio.ensure_future(frames.__anext__())
    await asyncio.sleep(0.3)  # connected and live

    async def one(http: httpx.AsyncClient, i: int) -> str:
        r = await http.post(
            f"/v1/bots/{world.bot}/memory",
            json={"command": {"_tag": "Remember", "content": f"note {i}"}},
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]

    headers = {"Authorization": f"Bearer {world.tokens['alice']}"}
    async with httpx.AsyncClient(base_url=world.server.url, headers=headers) as http:
        ids = await asyncio.gather(*(one(http, i) for i in range(24)))
    got = [await asyncio.wait_for(first, 5)]
    while len(got) < 24:
        got.append(await asyncio.wait_for(frames.__anext__(), 5))
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(frames.__anext__(), 0.3)  # nothing twice
    await client.close()
    assert sorted(f.data["entry"] for f in got) == sorted(ids)
    cursors = [f.cursor for f in got]
    assert len(set(cursors)) == 24
    handed = sum(port.handed_events() for port in engine.shard_ports)
    assert handed > 0
