"""Check-then-act under 24 concurrent requests: every revisioned or unique write has
exactly one winner and a 409 for the others, idempotent opens give everyone the same answer,
and no acknowledged edit is lost. Real server, real actors, real DuckDB files; the requests are
sent at once from one asyncio loop."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import Counter

import httpx
import pytest

from tests.conftest import ADMIN
from tests.openai_stub import completion

N = 24
WS = "/api/app/workspace"


async def burst(url: str, token: str, requests: list[tuple[str, str, dict | None]]) -> list:
    """Send every request at once (one connection each) and return the responses in order."""
    limits = httpx.Limits(max_connections=len(requests), max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as c:
        return await asyncio.gather(
            *(c.request(method, path, json=body) for method, path, body in requests)
        )


def codes(responses) -> Counter:
    return Counter(
        (r.status_code, r.json()["error"]["code"] if r.status_code >= 400 else None)
        for r in responses
    )


def one_winner(responses, won: int, lost: str) -> httpx.Response:
    """Exactly one `won` answer and a 409 `lost` for all the others; returns the winner."""
    assert codes(responses) == Counter({(won, None): 1, (409, lost): len(responses) - 1}), [
        (r.status_code, r.text[:200]) for r in responses
    ]
    return next(r for r in responses if r.status_code == won)


# --- bots' rules -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_rules_edits_naming_one_revision_have_one_winner(world):
    url, path = world.server.url, f"{WS}/bots/{world.bot}/rules"
    with world.client("alice") as alice:
        revision = alice.get(path).json()["revision"]
    edits = [
        ("PATCH", path, {"expectedRevision": revision, "description": f"edit {k}"})
        for k in range(N)
    ]
    winner = one_winner(await burst(url, world.tokens["alice"], edits), 200, "stale_revision")
    with world.client("alice") as alice:
        now = alice.get(path).json()
    assert now["revision"] == revision + 1
    assert now["rules"]["description"] == winner.json()["rules"]["description"]


@pytest.mark.anyio
async def test_no_acknowledged_rules_edit_is_lost(world):
    """24 editors, each retrying on 409 until its edit is in: 24 acknowledgements, each with a
    revision of its own, and the last state is the last acknowledged one."""
    url, path = world.server.url, f"{WS}/bots/{world.bot}/rules"

    async def editor(c: httpx.AsyncClient, k: int) -> dict:
        while True:
            current = (await c.get(path)).json()
            body = {"expectedRevision": current["revision"], "duties": f"duty {k}"}
            r = await c.patch(path, json=body)
            if r.status_code == 200:
                return r.json()
            assert r.status_code == 409 and r.json()["error"]["code"] == "stale_revision"

    headers = {"Authorization": f"Bearer {world.tokens['alice']}"}
    limits = httpx.Limits(max_connections=N)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as c:
        start = (await c.get(path)).json()["revision"]
        acks = await asyncio.gather(*(editor(c, k) for k in range(N)))
        final = (await c.get(path)).json()
    revisions = sorted(a["revision"] for a in acks)
    assert revisions == list(range(start + 1, start + N + 1))
    last = max(acks, key=lambda a: a["revision"])
    assert final["revision"] == start + N and final["rules"]["duties"] == last["rules"]["duties"]


@pytest.mark.anyio
async def test_self_rules_tool_naming_one_revision_has_one_winner(world, admin, bot_model):
    """The bot's own `workspace_update_self_rules`, called in 24 chats at once with one
    `expectedRevision`: one change, 23 stale answers to the model, revision + 1."""
    name = "Selfie" + secrets.token_hex(3)
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
    ).json()["id"]
    results: list[dict] = []

    def route(body):
        if not body["messages"][0]["content"].startswith(f"You are {name}."):
            return None
        last = body["messages"][-1]
        if last["role"] == "tool":
            results.append(json.loads(last["content"]))
            return completion("done")
        k = last["content"]
        args = {"expectedRevision": 1, "description": f"set in {k}"}
        return completion(tool_calls=[("workspace_update_self_rules", args)])

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chats = [alice.post("/v1/chats", json={"bot": bot}).json()["id"] for _ in range(N)]
    turns = [
        ("POST", f"/v1/chats/{chat}/turns?wait=true", {"text": f"chat-{k}"})
        for k, chat in enumerate(chats)
    ]
    answers = await burst(world.server.url, world.tokens["alice"], turns)
    assert all(r.status_code == 200 for r in answers), [r.text[:200] for r in answers]
    assert len(results) == N
    assert Counter(r.get("error") for r in results) == Counter({None: 1, "stale_revision": N - 1})
    won = next(r for r in results if r.get("error") is None)
    with world.client("alice") as alice:
        now = alice.get(f"{WS}/bots/{bot}/rules").json()
    assert now["revision"] == 2 and now["rules"]["description"] == won["rules"]["description"]


# --- chats ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_opens_of_a_channel_get_one_group_chat(world, admin):
    channel = admin.post(
        "/v1/admin/channels",
        json={"org": world.org, "people": list(world.users.values()), "bots": [world.bot]},
    ).json()["id"]
    names = list(world.users)
    by_user = {name: [] for name in names}
    for k in range(N):
        by_user[names[k % len(names)]].append(k)

    async def opener(name: str, count: int):
        headers = {"Authorization": f"Bearer {world.tokens[name]}"}
        async with httpx.AsyncClient(base_url=world.server.url, headers=headers, timeout=60) as c:
            return await asyncio.gather(
                *(c.post("/v1/chats", json={"channel": channel}) for _ in range(count))
            )

    parts = await asyncio.gather(*(opener(n, len(ks)) for n, ks in by_user.items()))
    answers = [r for part in parts for r in part]
    assert all(r.is_success for r in answers), [r.text for r in answers]
    assert len({r.json()["id"] for r in answers}) == 1


# --- explicit ids in the admin API -----------------------------------------------------------


async def _admin_creates(server, path: str, body: dict) -> list:
    return await burst(server.url, ADMIN, [("POST", path, body)] * N)


@pytest.mark.anyio
async def test_one_explicit_org_id_has_one_winner(server):
    oid = "o_race" + secrets.token_hex(4)
    one_winner(
        await _admin_creates(server, "/v1/admin/orgs", {"id": oid, "name": "x"}), 201, "exists"
    )


@pytest.mark.anyio
async def test_one_explicit_user_id_has_one_winner_and_one_token(server, world):
    uid = "u_race" + secrets.token_hex(4)
    body = {"id": uid, "name": "racer", "orgs": [world.org]}
    answers = await _admin_creates(server, "/v1/admin/users", body)
    winner = one_winner(answers, 201, "exists")
    token = winner.json()["token"]
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    ) as c:
        assert c.get(f"{WS}/projects").status_code == 200


@pytest.mark.anyio
async def test_one_explicit_bot_id_has_one_winner(server, world):
    bid = "b_race" + secrets.token_hex(4)
    body = {"id": bid, "name": "r", "org": world.org, "owner": world.users["alice"]}
    winner = one_winner(await _admin_creates(server, "/v1/admin/bots", body), 201, "exists")
    assert winner.json()["id"] == bid


@pytest.mark.anyio
async def test_one_explicit_channel_id_has_one_winner(server, world):
    cid = "c_race" + secrets.token_hex(4)
    body = {"id": cid, "org": world.org, "people": [world.users["alice"]], "bots": []}
    one_winner(await _admin_creates(server, "/v1/admin/channels", body), 201, "exists")


@pytest.mark.anyio
async def test_concurrent_org_patches_are_all_kept(server, admin):
    """Each patch merges one key into the current settings; three patches of three keys sent at
    once to each of 24 orgs: every org ends with all three."""
    orgs = [admin.post("/v1/admin/orgs", json={"name": f"p{k}"}).json()["id"] for k in range(N)]
    keys = [{"botMemory": False}, {"autoRecord": True}, {"botMemoryModel": "mem"}]
    patches = [
        ("PATCH", f"/v1/admin/orgs/{oid}", {"settings": key}) for oid in orgs for key in keys
    ]
    answers = await burst(server.url, ADMIN, patches)
    assert all(r.status_code == 200 for r in answers)
    for oid in orgs:
        now = admin.patch(f"/v1/admin/orgs/{oid}", json={"settings": {}}).json()["settings"]
        assert now == {
            "botMemory": False,
            "autoRecord": True,
            "botMemoryModel": "mem",
            "collaboration": True,  # untouched by these patches (WS-1's default)
        }, oid


@pytest.mark.anyio
async def test_concurrent_grants_to_one_bot_are_all_kept(server, world, admin):
    """Each grant rewrites the bot's record: without compare-and-set, concurrent grants to
    different people lose each other."""
    users = [
        admin.post("/v1/admin/users", json={"name": f"g{k}", "orgs": [world.org]}).json()
        for k in range(N)
    ]
    grants = [
        ("POST", "/v1/admin/grants", {"bot": world.bot, "user": u["id"], "permission": "read"})
        for u in users
    ]
    assert all(r.status_code == 201 for r in await burst(server.url, ADMIN, grants))
    for u in users:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {u['token']}"}, timeout=30
        ) as c:
            assert c.get(f"/v1/bots/{world.bot}/memory").status_code == 200


# --- workspace projects and memories ---------------------------------------------------------


@pytest.mark.anyio
async def test_one_explicit_project_id_has_one_winner(world):
    key = "p_race" + secrets.token_hex(4)
    creates = [
        ("POST", f"{WS}/projects", {"requestId": f"r{k}", "id": key, "name": f"P{k}"})
        for k in range(N)
    ]
    one_winner(await burst(world.server.url, world.tokens["alice"], creates), 201, "exists")
    with world.client("alice") as alice:
        assert len(alice.get(f"{WS}/projects").json()["projects"]) == 1


@pytest.mark.anyio
async def test_one_request_id_makes_one_project(world):
    body = {"requestId": "same-" + secrets.token_hex(4), "name": "Once"}
    answers = await burst(
        world.server.url, world.tokens["alice"], [("POST", f"{WS}/projects", body)] * N
    )
    assert all(r.status_code == 201 for r in answers)
    assert len({r.json()["id"] for r in answers}) == 1


@pytest.mark.anyio
async def test_project_changes_naming_one_revision_have_one_winner(world):
    with world.client("alice") as alice:
        p = alice.post(f"{WS}/projects", json={"requestId": "c0", "name": "Base"}).json()
    changes = [
        (
            "POST",
            f"{WS}/projects",
            {
                "requestId": f"c{k + 1}",
                "id": p["id"],
                "expectedRevision": 1,
                "name": f"N{k}",
                # New members are looked up in the directory: an await between the revision
                # check and the write, which only the project lock keeps others out of.
                "members": [world.users["alice"], world.users["bob"]],
            },
        )
        for k in range(N)
    ]
    winner = one_winner(
        await burst(world.server.url, world.tokens["alice"], changes), 200, "stale_revision"
    )
    with world.client("alice") as alice:
        (now,) = alice.get(f"{WS}/projects").json()["projects"]
    assert now["revision"] == 2 and now["name"] == winner.json()["name"]


@pytest.mark.anyio
async def test_memory_changes_naming_one_revision_have_one_winner(world):
    with world.client("alice") as alice:
        entry = alice.post(
            f"{WS}/memories",
            json={"requestId": "m0", "scope": "bot", "bot": world.bot, "content": "base"},
        ).json()
    changes = [
        (
            "POST",
            f"{WS}/memories",
            {
                "requestId": f"m{k + 1}",
                "id": entry["id"],
                "expectedRevision": entry["revision"],
                "content": f"change {k}",
            },
        )
        for k in range(N)
    ]
    one_winner(await burst(world.server.url, world.tokens["alice"], changes), 200, "stale_revision")


@pytest.mark.anyio
async def test_forgets_naming_one_revision_have_one_winner(world):
    with world.client("alice") as alice:
        entry = alice.post(
            f"{WS}/memories",
            json={"requestId": "f0", "scope": "bot", "bot": world.bot, "content": "forget me"},
        ).json()
    forgets = [
        (
            "POST",
            f"{WS}/memories/forget",
            {"requestId": f"f{k + 1}", "id": entry["id"], "expectedRevision": entry["revision"]},
        )
        for k in range(N)
    ]
    one_winner(await burst(world.server.url, world.tokens["alice"], forgets), 200, "stale_revision")


@pytest.mark.anyio
async def test_memory_bot_settings_naming_one_version_have_one_winner(world):
    path = f"/v1/bots/{world.bot}/memory/bot"
    with world.client("alice") as alice:
        version = alice.get(path).json()["version"]
    patches = [("PATCH", path, {"expected": version, "instructions": f"i{k}"}) for k in range(N)]
    one_winner(
        await burst(world.server.url, world.tokens["alice"], patches), 200, "version_mismatch"
    )
    with world.client("alice") as alice:
        assert alice.get(path).json()["version"] == version + 1


@pytest.mark.anyio
async def test_one_request_id_remembers_once(world):
    path = f"/v1/bots/{world.bot}/memory"
    body = {
        "requestId": "rem-" + secrets.token_hex(4),
        "command": {"_tag": "Remember", "content": "x"},
    }
    answers = await burst(world.server.url, world.tokens["alice"], [("POST", path, body)] * N)
    assert all(r.status_code == 201 for r in answers), [r.text for r in answers]
    assert len({r.json()["id"] for r in answers}) == 1
    with world.client("alice") as alice:
        assert len(alice.get(path).json()["entries"]) == 1


# --- the directory service itself (the calls shards make: the bot's own tool, projects) -------


@pytest.mark.anyio
async def test_self_rules_calls_naming_one_revision_have_one_winner(directory):
    """What `workspace_update_self_rules` calls on the directory, 24 at once: one change."""
    from engine.errors import Conflict
    from engine.self_rules import Editor, RulesUpdate

    svc = directory
    org = await svc.create_org("o")
    user, _ = await svc.create_user("u", [org.id])
    bot = await svc.create_bot(name="b", org=org.id, owner=user.id)
    me = Editor(kind="self", id=bot.id)
    answers = await asyncio.gather(
        *(
            svc.update_rules(bot.id, RulesUpdate(expectedRevision=1, tone=f"t{k}"), me)
            for k in range(N)
        ),
        return_exceptions=True,
    )
    won = [a for a in answers if not isinstance(a, BaseException)]
    assert len(won) == 1 and won[0].revision == 2
    assert all(
        isinstance(a, Conflict) and a.code == "stale_revision" for a in answers if a not in won
    )


@pytest.mark.anyio
async def test_one_project_id_registers_one_owner(directory):
    """Shards register the projects they create; one id from 24 accounts at once: one owner."""
    from engine.errors import Conflict

    svc = directory
    answers = await asyncio.gather(
        *(svc.register_project("p_one", f"u_{k}") for k in range(N)), return_exceptions=True
    )
    owners = [a for a in answers if isinstance(a, str)]
    assert len(owners) == 1
    assert all(isinstance(a, Conflict) for a in answers if not isinstance(a, str))
    assert await svc.project_owner("p_one") == owners[0]
