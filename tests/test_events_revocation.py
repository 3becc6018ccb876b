"""A revocation reaches open event sockets within its own acknowledgement (gateway/events.py,
gateway/auth.py `on_access_change`, actors/access_watch.py): once `DELETE .../grants/{user}`
returned, an open socket hears nothing more of that bot; once a token replacement returned, a
socket opened with the old token is closed with 4403. Real uvicorn gateways (one caching, one
not) whose periodic re-read is an hour away, real websockets, real actors."""

from __future__ import annotations

import asyncio
import json
import secrets

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.directory import bot_pool
from engine.memory_entries import EntryMeta, Layer
from gateway.app import create_app
from gateway.events import REVOKED
from gateway.live_server import LiveServer
from tests.conftest import ADMIN, _ok


@pytest.fixture(scope="module", params=[0.0, 60.0], ids=["uncached", "cached"])
def gateway(engine, request):
    live = LiveServer(create_app(engine, ADMIN, cache_ttl=request.param, listener_refresh=3600))
    yield live
    live.stop()


async def _open(gateway: LiveServer, token: str):
    ws = await connect(
        f"{gateway.url.replace('http', 'ws')}/v1/events",
        additional_headers={"Authorization": f"Bearer {token}"},
    )
    hello = json.loads(await ws.recv())
    assert hello["type"] == "hello"
    return ws


async def _write(engine, world, bot: str, text: str) -> str:
    """An entry every reader of `bot` may see (its event's audience is the bot's readers)."""
    import ray

    meta = EntryMeta(
        id=f"mem_{secrets.token_hex(6)}",
        pool=bot_pool(bot),
        layer=Layer.PINNED,
        tags=("for:bot", f"org:{world.org}"),
        created_at=1,
        updated_at=1,
    )
    shard = engine.shard_for(world.users["alice"])  # alice's bots' pools, in one log
    await asyncio.to_thread(ray.get, shard.add_entries.remote(bot_pool(bot), [(meta, text)]))
    return meta.id


async def _until(ws, entry: str) -> list[dict]:
    """Frames up to the one about `entry` (bounded: it is known to come)."""
    frames = []
    async with asyncio.timeout(30):
        while True:
            frames.append(json.loads(await ws.recv()))
            if (frames[-1].get("data") or {}).get("entry") == entry:
                return frames


def _second_bot(admin, world) -> str:
    """Another bot of alice's (its pool in the same shard log) that bob keeps reading."""
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": f"other {secrets.token_hex(3)}", "org": world.org,
                  "owner": world.users["alice"]},
        )
    )["id"]  # fmt: skip
    grant = {"bot": bot, "user": world.users["bob"], "permission": "read"}
    _ok(admin.post("/v1/admin/grants", json=grant))
    return bot


def test_a_revoked_grant_is_not_heard_after_the_revocation_returned(engine, admin, world, gateway):
    world.grant("bob", "read")
    other = _second_bot(admin, world)

    async def scenario():
        ws = await _open(gateway, world.tokens["bob"])
        try:
            before = await _write(engine, world, world.bot, "heard while granted")
            await _until(ws, before)  # the grant is in force on this socket
            r = await asyncio.to_thread(
                admin.delete, f"/v1/admin/bots/{world.bot}/grants/{world.users['bob']}"
            )
            assert r.status_code == 200, r.text
            after = await _write(engine, world, world.bot, "written after the revocation")
            control = await _write(engine, world, other, "still readable")
            frames = await _until(ws, control)
        finally:
            await ws.close()
        return after, frames

    after, frames = asyncio.run(scenario())
    assert [f["data"]["entry"] for f in frames if f["data"].get("bot") == world.bot] == []
    assert after not in json.dumps(frames)


def test_a_replaced_token_closes_its_open_socket(engine, admin, world, gateway):
    world.grant("bob", "read")

    async def scenario():
        ws = await _open(gateway, world.tokens["bob"])
        try:
            r = await asyncio.to_thread(admin.post, f"/v1/admin/users/{world.users['bob']}/token")
            assert r.status_code == 200, r.text
            await _write(engine, world, world.bot, "written after the replacement")
            try:
                async with asyncio.timeout(30):
                    frame = await ws.recv()
            except ConnectionClosed as e:
                return e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else ""
            pytest.fail(f"the socket of a replaced token got {frame}")
        finally:
            await ws.close()

    code, reason = asyncio.run(scenario())
    assert code == REVOKED == 4403 and "replaced" in reason


def test_a_grant_revoked_while_a_socket_authenticates_is_applied(
    engine, admin, world, gateway, monkeypatch
):
    """The revocation lands after the socket read its token but before it subscribed (nothing
    open to re-check yet): the socket reads its token again before it goes live."""
    import threading

    from gateway.fanout import Hub

    world.grant("bob", "read")
    other = _second_bot(admin, world)
    authenticated, go = threading.Event(), threading.Event()
    subscribe = Hub.subscribe

    async def held(self, listener, cursor, outlet):
        if not authenticated.is_set():
            authenticated.set()
            await asyncio.to_thread(go.wait, 30)
        return await subscribe(self, listener, cursor, outlet)

    monkeypatch.setattr(Hub, "subscribe", held)

    async def scenario():
        opening = asyncio.ensure_future(_open(gateway, world.tokens["bob"]))
        try:
            assert await asyncio.to_thread(authenticated.wait, 30)
            r = await asyncio.to_thread(
                admin.delete, f"/v1/admin/bots/{world.bot}/grants/{world.users['bob']}"
            )
            assert r.status_code == 200, r.text
        finally:
            go.set()
        ws = await opening
        try:
            await _write(engine, world, world.bot, "written after the revocation")
            control = await _write(engine, world, other, "still readable")
            return await _until(ws, control)
        finally:
            await ws.close()

    frames = asyncio.run(scenario())
    assert [f["data"]["entry"] for f in frames if f["data"].get("bot") == world.bot] == []


def test_a_socket_whose_access_cannot_be_read_again_is_closed(
    engine, admin, world, gateway, monkeypatch
):
    """Access changed and the socket's token cannot be read again (the directory fails for
    it): the socket is closed (1011) rather than kept on what it may no longer hear."""
    from engine.errors import Unavailable
    from gateway.auth import Auth

    world.grant("bob", "read")
    bob = world.tokens["bob"]
    principal_for = Auth.principal_for

    async def failing(self, token):
        if token == bob and failing.on:
            raise Unavailable("the directory is unavailable")
        return await principal_for(self, token)

    failing.on = False
    monkeypatch.setattr(Auth, "principal_for", failing)

    async def scenario():
        ws = await _open(gateway, bob)
        try:
            failing.on = True
            r = await asyncio.to_thread(
                admin.post,
                "/v1/admin/grants",
                json={"bot": world.bot, "user": world.users["carol"], "permission": "read"},
            )
            assert r.status_code == 201, r.text
            await _write(engine, world, world.bot, "written after the change")
            try:
                async with asyncio.timeout(30):
                    frame = await ws.recv()
            except ConnectionClosed as e:
                return e.rcvd.code if e.rcvd else None
            pytest.fail(f"the socket got {frame}")
        finally:
            await ws.close()

    assert asyncio.run(scenario()) == 1011
