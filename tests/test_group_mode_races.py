"""A group's mode switch is atomic with respect to its turns (WS-6): the shard that
keeps the group's chat checks that it is idle and switches under the chat's turn lock, and a
turn re-reads the mode under that lock. So a turn never runs in a mode the group has left, and
no switch lands while a turn runs. Real server and actors; the bots' model is a loopback stub
that answers slowly, so a turn is surely running while the switches arrive."""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx
import pytest

from tests.openai_stub import completion

N = 24
WS = "/api/app/workspace"
SLOW = 0.6  # seconds per model answer: a turn outlasts a burst of switches
ROUNDS = 8
STAGGER = 0.003  # seconds between the sends of one burst


@pytest.fixture
def slow_group(world, admin, model_stubs):
    tag = "M" + secrets.token_hex(3)
    stub = model_stubs["bot"]
    stub.routes.append(
        lambda body: (
            ("delay", SLOW, completion("ok"))
            if body["messages"][0]["content"].startswith(f"You are {tag}")
            else None
        )
    )
    bots = [
        admin.post(
            "/v1/admin/bots",
            json={
                "name": f"{tag}{k}",
                "org": world.org,
                "owner": world.users["alice"],
                "model": "bot",
            },
        ).json()["id"]
        for k in range(2)
    ]
    channel = admin.post(
        "/v1/admin/channels",
        json={"org": world.org, "people": list(world.users.values()), "bots": bots},
    ).json()["id"]
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"channel": channel}).json()["id"]
    yield world, channel, chat, bots
    stub.routes.clear()


def _client(world) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=world.server.url,
        headers={"Authorization": f"Bearer {world.tokens['alice']}"},
        timeout=120,
        limits=httpx.Limits(max_connections=2 * N),
    )


def _switch(channel: str, mode: str, leader: str | None) -> tuple[str, dict]:
    body: dict = {"mode": mode} | ({"leader": leader} if leader else {})
    return f"{WS}/groups/{channel}/mode", body


async def _wait_idle(c: httpx.AsyncClient, channel: str, mode: str, leader: str | None) -> None:
    """Switch to `mode` as soon as the group is idle (409 group_busy until then)."""
    path, body = _switch(channel, mode, leader)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        r = await c.post(path, json=body)
        if r.status_code == 200:
            return
        assert r.status_code == 409 and r.json()["error"]["code"] == "group_busy", r.text
        await asyncio.sleep(0.1)
    raise AssertionError("the group never became idle")


@pytest.mark.anyio
async def test_no_switch_while_a_turn_runs(slow_group):
    world, channel, chat, bots = slow_group

    async with _client(world) as c:
        r = await c.post(f"/v1/chats/{chat}/turns", json={"text": "work on it"})
        assert r.status_code == 202, r.text
        path, body = _switch(channel, "delivery", bots[0])
        answers = await asyncio.gather(*(c.post(path, json=body) for _ in range(N)))
        group = await c.get(f"{WS}/bots/{bots[0]}/rules")  # any read, the group is unchanged
        assert group.status_code == 200
        await _wait_idle(c, channel, "discussion", None)
    assert [(r.status_code, r.json()["error"]["code"]) for r in answers] == [
        (409, "group_busy")
    ] * N


@pytest.mark.anyio
async def test_a_turn_never_runs_in_a_mode_the_group_left(slow_group):
    """One turn posted in the middle of 24 switches to delivery, again and again: when any
    switch was acknowledged, the turn ran as a delivery goal (it started after the switch);
    when the turn ran as a discussion, no switch was acknowledged (they all met a busy
    group)."""
    world, channel, chat, bots = slow_group

    async def once(c: httpx.AsyncClient) -> tuple[int, str | None]:
        path, body = _switch(channel, "delivery", bots[0])

        async def later(k: int, send):
            await asyncio.sleep(k * STAGGER)  # spread over the moment the turn starts
            return await send()

        switches = [later(k, lambda: c.post(path, json=body)) for k in range(N)]
        turn = later(
            N // 2, lambda: c.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "go"})
        )
        answers = await asyncio.gather(*switches[: N // 2], turn, *switches[N // 2 :])
        turn_answer = answers.pop(N // 2)
        assert turn_answer.status_code == 200, turn_answer.text
        for r in answers:
            assert r.status_code == 200 or (
                r.status_code == 409 and r.json()["error"]["code"] == "group_busy"
            ), r.text
        switched = sum(r.status_code == 200 for r in answers)
        goal = turn_answer.json()["turn"].get("goal")
        await _wait_idle(c, channel, "discussion", None)
        return switched, goal

    async with _client(world) as c:
        outcomes = [await once(c) for _ in range(ROUNDS)]
    for switched, goal in outcomes:
        assert (switched > 0) == (goal == "delivering"), (switched, goal)


@pytest.mark.anyio
async def test_a_turn_waits_for_a_switch_under_way(shards, tmp_path):
    """Deterministic interleaving on one shard (no Ray): a switch that found the group idle
    holds the chat's turn lock until the directory has stored the new mode, so a turn asked
    for meanwhile starts after it, in the new mode, even though its caller read the old one."""
    from actors.contracts import TurnStart
    from actors.models.registry import ScriptedModel

    script = tmp_path / "script.toml"
    script.write_text('default = "ok"\n')

    svc = shards(models={"talk": ScriptedModel.from_file("talk", script)}, directory=True)
    d = shards.directory_service()
    org = await d.create_org("o")
    user, _ = await d.create_user("u", [org.id])
    bots = [
        await d.create_bot(name=f"B{k}", org=org.id, owner=user.id, model="talk") for k in range(2)
    ]
    channel = await d.create_channel(org=org.id, people=[user.id], bots=[b.id for b in bots])
    chat = await d.group_chat(channel.id)
    async with d.records.lock:  # the directory is slow to store the switch
        switch = asyncio.create_task(
            svc.switch_group_mode(chat.id, channel.id, "delivery", bots[0].id)
        )
        await asyncio.sleep(0.05)
        start = TurnStart(
            chat=chat,
            bot=None,
            org=org,
            operator=user.id,
            text="go",
            channel=channel,  # read before the switch: discussion
            members=tuple(bots),
        )
        turn = asyncio.create_task(svc.start_turn(start))
        await asyncio.sleep(0.05)
        assert not turn.done()  # it waits for the switch
    switched = await switch
    started = await turn
    assert switched.mode == "delivery"
    assert started.goal == "delivering"
    result = await svc.wait_turn(chat.id, started.id)
    assert result.turn.status == "done"


@pytest.mark.anyio
async def test_one_verdict_per_delivered_result(slow_group):
    """24 people's verdicts on one delivered result at once: one is recorded, the others get
    409 `already_decided`."""
    world, channel, chat, bots = slow_group

    async with _client(world) as c:
        await _wait_idle(c, channel, "delivery", bots[0])
        r = await c.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "deliver"})
        assert r.status_code == 200 and r.json()["turn"]["goal"] == "delivering", r.text
        path = f"/v1/chats/{chat}/turns/{r.json()['turn']['id']}/verdict"
        answers = await asyncio.gather(
            *(c.post(path, json={"accepted": True, "note": f"n{k}"}) for k in range(N))
        )
    got = sorted((r.status_code, r.json().get("error", {}).get("code")) for r in answers)
    assert got == [(200, None)] + [(409, "already_decided")] * (N - 1), got
