"""One JSON casing: every response body and event frame of the real server has
camelCase keys; old snake_case names are still accepted on input.

The walk fails on any key with `_` except `_tag` (the memory command union, a contract) and
the keys of maps keyed by data (a bot's `grants` by user id, a project's `metadata`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import httpx
import msgspec

from engine.casing import camel, camel_keys, snake_keys
from gateway.client import EventClient
from tests.openai_stub import completion

WS = "/api/app/workspace"
DATA_MAPS = {"grants", "metadata", "files"}  # keyed by user ids, user keys, file paths


def snake_keys_in(value, path="$") -> list[str]:
    bad: list[str] = []
    if isinstance(value, dict):
        for k, v in value.items():
            if "_" in k and k != "_tag":
                bad.append(f"{path}.{k}")
            if k in DATA_MAPS and isinstance(v, dict):
                for dk, dv in v.items():
                    bad += snake_keys_in(dv, f"{path}.{k}[{dk}]")
            else:
                bad += snake_keys_in(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            bad += snake_keys_in(v, f"{path}[{i}]")
    return bad


class Walker:
    """Every answer passes through here: its body is walked for snake_case keys."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.bad: list[str] = []

    def __call__(self, r: httpx.Response) -> httpx.Response:
        r.read()
        label = f"{r.request.method} {r.request.url.path} {r.status_code}"
        self.seen.append(label)
        if r.headers.get("content-type", "").startswith("application/json"):
            self.bad += [f"{label}: {k}" for k in snake_keys_in(r.json())]
        return r


def _client(server, token, walker) -> httpx.Client:
    return httpx.Client(
        base_url=server.url,
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
        event_hooks={"response": [walker]},
    )


def _ok(r: httpx.Response) -> dict:
    assert r.is_success, (r.request.url.path, r.status_code, r.text)
    return r.json()


def _rid() -> str:
    return secrets.token_hex(6)


def test_camel_and_snake_helpers():
    assert camel("created_at") == "createdAt" and camel("verdict_by") == "verdictBy"
    assert camel("_tag") == "_tag" and camel("rootChat") == "rootChat"
    out = camel_keys({"tool_calls": [{"tool_call_id": 1}], "grants": {"u_a": "read"}})
    assert out == {"toolCalls": [{"toolCallId": 1}], "grants": {"u_a": "read"}}
    assert snake_keys({"toolCalls": [{"toolCallId": 1}]}) == {"tool_calls": [{"tool_call_id": 1}]}


def test_every_route_family_answers_in_camel_case(server, model_stubs):
    bot_model, mem = model_stubs["bot"], model_stubs["mem"]
    walk = Walker()
    from tests.conftest import ADMIN

    admin = _client(server, ADMIN, walk)
    tag = secrets.token_hex(3)
    org = _ok(admin.post("/v1/admin/orgs", json={"name": f"casing {tag}"}))["id"]
    _ok(admin.patch(f"/v1/admin/orgs/{org}", json={"settings": {"botMemoryModel": "mem"}}))
    users, tokens = {}, {}
    for name in ("alice", "bob"):
        u = _ok(admin.post("/v1/admin/users", json={"name": name, "orgs": [org]}))
        users[name], tokens[name] = u["id"], u["token"]
    lead = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": f"Lead{tag}", "org": org, "owner": users["alice"], "model": "bot"},
        )
    )
    crew = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": f"Crew{tag}", "org": org, "owner": users["bob"], "model": "bot"},
        )
    )
    _ok(
        admin.post(
            "/v1/admin/grants",
            json={"bot": crew["id"], "user": users["alice"], "permission": "read"},
        )
    )
    channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={
                "org": org,
                "people": [users["alice"], users["bob"]],
                "bots": [lead["id"], crew["id"]],
                "mode": "delivery",
                "leader": lead["id"],
            },
        )
    )

    def route(body):
        first = str(body["messages"][0]["content"])
        last = body["messages"][-1]
        text = str(last["content"])
        if f"Lead{tag}" in first and first.startswith(f"You are Lead{tag}"):
            if last["role"] == "tool":
                return completion("The crew is on it.")
            if "[delivery from" in text:
                return completion("Final result: ready.")
            if "direct" in text:
                return completion(
                    None, tool_calls=[("confide", {"text": "I want to get this right"})]
                )
            msg = {"agent": f"Crew{tag}", "message": "Draw the poster"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if first.startswith(f"You are Crew{tag}"):
            return completion("Poster drawn.")
        return None

    bot_model.routes.append(route)
    mem.answer(completion("Thanks for telling me."))
    frames: list[dict] = []

    events = EventClient(server.url, tokens["alice"])

    async def listen() -> None:
        async for f in events:
            frames.append(f.data or {})

    def drive() -> None:
        alice = _client(server, tokens["alice"], walk)
        bob = _client(server, tokens["bob"], walk)
        _ok(alice.get("/healthz"))
        _ok(alice.get("/v1/capabilities"))
        _ok(alice.get("/openapi.json"))
        for path in ("/v1/me", "/v1/chats", "/v1/bots", "/v1/channels"):
            _ok(alice.get(path))
        for kind in ("orgs", "users", "bots", "channels"):
            _ok(admin.get(f"/v1/admin/{kind}", params={"limit": 2}))
        # A direct chat: a turn (with confide), items, confessions, enrichments.
        direct = _ok(alice.post("/v1/chats", json={"bot": lead["id"]}))
        turns = f"/v1/chats/{direct['id']}/turns"
        _ok(alice.post(f"{turns}?wait=true", json={"text": "a direct question"}))
        _ok(alice.post(turns, json={"text": "a direct question", "request_id": _rid()}))
        _ok(alice.get(f"/v1/chats/{direct['id']}/items"))
        _ok(alice.get(f"/v1/chats/{direct['id']}/confessions"))
        _ok(alice.get(f"/v1/chats/{direct['id']}/enrichments"))
        # A delivery group: a chain, a verdict, the chain listing and stop, the group mode.
        group = _ok(alice.post("/v1/chats", json={"channel": channel["id"]}))
        gturns = f"/v1/chats/{group['id']}/turns"
        turn = _ok(alice.post(f"{gturns}?wait=true", json={"text": "Make a poster"}))["turn"]
        deadline = time.monotonic() + 30
        chains = []
        while time.monotonic() < deadline:
            r = alice.get(f"{WS}/collaboration")
            chains = r.json().get("items", []) if r.status_code == 200 else []
            if any(c["status"] == "done" for c in chains):
                break
            time.sleep(0.2)
        assert chains, "no collaboration chain"
        alice.post(f"{WS}/collaboration/{chains[0]['id']}/stop")
        _ok(bob.post(f"{gturns}/{turn['id']}/verdict", json={"accepted": True, "note": "ok"}))
        _ok(alice.get(f"/v1/chats/{group['id']}/items"))
        _ok(alice.post(f"{WS}/groups/{channel['id']}/mode", json={"mode": "discussion"}))
        # Bot memory: remember, read, log, widen, forget, the memory bot's settings.
        mem_url = f"/v1/bots/{lead['id']}/memory"
        cmd = {"_tag": "Remember", "content": "Alice likes tea", "tags": []}
        entry = _ok(alice.post(mem_url, json={"command": cmd, "request_id": _rid()}))
        _ok(alice.get(mem_url))
        _ok(alice.get(f"{mem_url}/log"))
        alice.post(f"{mem_url}/{entry['id']}/widen", json={"to": f"user:{users['bob']}"})
        settings = _ok(alice.get(f"{mem_url}/bot"))
        alice.patch(f"{mem_url}/bot", json={"expected": settings.get("version", 1)})
        _ok(alice.post(mem_url, json={"command": {"_tag": "Forget", "id": entry["id"]}}))
        _ok(alice.get(f"/v1/bots/{lead['id']}/node"))
        # Self rules, projects, workspace memories, memory jobs.
        rules = _ok(alice.get(f"{WS}/bots/{lead['id']}/rules"))
        alice.patch(
            f"{WS}/bots/{lead['id']}/rules",
            json={"expected_revision": rules["revision"], "tone": "calm"},
        )
        project = _ok(
            alice.post(
                f"{WS}/projects",
                json={"request_id": _rid(), "name": "Casing", "metadata": {"my_key": "v"}},
            )
        )
        _ok(alice.get(f"{WS}/projects"))
        fact = _ok(
            alice.post(
                f"{WS}/memories",
                json={
                    "request_id": _rid(),
                    "scope": "user",
                    "bot": lead["id"],
                    "content": "Alice drinks tea.",
                    "topics": ["drinks-and-food"],
                },
            )
        )
        fact = fact.get("entry", fact)
        _ok(alice.get(f"{WS}/memories", params={"scope": "user", "bot": lead["id"]}))
        _ok(alice.get(f"{WS}/memories/{fact['id']}/revisions"))
        _ok(alice.get(f"{WS}/memory-jobs"))
        export = _ok(admin.get("/v1/admin/export"))["files"]
        assert any(p.endswith("account.json") for p in export)
        for path, text in export.items():
            if path.endswith(".json"):
                walk.bad += [f"export {path}: {k}" for k in snake_keys_in(json.loads(text))]
            elif text.startswith("---\n"):
                front = text.split("---\n")[1].splitlines()
                walk.bad += [f"export {path}: {ln}" for ln in front if "_" in ln.split(":")[0]]
        # Errors are camelCase too (their details included).
        alice.get("/v1/chats/nosuch/items")
        alice.post("/v1/chats", content=b"{")
        assert project
        alice.close()
        bob.close()

    async def scenario() -> None:
        task = asyncio.create_task(listen())
        await asyncio.sleep(0.3)
        try:
            await asyncio.to_thread(drive)
            await asyncio.sleep(1.0)
        finally:
            await events.close()
            task.cancel()

    try:
        asyncio.run(scenario())
    finally:
        bot_model.routes.clear()
        admin.close()
    assert len(walk.seen) > 30
    assert frames, "no event frames"
    bad_frames = [k for f in frames for k in snake_keys_in(f)]
    assert walk.bad == [] and bad_frames == []


def test_node_frames_in_either_casing():
    from gateway.nodes import Hello, Result, decode_frame

    old = msgspec.json.encode(
        {"type": "hello", "node": "n", "capabilities": {"memory_isolation": True}}
    )
    new = msgspec.json.encode(
        {"type": "hello", "node": "n", "capabilities": {"memoryIsolation": True}}
    )
    assert decode_frame(old, Hello) == decode_frame(new, Hello)
    assert decode_frame(new, Hello).capabilities.memory_isolation is True
    result = {"type": "result", "id": "w", "toolCalls": [{"id": "c", "name": "f", "arguments": ""}]}
    decoded = decode_frame(msgspec.json.encode(result), Result)
    assert decoded.tool_calls[0].name == "f"
