"""Bad input gets a clear 4xx JSON error and changes nothing."""

from __future__ import annotations

import pytest

from tests.conftest import user_client


def _error(resp, status: int) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}
    assert body["error"]["message"]
    return body["error"]["code"]


BAD_BODIES = [
    (b"{not json", 400, "invalid_json"),
    (b"", 400, "invalid_json"),
    (b'{"command": {"_tag": "Delete", "id": "x"}}', 400, "invalid_body"),
    (b'{"command": {"_tag": "Remember"}}', 400, "invalid_body"),
    (
        b'{"command": {"_tag": "Remember", "content": "x", "tags": ["Bad Topic"]}}',
        400,
        "invalid_tag",
    ),
    (
        b'{"command": {"_tag": "Remember", "content": "x", "tags": ["for:bot"]}}',
        400,
        "system_tag_not_allowed",
    ),
    (
        b'{"command": {"_tag": "Remember", "content": "x", "tags": ["org:o_other"]}}',
        400,
        "system_tag_not_allowed",
    ),
    (b'{"command": {"_tag": "Remember", "content": "   "}}', 400, "invalid_content"),
    (b'{"command": {"_tag": "Remember", "content": "x"}, "extra": 1}', 400, "invalid_body"),
    (b"[1, 2]", 400, "invalid_body"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD_BODIES)
def test_bad_memory_commands_change_nothing(world, body, status, code):
    with world.client("alice") as alice:
        before = alice.get(f"/v1/bots/{world.bot}/memory").json()
        r = alice.post(
            f"/v1/bots/{world.bot}/memory",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert _error(r, status) == code
        assert alice.get(f"/v1/bots/{world.bot}/memory").json() == before


def test_oversized_body_is_413(world):
    with world.client("alice") as alice:
        big = b'{"command": {"_tag": "Remember", "content": "' + b"x" * (1024 * 1024 + 10) + b'"}}'
        r = alice.post(f"/v1/bots/{world.bot}/memory", content=big)
        assert _error(r, 413) == "body_too_large"
        assert alice.get(f"/v1/bots/{world.bot}/memory").json()["version"] == 0


def test_missing_or_wrong_token_is_401(server, world):
    import httpx

    with httpx.Client(base_url=server.url) as anon:
        r = anon.get(f"/v1/bots/{world.bot}/memory")
        assert _error(r, 401) == "missing_token"
        assert r.headers["www-authenticate"] == "Bearer"
        r = anon.post(f"/v1/bots/{world.bot}/memory", content=b"{bad")
        assert _error(r, 401) == "missing_token"  # auth comes before parsing
    with user_client(server, "obt_forged") as forged:
        assert _error(forged.get(f"/v1/bots/{world.bot}/memory"), 401) == "bad_token"
        assert _error(forged.post("/v1/admin/orgs", json={"name": "x"}), 401) == "bad_token"


def test_unknown_bot_is_404_and_no_grant_is_403(world):
    with world.client("alice") as alice:
        assert _error(alice.get("/v1/bots/b_nope/memory"), 404) == "bot_not_found"
    with world.client("carol") as carol:  # same org, no grant
        assert _error(carol.get(f"/v1/bots/{world.bot}/memory"), 403) == "no_access"
        r = carol.post(
            f"/v1/bots/{world.bot}/memory",
            json={"command": {"_tag": "Remember", "content": "sneaky"}},
        )
        assert _error(r, 403) == "no_access"


def test_admin_routes_need_the_admin_token(world):
    with world.client("alice") as alice:
        assert _error(alice.post("/v1/admin/orgs", json={"name": "x"}), 403) == "admin_only"


def test_user_routes_refuse_the_admin_token(admin, world):
    assert _error(admin.get(f"/v1/bots/{world.bot}/memory"), 403) == "user_only"


def test_org_header_must_be_one_of_the_users_orgs(world):
    with world.client("alice") as alice:
        r = alice.get(f"/v1/bots/{world.bot}/memory", headers={"OpenBot-Org": "o_elsewhere"})
        assert _error(r, 403) == "not_in_org"


def test_bad_purge_tags(world):
    with world.client("alice") as alice:
        for tag in ("topic", "for:bot", "for:person:u_x", "app:calendar", ""):
            r = alice.post(f"/v1/bots/{world.bot}/memory/purge", json={"tag": tag})
            assert _error(r, 400) == "invalid_tag", tag


def test_unknown_route_and_method(world):
    with world.client("alice") as alice:
        assert _error(alice.get("/v1/nothing-here"), 404) == "route_not_found"
        assert _error(alice.delete(f"/v1/bots/{world.bot}/memory"), 405) == "method_not_allowed"


def test_admin_bad_input(admin, world):
    assert _error(admin.post("/v1/admin/users", json={"name": "x", "orgs": ["o_missing"]}), 404)
    assert (
        _error(admin.post("/v1/admin/orgs", json={"name": "x", "id": "bad id!"}), 400)
        == "invalid_id"
    )
    assert (
        _error(admin.post("/v1/admin/orgs", json={"name": "x", "id": world.org}), 409) == "exists"
    )
    r = admin.post(
        "/v1/admin/grants", json={"bot": world.bot, "user": world.users["bob"], "permission": "own"}
    )
    assert _error(r, 400) == "invalid_body"
    r = admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"botMemory": "yes"}})
    assert _error(r, 400) == "invalid_settings"
    r = admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"botMemoryModel": "mem"}})
    assert r.status_code == 200 and r.json()["settings"]["botMemoryModel"] == "mem"
    # A model the server's config does not name is refused before anything changes (422).
    for bad in ("local", ["mem"]):
        r = admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"botMemoryModel": bad}})
        assert r.status_code in (400, 422), r.text
    r = admin.post("/v1/admin/orgs", json={"name": "x", "settings": {"botMemoryModel": "local"}})
    assert _error(r, 422) == "unknown_model"
    org = admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {}}).json()
    assert org["settings"]["botMemoryModel"] == "mem"
    bot = {"name": "m", "org": world.org, "owner": world.users["alice"], "model": "local"}
    assert _error(admin.post("/v1/admin/bots", json=bot), 422) == "unknown_model"
    r = admin.patch(f"/v1/admin/bots/{world.bot}", json={"model": "gpt-x"})
    assert _error(r, 422) == "unknown_model"
    r = admin.patch(f"/v1/admin/bots/{world.bot}", json={"model": "bot", "avatar": "a.png"})
    assert r.status_code == 200 and (r.json()["model"], r.json()["avatar"]) == ("bot", "a.png")
    assert _error(admin.patch(f"/v1/admin/bots/{world.bot}", json={"name": " "}), 400)
    assert _error(admin.patch(f"/v1/admin/bots/{world.bot}", json={"owner": "x"}), 400)
    assert _error(admin.patch("/v1/admin/bots/b_none", json={"name": "n"}), 404)


def test_capabilities_and_openapi(server):
    import httpx

    from tests.conftest import ADMIN

    with httpx.Client(base_url=server.url) as stranger:  # no token: nothing
        assert stranger.get("/v1/capabilities").status_code == 401
        assert stranger.get("/openapi.json").status_code == 401
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        caps = c.get("/v1/capabilities").json()
        assert "bot-memory-v1" in caps["capabilities"]
        assert caps["unavailable"] == []
        assert "bot-file-memory-v1" in caps["capabilities"]
        assert "bot-projects-v1" in caps["capabilities"]
        doc = c.get("/openapi.json").json()
        assert doc["openapi"].startswith("3.")
        assert {"get", "post"} <= set(doc["paths"]["/v1/bots/{bot}/memory"])
        assert "MemoryCommand" in doc["components"]["schemas"]
