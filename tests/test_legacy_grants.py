"""A grant across orgs left in an older directory (a bot works in its own org).

Such a row comes from a directory written without the org check on grants. It stays in the file;
nothing may honour it: `may_use`, the bots a token may use, the `/v1/bots` listing, the bot's
routes and the event stream all treat the bot as unknown to the grantee.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import msgspec

from actors.directory import DirectoryService
from engine.directory import Bot, Permission, User, may_use
from storage.directory_store import hash_token
from tests.conftest import ADMIN, LiveServer


def test_may_use_refuses_a_grant_from_another_org():
    bot = Bot(id="b1", name="B", org="o1", owner="u1", grants={"u2": Permission.READ})
    assert may_use(bot, User(id="u2", name="Mal", orgs=("o1",)))  # the control: same org
    assert not may_use(bot, User(id="u2", name="Mal", orgs=("o2",)))
    assert not may_use(bot, User(id="u2", name="Mal", orgs=()))


def _start(data_dir):
    from actors.runtime.engine import Engine
    from gateway.app import create_app

    engine = Engine.start(data_dir, shards=2, prefix="lgr")
    return engine, LiveServer(create_app(engine, ADMIN, cache_ttl=0.0))


def _ok(r: httpx.Response, code: int | None = None) -> dict:
    assert r.status_code == code if code else r.is_success, r.text
    return r.json()


def _write_legacy_grant(data_dir, bot_id: str, user_id: str) -> None:
    """The grant row as an older directory could hold it, written to the file directly (the
    directory's own writes refuse it). The engine is stopped: the file is free."""

    async def write() -> None:
        svc = DirectoryService(data_dir)
        try:
            bot = svc.records.bots[bot_id]
            legacy = msgspec.structs.replace(bot, grants={**bot.grants, user_id: Permission.READ})
            await svc.store.put("bots", legacy)
        finally:
            svc.store.db.close()

    asyncio.run(write())


def _stop(engine, server, data_dir) -> None:
    from actors.runtime.hosting import guard_store

    server.stop()
    engine.stop()
    # The directory's process lets go of its file's lock before the file is opened here.
    guard_store(data_dir, data_dir / "directory.duckdb", restarted=False, needs_key=False)


def test_a_legacy_cross_org_grant_exposes_the_bot_nowhere(tmp_path, ray_session):
    engine, server = _start(tmp_path)
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"})
    home = _ok(admin.post("/v1/admin/orgs", json={"name": "home"}))["id"]
    away = _ok(admin.post("/v1/admin/orgs", json={"name": "away"}))["id"]
    alice = _ok(admin.post("/v1/admin/users", json={"name": "alice", "orgs": [home, away]}))
    mal = _ok(admin.post("/v1/admin/users", json={"name": "mal", "orgs": [away]}))
    bot = _ok(
        admin.post("/v1/admin/bots", json={"name": "Home", "org": home, "owner": alice["id"]}),
    )["id"]
    # The control: a bot of the grantee's own org with a proper grant.
    control = _ok(
        admin.post("/v1/admin/bots", json={"name": "Away", "org": away, "owner": alice["id"]}),
    )["id"]
    body = {"bot": control, "user": mal["id"], "permission": "read"}
    _ok(admin.post("/v1/admin/grants", json=body))
    r = admin.post("/v1/admin/grants", json={**body, "bot": bot})
    assert r.status_code in (403, 404, 409, 422), r.text  # the directory refuses it today
    _stop(engine, server, tmp_path)

    _write_legacy_grant(tmp_path, bot, mal["id"])

    async def principal():
        svc = DirectoryService(tmp_path)
        try:
            # the row is there
            assert svc.records.bots[bot].grants.get(mal["id"]) == Permission.READ
            found = await svc.authenticate(hash_token(mal["token"]))
            listed = await svc.list_user_bots(mal["id"], None, 100)
            return found, listed
        finally:
            svc.store.db.close()

    found, listed = asyncio.run(principal())
    assert found is not None and found.bots == frozenset({control})
    assert [b.id for b in listed.items] == [control]

    engine, server = _start(tmp_path)
    try:
        headers = {"Authorization": f"Bearer {mal['token']}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
            ids = [b["id"] for b in _ok(c.get("/v1/bots"))["items"]]
            assert ids == [control]
            r = c.get(f"/v1/bots/{bot}/memory")
            assert r.status_code == 404 and r.json()["error"]["code"] == "bot_not_found"
            r = c.post("/v1/chats", json={"bot": bot})
            assert r.status_code == 404, r.text
            r = c.get("/api/app/workspace/memories", params={"scope": "bot"})
            assert _ok(r)["entries"] == []
        asyncio.run(_events_reach_only_the_grantees_org(server, alice, mal, bot, control))
    finally:
        _stop(engine, server, tmp_path)


async def _events_reach_only_the_grantees_org(server, alice, mal, bot, control) -> None:
    """The stream of the grantee carries the control bot's event and nothing of the other
    bot's, though both bots' events come from one shard in order (one owner)."""
    from websockets.asyncio.client import connect

    url = server.url.replace("http://", "ws://") + "/v1/events"
    headers = {"Authorization": f"Bearer {mal['token']}"}
    async with connect(url, additional_headers=headers) as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), 30))
        assert "cursor" in first, first

        def writes() -> None:
            ws_url = "/api/app/workspace/memories"
            a = {"Authorization": f"Bearer {alice['token']}"}
            with httpx.Client(base_url=server.url, headers=a, timeout=30) as c:
                body = {"requestId": "r1", "scope": "bot", "bot": bot, "content": "home only"}
                _ok(c.post(ws_url, json=body), 201)
            m = {"Authorization": f"Bearer {mal['token']}"}
            with httpx.Client(base_url=server.url, headers=m, timeout=30) as c:
                remember = {"command": {"_tag": "Remember", "content": "mine"}}
                _ok(c.post(f"/v1/bots/{control}/memory", json=remember), 201)

        await asyncio.to_thread(writes)
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert f"bot:{bot}" not in json.dumps(frame), frame
            if frame.get("data", {}).get("pool") == f"bot:{control}":
                break
