"""Deleting deletes, and memory reaches only whom it is for (seed 000 purge and forget, SPEC
API-2 … API-5, SC-1), through the real HTTP API.

Purge by `from:`, `org:` or `chat:` covers every store of the bot's one memory: its learned and
pinned entries, the workspace records people wrote for it, and the user and project facts its
memory bot learned from a purged chat. Forget works on every entry the bot's memory lists that
the caller may forget; the memory log shows workspace record changes; a person's user memory
reaches only the bots of their own account; the memory bot's settings are read with write.
"""

from __future__ import annotations

import json
import secrets

import httpx

from tests.openai_stub import completion

WS = "/api/app/workspace"


def _ok(r: httpx.Response, code: int = 200) -> dict:
    assert r.status_code == code, r.text
    return r.json()


def _rid() -> str:
    return "r-" + secrets.token_hex(6)


def _bot(admin, world, owner: str, name: str | None = None) -> tuple[str, str]:
    name = name or f"B{secrets.token_hex(4)}"
    body = {"name": name, "org": world.org, "owner": world.users[owner], "model": "bot"}
    return _ok(admin.post("/v1/admin/bots", json=body), 201)["id"], name


def _grant(admin, bot: str, user: str, permission: str = "read") -> None:
    body = {"bot": bot, "user": user, "permission": permission}
    _ok(admin.post("/v1/admin/grants", json=body), 201)


def _record(client, bot: str, content: str, scope: str = "bot", **extra) -> dict:
    body = {"requestId": _rid(), "scope": scope, "bot": bot, "content": content, **extra}
    return _ok(client.post(f"{WS}/memories", json=body), 201)


# --- user memory is for the bots of the same account (SC-1) -------------------------------------


def test_a_persons_user_memory_reaches_only_the_bots_of_their_own_account(world, admin, bot_model):
    """Alice's user memory is in the prompt and the search tool of her own bot, and in neither
    of a bot Bob owns that she uses through a grant."""
    mine, mine_name = _bot(admin, world, "alice")
    theirs, theirs_name = _bot(admin, world, "bob")
    _grant(admin, theirs, world.users["alice"])
    secret = f"My bike lock code is {secrets.randbelow(10**6):06d}"
    prompts: dict[str, list[dict]] = {mine_name: [], theirs_name: []}

    def route(body):
        system = body["messages"][0]["content"]
        name = next((n for n in prompts if system.startswith(f"You are {n}.")), None)
        if name is None:
            return None
        prompts[name].append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            return completion("Looked.")
        if "look it up" in str(last["content"]):
            return completion(None, tool_calls=[("workspace_memory_search", {"query": "bike"})])
        return completion("Hi.")

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        _record(alice, mine, secret, scope="user")
        for bot in (mine, theirs):
            chat = _ok(alice.post("/v1/chats", json={"bot": bot}), 201)
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Hello"}))
            turn = {"text": "look it up"}
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json=turn))
    # Her own bot: in the prompt and found by its search tool.
    first = prompts[mine_name][0]["messages"][0]["content"]
    assert secret in first
    found = json.loads(prompts[mine_name][-1]["messages"][-1]["content"])["entries"]
    assert secret in [e["content"] for e in found]
    # Bob's bot: neither.
    assert prompts[theirs_name], "Bob's bot was asked"
    assert all(secret not in json.dumps(p) for p in prompts[theirs_name])
    found = json.loads(prompts[theirs_name][-1]["messages"][-1]["content"])["entries"]
    assert found == []
