"""The gateway's cache of who may do what (gateway/auth.py, actors/access_watch.py): two caching
gateways on one engine serve repeated requests without asking the directory, and a revoked
grant or token is never served by either once its revocation returned, with 32 requests in
flight around it."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

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
