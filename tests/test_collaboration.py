"""Collaboration chains and self-rules end to end (WS-2 … WS-4, CO-1, UI-1): real HTTP, the
bots' model served on loopback, bots of different people (so different shards)."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import threading
import time

import pytest
import ray

from engine.errors import Forbidden
from engine.self_rules import Editor, RulesUpdate
from gateway.client import EventClient
from tests.openai_stub import bot_of, completion

WS = "/api/app/workspace"


def _last(body) -> dict:
    return body["messages"][-1]


def _bots(world, admin, *names):
    tag = secrets.token_hex(3)
    owners = list(world.users.values())
    out = {}
    for k, n in enumerate(names):
        out[n] = admin.post(
            "/v1/admin/bots",
            json={
                "name": f"{n}{tag}",
                "org": world.org,
                "owner": owners[(k + 1) % len(owners)],
                "model": "bot",
            },
        ).json()
    for b in out.values():  # alice uses every bot
        if b["owner"] != world.users["alice"]:
            admin.post(
                "/v1/admin/grants",
                json={"bot": b["id"], "user": world.users["alice"], "permission": "read"},
            )
    return out


def _chains(client) -> list[dict]:
    r = client.get(f"{WS}/collaboration")
    if r.status_code == 503:  # a shard is restarting: ask again
        return []
    assert r.status_code == 200, r.text
    return r.json()["items"]


def _wait_chain(client, chat_id, until, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in _chains(client):
            if c["rootChat"] == chat_id and until(c):
                return c
        time.sleep(0.05)
    raise AssertionError(f"chain of {chat_id} never reached the state: {_chains(client)}")


def _wait_items(client, chat_id, n, timeout=20.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = client.get(f"/v1/chats/{chat_id}/items").json()["items"]
        if len(items) >= n:
            return items
        time.sleep(0.05)
    raise AssertionError(f"chat {chat_id} has {items}")


@pytest.mark.anyio
async def test_a_send_returns_a_receipt_and_the_reply_wakes_the_sender(world, admin, bot_model):
    bots = _bots(world, admin, "Asker", "Helper")
    asker, helper = bots["Asker"], bots["Helper"]

    def route(body):
        name, last = bot_of(body), _last(body)
        if name == asker["name"]:
            if last["role"] == "tool":
                return completion("I asked my colleague.")
            if "[delivery from" in str(last["content"]):
                return completion("My colleague says the build is green.")
            msg = {"agent": helper["name"], "message": "Is the build green?"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == helper["name"]:
            return completion("Yes, the build is green.")
        return None

    bot_model.routes.append(route)

    events = EventClient(world.server.url, world.tokens["alice"])
    it = aiter(events)
    first = asyncio.ensure_future(it.__anext__())
    await asyncio.sleep(0.3)  # connected and live before the turn
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": asker["id"]}).json()
        r = await asyncio.to_thread(
            alice.post, f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Check CI"}
        )
        assert r.status_code == 200, r.text
        turn_items = r.json()["items"]
        # The turn's items: the person's, the reply, and what the bot sent (UI-1).
        assert [i["kind"] for i in turn_items] == ["person", "bot", "delivery"]
        assert turn_items[2]["communication"]["direction"] == "sent"
        # The receipt came back at once, in the same step.
        tool_msgs = [
            m
            for b in bot_model.requests
            if bot_of(b) == asker["name"]
            for m in b["messages"]
            if m["role"] == "tool"
        ]
        assert tool_msgs and '"receipt":"dlv_' in tool_msgs[-1]["content"]
        chain = await asyncio.to_thread(
            _wait_chain, alice, chat["id"], lambda c: c["status"] == "done"
        )
        seen = [await asyncio.wait_for(first, 10)]
        while not (seen[-1].type == "collaboration.changed" and seen[-1].data["status"] == "done"):
            seen.append(await asyncio.wait_for(it.__anext__(), 10))
        assert seen[-1].data["chat"] == chat["id"]
        items = await asyncio.to_thread(_wait_items, alice, chat["id"], 5)
    await events.close()
    assert chain["deliveries"] == 2 and chain["rootBot"] == asker["id"]
    (link,) = chain["links"]
    assert link["toBot"] == helper["id"] and link["status"] == "answered"
    assert link["request"] == "Is the build green?"
    assert link["result"] == "Yes, the build is green."
    kinds = [i["kind"] for i in items]
    assert kinds == ["person", "bot", "delivery", "delivery", "bot"]
    assert items[2]["communication"]["direction"] == "sent"  # UI-1: what the asker sent
    delivery = items[3]
    assert delivery["author"] == helper["id"]
    assert delivery["communication"] == {
        "direction": "received",
        "peer": helper["id"],
        "body": "Yes, the build is green.",
        "name": helper["name"],
        "avatar": None,
    }
    assert items[4]["text"] == "My colleague says the build is green."
    # UI-1: ordinary items never carry a communication record, whatever they say.
    assert all(i["communication"] is None for i in items if i["kind"] != "delivery")
    # The peer worked in an agent chat that holds only what was sent to it.
    helper_requests = [b for b in bot_model.requests if bot_of(b) == helper["name"]]
    assert "Check CI" not in str(helper_requests[-1]["messages"])
    # Someone else neither lists nor stops the chain.
    with world.client("bob") as bob:
        assert all(c["id"] != chain["id"] for c in _chains(bob))
        assert bob.post(f"{WS}/collaboration/{chain['id']}/stop").status_code == 404


def test_two_bots_delegating_forever_stop_at_the_caps(world, admin, bot_model):
    bots = _bots(world, admin, "Ping", "Pong")
    ping, pong = bots["Ping"], bots["Pong"]
    counter = iter(range(10_000))

    def route(body):
        name, last = bot_of(body), _last(body)
        if name not in (ping["name"], pong["name"]):
            return None
        if last["role"] == "tool":
            return completion("Delegated.")
        other = pong if name == ping["name"] else ping
        msg = {"agent": other["name"], "message": f"please handle part {next(counter)}"}
        return completion(None, tool_calls=[("workspace_send_to_agent", msg)])

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": ping["id"]}).json()
        alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Go"})
        chain = _wait_chain(alice, chat["id"], lambda c: c["status"] != "running")
    assert chain["status"] == "capped"
    assert "depth" in chain["reason"]
    delivered = [k for k in chain["links"] if k["status"] in ("sent", "answered")]
    assert max(k["depth"] for k in delivered) <= 8
    assert chain["deliveries"] <= 32
    refused = [k for k in chain["links"] if k["status"] == "refused"]
    assert refused and refused[-1]["depth"] == 9


def test_after_stop_a_late_reply_starts_nothing(world, admin, bot_model):
    bots = _bots(world, admin, "Boss", "Slow")
    boss, slow = bots["Boss"], bots["Slow"]

    def route(body):
        name, last = bot_of(body), _last(body)
        if name == boss["name"]:
            if last["role"] == "tool":
                return completion("Asked.")
            if "[delivery from" in str(last["content"]):
                return completion("WOKEN")
            msg = {"agent": slow["name"], "message": "Write the report"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == slow["name"]:
            return ("delay", 1.5, completion("Here is the report."))
        return None

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": boss["id"]}).json()
        alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Report please"})
        running = _wait_chain(alice, chat["id"], lambda c: c["links"] != [])
        stopped = alice.post(f"{WS}/collaboration/{running['id']}/stop")
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["status"] == "stopped"
        late = _wait_chain(
            alice, chat["id"], lambda c: c["links"] and c["links"][0]["status"] == "answered"
        )
        time.sleep(0.5)  # room for a wrong wake-up to show
        items = alice.get(f"/v1/chats/{chat['id']}/items").json()["items"]
    assert late["status"] == "stopped" and late["links"][0]["result"] == "Here is the report."
    # The record of what was sent (UI-1), and no delivery came back after the stop.
    assert [i["kind"] for i in items] == ["person", "bot", "delivery"]
    assert items[2]["communication"]["direction"] == "sent"
    woken = [b for b in bot_model.requests if bot_of(b) == boss["name"]]
    assert not any("[delivery from" in str(b["messages"][-1]["content"]) for b in woken)


def test_self_rules_revisions_and_the_creator_lock(world, admin, bot_model, engine):
    bots = _bots(world, admin, "Maker")
    maker = bots["Maker"]

    def route(body):
        if bot_of(body) != maker["name"]:
            return None
        last = _last(body)
        if last["role"] == "tool":
            return completion("Done.")
        text = str(last["content"])
        if "stale" in text:
            update = {"expectedRevision": 99, "tone": "grumpy"}
            return completion(None, tool_calls=[("workspace_update_self_rules", update)])
        if "update" in text:
            update = {"expectedRevision": 1, "tone": "cheerful"}
            return completion(None, tool_calls=[("workspace_update_self_rules", update)])
        if "create" in text:
            args = {"name": "Minion", "prompt": "Fetch things."}
            return completion(None, tool_calls=[("workspace_create_agent", args)])
        return completion(None, tool_calls=[("workspace_get_self_rules", {})])

    bot_model.routes.append(route)

    def tool_result() -> str:
        return bot_model.requests[-1]["messages"][-1]["content"]

    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": maker["id"]}).json()
        turn = f"/v1/chats/{chat['id']}/turns?wait=true"
        alice.post(turn, json={"text": "stale please"})
        assert (
            '"error":"stale_revision"' in tool_result() and '"currentRevision":1' in tool_result()
        )
        alice.post(turn, json={"text": "update please"})
        assert '"revision":2' in tool_result() and "cheerful" in tool_result()
        alice.post(turn, json={"text": "who are you"})
        assert '"tone":"cheerful"' in tool_result()  # effective from the next turn
        alice.post(turn, json={"text": "create a helper"})
        minion = tool_result()
        assert '"name":"Minion"' in minion
        minion_id = re.search(r'"id":"(b_[0-9a-f]+)"', minion).group(1)
        # Over HTTP: a stale revision is a 409 with the current one; nothing changes.
        owner_name = next(n for n, u in world.users.items() if u == maker["owner"])
    with world.client(owner_name) as owner:
        url = f"{WS}/bots/{maker['id']}/rules"
        stale = owner.patch(url, json={"expectedRevision": 1, "tone": "calm"})
        assert stale.status_code == 409
        assert stale.json()["error"]["currentRevision"] == 2
        assert owner.get(url).json()["rules"]["tone"] == "cheerful"
        ok = owner.patch(url, json={"expectedRevision": 2, "tone": "calm"})
        assert ok.status_code == 200 and ok.json()["revision"] == 3
        bad = owner.patch(url, json={"expectedRevision": 3, "model": "other"})
        assert bad.status_code == 400
    with world.client("carol") as carol:
        if maker["owner"] != world.users["carol"]:
            r = carol.patch(f"{WS}/bots/{maker['id']}/rules", json={"expectedRevision": 3})
            assert r.status_code == 403
    # WS-3: the creator set the member's first rules and may not change them afterwards.
    member = ray.get(engine.directory.get_bot.remote(minion_id))
    assert member.creator == maker["id"] and member.rules.prompt == "Fetch things."
    with pytest.raises(Forbidden) as err:
        try:
            ray.get(
                engine.directory.update_rules.remote(
                    minion_id,
                    RulesUpdate(expectedRevision=1, tone="obedient"),
                    Editor(kind="bot", id=maker["id"]),
                )
            )
        except ray.exceptions.RayTaskError as e:
            raise e.cause from None
    assert err.value.code == "creator_locked"


def test_a_delivery_group_runs_through_its_leader_and_the_person_decides(world, admin, bot_model):
    bots = _bots(world, admin, "Lead", "Crew")
    lead, crew = bots["Lead"], bots["Crew"]
    slow_step = threading.Event()  # the lead's "slow goal" step runs until this is set
    slow_phase = False
    channel = admin.post(
        "/v1/admin/channels",
        json={
            "org": world.org,
            "people": [world.users["alice"], world.users["bob"]],
            "bots": [lead["id"], crew["id"]],
            "mode": "delivery",
            "leader": lead["id"],
        },
    ).json()

    def route(body):
        name, last = bot_of(body), _last(body)
        text = str(last["content"])
        if name == lead["name"]:
            # Known by when it asks, not by its text: the memory bot may rewrite a person's
            # input (ENR) once it has learned from the first turn.
            if slow_phase:
                return ("gate", slow_step, completion("Thinking slowly."))
            if last["role"] == "tool":
                return completion("The crew is on it.")
            if "[delivery from" in text:
                return completion("Final result: the poster is ready.")
            assert any("You lead this group" in str(m["content"]) for m in body["messages"])
            msg = {"agent": crew["name"], "message": "Draw the poster"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == crew["name"]:
            return completion("Poster drawn.")
        return None

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"channel": channel["id"]}).json()
        turns = f"/v1/chats/{chat['id']}/turns"
        assert alice.post(turns, json={"text": "Make a poster", "rounds": 2}).status_code == 422
        r = alice.post(f"{turns}?wait=true", json={"text": "Make a poster for Friday"}).json()
        turn = r["turn"]
        assert turn["goal"] == "delivering"
        assert [i["author"] for i in r["items"] if i["kind"] == "bot"] == [lead["id"]]
        items = _wait_items(alice, chat["id"], 5)
        assert [i["kind"] for i in items] == ["person", "bot", "delivery", "delivery", "bot"]
        assert items[4]["text"] == "Final result: the poster is ready."
        _wait_chain(alice, chat["id"], lambda c: c["status"] == "done")
        verdict = f"{turns}/{turn['id']}/verdict"
    with world.client("bob") as bob:  # any person of the group decides, once
        ok = bob.post(verdict, json={"accepted": True, "note": "Looks great"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["turn"]["goal"] == "accepted"
        again = bob.post(verdict, json={"accepted": False})
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"
    with world.client("carol") as carol:
        assert carol.post(verdict, json={"accepted": True}).status_code == 403
    # Switching mode: only when idle.
    with world.client("alice") as alice:
        mode = f"{WS}/groups/{channel['id']}/mode"
        slow_phase = True
        slow = alice.post(turns, json={"text": "slow goal"})
        assert slow.status_code == 202
        busy = alice.post(mode, json={"mode": "discussion"})
        lead_saw = [b["messages"][-1] for b in bot_model.requests if bot_of(b) == lead["name"]]
        assert busy.status_code == 409, (busy.text, lead_saw[-1:])
        assert busy.json()["error"]["code"] == "group_busy"
        slow_step.set()
        deadline = time.monotonic() + 10
        while (switched := alice.post(mode, json={"mode": "discussion"})).status_code == 409:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert switched.status_code == 200, switched.text
        assert switched.json()["mode"] == "discussion" and switched.json()["leader"] is None
        bad = alice.post(mode, json={"mode": "delivery", "leader": world.bot})
        assert bad.status_code == 422


def test_a_chain_resumes_after_its_shard_is_killed_and_delivers_once(
    world, admin, bot_model, engine
):
    from tests.openai_stub import OpenAIStub
    from tests.test_learning_restart import _after_restart

    bots = _bots(world, admin, "Sender", "Worker")
    sender, worker = bots["Sender"], bots["Worker"]
    calls = {"worker": 0}

    def route(body):
        name, last = bot_of(body), _last(body)
        if name == sender["name"]:
            if last["role"] == "tool":
                return completion("Sent.")
            if "[delivery from" in str(last["content"]):
                return completion("Thanks, got the numbers.")
            msg = {"agent": worker["name"], "message": "Count the votes"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == worker["name"]:
            calls["worker"] += 1
            return OpenAIStub.HANG if calls["worker"] == 1 else completion("42 votes.")
        return None

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": sender["id"]}).json()
        alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Votes?"})
        deadline = time.monotonic() + 20
        while calls["worker"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        home = engine.shard_for(sender["owner"])
        ray.kill(home, no_restart=False)  # a crash mid-delivery; Ray restarts the actor
        _after_restart(lambda: ray.get(home.ping.remote(), timeout=60))
        # Generous: a restart under a loaded CI machine takes a while.
        done = _wait_chain(alice, chat["id"], lambda c: c["status"] == "done", timeout=120)
        items = _wait_items(alice, chat["id"], 5)
        agent = alice.get(f"/v1/chats/{done['links'][0]['agentChat']}/items").json()["items"]
    assert [i["kind"] for i in items] == ["person", "bot", "delivery", "delivery", "bot"]
    assert items[3]["text"] == "42 votes."
    assert [i["kind"] for i in agent] == ["delivery", "bot"]  # delivered once, answered once
    assert done["deliveries"] == 2


def test_learning_waits_for_the_collaboration_and_runs_once(
    world, admin, bot_model, model_stubs, engine
):
    mem = model_stubs["mem"]
    settings = {"botMemoryModel": "mem", "autoRecord": True}
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings})
    bots = _bots(world, admin, "Planner", "Scout")
    planner, scout = bots["Planner"], bots["Scout"]
    chat_box: dict = {}
    learning_requests: list = []

    def route(body):
        name, last = bot_of(body), _last(body)
        if name == planner["name"]:
            if last["role"] == "tool":
                return completion("Asked the scout.")
            if "[delivery from" in str(last["content"]):
                return completion("The scout found a trail.")
            msg = {"agent": scout["name"], "message": "Find a trail"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == scout["name"]:
            return ("delay", 1.0, completion("Trail found north."))
        return None

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        learning_requests.append(body)
        learn = {"content": "Alice hikes", "items": [{"chat": chat_box["id"], "item": "i-1"}]}
        return completion(None, tool_calls=[("learn_fact", learn)])

    bot_model.routes.append(route)
    mem.routes.append(mem_route)
    shard = engine.shard_for(planner["owner"])
    try:
        with world.client("alice") as alice:
            chat = alice.post("/v1/chats", json={"bot": planner["id"]}).json()
            chat_box["id"] = chat["id"]
            alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "I love hiking"})
            (job,) = ray.get(shard.learning_jobs.remote(f"bot:{planner['id']}"))
            assert job.status == "deferred" and not learning_requests  # waits for the chain
            _wait_chain(alice, chat["id"], lambda c: c["status"] == "done")
            _wait_items(alice, chat["id"], 5)
            deadline = time.monotonic() + 20
            while ray.get(shard.learning_jobs.remote(f"bot:{planner['id']}"))[0].status != "done":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            (entry,) = alice.get(f"/v1/bots/{planner['id']}/memory").json()["entries"]
    finally:
        mem.routes.clear()
    assert entry["content"] == "Alice hikes"
    (request,) = learning_requests  # one extraction, after the results came back
    evidence = json.loads(request["messages"][-1]["content"])["evidence"]
    assert [e["kind"] for e in evidence] == ["person", "bot", "delivery", "delivery", "bot"]


@pytest.mark.anyio
async def test_a_deliverys_items_are_readable_as_soon_as_they_are_announced(
    world, admin, bot_model, monkeypatch, engine
):
    """A hop asks the directory nothing (its agent chat is registered later, gathered): a
    client that fetches an item of the agent chat the moment its `chat.item.created` arrives is
    served all the same, the gateway finding the chat on the shard that made it."""
    from tests.conftest import count_gateway_calls

    counted = count_gateway_calls(monkeypatch, engine)
    bots = _bots(world, admin, "Asker", "Helper")
    asker, helper = bots["Asker"], bots["Helper"]

    def route(body):
        name, last = bot_of(body), _last(body)
        if name == asker["name"]:
            if last["role"] == "tool":
                return completion("I asked my colleague.")
            if "[delivery from" in str(last["content"]):
                return completion("Thanks.")
            msg = {"agent": helper["name"], "message": "Is the build green?"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == helper["name"]:
            return completion("Yes, the build is green.")
        return None

    bot_model.routes.append(route)

    events = EventClient(world.server.url, world.tokens["alice"])
    it = aiter(events)
    first = asyncio.ensure_future(it.__anext__())
    await asyncio.sleep(0.3)  # connected and live before the turn
    read: list[tuple[str, int, str]] = []
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": asker["id"]}).json()["id"]
        r = await asyncio.to_thread(
            alice.post, f"/v1/chats/{chat}/turns?wait=true", json={"text": "Check CI"}
        )
        assert r.status_code == 200, r.text
        frame = await asyncio.wait_for(first, 10)
        while not (frame.type == "collaboration.changed" and frame.data["status"] == "done"):
            agent = frame.data.get("chat", "")
            if frame.type == "chat.item.created" and agent.startswith("chat_agent_"):
                got = await asyncio.to_thread(
                    alice.get, f"/v1/chats/{agent}/items/{frame.data['item']}"
                )
                read.append((agent, got.status_code, got.json().get("kind", "")))
            frame = await asyncio.wait_for(it.__anext__(), 10)
    await events.close()
    assert [(status, kind) for _, status, kind in read] == [(200, "delivery"), (200, "bot")]
    assert counted["find_agent_chat"] >= 1  # served before the directory had it
