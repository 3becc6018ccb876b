"""Resume across a killed and restarted server, and reset past the kept window."""

from __future__ import annotations

import asyncio

import ray

from gateway.client import EventClient
from tests.conftest import ADMIN, LiveServer, World


def _start(data_dir, retain):
    from actors.runtime.engine import Engine
    from gateway.app import create_app

    engine = Engine.start(data_dir, shards=2, prefix="evr", event_retain=retain)
    return engine, LiveServer(create_app(engine, ADMIN, cache_ttl=0.0))


def _kill(engine, server):
    server.stop()
    for handle in [*engine.shards, engine.directory]:
        ray.kill(handle, no_restart=True)  # a crash: no flush, no clean close


async def _first_cursor(url, token):
    from websockets.asyncio.client import connect

    async with connect(
        f"{url.replace('http', 'ws')}/v1/events",
        additional_headers={"Authorization": f"Bearer {token}"},
    ) as ws:
        import json

        return json.loads(await ws.recv())["cursor"]


def _remember(world, n, prefix):
    ids = []
    with world.client("alice") as alice:
        for i in range(n):
            r = alice.post(
                f"/v1/bots/{world.bot}/memory",
                json={"command": {"_tag": "Remember", "content": f"{prefix}{i}"}},
            )
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
    return ids


def test_resume_across_kill_and_restart_then_reset_past_the_window(tmp_path, ray_session):
    import httpx

    engine, server = _start(tmp_path, retain=8)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"})
    world = World(admin, server)
    cursor = asyncio.run(_first_cursor(server.url, world.tokens["alice"]))
    ids = _remember(world, 5, "before-crash-")
    _kill(engine, server)

    engine, server = _start(tmp_path, retain=8)
    world.server = server
    admin.base_url = server.url

    async def resume(cursor, n):
        client = EventClient(server.url, world.tokens["alice"], cursor=cursor)
        it = aiter(client)
        frames = [await asyncio.wait_for(it.__anext__(), 5) for _ in range(n)]
        try:
            extra = await asyncio.wait_for(it.__anext__(), 0.5)
        except TimeoutError:
            extra = None
        await client.close()
        return frames, extra

    frames, extra = asyncio.run(resume(cursor, 5))
    assert [f.data["entry"] for f in frames] == ids
    assert extra is None

    # 20 more changes: the shard of this bot keeps only the last 8 events, so the old cursor
    # cannot be resumed without a gap and must get `reset`.
    _remember(world, 20, "after-")
    frames, _ = asyncio.run(resume(cursor, 1))
    assert frames[0].type == "reset"
    admin.close()
    server.stop()
    engine.stop()
