"""Requests (approvals) and their review through the public API (ENR-3): a bot proposes with
`workspace_request_approval`; the request and its review chat see only what the bot proposed,
never the memory bot's rewrite of the input; a review chat has no enrichment and no confide; a
person decides once, announced as `request.changed`."""

from __future__ import annotations

import asyncio
import json
import secrets

import httpx
import pytest

from gateway.client import EventClient
from tests.openai_stub import bot_of, completion

PROPOSAL = "Buy the ThinkPad X1 for 450 EUR from the usual shop."


@pytest.fixture
def stubs(model_stubs):
    bot, mem = model_stubs["bot"], model_stubs["mem"]
    yield bot, mem
    bot.routes.clear()
    mem.routes.clear()


def _tools(body) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools", [])}


def _setup(world, admin, stubs, marker: str) -> dict:
    """A bot that asks for approval when its (rewritten) input says so; a memory model that
    rewrites every input it is asked about with `marker` and the entries it was given."""
    bot_stub, mem = stubs
    settings = {"botMemoryModel": "mem", "autoRecord": False}
    assert admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings}).is_success
    bot = admin.post(
        "/v1/admin/bots",
        json={
            "name": f"Buyer{secrets.token_hex(3)}",
            "org": world.org,
            "owner": world.users["alice"],
            "model": "bot",
        },
    ).json()

    def rewrite(body):
        if "rewrite" not in _tools(body):
            return None
        asked = json.loads(body["messages"][-1]["content"])
        ids = [e["id"] for e in asked["entries"]]
        text = f"{marker} {asked['input']} (remembered: budget 500 EUR)"
        return completion(None, tool_calls=[("rewrite", {"text": text, "entries": ids})])

    def route(body):
        if bot_of(body) != bot["name"]:
            return None
        last = body["messages"][-1]
        if last["role"] == "tool":
            return completion("I asked you to approve it.")
        if "This chat reviews a request" in body["messages"][0]["content"]:
            return completion("It fits the budget and the shop is reliable.")
        if marker in str(last["content"]):
            args = {"title": "Laptop", "proposal": PROPOSAL}
            return completion(None, tool_calls=[("workspace_request_approval", args)])
        return completion("OK.")

    mem.routes.append(rewrite)
    bot_stub.routes.append(route)
    return bot


def test_enr3_request_and_review_see_only_the_proposal_never_the_enrichment(world, admin, stubs):
    """ENR-3: the bot's model saw the rewritten input, but the request keeps only what the bot
    proposed; its review chat gets no enrichment, no confide and no request tool, and shows the
    proposal; the person of the turn decides once; nobody else sees or decides it."""
    bot_stub, mem = stubs
    marker = "ENRICHED-" + secrets.token_hex(4)
    bot = _setup(world, admin, stubs, marker)
    with world.client("alice") as alice, world.client("bob") as bob:
        remembered = alice.post(
            f"/v1/bots/{bot['id']}/memory",
            json={"command": {"_tag": "Remember", "content": "My laptop budget is 500 EUR"}},
        )
        assert remembered.status_code == 201, remembered.text
        chat = alice.post("/v1/chats", json={"bot": bot["id"]}).json()["id"]
        r = alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "I need a laptop"})
        assert r.status_code == 200, r.text
        (enrichment,) = alice.get(f"/v1/chats/{chat}/enrichments").json()["enrichments"]
        assert marker in enrichment["text"]  # the bot's model did see the rewrite
        (req,) = [q for q in alice.get("/v1/requests").json()["requests"] if q["chat"] == chat]
        assert req["proposal"] == PROPOSAL and req["title"] == "Laptop"
        assert req["status"] == "pending" and req["owner"] == world.users["alice"]
        assert marker not in json.dumps(req) and "500 EUR" not in json.dumps(req)
        assert alice.get(f"/v1/requests/{req['id']}").json() == req
        # Not bob's: not listed, not readable, not decidable, no review chat.
        assert all(q["id"] != req["id"] for q in bob.get("/v1/requests").json()["requests"])
        assert bob.get(f"/v1/requests/{req['id']}").status_code == 404
        assert (
            bob.post(f"/v1/requests/{req['id']}/decision", json={"approved": True}).status_code
            == 404
        )
        assert bob.post(f"/v1/requests/{req['id']}/review").status_code == 404
        # The review chat.
        opened = alice.post(f"/v1/requests/{req['id']}/review")
        assert opened.status_code == 201, opened.text
        review = opened.json()
        assert review["kind"] == "review" and review["bot"] == bot["id"]
        assert alice.post(f"/v1/requests/{req['id']}/review").json()["id"] == review["id"]
        rewrites_before = sum(1 for b in mem.requests if "rewrite" in _tools(b))
        seen_before = len(bot_stub.requests)
        asked = alice.post(f"/v1/chats/{review['id']}/turns?wait=true", json={"text": "Why?"})
        assert asked.status_code == 200, asked.text
        assert asked.json()["items"][-1]["text"] == "It fits the budget and the shop is reliable."
        assert sum(1 for b in mem.requests if "rewrite" in _tools(b)) == rewrites_before
        assert alice.get(f"/v1/chats/{review['id']}/enrichments").json()["enrichments"] == []
        (review_call,) = [b for b in bot_stub.requests[seen_before:] if bot_of(b) == bot["name"]]
        assert "confide" not in _tools(review_call)
        assert "workspace_request_approval" not in _tools(review_call)
        sent = json.dumps(review_call["messages"])
        assert PROPOSAL in sent and marker not in sent and "500 EUR" not in sent
        assert alice.get(f"/v1/requests/{req['id']}").json()["reviewChats"] == [review["id"]]
        # Deciding: bad input changes nothing; then once.
        decision = f"/v1/requests/{req['id']}/decision"
        assert alice.post(decision, json={"approved": "yes"}).status_code == 400
        assert alice.post(decision, json={"approved": True, "note": "x" * 4001}).status_code == 400
        assert alice.get(f"/v1/requests/{req['id']}").json()["status"] == "pending"
        ok = alice.post(decision + "?wait=true", json={"approved": True, "note": "Go ahead"})
        assert ok.status_code == 200, ok.text
        assert ok.json()["status"] == "approved" and ok.json()["decidedBy"] == world.users["alice"]
        again = alice.post(decision, json={"approved": False})
        assert again.status_code == 409
        assert again.json()["error"]["code"] == "already_decided"
        assert alice.get("/v1/requests?status=approved").json()["requests"][-1]["id"] == req["id"]
        told = alice.get(f"/v1/chats/{chat}/items").json()["items"][-2]  # then the bot's answer
        assert (
            told["kind"] == "notification" and told["text"] == "Request “Laptop” approved: Go ahead"
        )
        assert alice.get("/v1/requests?status=maybe").status_code == 400


def test_enr3_a_plain_review_chat_is_never_enriched(world, admin, stubs):
    """ENR-3 / LRN-10: a review chat opened directly (`kind: review`) has no enrichment and no
    confide, even with visible entries and a memory model that would rewrite."""
    bot_stub, _ = stubs
    marker = "ENRICHED-" + secrets.token_hex(4)
    bot = _setup(world, admin, stubs, marker)
    with world.client("alice") as alice:
        alice.post(
            f"/v1/bots/{bot['id']}/memory",
            json={"command": {"_tag": "Remember", "content": "My laptop budget is 500 EUR"}},
        )
        chat = alice.post("/v1/chats", json={"bot": bot["id"], "kind": "review"}).json()
        assert chat["kind"] == "review"
        seen = len(bot_stub.requests)
        r = alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "laptop?"})
        assert r.status_code == 200, r.text
        assert alice.get(f"/v1/chats/{chat['id']}/enrichments").json()["enrichments"] == []
    (call,) = [b for b in bot_stub.requests[seen:] if bot_of(b) == bot["name"]]
    assert marker not in json.dumps(call["messages"]) and "confide" not in _tools(call)


def test_enr3_concurrent_decisions_one_wins_and_events_announce_it(world, admin, stubs):
    """ENR-3: 24 concurrent decisions on one request: exactly one succeeds, the others get 409,
    and the stored outcome is the winner's; `request.changed` announces creation and decision
    to the person."""
    marker = "ENRICHED-" + secrets.token_hex(4)
    bot = _setup(world, admin, stubs, marker)

    async def scenario():
        events = EventClient(world.server.url, world.tokens["alice"])
        frames = []

        async def collect():
            async for frame in events:
                if frame.type == "request.changed":
                    frames.append(frame)
                    if frame.data["status"] != "pending":
                        return

        listener = asyncio.ensure_future(collect())
        await asyncio.sleep(0.3)
        headers = {"Authorization": f"Bearer {world.tokens['alice']}"}
        async with httpx.AsyncClient(base_url=world.server.url, headers=headers, timeout=60) as c:
            await c.post(
                f"/v1/bots/{bot['id']}/memory",
                json={"command": {"_tag": "Remember", "content": "budget 500"}},
            )
            chat = (await c.post("/v1/chats", json={"bot": bot["id"]})).json()["id"]
            r = await c.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "buy it"})
            assert r.status_code == 200, r.text
            listed = (await c.get("/v1/requests")).json()["requests"]
            (req,) = [q for q in listed if q["chat"] == chat]
            url = f"/v1/requests/{req['id']}/decision"
            answers = await asyncio.gather(
                *[c.post(url, json={"approved": k % 2 == 0, "note": f"n{k}"}) for k in range(24)]
            )
            final = (await c.get(f"/v1/requests/{req['id']}")).json()
            review = f"/v1/requests/{req['id']}/review"
            opened = await asyncio.gather(*[c.post(review) for _ in range(24)])
            reviewed = (await c.get(f"/v1/requests/{req['id']}")).json()
        await asyncio.wait_for(listener, 15)
        await events.close()
        return req, answers, final, frames, opened, reviewed

    req, answers, final, frames, opened, reviewed = asyncio.run(scenario())
    # 24 concurrent opens of the review chat: one chat, the same answer to all.
    assert {o.status_code for o in opened} == {201}
    assert len({o.text for o in opened}) == 1
    assert reviewed["reviewChats"] == [opened[0].json()["id"]]
    codes = sorted(a.status_code for a in answers)
    assert codes == [200] + [409] * 23
    (winner,) = [a.json() for a in answers if a.status_code == 200]
    assert final["status"] == winner["status"] and final["note"] == winner["note"]
    assert final["revision"] == 2
    mine = [f.data for f in frames if f.data["request"] == req["id"]]
    assert [(d["status"], d["revision"]) for d in mine] == [
        ("pending", 1),
        (final["status"], 2),
    ]
