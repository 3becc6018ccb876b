"""ND-1: each capability `GET /v1/capabilities` announces is one a client can use. For
`bot-collaboration-v1` and `bot-discussion-v1`: announced (and not listed as unavailable), and
the feature each names answers a minimal call over the real HTTP API and events socket."""

from __future__ import annotations

import asyncio
import re
import secrets

import msgspec
from websockets.asyncio.client import connect

from tests.conftest import _ok
from tests.openai_stub import bot_of, completion

WS = "/api/app/workspace"


def _announced(client, capability: str) -> None:
    caps = _ok(client.get("/v1/capabilities"))
    assert capability in caps["capabilities"], caps
    assert capability not in caps["unavailable"], caps


def _bots(world, admin, *roles: str) -> list[dict]:
    tag = secrets.token_hex(3)
    return [
        _ok(
            admin.post(
                "/v1/admin/bots",
                json={
                    "name": f"{role}{tag}",
                    "org": world.org,
                    "owner": world.users["alice"],
                    "model": "bot",
                },
            )
        )
        for role in roles
    ]


def test_nd1_bot_collaboration_v1_is_announced_and_a_bot_hands_work_to_another(
    world, admin, server, bot_model
):
    """`workspace_send_to_agent` (WS-4): the asker gets a receipt, the helper's answer comes
    back to the asker's chat as a delivery from the helper, and the chain is listed done."""
    asker, helper = _bots(world, admin, "Asker", "Helper")

    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name == asker["name"]:
            if last["role"] == "tool":
                return completion("I asked my colleague.")
            if "[delivery from" in str(last["content"]):
                return completion("My colleague says yes.")
            ask = {"agent": helper["name"], "message": "Is the build green?"}
            return completion(None, tool_calls=[("workspace_send_to_agent", ask)])
        if name == helper["name"]:
            return completion("Yes, the build is green.")
        return None

    bot_model.routes.append(route)

    async def scenario() -> tuple[dict, list[dict], list[dict]]:
        url = server.url.replace("http://", "ws://") + "/v1/events"
        headers = {"Authorization": f"Bearer {world.tokens['alice']}"}
        async with connect(url, additional_headers=headers) as ws:
            hello = msgspec.json.decode(await ws.recv())
            assert hello["type"] == "hello"
            with world.client("alice") as alice:
                _announced(alice, "bot-collaboration-v1")
                chat = _ok(alice.post("/v1/chats", json={"bot": asker["id"]}))
                turn = f"/v1/chats/{chat['id']}/turns?wait=true"
                first = _ok(await asyncio.to_thread(alice.post, turn, json={"text": "Check CI"}))
                # At once: the asker's reply and what it sent (UI-1), and a delivery receipt.
                assert [i["kind"] for i in first["items"]] == ["person", "bot", "delivery"]
                assert first["items"][2]["communication"]["direction"] == "sent"
                told = [
                    m["content"]
                    for b in bot_model.requests
                    if bot_of(b) == asker["name"]
                    for m in b["messages"]
                    if m["role"] == "tool"
                ]
                assert told and '"receipt":"dlv_' in told[-1]

                shown = {i["id"] for i in first["items"]}

                async def delivered() -> None:
                    """Until the chain is done and the woken asker has answered."""
                    done = answered = False
                    while not (done and answered):
                        frame = msgspec.json.decode(await ws.recv())
                        data = frame.get("data") or {}
                        if data.get("chat") != chat["id"]:
                            continue
                        if frame["type"] == "collaboration.changed":
                            done = done or data["status"] == "done"
                        elif frame["type"] == "chat.item.created" and data["kind"] == "bot":
                            answered = answered or data["item"] not in shown

                await asyncio.wait_for(delivered(), 30)  # the asker was woken and answered
                items = _ok(alice.get(f"/v1/chats/{chat['id']}/items"))["items"]
                chains = _ok(alice.get(f"{WS}/collaboration"))["items"]
        return chat, items, chains

    chat, items, chains = asyncio.run(scenario())
    received = [
        i
        for i in items
        if i["kind"] == "delivery" and (i.get("communication") or {}).get("direction") == "received"
    ]
    assert [i["communication"]["peer"] for i in received] == [helper["id"]]
    assert "Yes, the build is green." in received[0]["text"]
    assert [i["text"] for i in items if i["kind"] == "bot"][-1] == "My colleague says yes."
    mine = [c for c in chains if c["rootChat"] == chat["id"]]
    assert [c["status"] for c in mine] == ["done"], mine


def test_nd1_bot_discussion_v1_is_announced_and_a_group_discusses_in_rounds(
    world, admin, bot_model
):
    """WS-5: a message asking for two rounds in a group of two bots gets each bot once per
    round, every round."""
    bots = _bots(world, admin, "Ada", "Bea")
    names = {b["name"] for b in bots}

    def route(body):
        name = bot_of(body)
        if name not in names:
            return None
        said = " ".join(str(m["content"]) for m in body["messages"])
        rounds = re.findall(r"\(round (\d+) of", said)
        return completion(f"{name} in round {rounds[-1] if rounds else 1}")

    bot_model.routes.append(route)
    channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={
                "org": world.org,
                "people": [world.users["alice"]],
                "bots": [b["id"] for b in bots],
            },
        )
    )
    with world.client("alice") as alice:
        _announced(alice, "bot-discussion-v1")
        chat = _ok(alice.post("/v1/chats", json={"channel": channel["id"]}))
        result = _ok(
            alice.post(
                f"/v1/chats/{chat['id']}/turns?wait=true",
                json={"text": "Discuss: tabs or spaces?", "rounds": 2},
            )
        )
    assert result["turn"]["status"] == "done" and result["turn"]["rounds"] == 2
    said = [i for i in result["items"] if i["kind"] == "bot"]
    assert len(said) == 4, result["items"]
    for k, pair in enumerate((said[:2], said[2:]), start=1):
        assert {i["author"] for i in pair} == {b["id"] for b in bots}
        assert all(f"in round {k}" in i["text"] for i in pair), pair
