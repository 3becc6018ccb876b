"""The event stream end to end: real uvicorn, real websocket clients, real actors and files."""

from __future__ import annotations

import asyncio
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.events import Position, decode_cursor, encode_cursor
from gateway.client import EventClient, EventStreamClosed


def _remember(client, bot, content):
    r = client.post(
        f"/v1/bots/{bot}/memory", json={"command": {"_tag": "Remember", "content": content}}
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


async def _next(it, timeout=5.0):
    return await asyncio.wait_for(it.__anext__(), timeout)


async def _hello(url, token, cursor=None):
    ws = await connect(
        f"{url.replace('http', 'ws')}/v1/events" + (f"?cursor={cursor}" if cursor else ""),
        additional_headers={"Authorization": f"Bearer {token}"},
    )
    import json

    frame = json.loads(await ws.recv())
    return ws, frame


async def _stamped(it) -> tuple[object, float]:
    frame = await _next(it)
    return frame, time.monotonic()


def test_own_remember_arrives_within_100ms_and_not_to_others(world):
    world.grant("bob", "write")

    async def scenario():
        alice_c = EventClient(world.server.url, world.tokens["alice"])
        bob_c = EventClient(world.server.url, world.tokens["bob"], header_auth=False)
        alice_it, bob_it = aiter(alice_c), aiter(bob_c)
        # Connect both (the first frame each yields is the live event; wait until subscribed).
        ws, hello = await _hello(world.server.url, world.tokens["alice"])
        await ws.close()
        assert hello["type"] == "hello"
        alice_task = asyncio.ensure_future(_stamped(alice_it))
        bob_task = asyncio.ensure_future(_next(bob_it, timeout=1.0))
        await asyncio.sleep(0.3)  # let both clients connect and go live
        with world.client("alice") as alice:
            t0 = time.monotonic()
            entry = await asyncio.to_thread(_remember, alice, world.bot, "secret plan")
            acked = time.monotonic()
            frame, arrived = await alice_task
        assert frame.type == "memory.changed"
        assert frame.data == {
            "pool": f"bot:{world.bot}",
            "entry": entry,
            "version": 1,
            "change": "created",
            "bot": world.bot,
        }
        assert "secret plan" not in str(frame)
        # Pushed, not polled: the event follows the write's acknowledgement within 100 ms, or
        # within one more round trip of the Remember on a host too busy for 100 ms round trips.
        round_trip = acked - t0
        assert arrived - acked < max(0.1, round_trip), (arrived - acked, round_trip)
        with pytest.raises(TimeoutError):
            await bob_task
        await alice_c.close()
        await bob_c.close()

    asyncio.run(scenario())


def test_resume_after_disconnect_gets_exactly_the_missed_events(world):
    async def scenario():
        ws, hello = await _hello(world.server.url, world.tokens["alice"])
        await ws.close()
        cursor = hello["cursor"]
        with world.client("alice") as alice:
            ids = [await asyncio.to_thread(_remember, alice, world.bot, f"n{i}") for i in range(7)]
        client = EventClient(world.server.url, world.tokens["alice"], cursor=cursor)
        it = aiter(client)
        got = [await _next(it) for _ in range(7)]
        assert [f.data["entry"] for f in got] == ids
        assert [f.data["version"] for f in got] == list(range(1, 8))
        with pytest.raises(TimeoutError):
            await _next(it, timeout=0.5)  # nothing more: each event once
        await client.close()

    asyncio.run(scenario())


def test_client_reconnects_by_itself_without_gap_or_duplicate(world):
    async def scenario():
        client = EventClient(world.server.url, world.tokens["alice"])
        it = aiter(client)
        first = asyncio.ensure_future(_next(it))
        await asyncio.sleep(0.3)
        with world.client("alice") as alice:
            ids = [await asyncio.to_thread(_remember, alice, world.bot, "a")]
            assert (await first).data["entry"] == ids[0]
            await client.drop()
            ids += [await asyncio.to_thread(_remember, alice, world.bot, f"b{i}") for i in range(5)]
            got = [await _next(it) for _ in range(5)]
        assert [f.data["entry"] for f in got] == ids[1:]
        assert client.reconnects >= 1
        await client.close()

    asyncio.run(scenario())


def test_foreign_epoch_or_malformed_cursor(world):
    async def scenario():
        ws, hello = await _hello(world.server.url, world.tokens["alice"])
        await ws.close()
        positions = decode_cursor(hello["cursor"])
        foreign = encode_cursor([Position("0000", p.seq) for p in positions])
        ws, frame = await _hello(world.server.url, world.tokens["alice"], foreign)
        assert frame["type"] == "reset"
        assert decode_cursor(frame["cursor"]) == positions
        await ws.close()
        short = encode_cursor(positions[:1])  # another shard layout
        ws, frame = await _hello(world.server.url, world.tokens["alice"], short)
        assert frame["type"] == "reset"
        await ws.close()
        ahead = encode_cursor([Position(p.epoch, p.seq + 10_000) for p in positions])
        ws, frame = await _hello(world.server.url, world.tokens["alice"], ahead)
        assert frame["type"] == "reset"
        await ws.close()
        ws = await connect(
            f"{world.server.url.replace('http', 'ws')}/v1/events?cursor=%%%garbage",
            additional_headers={"Authorization": f"Bearer {world.tokens['alice']}"},
        )
        with pytest.raises(ConnectionClosed) as info:
            await ws.recv()
        assert info.value.rcvd.code == 4400

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("first", "code"),
    [
        ("not json at all", 4400),
        ('{"type": "subscribe"}', 4401),  # the first message must be auth
        ('{"type": "auth", "token": "obt_forged"}', 4401),
        ("x" * (70 * 1024), 1009),
    ],
)
def test_bad_first_frames_close_with_a_clear_code(server, world, first, code):
    async def scenario():
        ws = await connect(f"{server.url.replace('http', 'ws')}/v1/events", max_size=None)
        await ws.send(first)
        with pytest.raises(ConnectionClosed) as info:
            await ws.recv()
        assert info.value.rcvd.code == code
        assert info.value.rcvd.reason

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("garbage", 4400),
        ('{"type": "launch"}', 4400),
        ('{"no": "type"}', 4400),
        ("y" * (70 * 1024), 1009),
    ],
)
def test_bad_frames_after_auth_close_and_others_keep_being_served(world, message, code):
    async def scenario():
        good = EventClient(world.server.url, world.tokens["alice"])
        it = aiter(good)
        pending = asyncio.ensure_future(_next(it))
        ws, hello = await _hello(world.server.url, world.tokens["alice"])
        assert hello["type"] == "hello"
        await ws.send(message)
        with pytest.raises(ConnectionClosed) as info:
            await ws.recv()
        assert info.value.rcvd.code == code
        await asyncio.sleep(0.2)
        with world.client("alice") as alice:
            entry = await asyncio.to_thread(_remember, alice, world.bot, "still served")
        assert (await pending).data["entry"] == entry
        await good.close()

    asyncio.run(scenario())


def test_bad_header_token_is_refused(server):
    async def scenario():
        client = EventClient(server.url, "obt_forged")
        with pytest.raises(EventStreamClosed) as info:
            await _next(aiter(client))
        assert info.value.code == 4401

    asyncio.run(scenario())


def test_a_grant_given_while_connected_applies_to_the_open_stream(engine, world):
    import ray

    from engine.directory import bot_pool
    from engine.memory_entries import EntryMeta, Layer

    async def scenario():
        bob = EventClient(world.server.url, world.tokens["bob"])
        it = aiter(bob)
        first = asyncio.ensure_future(_next(it, timeout=10))
        await asyncio.sleep(0.3)  # connected, without access to the bot
        world.grant("bob", "read")
        await asyncio.sleep(0.6)  # the stream re-reads its listener every 0.2 s in tests
        meta = EntryMeta(
            id=f"mem_forbot_{world.bot}",
            pool=bot_pool(world.bot),
            layer=Layer.PINNED,
            tags=("for:bot", f"org:{world.org}"),
            created_at=1,
            updated_at=1,
        )
        shard = engine.shard_for(world.users["alice"])
        await asyncio.to_thread(
            ray.get, shard.add_entries.remote(bot_pool(world.bot), [(meta, "for everyone")])
        )
        frame = await first
        await bob.close()
        return frame

    frame = asyncio.run(scenario())
    assert frame.type == "memory.changed" and frame.data["entry"] == f"mem_forbot_{world.bot}"
