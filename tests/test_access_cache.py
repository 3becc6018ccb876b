"""The gateway's cache of who may do what (gateway/auth.py, actors/access_watch.py): two caching
gateways on one engine serve repeated requests without asking the directory, and a revoked
grant or token is never served by either once its revocation returned, with 32 requests in
flight around it."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from actors.access_watch import ACK_WAIT
from gateway.app import create_app
from gateway.live_server import LiveServer
from tests.conftest import ADMIN, count_gateway_calls

IN_FLIGHT = 32


@pytest.fixture(scope="module")
def gateways(engine):
    """Two gateways that cache (as `openbot serve` does), beside the tests' uncached one."""
    live = [LiveServer(create_app(engine, ADMIN, cache_ttl=60.0)) for _ in range(2)]
    yield live
    for g in live:
        g.stop()


@pytest.fixture
def counted(monkeypatch, engine):
    return count_gateway_calls(monkeypatch, engine)


async def _get(client: httpx.AsyncClient, path: str, token: str) -> tuple[float, int]:
    """(when the request started, its status)."""
    started = time.monotonic()
    r = await client.get(path, headers={"Authorization": f"Bearer {token}"})
    return started, r.status_code


async def _around(gateways, path: str, token: str, revoke) -> tuple[float, list]:
    """IN_FLIGHT requests spread over both gateways while `revoke` runs, then IN_FLIGHT more;
    returns when the revocation returned and every (start, status, gateway)."""
    clients = [httpx.AsyncClient(base_url=g.url, timeout=60) for g in gateways]
    try:
        for c in clients:  # warm: the principal and the bot are cached on both
            for _ in range(3):
                assert (await _get(c, path, token))[1] == 200

        async def one(k: int):
            await asyncio.sleep(0.002 * k)
            started, status = await _get(clients[k % 2], path, token)
            return started, status, k % 2

        during = [asyncio.ensure_future(one(k)) for k in range(IN_FLIGHT)]
        await asyncio.sleep(0.01)
        await revoke()
        revoked = time.monotonic()
        after = [asyncio.ensure_future(one(k)) for k in range(IN_FLIGHT)]
        return revoked, [*await asyncio.gather(*during), *await asyncio.gather(*after)]
    finally:
        for c in clients:
            await c.aclose()


def _check(revoked: float, results: list, denied: int) -> None:
    assert all(status in (200, denied) for _, status, _ in results), results
    late = [(status, g) for started, status, g in results if started > revoked]
    assert len(late) >= IN_FLIGHT
    assert all(status == denied for status, _ in late), late  # never served once revoked
    assert {g for started, _, g in results if started > revoked} == {0, 1}  # both gateways


def test_cached_requests_ask_the_directory_nothing(world, gateways, counted):
    world.grant("bob", "read")
    path = f"/v1/bots/{world.bot}/memory"
    with httpx.Client(base_url=gateways[0].url, timeout=30) as c:
        headers = {"Authorization": f"Bearer {world.tokens['bob']}"}
        assert c.get(path, headers=headers).status_code == 200
        time.sleep(0.2)  # the watch has answered once: the cache is trusted
        assert c.get(path, headers=headers).status_code == 200
        counted.clear()
        for _ in range(20):
            assert c.get(path, headers=headers).status_code == 200
    assert counted["authenticate_at"] == 0 and counted["bot_at"] == 0, counted


def test_a_revoked_grant_is_never_served_once_the_revocation_returned(world, gateways, admin):
    world.grant("bob", "read")
    bob = world.users["bob"]

    async def revoke():
        async with httpx.AsyncClient(base_url=gateways[0].url, timeout=60) as a:
            r = await a.delete(
                f"/v1/admin/bots/{world.bot}/grants/{bob}",
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert r.status_code == 200, r.text
            assert r.json() == {"bot": world.bot, "user": bob, "revoked": True}

    revoked, results = asyncio.run(
        _around(gateways, f"/v1/bots/{world.bot}/memory", world.tokens["bob"], revoke)
    )
    _check(revoked, results, 403)
    r = admin.delete(f"/v1/admin/bots/{world.bot}/grants/{bob}")  # nothing left to take
    assert r.status_code == 404 and r.json()["error"]["code"] == "grant_not_found"


def test_a_replaced_token_is_never_served_once_the_new_one_was_issued(world, gateways, admin):
    old = world.tokens["alice"]
    new: list[str] = []

    async def revoke():
        async with httpx.AsyncClient(base_url=gateways[1].url, timeout=60) as a:
            r = await a.post(
                f"/v1/admin/users/{world.users['alice']}/token",
                headers={"Authorization": f"Bearer {ADMIN}"},
            )
            assert r.status_code == 200, r.text
            new.append(r.json()["token"])

    revoked, results = asyncio.run(_around(gateways, "/v1/me", old, revoke))
    _check(revoked, results, 401)
    for g in gateways:
        with httpx.Client(base_url=g.url, timeout=30) as c:
            me = c.get("/v1/me", headers={"Authorization": f"Bearer {new[0]}"})
            assert me.status_code == 200 and me.json()["id"] == world.users["alice"]
    assert admin.post("/v1/admin/users/u_nobody_here/token").status_code == 404


# --- turn contexts (gateway/auth.py `context`): cached in parts at the access revision ---


def _headers(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_turns_in_known_chats_ask_the_directory_nothing(world, gateways, counted):
    """A turn's context (chat, org, bot) comes from the cache: later turns of a chat, and the
    first turn of a new chat with a bot already seen, cost no directory call."""
    world.grant("bob", "read")
    bob = _headers(world.tokens["bob"])
    with httpx.Client(base_url=gateways[0].url, timeout=30, headers=bob) as c:
        first = c.post("/v1/chats", json={"bot": world.bot}).json()["id"]
        time.sleep(0.2)  # the watch has answered once: the cache is trusted
        assert c.post(f"/v1/chats/{first}/turns", json={"text": "hi"}).status_code == 202
        second = c.post("/v1/chats", json={"bot": world.bot}).json()["id"]
        counted.clear()
        for chat in (first, first, second, second):
            assert c.post(f"/v1/chats/{chat}/turns", json={"text": "hi"}).status_code == 202
    assert counted["chat_context_at"] == 0 and counted["chat_context"] == 0, counted
    assert counted["start_turn"] == 4


async def _turns_around(gateways, chats: list[str], token: str, change) -> tuple[float, list]:
    """IN_FLIGHT turns spread over both gateways (`chats[g]` on gateway g) while `change` runs,
    then IN_FLIGHT more; (when the change returned, every (start, status, gateway))."""
    clients = [
        httpx.AsyncClient(base_url=g.url, timeout=60, headers=_headers(token)) for g in gateways
    ]

    async def turn(k: int) -> tuple[float, int, int]:
        g = k % 2
        started = time.monotonic()
        r = await clients[g].post(f"/v1/chats/{chats[g]}/turns", json={"text": f"t{k}"})
        return started, r.status_code, g

    try:
        for k in range(4):  # warm: each gateway holds the chat's context
            assert (await turn(k))[1] == 202

        async def one(k: int):
            await asyncio.sleep(0.002 * k)
            return await turn(k)

        during = [asyncio.ensure_future(one(k)) for k in range(IN_FLIGHT)]
        await asyncio.sleep(0.01)
        await change()
        changed = time.monotonic()
        after = [asyncio.ensure_future(one(k)) for k in range(IN_FLIGHT)]
        return changed, [*await asyncio.gather(*during), *await asyncio.gather(*after)]
    finally:
        for c in clients:
            await c.aclose()


class SlowWatch:
    """The directory port, except that news of a change reaches the gateways' watches 0.3 s
    late: a gateway that served turns from its cache without waiting for the change to be
    applied everywhere would serve the old record meanwhile."""

    def __init__(self, port) -> None:
        self._port = port

    def __getattr__(self, name: str):
        return getattr(self._port, name)

    async def watch_access(self, watcher: str, since: int, wait: float = 5.0):
        revision, changed = await self._port.watch_access(watcher, since, wait)
        if revision != since:
            await asyncio.sleep(0.3)
        return revision, changed


def _bobs_chats(world, gateways, engine, monkeypatch) -> list[str]:
    monkeypatch.setattr(engine, "directory_port", SlowWatch(engine.directory_port))
    world.grant("bob", "write")
    chats = []
    for g in gateways:
        with httpx.Client(base_url=g.url, timeout=30) as c:
            r = c.post("/v1/chats", json={"bot": world.bot}, headers=_headers(world.tokens["bob"]))
            assert r.status_code == 201, r.text
            chats.append(r.json()["id"])
    time.sleep(0.6)  # both watches have answered (slowly): the caches are trusted
    return chats


def test_a_revoked_grant_takes_no_turn_once_the_revocation_returned(
    world, gateways, engine, monkeypatch
):
    chats = _bobs_chats(world, gateways, engine, monkeypatch)
    bob = world.users["bob"]

    async def revoke():
        async with httpx.AsyncClient(base_url=gateways[0].url, timeout=60) as a:
            r = await a.delete(f"/v1/admin/bots/{world.bot}/grants/{bob}", headers=_headers(ADMIN))
            assert r.status_code == 200, r.text

    changed, results = asyncio.run(_turns_around(gateways, chats, world.tokens["bob"], revoke))
    assert all(status in (202, 403) for _, status, _ in results), results
    late = [(status, g) for started, status, g in results if started > changed]
    assert len(late) >= IN_FLIGHT and {g for _, g in late} == {0, 1}
    assert all(status == 403 for status, _ in late), late


def test_an_archived_bot_takes_no_turn_once_the_archive_returned(
    world, gateways, engine, monkeypatch
):
    """Archiving changes no one's access, but a turn's context holds the bot: the change
    returns only once both gateways dropped what they held (actors/directory/records.py
    `changing`)."""
    chats = _bobs_chats(world, gateways, engine, monkeypatch)

    async def archive():
        async with httpx.AsyncClient(base_url=gateways[1].url, timeout=60) as a:
            r = await a.post(
                f"/api/app/workspace/bots/{world.bot}/archive",
                json={"archived": True},
                headers=_headers(world.tokens["alice"]),
            )
            assert r.status_code == 200, r.text

    changed, results = asyncio.run(_turns_around(gateways, chats, world.tokens["bob"], archive))
    assert all(status in (202, 409) for _, status, _ in results), results
    late = [(status, g) for started, status, g in results if started > changed]
    assert len(late) >= IN_FLIGHT and {g for _, g in late} == {0, 1}
    assert all(status == 409 for status, _ in late), late


def test_a_stopped_gateway_is_not_waited_for(world, admin, engine):
    """A caching gateway that stops leaves the directory's watch: a revocation right after
    returns at once, not after waiting for the gone gateway's acknowledgement (ACK_WAIT)."""
    world.grant("bob", "read")
    gone = LiveServer(create_app(engine, ADMIN, cache_ttl=60.0))
    try:
        with httpx.Client(base_url=gone.url, timeout=30) as c:
            headers = {"Authorization": f"Bearer {world.tokens['bob']}"}
            assert c.get(f"/v1/bots/{world.bot}/memory", headers=headers).status_code == 200
    finally:
        gone.stop()
    started = time.monotonic()
    r = admin.delete(f"/v1/admin/bots/{world.bot}/grants/{world.users['bob']}")
    assert r.status_code == 200, r.text
    assert time.monotonic() - started < ACK_WAIT / 2
