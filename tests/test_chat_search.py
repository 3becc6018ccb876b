"""Chat history search over HTTP: `GET /v1/chats/{chat}/items?q=`, `GET /v1/search?q=` and the
bots' `workspace_chat_search`, on the real server (real Ray actors, DuckDB files, uvicorn, the
embedding stub: hybrid search). Only what the caller may read by the chat routes' read rule is
ever found; pages, bounds and errors as documented."""

from __future__ import annotations

import json
import secrets

import pytest

from tests.conftest import _ok, user_client
from tests.openai_stub import completion

pytestmark = pytest.mark.ray


def _bot(admin, world, owner: str = "alice") -> str:
    body = {"name": f"b{secrets.token_hex(3)}", "org": world.org, "model": "bot"}
    return _ok(admin.post("/v1/admin/bots", json={**body, "owner": world.users[owner]}))["id"]


def _grant(admin, bot: str, user: str) -> None:
    _ok(admin.post("/v1/admin/grants", json={"bot": bot, "user": user, "permission": "read"}))


def _say(client, chat: str, text: str) -> None:
    r = client.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": text})
    assert r.status_code == 200, r.text
    assert r.json()["turn"]["status"] == "done", r.text


def _found(client, path: str, q: str, **params) -> list[tuple[str, str]]:
    r = client.get(path, params={"q": q, **params})
    assert r.status_code == 200, r.text
    return [(i["chat"], i["text"]) for i in r.json()["items"]]


def _error(resp, status: int) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and body["error"]["message"], body
    return body["error"]["code"]


def test_people_find_only_what_their_chats_hold(world, admin, server):
    """A chat's owner searches it; `/v1/search` covers the caller's direct chats and their
    channels' group chat, never another person's chat (403 for its `?q=` as for its listing),
    nor another org's (404), nor a chat whose bot the caller may no longer use."""
    users = world.users
    bot, other = _bot(admin, world), _bot(admin, world, "bob")
    _grant(admin, bot, users["bob"])
    channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={"org": world.org, "people": [users["alice"], users["carol"]], "bots": [bot]},
        )
    )["id"]
    with world.client("alice") as alice, world.client("bob") as bob, world.client("carol") as carol:
        mine = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        bobs = _ok(bob.post("/v1/chats", json={"bot": bot}))["id"]
        bobs_own = _ok(bob.post("/v1/chats", json={"bot": other}))["id"]
        group = _ok(alice.post("/v1/chats", json={"channel": channel}))["id"]
        _say(alice, mine, "The zephyrine census counts quokkas on Tuesday")
        _say(alice, mine, "Lunch is at noon")
        _say(bob, bobs, "Bob's zephyrine photos from the island")
        _say(bob, bobs_own, "zephyrine notes for the other bot")
        _say(carol, group, "The group's zephyrine plan for the weekend")

        found = _found(alice, f"/v1/chats/{mine}/items", "zephyrine census")
        assert found[0] == (mine, "The zephyrine census counts quokkas on Tuesday")
        assert {c for c, _ in found} == {mine}
        hit = alice.get(f"/v1/chats/{mine}/items", params={"q": "census"}).json()["items"][0]
        assert hit["id"] == "i-1" and hit["kind"] == "person" and "keyword" in hit["foundBy"]
        assert hit["score"] > 0

        everywhere = _found(alice, "/v1/search", "zephyrine")
        assert {c for c, _ in everywhere} == {mine, group}
        assert len(everywhere) == 2
        assert {c for c, _ in _found(carol, "/v1/search", "zephyrine")} == {group}
        assert {c for c, _ in _found(bob, "/v1/search", "zephyrine")} == {bobs, bobs_own}

        # Another person's chat: refused as its listing is; nothing of it leaks through ?q=.
        assert _error(bob.get(f"/v1/chats/{mine}/items", params={"q": "census"}), 403) == (
            "not_chat_owner"
        )
        # A grant revoked: bob's chat with the bot is still his, listed, but no longer read.
        r = admin.delete(f"/v1/admin/bots/{bot}/grants/{users['bob']}")
        assert r.is_success, r.text
        assert bob.get(f"/v1/chats/{bobs}/items").status_code == 403
        assert {c for c, _ in _found(bob, "/v1/search", "zephyrine")} == {bobs_own}

    stranger_org = _ok(admin.post("/v1/admin/orgs", json={"name": "elsewhere"}))["id"]
    dave = _ok(admin.post("/v1/admin/users", json={"name": "dave", "orgs": [stranger_org]}))
    with user_client(server, dave["token"]) as d:
        assert _error(d.get(f"/v1/chats/{mine}/items", params={"q": "census"}), 404) == (
            "chat_not_found"
        )
        assert _found(d, "/v1/search", "zephyrine") == []


def test_search_pages_bounds_and_deleted_history(world, admin):
    bot = _bot(admin, world)
    with world.client("alice") as alice:
        chat = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        for n in range(3):
            _say(alice, chat, f"marmalade batch {n} " + "marmalade " * n)
        path = f"/v1/chats/{chat}/items"
        whole = _found(alice, path, "marmalade", limit=10)
        assert len(whole) == 3
        pages, cursor = [], None
        while True:
            params = {"q": "marmalade", "limit": 1} | ({"cursor": cursor} if cursor else {})
            body = _ok(alice.get(path, params=params))
            pages += [(i["chat"], i["text"]) for i in body["items"]]
            cursor = body["nextCursor"]
            if cursor is None:
                break
        assert pages == whole
        assert _found(alice, "/v1/search", "marmalade", limit=10) == whole

        assert _error(alice.get(path, params={"q": "x" * 1001}), 400) == "query_too_long"
        assert _error(alice.get("/v1/search", params={"q": " "}), 400) == "invalid_query"
        assert _error(alice.get("/v1/search"), 400) == "invalid_query"
        assert _error(alice.get(path, params={"q": "a", "limit": 101}), 422) == "out_of_range"
        assert _error(alice.get(path, params={"q": "a", "limit": 0}), 422) == "out_of_range"
        r = alice.get(path, params={"q": "a", "limit": 100, "cursor": 401})
        assert _error(r, 422) == "out_of_range"
        assert _error(alice.get(path, params={"q": "a", "using": "x"}), 400) == "invalid_using"

        assert alice.delete(path).json() == {"count": 6}
        assert _found(alice, path, "marmalade") == []
        assert _found(alice, "/v1/search", "marmalade") == []
        _say(alice, chat, "fresh marmalade after the deletion")
        assert _found(alice, path, "marmalade") == [(chat, "fresh marmalade after the deletion")]


def test_the_bot_tool_searches_its_chats_with_this_person_only(world, admin, model_stubs):
    """`workspace_chat_search` in a person's direct chat: that person's chats with this bot
    (direct, and groups the bot is in), never another person's chat with it nor the person's
    chats with another bot; in a group, the group's own history only."""
    bot_model = model_stubs["bot"]
    users = world.users
    name = f"seeker{secrets.token_hex(3)}"
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": name, "org": world.org, "owner": users["alice"], "model": "bot"},
        )
    )["id"]
    _grant(admin, bot, users["bob"])
    _grant(admin, bot, users["carol"])
    channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={"org": world.org, "people": [users["alice"], users["carol"]], "bots": [bot]},
        )
    )["id"]
    with world.client("alice") as alice, world.client("bob") as bob, world.client("carol") as carol:
        first = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        second = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        elsewhere = _ok(alice.post("/v1/chats", json={"bot": _bot(admin, world)}))["id"]
        bobs = _ok(bob.post("/v1/chats", json={"bot": bot}))["id"]
        group = _ok(alice.post("/v1/chats", json={"channel": channel}))["id"]
        carols = _ok(carol.post("/v1/chats", json={"bot": bot}))["id"]
        _say(carol, carols, "Carol's own brompton, not the group's")
        _say(alice, first, "My brompton bicycle is green")
        _say(alice, elsewhere, "brompton remark to the other bot")
        _say(bob, bobs, "Bob's brompton secret")
        _say(carol, group, "brompton group ride on Sunday")

        def tool(client, chat: str) -> list[dict]:
            bot_model.routes.clear()
            call = completion(None, tool_calls=[("workspace_chat_search", {"query": "brompton"})])
            asked: list[dict] = []

            def route(body):
                if not body["messages"][0]["content"].startswith(f"You are {name}."):
                    return None
                asked.append(body)
                return call if len(asked) == 1 else completion("done")

            bot_model.routes.append(route)
            try:
                _say(client, chat, "what about the brompton?")
            finally:
                bot_model.routes.clear()
            result = next(m for m in asked[-1]["messages"] if m["role"] == "tool")
            return json.loads(result["content"])["items"]

        direct = tool(alice, second)
        assert {first, group} <= {h["chat"] for h in direct} <= {first, group, second}
        assert any(h["text"] == "My brompton bicycle is green" for h in direct)
        in_group = tool(carol, group)  # carol's direct chat with the bot is hers, not the room's
        assert {h["chat"] for h in in_group} == {group}
        assert {h["chat"] for h in tool(carol, carols)} == {carols, group}
        assert {h["chat"] for h in tool(bob, bobs)} == {bobs}
