"""Requests to widen an entry's visibility over HTTP and from the memory bot
(ACL-4, API-1, API-2, MEM-3): every source's rule decides; no reason, model instruction or bot
ownership skips it."""

from __future__ import annotations

import json
import secrets
import time

import ray

from tests.openai_stub import completion

WS = "/api/app/workspace"


def _ok(r, code=200):
    assert r.status_code == code, r.text
    return r.json()


def _ids(client, bot) -> list[str]:
    return [e["id"] for e in _ok(client.get(f"/v1/bots/{bot}/memory"))["entries"]]


def test_acl4_widen_route_and_memory_bot_tool_pass_every_sources_rule(
    world, admin, model_stubs, engine
):
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    admin.patch(
        f"/v1/admin/orgs/{world.org}",
        json={"settings": {"botMemoryModel": "mem", "autoRecord": True}},
    )
    alice_id, bob_id, carol_id = (world.users[n] for n in ("alice", "bob", "carol"))
    name = f"Widener{secrets.token_hex(3)}"
    # Carol owns the bot; Alice and Bob use it.
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": name, "org": world.org, "owner": carol_id, "model": "bot"},
        ),
        201,
    )["id"]
    for user in (alice_id, bob_id):
        grant = {"bot": bot, "user": user, "permission": "read"}
        _ok(admin.post("/v1/admin/grants", json=grant), 201)
    said = "My locker code is 4512"
    box: dict = {}
    asked: list[str] = []

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        request = json.loads(body["messages"][-1]["content"])
        mine = [e for e in request["evidence"] if e["chat"] == box.get("chat")]
        if not mine:
            return None
        tools = [t["function"]["name"] for t in body["tools"]]
        asked.append(",".join(tools))
        if "fact" not in box:
            item = next(e for e in mine if e["text"] == said)
            ref = {"chat": item["chat"], "item": item["item"]}
            return completion(None, tool_calls=[("learn_fact", {"content": said, "items": [ref]})])
        # Later turns: the model asks to show Alice's fact to everyone, with a reason.
        widen = {"entry": box["fact"], "to": "bot", "reason": "the owner asked for it"}
        return completion(None, tool_calls=[("widen", widen)])

    def bot_route(body):
        if body["messages"][0]["content"].startswith(f"You are {name}."):
            return completion("Ok.")
        return None

    def learn(client, chat, text):
        _ok(client.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": text}))
        ray.get(engine.shard_for(carol_id).learning_idle.remote())
        deadline = time.monotonic() + 20
        while True:
            jobs = [j for j in _ok(client.get(f"{WS}/memory-jobs"))["jobs"] if j["chat"] == chat]
            if len(jobs) >= box.get("turns", 0) + 1 and all(
                j["status"] in ("done", "failed") for j in jobs
            ):
                box["turns"] = len(jobs)
                return jobs
            assert time.monotonic() < deadline, jobs
            time.sleep(0.05)

    mem.routes.append(mem_route)
    bot_model.routes.append(bot_route)
    try:
        with (
            world.client("alice") as alice,
            world.client("bob") as bob,
            world.client("carol") as carol,
        ):
            chat = _ok(alice.post("/v1/chats", json={"bot": bot}), 201)["id"]
            box["chat"] = chat
            learn(alice, chat, said)
            (fact,) = _ok(alice.get(f"/v1/bots/{bot}/memory"))["entries"]
            box["fact"] = fact["id"]
            assert f"for:person:{alice_id}" in fact["tags"]

            # The memory bot's widen tool: offered, and refused by the fact's source rule.
            jobs = learn(alice, chat, "Thanks")
            assert "widen" in asked[-1]
            assert [j["error"] for j in jobs].count("1 proposed change(s) rejected") == 1
            assert _ids(bob, bot) == []

            route = f"/v1/bots/{bot}/memory/{fact['id']}/widen"
            body = {"to": "for:bot", "reason": "I own this bot"}
            for who in (carol, alice, bob):  # ownership, authorship of the words, a reason: no
                r = who.post(route, json=body)
                assert r.status_code == 409, r.text
                assert r.json()["error"]["code"] == "widen_refused"
            assert _ids(bob, bot) == [] and _ids(carol, bot) == []
            # An id that is not there is refused the same way (existence is not revealed).
            missing = alice.post(f"/v1/bots/{bot}/memory/mem_nothere/widen", json=body)
            assert missing.status_code == 409
            # Bad input changes nothing.
            for bad in ({"to": "org:elsewhere"}, {"to": "for:project:p1"}, {"to": 3}, {}):
                assert alice.post(route, json=bad).status_code in (400, 422), bad
            assert _ok(alice.get(f"/v1/bots/{bot}/memory"))["entries"] == [fact]

            # A pinned entry's source is the person who pinned it: she may share it, the
            # owner may not.
            remember = {"command": {"_tag": "Remember", "content": "Standup is at 9:30"}}
            pinned = _ok(alice.post(f"/v1/bots/{bot}/memory", json=remember), 201)
            pin_route = f"/v1/bots/{bot}/memory/{pinned['id']}/widen"
            r = carol.post(pin_route, json={"to": "for:bot"})
            assert r.status_code == 409, r.text
            assert pinned["id"] not in _ids(bob, bot)
            done = _ok(alice.post(pin_route, json={"to": "for:bot"}))
            assert done["widened"] is True and done["to"] == "for:bot"
            assert pinned["id"] in _ids(bob, bot) and pinned["id"] in _ids(carol, bot)
            assert fact["id"] not in _ids(bob, bot)
            again = _ok(alice.post(pin_route, json={"to": "for:bot"}))
            assert again["widened"] is False and again["version"] == done["version"]
            log = _ok(bob.get(f"/v1/bots/{bot}/memory/log"))["changes"]
            assert [c["entry"] for c in log][-1] == pinned["id"]
    finally:
        mem.routes.remove(mem_route)
        bot_model.routes.remove(bot_route)
