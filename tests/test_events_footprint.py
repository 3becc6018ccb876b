"""What a connected client of the event stream costs the gateway, and that the savings keep every
check: one task per connection (its handler), a token that stops working closes its socket through
the one re-read shared by every connection, and an outlet that gives up closes its connection with
its code though no task of its own waits on it. Real uvicorn, real websocket clients; the shards
and the directory are stand-ins (the hub's shard ports and the auth's `principal_for`)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from starlette.routing import WebSocketRoute
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.errors import Unauthenticated
from gateway.events import PATH, REREAD_CALLS, EventsEndpoint, StreamFirst
from gateway.fanout import Hub
from gateway.live_server import LiveServer
from gateway.subscriber import Outlet
from tests.test_event_subscriber import FakeShard
from tests.waiting import until


class StubAuth:
    """Tokens and who they are; a token taken away is noticed only by re-reading it (no
    access-change notification reaches the endpoint)."""

    def __init__(self) -> None:
        self.valid: dict[str, SimpleNamespace] = {}
        self.reads = 0
        self.reading = self.most_at_once = 0

    def add(self, token: str, user: str) -> None:
        self.valid[token] = SimpleNamespace(
            user=SimpleNamespace(id=user, orgs=("o1",)),
            channels=frozenset(),
            bots=frozenset(),
            unshared=frozenset(),
        )

    def on_access_change(self, callback) -> None:
        pass

    def watch(self) -> None:
        pass

    async def principal_for(self, token: str):
        self.reads += 1
        self.reading += 1
        self.most_at_once = max(self.most_at_once, self.reading)
        try:
            await asyncio.sleep(0.002)  # as a directory call would take a while
            return self.valid[token]
        except KeyError:
            raise Unauthenticated("unknown token") from None
        finally:
            self.reading -= 1


@pytest.fixture
def stream():
    auth = StubAuth()
    hub = Hub(SimpleNamespace(shard_ports=[FakeShard(0), FakeShard(1)]))
    endpoint = EventsEndpoint(hub, auth, refresh_every=0.1)
    app = StreamFirst(routes=[WebSocketRoute(PATH, endpoint.handle)])
    app.events = endpoint
    live = LiveServer(app)
    yield SimpleNamespace(auth=auth, hub=hub, live=live)
    live.stop()


def _on_loop(live: LiveServer, fn):
    async def run():
        return fn()

    assert live.loop is not None
    return asyncio.run_coroutine_threadsafe(run(), live.loop).result(10)


async def _open(live: LiveServer, token: str):
    ws = await connect(
        live.url.replace("http://", "ws://") + PATH,
        additional_headers={"Authorization": f"Bearer {token}"},
    )
    hello = json.loads(await asyncio.wait_for(ws.recv(), 15))
    assert hello["type"] == "hello", hello
    return ws


async def _closed_with(ws) -> int | None:
    try:
        while True:
            await asyncio.wait_for(ws.recv(), 15)
    except ConnectionClosed as e:
        return e.rcvd.code if e.rcvd is not None else None


def test_a_connected_client_costs_its_handler_task_and_no_other(stream):
    stream.auth.add("t1", "u1")
    tasks = lambda: len(asyncio.all_tasks())  # noqa: E731  (run on the server's loop)

    async def scenario() -> tuple[int, int, int]:
        socks = [await _open(stream.live, "t1") for _ in range(2)]
        before = _on_loop(stream.live, tasks)  # the shared re-read and the pumps run by now
        socks += [await _open(stream.live, "t1") for _ in range(30)]
        during = _on_loop(stream.live, tasks)
        for ws in socks:
            await ws.close()
        await until(lambda: not stream.hub.subscribers, "every subscriber gone")
        return before, during, len(stream.hub.subscribers)

    before, during, left = asyncio.run(scenario())
    # uvicorn's one task per connection, and a few short-lived ones of the server's own (a
    # second task per connection would add 30 more).
    assert during - before <= 30 + 5, (before, during)
    assert left == 0


def test_a_token_that_stops_working_closes_its_sockets_through_the_shared_reread(stream):
    stream.auth.add("t1", "u1")
    stream.auth.add("t2", "u2")

    async def scenario() -> tuple[list[int | None], bool]:
        gone = [await _open(stream.live, "t1") for _ in range(3)]
        kept = await _open(stream.live, "t2")
        reads = stream.auth.reads
        del stream.auth.valid["t1"]  # no notification: only a re-read can tell
        codes = await asyncio.gather(*(_closed_with(ws) for ws in gone))
        assert stream.auth.reads > reads
        still_open = True
        try:
            await kept.send(json.dumps({"type": "ping"}))
            await asyncio.wait_for(kept.recv(), 0.5)
        except TimeoutError:
            pass  # nothing to hear, and not closed
        except ConnectionClosed:
            still_open = False
        await kept.close()
        return codes, still_open

    codes, still_open = asyncio.run(scenario())
    assert codes == [4403, 4403, 4403]
    assert still_open


def test_an_outlet_that_gives_up_closes_its_connection_with_its_code(stream):
    stream.auth.add("t1", "u1")

    async def scenario() -> tuple[int | None, bool]:
        slow = await _open(stream.live, "t1")
        other = await _open(stream.live, "t1")
        subs = list(stream.hub.subscribers)
        assert len(subs) == 2
        # The hub ends one outlet (as it does for a client too far behind): its connection,
        # whose handler is waiting for the client's next message, must close with 4429.
        _on_loop(stream.live, lambda: subs[0].outlet.end(4429))
        _on_loop(stream.live, lambda: subs[1].outlet.end(4429))
        codes = await asyncio.gather(_closed_with(slow), _closed_with(other))
        return codes, bool(stream.hub.subscribers)

    codes, left = asyncio.run(scenario())
    assert codes == [4429, 4429]
    assert not left


def test_an_outlet_tells_both_its_waiters_and_its_handler_once() -> None:
    calls: list[int] = []
    outlet = Outlet(_never_sent)
    outlet.on_end(lambda: calls.append(outlet.code))
    ended = outlet.ended  # someone waits on the event too: the handler is still told
    outlet.end(4429)
    outlet.end(4403)
    assert calls == [4429] and ended.is_set() and outlet.code == 4429
    quiet = Outlet(_never_sent)
    quiet.on_end(lambda: calls.append(0))
    quiet.close()  # torn down by its own handler: nothing to interrupt
    assert calls == [4429] and quiet.over


async def _never_sent(message: dict) -> None:
    raise AssertionError("nothing is sent")


def test_a_reread_asks_a_few_tokens_at_a_time(stream):
    for i in range(40):
        stream.auth.add(f"t{i}", f"u{i}")

    async def scenario() -> None:
        socks = [await _open(stream.live, f"t{i}") for i in range(40)]
        stream.auth.most_at_once = 0  # from here on only re-reads ask
        reads = stream.auth.reads
        deadline = asyncio.get_running_loop().time() + 15
        while stream.auth.reads < reads + 80:  # two rounds of re-reads
            assert asyncio.get_running_loop().time() < deadline, "no re-read"
            await asyncio.sleep(0.05)
        for ws in socks:
            await ws.close()

    asyncio.run(scenario())
    assert 1 < stream.auth.most_at_once <= REREAD_CALLS
