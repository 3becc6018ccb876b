"""Events that come with a gateway's write replies (issue 13; actors/runtime/follow.py,
actors/shard/packed.py, storage/event_log.py): a coalesced write's reply brings the events
published since the gateway's `seen`, and the shard's answer to that gateway's waiting poll waits
on for events it was not handed. In process, against a real shard on a DuckDB file; over Ray and
HTTP at the end."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from actors.contracts import (
    EVENT_BATCH,
    FOLLOWED,
    HANDED_LIMIT,
    REPLIES,
    EventBatch,
    FollowingCall,
    RememberCall,
)
from actors.runtime.follow import Follower
from actors.shard.packed import PackedEvents
from actors.shard.service import ShardService
from engine.events import Event, MemoryChanged, ShardHead
from engine.memory import Reader

pytestmark = pytest.mark.usefixtures("no_env_key")
POOL = "bot:b_follow"
ANN = Reader(user="u_ann", org="o_1", uses_bot=True)
_enc = msgspec.msgpack.Encoder()


class Shard(PackedEvents, ShardService):
    """What `PlacedShardService` is, without Ray's start-up guard."""


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
        reply = FOLLOWED.decode(
            await self.svc.remember_many_followed(_followed(contents, self.follow.id, seen))
        )
        if drop_reply:  # as if the call failed after the shard answered it
            self.follow.lost()
        else:
            self.follow.take_reply(seen, reply.events, HANDED_LIMIT)
        return REPLIES.decode(reply.replies)


async def _pump(follow: Follower, head: int, got: list[Event], stop: asyncio.Event) -> None:
    """The hub's loop (gateway/fanout.py): ask after the last event handed out."""
    while not stop.is_set():
        answer = await follow.after(head, 1000, 5.0)
        assert answer is not None
        _, events = answer
        got.extend(events)
        head = events[-1].seq if events else head


def test_a_followers_poll_waits_on_for_events_it_was_handed(tmp_path: Path) -> None:
    async def main() -> None:
        svc = Shard(tmp_path / "data", 0)
        try:
            await svc.remember(POOL, ANN, "first")
            head = svc.kernel.events.published
            poll = asyncio.create_task(svc.events_packed(head, 1000, 5.0, "f1"))
            await asyncio.sleep(0.05)
            reply = FOLLOWED.decode(
                await svc.remember_many_followed(_followed(["a", "b"], "f1", head))
            )
            assert [e.seq for e in reply.events.events] == [head + 1, head + 2]
            assert reply.events.head.head == head + 2
            await asyncio.sleep(0.1)
            assert not poll.done()  # everything new went to f1 with its reply
            # Another follower's poll, and a plain one, answer at once for the same events.
            other = EVENT_BATCH.decode(await svc.events_packed(head, 1000, 5.0, "f2"))
            assert [e.seq for e in other.events] == [head + 1, head + 2]
            # An event f1 was not handed: its poll answers, with everything after its seq.
            await svc.remember(POOL, ANN, "elsewhere")
            late = EVENT_BATCH.decode(await asyncio.wait_for(poll, 5))
            assert [e.seq for e in late.events] == [head + 1, head + 2, head + 3]
            # A handed reply that got lost costs at most the poll's wait: it then answers.
            now = svc.kernel.events.published
            await svc.remember_many_followed(_followed(["c"], "f1", now))
            t0 = time.monotonic()
            timed = EVENT_BATCH.decode(await svc.events_packed(now, 1000, 0.3, "f1"))
            assert [e.seq for e in timed.events] == [now + 1]
            assert 0.25 <= time.monotonic() - t0 < 2
        finally:
            await svc.close()

    asyncio.run(main())


def test_a_page_read_from_the_file_says_the_head_it_was_read_at(tmp_path: Path) -> None:
    """A poll whose events are read from the file while a commit publishes more: its head is
    where the read stood, not the newer one (the follower takes (since, head] as complete)."""

    async def main() -> None:
        svc = Shard(tmp_path / "data", 0)
        try:
            for i in range(5):
                await svc.remember(POOL, ANN, f"n{i}")
            log = svc.kernel.events
            start = log.published - 5
            log._ring = []  # older than what is kept in memory: read from the file
            gate = asyncio.Event()
            real_run = log.db.run

            async def held_run(fn):
                await gate.wait()
                return await real_run(fn)

            log.db.run = held_run  # type: ignore[method-assign]
            try:
                reading = asyncio.create_task(svc.events_packed(start, 1000, 0.0))
                await asyncio.sleep(0.01)
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

    asyncio.run(main())


def test_followed_writes_answer_as_the_plain_calls_and_hand_their_events(tmp_path: Path) -> None:
    """`remember_many_followed` and `ws_create_memory_many_followed` answer each request as
    the plain coalesced calls do (a bad one fails alone) and hand over the events after `seen`;
    a garbled call is invalid input and stores nothing."""
    from actors.contracts import WsAccess, WsCreateCall
    from engine.errors import InvalidInput
    from engine.scoped_memory import WsMemoryCreate

    ann = WsAccess(account="u_ann", bots=frozenset({"b_follow"}))

    def ws(content: str, rid: str, access: WsAccess = ann) -> bytes:
        body = WsMemoryCreate(bot="b_follow", scope="user", content=content, requestId=rid)
        return _enc.encode(WsCreateCall(access=access, body=body))

    async def main() -> None:
        svc = Shard(tmp_path / "data", 0)
        try:
            start = svc.kernel.events.published
            got = FOLLOWED.decode(
                await svc.remember_many_followed(_followed(["x", ""], "f", start))
            )
            replies = REPLIES.decode(got.replies)
            assert msgspec.json.decode(replies[0])["content"] == "x"
            assert not isinstance(replies[1], bytes)  # empty content: its own error
            assert [e.seq for e in got.events.events] == [start + 1]
            calls = [ws("fact", "w1"), ws("theirs", "w2", WsAccess(account="u_eve"))]
            asked = FollowingCall(
                follower="f", seen=start + 1, call=msgspec.Raw(_enc.encode(calls))
            )
            got = FOLLOWED.decode(await svc.ws_create_memory_many_followed(_enc.encode(asked)))
            replies = REPLIES.decode(got.replies)
            assert msgspec.msgpack.decode(replies[0])["content"] == "fact"
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

    asyncio.run(main())


def test_every_event_reaches_the_pump_once_in_order_with_fewer_poll_answers(
    tmp_path: Path,
) -> None:
    """24 concurrent coalesced writers feeding the follower, plain writes in between (their
    events come by the poll only), one lost reply: the pump gets exactly the shard's log."""

    async def main() -> None:
        svc = Shard(tmp_path / "data", 0)
        try:
            gw = Gateway(svc)
            start = svc.kernel.events.published
            got: list[Event] = []
            stop = asyncio.Event()
            pump = asyncio.create_task(_pump(gw.follow, start, got, stop))
            await asyncio.sleep(0.05)  # the pump's first poll is out: the writes follow now

            async def writer(i: int) -> None:
                for round_ in range(4):
                    replies = await gw.write([f"w{i}.{round_}.{k}" for k in range(2)])
                    assert all(isinstance(r, bytes) for r in replies)
                    if i == 0 and round_ == 1:
                        await svc.remember(POOL, ANN, "a plain write")

            await asyncio.gather(*(writer(i) for i in range(24)))
            await gw.write(["its reply is lost"], drop_reply=True)
            last = svc.kernel.events.published
            t0 = time.monotonic()
            while (got[-1].seq if got else start) < last:
                assert time.monotonic() - t0 < 2, "the pump fell behind"
                await asyncio.sleep(0.01)
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

    asyncio.run(main())


def test_a_new_epoch_reaches_the_pump_and_nothing_of_it_is_mixed_in() -> None:
    async def main() -> None:
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
        f.take_reply(5, EventBatch(head=new, events=[]), HANDED_LIMIT)
        head, events = await asyncio.wait_for(f.after(5, 1000, 5.0), 1)
        assert (head, events) == (new, [])
        assert f.id != first_id  # the shard has no notes for the new id: its poll answers
        # The pump goes on from the new head; the next poll asks from there under the new id.
        task = asyncio.create_task(f.after(3, 1000, 5.0))
        await asyncio.sleep(0.01)
        assert asked[-1] == (3, f.id)
        await answers.put(EventBatch(head=new, events=[]))
        assert await asyncio.wait_for(task, 1) == (new, [])

    asyncio.run(main())


def test_remembers_over_http_each_reach_a_live_client_once(world, engine) -> None:
    """Over Ray and HTTP: 24 concurrent Remembers, a websocket client live before them gets
    each entry's `memory.changed` exactly once, in seq order; the gateway's follower took
    events from write replies."""
    from gateway.client import EventClient

    async def scenario() -> None:
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

    asyncio.run(scenario())
    handed = sum(w.follow.handed for port in engine.shard_ports for w in port._writes.values())
    assert handed > 0
