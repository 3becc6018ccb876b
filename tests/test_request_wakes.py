"""A decided request wakes its bot in the chat it came from (ENR-3): one step with the decision
as its input, whose answer the chat gets; once, however many decide at the same time, and
across a shard killed between the decision and the step. A person may open a request too,
under the bot's tool's rules."""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest
import ray

from tests.openai_stub import OpenAIStub, bot_of, completion

PROPOSAL = "Order 40 chairs for the new office from the usual supplier."
ANSWER = "Ordering the chairs now."


def _after_restart(call, attempts=50):
    """Calls made while Ray restarts the actor fail as unavailable: try again."""
    for _ in range(attempts):
        try:
            return call()
        except (ray.exceptions.ActorUnavailableError, ray.exceptions.RayActorError):
            continue
    return call()


def _woken(body) -> bool:
    return str(body["messages"][-1]["content"]).startswith("[request ")


class Script:
    """A bot that asks for approval when told to buy, and answers a decision with ANSWER (with
    `hang`, its first step woken by each decision hangs instead)."""

    def __init__(self, stub: OpenAIStub, name: str, hang: bool = False) -> None:
        self.stub, self.name, self.hang = stub, name, hang
        self.hung: set[str] = set()

    def __call__(self, body):
        if bot_of(body) != self.name:
            return None
        last = body["messages"][-1]
        if last["role"] == "tool":
            return completion("I asked you to approve it.")
        if _woken(body):
            request = str(last["content"]).split()[1]
            if self.hang and request not in self.hung:
                self.hung.add(request)
                return OpenAIStub.HANG
            return completion(ANSWER)
        if "buy" in str(last["content"]):
            args = {"title": "Chairs", "proposal": PROPOSAL}
            return completion(None, tool_calls=[("workspace_request_approval", args)])
        return completion("OK.")

    def decisions(self, request_id: str) -> list[dict]:
        """The bot's model calls woken by this request's decision."""
        return [
            b
            for b in list(self.stub.requests)
            if bot_of(b) == self.name and f"[request {request_id} " in str(b["messages"][-1])
        ]


def _bot(world, admin, bot_model, hang: bool = False) -> tuple[dict, Script]:
    bot = admin.post(
        "/v1/admin/bots",
        json={
            "name": f"Buyer{secrets.token_hex(3)}",
            "org": world.org,
            "owner": world.users["alice"],
            "model": "bot",
        },
    ).json()
    script = Script(bot_model, bot["name"], hang)
    bot_model.routes.append(script)
    return bot, script


def _proposed(alice: httpx.Client, bot: dict) -> tuple[str, dict]:
    """A direct chat of alice's in which the bot asked for approval: (chat, request)."""
    chat = alice.post("/v1/chats", json={"bot": bot["id"]}).json()["id"]
    r = alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "please buy chairs"})
    assert r.status_code == 200, r.text
    (req,) = [q for q in alice.get("/v1/requests").json()["requests"] if q["chat"] == chat]
    assert req["status"] == "pending" and req["wake"] is None and req["openedBy"] is None
    return chat, req


def _wake_items(alice: httpx.Client, chat: str, turn: str) -> list[tuple[str, str]]:
    items = alice.get(f"/v1/chats/{chat}/items").json()["items"]
    return [(i["kind"], i["text"]) for i in items if i["turn"] == turn]


def test_enr3_a_decision_wakes_the_bot_once_with_the_decision(world, admin, bot_model):
    """ENR-3: approving wakes the bot in the request's chat: one step whose input is the
    decision (and what was proposed), the chat shows the decision and the bot's answer; a
    second decision is refused and wakes nothing."""
    bot, script = _bot(world, admin, bot_model)
    with world.client("alice") as alice:
        chat, req = _proposed(alice, bot)
        url = f"/v1/requests/{req['id']}/decision?wait=true"
        ok = alice.post(url, json={"approved": True, "note": "Go ahead, max 900 EUR"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["status"] == "approved" and ok.json()["wake"] == "done"
        (woken,) = script.decisions(req["id"])
        said = str(woken["messages"][-1]["content"])
        assert "approved" in said and "Go ahead, max 900 EUR" in said and PROPOSAL in said
        items = alice.get(f"/v1/chats/{chat}/items").json()["items"]
        notice, answer = items[-2], items[-1]
        assert notice["kind"] == "notification"
        assert notice["text"] == "Request “Chairs” approved: Go ahead, max 900 EUR"
        assert (answer["kind"], answer["text"]) == ("bot", ANSWER)
        assert notice["turn"] == answer["turn"] and notice["turn"]
        again = alice.post(url, json={"approved": False})
        assert again.status_code == 409 and again.json()["error"]["code"] == "already_decided"
        assert alice.get(f"/v1/requests/{req['id']}").json()["wake"] == "done"
        assert len(script.decisions(req["id"])) == 1
        assert alice.get(f"/v1/chats/{chat}/items").json()["items"][-1] == answer


@pytest.mark.anyio
async def test_enr3_concurrent_decisions_wake_the_bot_once(engine, world, admin, bot_model):
    """ENR-3: 24 concurrent decisions: one wins, and the bot is woken exactly once."""
    bot, script = _bot(world, admin, bot_model)
    with world.client("alice") as alice:
        chat, req = _proposed(alice, bot)

    headers = {"Authorization": f"Bearer {world.tokens['alice']}"}
    async with httpx.AsyncClient(base_url=world.server.url, headers=headers, timeout=60) as c:
        url = f"/v1/requests/{req['id']}/decision"
        answers = await asyncio.gather(
            *[c.post(url, json={"approved": k % 2 == 0, "note": f"n{k}"}) for k in range(24)]
        )
    assert sorted(a.status_code for a in answers) == [200] + [409] * 23
    (winner,) = [a.json() for a in answers if a.status_code == 200]
    shard = engine.shard_for(world.users["alice"])
    ray.get(shard.requests_idle.remote(), timeout=60)
    assert len(script.decisions(req["id"])) == 1
    with world.client("alice") as alice:
        assert alice.get(f"/v1/requests/{req['id']}").json()["wake"] == "done"
        items = alice.get(f"/v1/chats/{chat}/items").json()["items"]
        turn = items[-1]["turn"]
        assert _wake_items(alice, chat, turn) == [
            ("notification", f"Request “Chairs” {winner['status']}: {winner['note']}"),
            ("bot", ANSWER),
        ]


def test_enr3_a_shard_killed_before_the_step_wakes_the_bot_once(engine, world, admin, bot_model):
    """ENR-3: the decision's commit holds its wake-up. The shard is killed while the woken
    bot's model call hangs: the restarted shard wakes the bot again and stores its answer once
    (the notice once). Killed again while a second decision's step hangs, the restarted shard
    wakes the bot for that one only, never again for the first."""
    bot, script = _bot(world, admin, bot_model, hang=True)
    shard = engine.shard_for(world.users["alice"])

    def decide_and_kill(alice, req) -> int:
        ok = alice.post(f"/v1/requests/{req['id']}/decision", json={"approved": True})
        assert ok.status_code == 200, ok.text
        assert ok.json()["wake"] == "due"

        async def until_the_step_asked():
            while not script.decisions(req["id"]):
                await asyncio.sleep(0.05)  # another process's HTTP request: nothing to await on

        asyncio.run(asyncio.wait_for(until_the_step_asked(), 30))
        ray.kill(shard, no_restart=False)  # a crash; Ray restarts the actor
        # (The killed process could not answer this: its wake-up hangs.)
        return _after_restart(lambda: ray.get(shard.requests_idle.remote(), timeout=60))

    expected = [("notification", "Request “Chairs” approved."), ("bot", ANSWER)]
    with world.client("alice") as alice:
        chat, first = _proposed(alice, bot)
        assert decide_and_kill(alice, first) == 1  # the restarted shard stored one step
        assert len(script.decisions(first["id"])) == 2  # the killed call, then the answered one
        assert alice.get(f"/v1/requests/{first['id']}").json()["wake"] == "done"
        turn = alice.get(f"/v1/chats/{chat}/items").json()["items"][-1]["turn"]
        assert _wake_items(alice, chat, turn) == expected
        r = alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "now buy tables"})
        assert r.status_code == 200, r.text
        listed = alice.get("/v1/requests?status=pending").json()["requests"]
        (second,) = [q for q in listed if q["chat"] == chat]
        assert decide_and_kill(alice, second) == 1  # the second decision's step only
        assert len(script.decisions(first["id"])) == 2
        assert len(script.decisions(second["id"])) == 2
        assert _wake_items(alice, chat, turn) == expected
        again = alice.get(f"/v1/chats/{chat}/items").json()["items"][-1]["turn"]
        assert again != turn and _wake_items(alice, chat, again) == expected
        assert alice.get(f"/v1/requests/{second['id']}").json()["wake"] == "done"


def test_enr3_a_chat_steps_a_decision_once_however_often_asked(engine, world, admin, bot_model):
    """ENR-3: the chat's shard asked again for a decision whose step it stored (the request's
    shard restarted before it heard) stores nothing and runs no step."""
    from actors.contracts import DecisionWake
    from engine.requests import decision_turn

    bot, script = _bot(world, admin, bot_model)
    with world.client("alice") as alice:
        chat, req = _proposed(alice, bot)
        url = f"/v1/requests/{req['id']}/decision?wait=true"
        assert alice.post(url, json={"approved": True}).json()["wake"] == "done"
        before = alice.get(f"/v1/chats/{chat}/items").json()["items"]
    directory = engine.directory
    wake = DecisionWake(
        request=req["id"],
        turn=decision_turn(req["id"]),
        chat=ray.get(directory.get_chat.remote(chat)),
        bot=ray.get(directory.get_bot.remote(bot["id"])),
        org=ray.get(directory.get_org.remote(world.org)),
        operator=world.users["alice"],
        notice="Request “Chairs” approved.",
        text=f"[request {req['id']} approved by {world.users['alice']}] again",
    )
    shard = engine.shard_for(world.users["alice"])
    assert ray.get(shard.wake_on_decision.remote(wake), timeout=60) is False
    assert len(script.decisions(req["id"])) == 1
    with world.client("alice") as alice:
        assert alice.get(f"/v1/chats/{chat}/items").json()["items"] == before


def test_enr3_a_person_opens_a_request_under_the_tools_rules(world, admin, bot_model):
    """ENR-3: a person opens a request in their direct chat or their group, never in another's
    chat, a review chat or a group they are not in; it keeps their words, the group's people
    decide it, and the decision wakes the group's bot with it."""
    bot, script = _bot(world, admin, bot_model)
    alice_id, bob_id = world.users["alice"], world.users["bob"]
    body = {"title": "Offsite", "proposal": "Hold the offsite in Lisbon in May."}
    with world.client("alice") as alice, world.client("bob") as bob:
        chat = alice.post("/v1/chats", json={"bot": bot["id"]}).json()["id"]
        opened = alice.post(f"/v1/chats/{chat}/requests", json=body)
        assert opened.status_code == 201, opened.text
        mine = opened.json()
        assert mine["openedBy"] == alice_id and mine["owner"] == alice_id
        assert mine["proposal"] == body["proposal"] and mine["chat"] == chat
        assert mine["bot"] == bot["id"] and mine["status"] == "pending"
        assert bob.post(f"/v1/chats/{chat}/requests", json=body).status_code in (403, 404)
        assert alice.post(f"/v1/chats/{chat}/requests", json={"proposal": " "}).status_code == 400
        review = alice.post("/v1/chats", json={"bot": bot["id"], "kind": "review"}).json()
        refused = alice.post(f"/v1/chats/{review['id']}/requests", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_chat"
        # A group: alice opens, bob (a person of the group) decides, the bot is woken there.
        channel = admin.post(
            "/v1/admin/channels",
            json={"org": world.org, "people": [alice_id, bob_id], "bots": [bot["id"]]},
        ).json()
        group = alice.post("/v1/chats", json={"channel": channel["id"]}).json()["id"]
        with world.client("carol") as carol:
            assert carol.post(f"/v1/chats/{group}/requests", json=body).status_code in (403, 404)
        shared = alice.post(f"/v1/chats/{group}/requests", json=body).json()
        assert shared["channel"] == channel["id"] and shared["openedBy"] == alice_id
        assert any(q["id"] == shared["id"] for q in bob.get("/v1/requests").json()["requests"])
        url = f"/v1/requests/{shared['id']}/decision?wait=true"
        decided = bob.post(url, json={"approved": False, "note": "Too far"})
        assert decided.status_code == 200, decided.text
        assert decided.json()["decidedBy"] == bob_id and decided.json()["wake"] == "done"
        (woken,) = script.decisions(shared["id"])
        said = str(woken["messages"][-1]["content"])
        assert "rejected" in said and "Too far" in said and body["proposal"] in said
        assert f"Proposed by {alice_id}" in said
        items = bob.get(f"/v1/chats/{group}/items").json()["items"]
        assert [(i["kind"], i["text"]) for i in items[-2:]] == [
            ("notification", "Request “Offsite” rejected: Too far"),
            ("bot", ANSWER),
        ]
        assert sum("Request “Offsite”" in i["text"] for i in items) == 1
