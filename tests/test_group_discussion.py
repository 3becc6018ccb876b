"""Group discussions end to end (WS-5): rounds, rotation and failure isolation, over HTTP with
the bots' model served by an OpenAI-compatible server on loopback. The bots belong to
different people, so their steps run on different shards."""

from __future__ import annotations

import re
import secrets

from tests.openai_stub import completion


def _name_of(body) -> str | None:
    m = re.match(r"You are (\S+)\.", body["messages"][0]["content"])
    return m.group(1) if m else None


def _group(world, admin, n=3, people=("alice", "bob", "carol")):
    tag = secrets.token_hex(3)
    owners = list(world.users.values())
    bots = []
    for k in range(n):
        bots.append(
            admin.post(
                "/v1/admin/bots",
                json={
                    "name": f"G{k}{tag}",
                    "org": world.org,
                    "owner": owners[k % len(owners)],
                    "model": "bot",
                },
            ).json()
        )
    channel = admin.post(
        "/v1/admin/channels",
        json={
            "org": world.org,
            "people": [world.users[p] for p in people],
            "bots": [b["id"] for b in bots],
        },
    )
    assert channel.status_code == 201, channel.text
    return bots, channel.json()


def _speaking(bot_model, failing=()):
    def route(body):
        name = _name_of(body)
        if name is None or not name.startswith("G"):
            return None
        if name in failing:
            return 500
        rounds = re.findall(
            r"\(round (\d+) of", " ".join(str(m["content"]) for m in body["messages"])
        )
        return completion(f"{name} speaks in round {rounds[-1] if rounds else 1}")

    bot_model.routes.append(route)


def test_three_bots_three_rounds_rotate_and_all_speak(world, admin, bot_model):
    bots, channel = _group(world, admin)
    _speaking(bot_model)
    with world.client("bob") as bob:
        chat = bob.post("/v1/chats", json={"channel": channel["id"]}).json()
        assert chat["kind"] == "group"
        r = bob.post(
            f"/v1/chats/{chat['id']}/turns?wait=true",
            json={"text": "What should we build next?", "rounds": 3},
        )
        assert r.status_code == 200, r.text
        result = r.json()
    assert result["turn"]["status"] == "done", result["turn"]
    assert result["turn"]["rounds"] == 3
    said = [i for i in result["items"] if i["kind"] == "bot"]
    assert len(said) == 9, result["items"]
    rounds = [said[k : k + 3] for k in range(0, 9, 3)]
    firsts = [r[0]["author"] for r in rounds]
    assert len(set(firsts)) == 3  # a different first speaker each round
    for k, r in enumerate(rounds):
        assert {i["author"] for i in r} == {b["id"] for b in bots}  # everyone once per round
        assert all(f"round {k + 1}" in i["text"] for i in r)
    # Each speaker saw what was said before it in the turn.
    last = bot_model.requests[-1]
    seen = " ".join(str(m["content"]) for m in last["messages"])
    assert said[-2]["text"] in seen
    # Another person of the channel reads the same conversation; someone outside cannot.
    with world.client("carol") as carol:
        same = carol.post("/v1/chats", json={"channel": channel["id"]}).json()
        assert same["id"] == chat["id"]
        items = carol.get(f"/v1/chats/{chat['id']}/items").json()["items"]
        assert [i["id"] for i in items] == [i["id"] for i in result["items"]]


def test_a_failing_member_is_recorded_and_the_others_go_on(world, admin, bot_model):
    bots, channel = _group(world, admin)
    broken = bots[1]
    _speaking(bot_model, failing={broken["name"]})
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"channel": channel["id"]}).json()
        r = alice.post(
            f"/v1/chats/{chat['id']}/turns?wait=true",
            json={"text": "Please discuss in 3 rounds: tabs or spaces?"},
        )
        result = r.json()
    said = [i for i in result["items"] if i["kind"] == "bot"]
    failed = [i for i in result["items"] if i["kind"] == "notification"]
    assert len(said) == 6
    assert broken["id"] not in {i["author"] for i in said}
    assert len(failed) == 3 and {i["author"] for i in failed} == {broken["id"]}
    assert all("failed in round" in i["text"] for i in failed)
    assert result["turn"]["status"] == "done" and "3 step(s) failed" in result["turn"]["error"]


def test_mentions_and_text_choose_the_speakers_and_rounds(world, admin, bot_model):
    bots, channel = _group(world, admin)
    _speaking(bot_model)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"channel": channel["id"]}).json()
        one = alice.post(
            f"/v1/chats/{chat['id']}/turns?wait=true",
            json={"text": f"@{bots[2]['name']} what do you think?"},
        ).json()
        assert [i["author"] for i in one["items"] if i["kind"] == "bot"] == [bots[2]["id"]]
        two = alice.post(
            f"/v1/chats/{chat['id']}/turns?wait=true",
            json={"text": "讨论一下这个方案", "mentions": [bots[0]["id"], bots[1]["id"]]},
        ).json()
        assert len([i for i in two["items"] if i["kind"] == "bot"]) == 4  # 2 bots x 2 rounds


def test_bad_group_requests_are_refused_and_change_nothing(world, admin, bot_model):
    _, channel = _group(world, admin)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"channel": channel["id"]}).json()
        url = f"/v1/chats/{chat['id']}/turns"
        too_many = alice.post(url, json={"text": "hi", "rounds": 13})
        assert too_many.status_code == 422
        assert too_many.json()["error"] | {"message": ""} == {
            "code": "out_of_range",
            "field": "rounds",
            "message": "",
        }
        in_words = alice.post(url, json={"text": "discuss in 20 rounds"})
        assert (in_words.status_code, in_words.json()["error"]["code"]) == (422, "invalid_rounds")
        outsider = alice.post(url, json={"text": "hi", "mentions": [world.bot]})
        assert outsider.status_code == 422
        assert alice.post(url, json={"text": "hi", "rounds": "3"}).status_code == 400
        assert alice.get(f"/v1/chats/{chat['id']}/items").json()["items"] == []
    # More than 8 bots in a channel: 422.
    many = [
        admin.post(
            "/v1/admin/bots",
            json={"name": f"x{k}", "org": world.org, "owner": world.users["alice"]},
        ).json()["id"]
        for k in range(9)
    ]
    r = admin.post(
        "/v1/admin/channels",
        json={"org": world.org, "people": [world.users["alice"]], "bots": many},
    )
    assert r.status_code == 422
    # Someone who is not in the channel neither reads nor posts.
    _, private = _group(world, admin, people=("alice",))
    with world.client("alice") as alice:
        pchat = alice.post("/v1/chats", json={"channel": private["id"]}).json()
    with world.client("bob") as bob:
        assert bob.post("/v1/chats", json={"channel": private["id"]}).status_code == 403
        assert bob.get(f"/v1/chats/{pchat['id']}/items").status_code == 403
        assert bob.post(f"/v1/chats/{pchat['id']}/turns", json={"text": "hi"}).status_code == 403


def test_a_confiding_group_bot_learns_a_channel_fact(world, admin, bot_model, model_stubs, engine):
    import ray

    mem = model_stubs["mem"]
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"botMemoryModel": "mem"}})
    bots, channel = _group(world, admin, n=2, people=("alice", "bob"))
    talker = bots[0]
    for person in ("alice", "carol"):
        if talker["owner"] != world.users[person]:
            admin.post(
                "/v1/admin/grants",
                json={"bot": talker["id"], "user": world.users[person], "permission": "read"},
            )
    chat_box = {}

    def bot_route(body):
        name = _name_of(body)
        if name != talker["name"]:
            return None
        if body["messages"][-1]["role"] == "tool":
            return completion("Noted, Fridays it is.")
        return completion(
            None, tool_calls=[("confide", {"text": "I want to get their habits right"})]
        )

    def mem_route(body):
        if "You keep a bot's memory" in body["messages"][0]["content"]:
            learn = {
                "content": "The team deploys on Fridays",
                "items": [{"chat": chat_box["id"], "item": "i-1"}],
            }
            return completion(None, tool_calls=[("learn_fact", learn)])
        return completion("Thank you for sharing that.")

    bot_model.routes.append(bot_route)
    _speaking(bot_model)
    mem.routes.append(mem_route)
    try:
        with world.client("bob") as bob:
            chat = bob.post("/v1/chats", json={"channel": channel["id"]}).json()
            chat_box["id"] = chat["id"]
            r = bob.post(
                f"/v1/chats/{chat['id']}/turns?wait=true",
                json={"text": "We always deploy on Fridays."},
            )
            assert r.json()["turn"]["status"] == "done", r.text
            shard = engine.shard_for(talker["owner"])
            ray.get(shard.learning_idle.remote())
            confessions = bob.get(f"/v1/chats/{chat['id']}/confessions")
            # Confessions stay with the chat's owner (API-6).
            if chat["owner"] == world.users["bob"]:
                assert confessions.json()["confessions"][0]["answer"] == (
                    "Thank you for sharing that."
                )
        with world.client("alice") as alice:
            (fact,) = alice.get(f"/v1/bots/{talker['id']}/memory").json()["entries"]
        assert fact["content"] == "The team deploys on Fridays" and fact["layer"] == "fact"
        assert f"for:channel:{channel['id']}" in fact["tags"]
        assert f"chat:{chat['id']}" in fact["tags"] and f"from:{world.users['bob']}" in fact["tags"]
        assert fact["sources"] == [{"chat": chat["id"], "item": "i-1"}]
        with world.client("carol") as carol:  # not in the channel: sees nothing of it
            assert carol.get(f"/v1/bots/{talker['id']}/memory").json()["entries"] == []
        with world.client("bob") as bob:  # the history goes everywhere; what was learned stays
            assert bob.delete(f"/v1/chats/{chat['id']}/items").status_code == 200
            assert ray.get(shard.chat_items.remote(chat["id"])) == []
        with world.client("alice") as alice:
            assert len(alice.get(f"/v1/bots/{talker['id']}/memory").json()["entries"]) == 1
    finally:
        mem.routes.clear()
