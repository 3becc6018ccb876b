"""External execution nodes over `/v1/nodes` (ND-1 … ND-3): a node connects with the admin
token, says what it can do, and answers the model requests of bots whose model is of kind
`node`. Memory reaches it only when it reports isolation; otherwise the API says so."""

from __future__ import annotations

import asyncio
import json

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.conftest import ADMIN


def _ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/nodes"


async def _node(server, isolation: bool, answers: list, seen: list, ready: asyncio.Event):
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with connect(_ws_url(server), additional_headers=headers) as ws:
        caps = {"memoryIsolation": isolation, "memoryExtraction": isolation}
        await ws.send(json.dumps({"type": "hello", "node": "edge-1", "capabilities": caps}))
        raw = await ws.recv()
        assert isinstance(raw, str)  # text frames, every one
        welcome = json.loads(raw)
        assert welcome["type"] == "welcome" and welcome["node"] == "edge-1"
        ready.set()
        async for raw in ws:
            assert isinstance(raw, str)
            frame = json.loads(raw)
            assert frame["type"] == "request"
            seen.append(frame)
            text = answers.pop(0) if answers else "edge says hi"
            await ws.send(json.dumps({"type": "result", "id": frame["id"], "text": text}))


@pytest.mark.anyio
async def test_a_node_without_isolation_chats_without_memory(world, admin, server, model_stubs):
    mem = model_stubs["mem"]
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"botMemoryModel": "mem"}})
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": "Edgy", "org": world.org, "owner": world.users["alice"], "model": "edge"},
    ).json()["id"]
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": bot}).json()
        # Nobody serves the node yet: a clear failure, and an honest status.
        r = alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "hello?"}).json()
        assert r["turn"]["status"] == "failed"
        status = alice.get(f"/v1/bots/{bot}/node").json()
        assert status["node"]["connected"] is False and status["memoryInjected"] is False
        assert status["node"]["hint"]
        secret = "my locker code is 4711"
        alice.post(
            f"/v1/bots/{bot}/memory", json={"command": {"_tag": "Remember", "content": secret}}
        )

    seen: list = []
    ready = asyncio.Event()
    node = asyncio.create_task(_node(server, False, ["plain answer"], seen, ready))
    await asyncio.wait_for(ready.wait(), 10)
    with world.client("alice") as alice:
        caps = (await asyncio.to_thread(alice.get, "/v1/capabilities")).json()
        edge = next(n for n in caps["nodes"] if n["id"] == "edge-1")
        builtin = next(n for n in caps["nodes"] if n["id"] == "builtin")
        status = (await asyncio.to_thread(alice.get, f"/v1/bots/{bot}/node")).json()
        before = len(mem.requests)
        r = await asyncio.to_thread(
            alice.post,
            f"/v1/chats/{chat['id']}/turns?wait=true",
            json={"text": "what is my locker code?"},
        )
    node.cancel()
    result = r.json()
    assert builtin["memoryIsolation"] and builtin["memoryExtraction"]
    assert edge["memoryIsolation"] is False and "Upgrade" in edge["hint"]
    assert status["node"]["connected"] and status["memoryInjected"] is False
    assert result["turn"]["status"] == "done"
    assert [i["text"] for i in result["items"] if i["kind"] == "bot"] == ["plain answer"]
    # ND-2: no enrichment ran and no memory crossed to the node.
    assert len(mem.requests) == before
    assert "4711" not in json.dumps(seen)
    assert any(t["name"] == "confide" for t in seen[-1]["tools"])


@pytest.mark.anyio
async def test_nodes_need_the_admin_token_and_a_hello(server, world):
    user = {"Authorization": f"Bearer {world.tokens['alice']}"}
    async with connect(_ws_url(server), additional_headers=user) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 4401
    admin = {"Authorization": f"Bearer {ADMIN}"}
    async with connect(_ws_url(server), additional_headers=admin) as ws:
        await ws.send("not json")
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
        assert closed.value.rcvd.code == 4400


@pytest.mark.anyio
async def test_a_node_with_isolation_but_no_extraction_gets_no_learning_requests(
    world, admin, server, engine
):
    """ND-2: `memoryIsolation` and `memoryExtraction` are two capabilities. A node that isolates
    memory but cannot run extraction, serving the org's memory model, is sent no learning
    request: the job fails with the reason instead."""
    import time

    import ray

    r = admin.patch(
        f"/v1/admin/orgs/{world.org}",
        json={"settings": {"botMemoryModel": "edge", "autoRecord": True}},
    )
    assert r.status_code == 200, r.text
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": "Plain", "org": world.org, "owner": world.users["alice"], "model": "bot"},
    ).json()["id"]

    async def node(seen: list, ready: asyncio.Event) -> None:
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with connect(_ws_url(server), additional_headers=headers) as ws:
            caps = {"memoryIsolation": True, "memoryExtraction": False}
            await ws.send(json.dumps({"type": "hello", "node": "edge-1", "capabilities": caps}))
            assert json.loads(await ws.recv())["type"] == "welcome"
            ready.set()
            async for raw in ws:
                frame = json.loads(raw)
                seen.append(frame)
                await ws.send(json.dumps({"type": "result", "id": frame["id"], "text": "ok"}))

    def job_of(alice, chat: str) -> dict:
        deadline = time.monotonic() + 30
        while True:
            jobs = alice.get("/api/app/workspace/memory-jobs").json()["jobs"]
            mine = [j for j in jobs if j["chat"] == chat]
            if mine and mine[0]["status"] in ("done", "failed"):
                return mine[0]
            assert time.monotonic() < deadline, jobs
            time.sleep(0.05)

    seen: list = []
    ready = asyncio.Event()
    task = asyncio.create_task(node(seen, ready))
    await asyncio.wait_for(ready.wait(), 10)
    with world.client("alice") as alice:
        status = (await asyncio.to_thread(alice.get, f"/v1/bots/{bot}/node")).json()
        assert status["node"]["id"] == "builtin"  # the bot itself runs here
        chat = (await asyncio.to_thread(alice.post, "/v1/chats", json={"bot": bot})).json()
        r = await asyncio.to_thread(
            alice.post,
            f"/v1/chats/{chat['id']}/turns?wait=true",
            json={"text": "My locker code is 4711, please remember it"},
        )
        assert r.status_code == 200, r.text
        shard = engine.shard_for(world.users["alice"])
        await asyncio.to_thread(ray.get, shard.learning_idle.remote())
        job = await asyncio.to_thread(job_of, alice, chat["id"])
    task.cancel()
    assert job["status"] == "failed" and "extraction" in (job["error"] or ""), job
    learning = [f for f in seen if any(t["name"] == "learn_fact" for t in f.get("tools") or ())]
    assert learning == [], learning
