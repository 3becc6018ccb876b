"""Fan-out to many clients of one gateway. Frames are encoded once per event and the
same text goes to every client in step with the hub, so these prove that sharing never widens an
audience, and that clients joining, replaying and going live while events flow get each of their
events exactly once, in order. Real uvicorn, real websocket clients, real shards."""

from __future__ import annotations

import asyncio
import json
import random

import ray
from websockets.asyncio.client import connect

from engine.directory import bot_pool
from engine.memory_entries import EntryMeta, Layer
from gateway.socket_frames import FrameWriter
from tests.conftest import World


async def _open(url: str, token: str, *, header: bool = True, cursor: str | None = None):
    base = url.replace("http://", "ws://") + "/v1/events"
    if cursor:
        base += f"?cursor={cursor}"
    if header:
        ws = await connect(base, additional_headers={"Authorization": f"Bearer {token}"})
    else:
        ws = await connect(base)
        await ws.send(json.dumps({"type": "auth", "token": token}))
    hello = json.loads(await asyncio.wait_for(ws.recv(), 15))
    assert hello["type"] == "hello", hello
    return ws, hello["cursor"]


async def _collect(ws, want: int, quiet: float) -> list[dict]:
    """Frames until `want` arrived, then `quiet` s more (anything extra is a leak or a dup)."""
    frames: list[dict] = []
    while True:
        wait = 30.0 if len(frames) < want else quiet
        try:
            raw = await asyncio.wait_for(ws.recv(), wait)
        except TimeoutError:
            if len(frames) < want:
                raise
            return frames
        assert isinstance(raw, str)
        frames.append(json.loads(raw))


def _remember(world: World, name: str, content: str) -> str:
    with world.client(name) as c:
        r = c.post(
            f"/v1/bots/{world.bot}/memory",
            json={"command": {"_tag": "Remember", "content": content}},
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]


def _add(engine, world: World, entry: str, tags: tuple[str, ...]) -> None:
    meta = EntryMeta(
        id=entry,
        pool=bot_pool(world.bot),
        layer=Layer.PINNED,
        tags=tags,
        created_at=1,
        updated_at=1,
    )
    shard = engine.shard_for(world.users["alice"])
    ray.get(shard.add_entries.remote(bot_pool(world.bot), [(meta, "content")]))


def test_shared_frames_reach_exactly_their_audience(engine, admin, server, world, monkeypatch):
    world.grant("bob", "read")  # bob may use the bot; carol, in the same org, may not
    # Event frames go to the sockets as ready-made bytes (gateway/socket_frames.py): count them.
    written: list[bytes] = []
    write = FrameWriter.write

    def spy(self, frame: bytes):
        done = write(self, frame)
        if done:
            written.append(frame)
        return done

    monkeypatch.setattr(FrameWriter, "write", spy)
    other = World(admin, server)  # another account: its own org, people and bot
    principals = {
        "alice": world.tokens["alice"],
        "bob": world.tokens["bob"],
        "carol": world.tokens["carol"],
        "other": other.tokens["alice"],
    }

    async def scenario():
        opened = await asyncio.gather(
            *(
                _open(server.url, token, header=i % 2 == 0)
                for token in principals.values()
                for i in range(6)
            )
        )
        sockets = dict(zip(principals, [opened[i : i + 6] for i in range(0, 24, 6)], strict=True))
        private = [
            await asyncio.to_thread(_remember, world, "alice", f"mine {i}") for i in range(2)
        ]
        theirs = await asyncio.to_thread(_remember, other, "alice", "another account's")
        hidden = f"mem_hidden_{world.bot}"  # no org: its audience is nobody
        await asyncio.to_thread(_add, engine, world, hidden, ("for:bot",))
        shared = f"mem_forbot_{world.bot}"
        await asyncio.to_thread(_add, engine, world, shared, ("for:bot", f"org:{world.org}"))
        want = {
            "alice": [*private, shared],
            "bob": [shared],
            "carol": [],
            "other": [theirs],
        }
        got = await asyncio.gather(
            *(
                _collect(ws, len(want[name]), quiet=0.5)
                for name, socks in sockets.items()
                for ws, _ in socks
            )
        )
        for (name, ws_cursor), frames in zip(
            [(n, s) for n, socks in sockets.items() for s in socks], got, strict=True
        ):
            assert [f["data"]["entry"] for f in frames] == want[name], (name, frames)
            assert all(f["type"] == "memory.changed" for f in frames)
            await ws_cursor[0].close()
        # Every event frame above went past ASGI: alice's 6 clients 3 each, bob's and other's 1.
        assert len(written) == 6 * 3 + 6 + 6

    asyncio.run(scenario())


def _bot_on_the_other_shard(engine, admin, world: World) -> str:
    """A bot whose pool lives on the other shard than alice's bot, where alice may write."""
    mine = engine.shard_index(world.users["alice"])
    for i in range(64):
        r = admin.post("/v1/admin/users", json={"name": f"dana {i}", "orgs": [world.org]})
        assert r.status_code == 201, r.text
        if engine.shard_index(r.json()["id"]) != mine:
            owner = r.json()["id"]
            break
    else:
        raise AssertionError("no user landed on the other shard")
    r = admin.post(
        "/v1/admin/bots", json={"name": f"far {owner}", "org": world.org, "owner": owner}
    )
    assert r.status_code == 201, r.text
    bot = r.json()["id"]
    r = admin.post(
        "/v1/admin/grants", json={"bot": bot, "user": world.users["alice"], "permission": "write"}
    )
    assert r.status_code in (200, 201), r.text
    return bot


def test_clients_joining_while_events_flow_get_each_once_in_order(engine, admin, server, world):
    """24 clients resume from one cursor at random moments while alice writes to bots on both
    shards: each replays, goes live on each shard and joins the shared frames with no gap and
    no duplicate, each shard's events in order; bob's clients, without access to either bot,
    joining alongside, get nothing."""
    n_events = 30
    bots = [world.bot, _bot_on_the_other_shard(engine, admin, world)]

    def remember(bot: str, content: str) -> str:
        with world.client("alice") as c:
            r = c.post(
                f"/v1/bots/{bot}/memory", json={"command": {"_tag": "Remember", "content": content}}
            )
            assert r.status_code == 201, r.text
            return r.json()["id"]

    async def scenario():
        ws, cursor = await _open(server.url, world.tokens["alice"])
        await ws.close()

        async def writer() -> list[tuple[str, str]]:
            made = []
            for i in range(n_events):
                bot = bots[i % 2]
                made.append((bot, await asyncio.to_thread(remember, bot, f"n{i}")))
            return made

        async def client(who: str, delay: float) -> list[dict]:
            await asyncio.sleep(delay)
            ws, _ = await _open(server.url, world.tokens[who], header=delay < 0.5, cursor=cursor)
            try:
                return await _collect(ws, n_events if who == "alice" else 0, quiet=0.5)
            finally:
                await ws.close()

        rng = random.Random(13)
        written = asyncio.ensure_future(writer())
        clients = [client("alice", rng.uniform(0, 1.5)) for _ in range(24)]
        clients += [client("bob", rng.uniform(0, 1.5)) for _ in range(4)]
        got = await asyncio.gather(*clients)
        made = await written
        for frames in got[:24]:
            for bot in bots:
                mine = [f["data"]["entry"] for f in frames if f["data"]["pool"] == f"bot:{bot}"]
                assert mine == [entry for b, entry in made if b == bot]
            assert len(frames) == n_events
        for frames in got[24:]:
            assert frames == []

    asyncio.run(scenario())
