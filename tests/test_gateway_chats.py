"""Chats, turns and the memory bot over HTTP and the event stream, with the models served by
OpenAI-compatible servers on loopback."""

from __future__ import annotations

import asyncio

from gateway.client import EventClient
from tests.openai_stub import completion


def _setup(world, admin, model="bot"):
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"botMemoryModel": "mem"}})
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": "Helper", "org": world.org, "owner": world.users["alice"], "model": model},
    ).json()["id"]
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": bot}).json()
    return bot, chat


def test_a_turn_with_confide_learns_and_streams_the_job(world, admin, model_stubs):
    bot_model, mem = model_stubs["bot"], model_stubs["mem"]
    bot, chat = _setup(world, admin)
    assert chat["kind"] == "direct" and chat["owner"] == world.users["alice"]
    bot_model.answer(
        completion(None, tool_calls=[("confide", {"text": "Alice moved; I want to get it right"})]),
        completion("Welcome to Oslo!"),
    )
    learn = {"content": "Alice lives in Oslo", "items": [{"chat": chat["id"], "item": "i-1"}]}
    mem.answer(
        completion("Thank you for telling me."),
        completion(None, tool_calls=[("learn_fact", learn)]),
    )

    async def scenario():
        events = EventClient(world.server.url, world.tokens["alice"])
        it = aiter(events)
        first = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(0.3)  # connected and live before the turn
        with world.client("alice") as alice:
            r = await asyncio.to_thread(
                alice.post,
                f"/v1/chats/{chat['id']}/turns?wait=true",
                json={"text": "I moved to Oslo"},
            )
        frames = [await asyncio.wait_for(first, 5)]
        while not (frames[-1].type == "memory.job.changed" and frames[-1].data["status"] == "done"):
            frames.append(await asyncio.wait_for(it.__anext__(), 10))
        await events.close()
        return r, frames

    r, frames = asyncio.run(scenario())
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["turn"]["status"] == "done" and body["turn"]["operator"] == world.users["alice"]
    assert [(i["kind"], i["text"]) for i in body["items"]] == [
        ("person", "I moved to Oslo"),
        ("bot", "Welcome to Oslo!"),
    ]
    types = [f.type for f in frames]
    assert types.count("chat.item.created") == 2 and "memory.changed" in types
    with world.client("alice") as alice:
        (fact,) = alice.get(f"/v1/bots/{bot}/memory").json()["entries"]
        assert fact["layer"] == "fact" and fact["sources"] == [{"chat": chat["id"], "item": "i-1"}]
        assert (
            f"chat:{chat['id']}" in fact["tags"] and f"from:{world.users['alice']}" in fact["tags"]
        )
        conf = alice.get(f"/v1/chats/{chat['id']}/confessions").json()["confessions"]
        assert conf[0]["answer"] == "Thank you for telling me."
        assert alice.delete(f"/v1/chats/{chat['id']}/items").json() == {"count": 2}
        assert alice.get(f"/v1/chats/{chat['id']}/items").json() == {"items": []}
        assert len(alice.get(f"/v1/bots/{bot}/memory").json()["entries"]) == 1  # API-5
        r = alice.post(f"/v1/bots/{bot}/memory/purge", json={"tag": f"chat:{chat['id']}"})
        assert r.json() == {"count": 1}
    with world.client("bob") as bob:  # API-6: only the chat's owner
        assert bob.get(f"/v1/chats/{chat['id']}/confessions").status_code == 403
        assert bob.get(f"/v1/chats/{chat['id']}/enrichments").status_code == 403
        assert bob.post(f"/v1/chats/{chat['id']}/turns", json={"text": "x"}).status_code == 403


def test_turn_without_a_bot_model_fails_clearly_and_202_without_wait(world, admin):
    _, chat = _setup(world, admin, model=None)
    with world.client("alice") as alice:
        r = alice.post(f"/v1/chats/{chat['id']}/turns", json={"text": "hello"})
        assert r.status_code == 202 and r.json()["turn"]["status"] == "running"
        again = alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "hello?"})
        assert again.json()["turn"]["status"] == "failed"
        assert again.json()["items"][-1]["kind"] == "notification"
        assert alice.post(f"/v1/chats/{chat['id']}/turns", json={"text": ""}).status_code == 400
        assert alice.post(f"/v1/chats/{chat['id']}/turns", json={"txt": "x"}).status_code == 400
        assert alice.get("/v1/chats/chat_missing/items").status_code == 404
