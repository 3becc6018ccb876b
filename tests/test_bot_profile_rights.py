"""The workspace side, through the public API: the sent side of bot-to-bot
communication (UI-1), the server's team/collaboration permission on the bot profile and the
auto-record pause (WS-1), a creator's rename and archive rights and archiving (WS-3)."""

from __future__ import annotations

import json
import secrets
import time

import ray

from tests.openai_stub import bot_of, completion

WS = "/api/app/workspace"


def _bot(world, admin, name: str, **extra) -> dict:
    body = {"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"}
    r = admin.post("/v1/admin/bots", json={**body, **extra})
    assert r.status_code == 201, r.text
    return r.json()


def _wait(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} never held")


def _items(client, chat_id) -> list[dict]:
    r = client.get(f"/v1/chats/{chat_id}/items")
    assert r.status_code == 200, r.text
    return r.json()["items"]


def _chain_of(client, chat_id) -> dict | None:
    for c in client.get(f"{WS}/collaboration").json()["items"]:
        if c["rootChat"] == chat_id and c["status"] == "done":
            return c
    return None


def test_ui1_the_asking_chat_gets_a_sent_record_and_ordinary_words_never_do(
    world, admin, bot_model
):
    """UI-1: when a bot sends to another, its chat shows a `sent` communication record (the
    peer's identity and avatar, the actual body); the chain's audit record keeps the request
    as it was; a person's message that merely reads like one is never communication."""
    tag = secrets.token_hex(3)
    asker = _bot(world, admin, f"Asker{tag}")
    helper = _bot(world, admin, f"Helper{tag}", avatar="https://example.test/helper.png")
    message = "Please check the build, thanks to you all"

    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name == asker["name"]:
            if last["role"] == "tool":
                return completion("I asked.")
            if "[delivery from" in str(last["content"]):
                return completion("The build is green.")
            if "Sent to" in str(last["content"]):
                return completion("Noted.")
            args = {"agent": helper["name"], "message": message}
            return completion(None, tool_calls=[("workspace_send_to_agent", args)])
        if name == helper["name"]:
            return completion("Green.")
        return None

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": asker["id"]}).json()["id"]
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "CI?"}).is_success
        chain = _wait(lambda: _chain_of(alice, chat), what="the chain to end")
        items = _wait(lambda: i if len(i := _items(alice, chat)) >= 5 else None)
        # An ordinary message worded like a communication record.
        fake = f"Sent to {helper['name']}: {message}"
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": fake}).is_success
        later = _items(alice, chat)
    sent = [i for i in items if (i["communication"] or {}).get("direction") == "sent"]
    assert len(sent) == 1
    (record,) = sent
    assert record["author"] == asker["id"] and record["text"] == message
    assert record["communication"] == {
        "direction": "sent",
        "peer": helper["id"],
        "body": message,
        "name": helper["name"],
        "avatar": "https://example.test/helper.png",
    }
    received = [i for i in items if (i["communication"] or {}).get("direction") == "received"]
    assert [i["communication"]["peer"] for i in received] == [helper["id"]]
    assert chain["links"][0]["request"] == message  # the audit record is not rewritten
    person = [i for i in later if i["kind"] == "person"]
    assert person[-1]["text"] == fake and person[-1]["communication"] is None
    assert all(i["communication"] is None for i in later if i["kind"] != "delivery")


def _tool_results(stub, bot_name: str) -> list[dict]:
    """The tool results the named bot's model was given, decoded, in order."""
    out = []
    for body in stub.requests:
        if bot_of(body) != bot_name:
            continue
        for m in body["messages"]:
            if m["role"] == "tool" and m not in [o[0] for o in out]:
                out.append((m, json.loads(m["content"]) if m["content"].startswith("{") else {}))
    return [r for _, r in out]


def _profile(client, bot_id) -> dict:
    r = client.get(f"{WS}/bots/{bot_id}")
    assert r.status_code == 200, r.text
    return r.json()


def test_ws1_team_and_collaboration_are_server_policy_shown_on_the_profile(world, admin, bot_model):
    """WS-1: the profile shows the server's team/collaboration status; a client's old per-bot
    toggles are accepted and never override it; with the policy off a bot can neither send
    nor post, and cannot lead a delivery goal (WS-6)."""
    tag = secrets.token_hex(3)
    asker, helper = _bot(world, admin, f"Asker{tag}"), _bot(world, admin, f"Helper{tag}")

    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name == asker["name"]:
            if last["role"] == "tool":
                return completion("Tried.")
            if "Post" in str(last["content"]):
                args = {"group": group["id"], "message": "Hello group"}
                return completion(None, tool_calls=[("workspace_post_to_group", args)])
            args = {"agent": helper["name"], "message": "Please help"}
            return completion(None, tool_calls=[("workspace_send_to_agent", args)])
        return None

    bot_model.routes.append(route)
    group = admin.post(
        "/v1/admin/channels",
        json={"org": world.org, "people": [world.users["alice"]], "bots": [asker["id"]]},
    ).json()
    with world.client("alice") as alice, world.client("bob") as bob:
        status = _profile(alice, asker["id"])["permissions"]
        assert status == {
            "team": True,
            "collaboration": True,
            "autoRecord": False,
            "source": "server",
            "reason": None,
        }
        old_client = alice.patch(
            f"{WS}/bots/{asker['id']}", json={"team": False, "collaboration": False}
        )
        assert old_client.status_code == 200, old_client.text
        assert old_client.json()["permissions"]["collaboration"] is True
        assert old_client.json()["ignored"] == ["team", "collaboration"]
        assert (
            alice.patch(f"{WS}/bots/{asker['id']}", json={"colaboration": False}).status_code == 400
        )
        assert bob.patch(f"{WS}/bots/{asker['id']}", json={"autoRecord": False}).status_code == 403
        led_before = admin.post(
            "/v1/admin/channels",
            json={
                "org": world.org,
                "people": [world.users["alice"]],
                "bots": [asker["id"], helper["id"]],
                "mode": "delivery",
                "leader": asker["id"],
            },
        )
        assert led_before.status_code == 201, led_before.text
        goal_chat = alice.post("/v1/chats", json={"channel": led_before.json()["id"]}).json()
        # The server's policy, set by the admin for the org.
        off = admin.patch(
            f"/v1/admin/orgs/{world.org}", json={"settings": {"collaboration": False}}
        )
        assert off.status_code == 200, off.text
        status = _profile(alice, asker["id"])["permissions"]
        assert status["collaboration"] is False and status["team"] is False
        chat = alice.post("/v1/chats", json={"bot": asker["id"]}).json()["id"]
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "Ask"}).is_success
        assert _tool_results(bot_model, asker["name"])[-1]["error"] == "collaboration_off"
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "Post"}).is_success
        assert _tool_results(bot_model, asker["name"])[-1]["error"] == "collaboration_off"
        chains = alice.get(f"{WS}/collaboration").json()["items"]
        assert all(c["rootChat"] != chat for c in chains)
        led = admin.post(
            "/v1/admin/channels",
            json={
                "org": world.org,
                "people": [world.users["alice"]],
                "bots": [asker["id"], helper["id"]],
                "mode": "delivery",
                "leader": asker["id"],
            },
        )
        assert led.status_code == 422 and led.json()["error"]["code"] == "no_team_permission"
        # A delivery group made before: its leader no longer has team permission (WS-6).
        goal = alice.post(f"/v1/chats/{goal_chat['id']}/turns", json={"text": "Ship it"})
        assert goal.status_code == 422 and goal.json()["error"]["code"] == "no_team_permission"
        on = admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"collaboration": True}})
        assert on.status_code == 200
        assert _profile(alice, asker["id"])["permissions"]["collaboration"] is True


def test_ws1_pausing_auto_record_keeps_memory_and_stops_learning(world, admin, model_stubs, engine):
    """WS-1: "auto-record long-term facts" pauses on its own: what was learned stays, no
    learning job follows a turn while paused, and resuming brings it back."""
    mem = model_stubs["mem"]
    marker = "tea-" + secrets.token_hex(4)

    def learner(body):
        if not any(t["function"]["name"] == "learn_fact" for t in body.get("tools", [])):
            return None
        request = json.loads(body["messages"][-1]["content"])
        person = [e for e in request["evidence"] if e["kind"] == "person"]
        if not person or marker not in person[-1]["text"]:
            return None
        e = person[-1]
        fact = {"content": e["text"], "items": [{"chat": e["chat"], "item": e["item"]}]}
        return completion(None, tool_calls=[("learn_fact", fact)])

    mem.routes.append(learner)
    settings = {"botMemoryModel": "mem", "autoRecord": True}
    assert admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings}).is_success
    bot = _bot(world, admin, f"Recorder{secrets.token_hex(3)}")
    shard = engine.shard_for(world.users["alice"])
    try:
        with world.client("alice") as alice:
            assert _profile(alice, bot["id"])["permissions"]["autoRecord"] is True
            chat = alice.post("/v1/chats", json={"bot": bot["id"]}).json()["id"]
            turns = f"/v1/chats/{chat}/turns?wait=true"
            assert alice.post(turns, json={"text": f"I drink {marker} daily"}).is_success
            ray.get(shard.learning_idle.remote())
            before = alice.get(f"/v1/bots/{bot['id']}/memory").json()["entries"]
            assert [e["content"] for e in before] == [f"I drink {marker} daily"]
            paused = alice.patch(f"{WS}/bots/{bot['id']}", json={"autoRecord": False})
            assert paused.status_code == 200 and paused.json()["permissions"]["autoRecord"] is False
            assert alice.post(turns, json={"text": f"I also like {marker} cake"}).is_success
            ray.get(shard.learning_idle.remote())
            jobs = [j for j in alice.get(f"{WS}/memory-jobs").json()["jobs"] if j["chat"] == chat]
            assert len(jobs) == 1  # no job for the paused turn
            after = alice.get(f"/v1/bots/{bot['id']}/memory").json()["entries"]
            assert after == before  # pausing deleted nothing
            resumed = alice.patch(f"{WS}/bots/{bot['id']}", json={"autoRecord": True})
            assert resumed.json()["permissions"]["autoRecord"] is True
            assert alice.post(turns, json={"text": f"And {marker} ice cream"}).is_success
            ray.get(shard.learning_idle.remote())
            jobs = [j for j in alice.get(f"{WS}/memory-jobs").json()["jobs"] if j["chat"] == chat]
            assert len(jobs) == 2
    finally:
        mem.routes.remove(learner)


def test_ws3_the_creator_renames_and_archives_its_member_and_archived_bots_take_no_turns(
    world, admin, bot_model
):
    """WS-3: a bot that created a member keeps the right to rename and archive it, not to edit
    its other rules; another bot has neither; an archived bot takes no turns and is no
    collaboration target; the owner archives and restores through the route."""
    tag = secrets.token_hex(3)
    boss, other = _bot(world, admin, f"Boss{tag}"), _bot(world, admin, f"Other{tag}")
    member_box: dict = {}
    plans = {
        "create": ("workspace_create_agent", lambda: {"name": f"Scout{tag}", "prompt": "Scout."}),
        "rename": (
            "workspace_rename_agent",
            lambda: {"agent": member_box["id"], "name": f"Ranger{tag}"},
        ),
        "archive": ("workspace_archive_agent", lambda: {"agent": member_box["id"]}),
        "send": ("workspace_send_to_agent", lambda: {"agent": member_box["id"], "message": "hi"}),
    }

    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name not in (boss["name"], other["name"]):
            return None
        if last["role"] == "tool":
            return completion("Done.")
        plan = plans.get(str(last["content"]).split()[0])
        if plan is None:
            return completion("Hi.")
        return completion(None, tool_calls=[(plan[0], plan[1]())])

    bot_model.routes.append(route)
    with world.client("alice") as alice, world.client("bob") as bob:
        boss_chat = alice.post("/v1/chats", json={"bot": boss["id"]}).json()["id"]
        other_chat = alice.post("/v1/chats", json={"bot": other["id"]}).json()["id"]

        def say(chat, text):
            r = alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": text})
            assert r.status_code == 200, r.text

        say(boss_chat, "create a scout")
        member_box["id"] = _tool_results(bot_model, boss["name"])[-1]["id"]
        member = member_box["id"]
        say(other_chat, "rename it")  # not its creator
        assert _tool_results(bot_model, other["name"])[-1]["error"] == "not_your_bot"
        say(boss_chat, "rename it")
        assert _tool_results(bot_model, boss["name"])[-1]["name"] == f"Ranger{tag}"
        rules = alice.get(f"{WS}/bots/{member}/rules").json()
        assert rules["name"] == f"Ranger{tag}" and rules["rules"]["prompt"] == "Scout."
        say(other_chat, "archive it")
        assert _tool_results(bot_model, other["name"])[-1]["error"] == "not_creator"
        say(boss_chat, "archive it")
        assert _tool_results(bot_model, boss["name"])[-1] == {"id": member, "archived": True}
        shown = _profile(alice, member)
        assert shown["archived"] is True and shown["permissions"]["collaboration"] is False
        group = admin.post(
            "/v1/admin/channels",
            json={"org": world.org, "people": [world.users["alice"]], "bots": [boss["id"], member]},
        ).json()
        group_chat = alice.post("/v1/chats", json={"channel": group["id"]}).json()["id"]
        r = alice.post(f"/v1/chats/{group_chat}/turns?wait=true", json={"text": "hello all"})
        assert r.status_code == 200, r.text
        # The archived member sits the group's turn out.
        assert [i["author"] for i in r.json()["items"] if i["kind"] == "bot"] == [boss["id"]]
        member_chat = alice.post("/v1/chats", json={"bot": member}).json()["id"]
        refused = alice.post(f"/v1/chats/{member_chat}/turns", json={"text": "hello?"})
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "bot_archived"
        say(boss_chat, "send to it")
        assert _tool_results(bot_model, boss["name"])[-1]["error"] == "bot_archived"
        # The owner restores it and archives another through the route; others may not.
        assert bob.post(f"{WS}/bots/{member}/archive", json={"archived": False}).status_code == 403
        restored = alice.post(f"{WS}/bots/{member}/archive", json={"archived": False})
        assert restored.status_code == 200 and restored.json()["archived"] is False
        assert (
            alice.post(f"/v1/chats/{member_chat}/turns", json={"text": "back?"}).status_code == 202
        )
        archived = alice.post(f"{WS}/bots/{other['id']}/archive")
        assert archived.status_code == 200 and archived.json()["archived"] is True
        again = alice.post(f"/v1/chats/{other_chat}/turns", json={"text": "hi"})
        assert again.status_code == 409
        assert (
            alice.post(f"{WS}/bots/{other['id']}/archive", json={"archived": "yes"}).status_code
            == 400
        )
