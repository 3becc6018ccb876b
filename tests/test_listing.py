"""Listing routes: `GET /v1/chats|bots|channels`, `/v1/me` and the admin lists, with
cursor pagination ({items, nextCursor}), over real HTTP against the real directory actor; a user
sees only what they may."""

from __future__ import annotations

import secrets

import pytest

from engine.errors import InvalidInput
from engine.listing import decode_cursor, encode_cursor, page
from tests.conftest import World, _ok


def _all(client, path: str, limit: int, **query) -> tuple[list[dict], int]:
    """Every record of a listing, page by page; and how many pages it took."""
    out: list[dict] = []
    cursor = None
    pages = 0
    while True:
        params = query | {"limit": limit} | ({"cursor": cursor} if cursor else {})
        body = _ok(client.get(path, params=params))
        assert set(body) == {"items", "nextCursor"}, body
        assert len(body["items"]) <= limit
        out.extend(body["items"])
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            return out, pages
        assert pages < 100


def test_page_walks_every_record_once_in_key_order():
    records = [f"r{k:03d}" for k in (5, 1, 9, 3, 7, 2, 8)]
    seen, cursor = [], None
    while True:
        got = page(records, lambda r: r, cursor, 3)
        seen.extend(got.items)
        cursor = got.nextCursor
        if cursor is None:
            break
    assert seen == sorted(records)
    # A record added before the cursor between pages neither repeats nor shifts the rest.
    first = page(records, lambda r: r, None, 2)
    rest = page([*records, "r000"], lambda r: r, first.nextCursor, 10)
    assert first.items + rest.items == sorted(records)
    assert page([], lambda r: r, None, 5).items == []


@pytest.mark.parametrize("bad", ["%%%", "x" * 600, "AAAA=", "not a cursor!"])
def test_a_cursor_the_server_did_not_make_is_refused(bad):
    with pytest.raises(InvalidInput):
        decode_cursor(bad)
    assert decode_cursor(encode_cursor("chat_1")) == "chat_1"


def test_user_lists_show_only_what_the_user_may(world: World, admin):
    alice, bob = world.users["alice"], world.users["bob"]
    # Alice owns world.bot; bob gets read on a second bot; carol owns a third one.
    tag = secrets.token_hex(3)
    b2 = _ok(
        admin.post("/v1/admin/bots", json={"name": f"b2{tag}", "org": world.org, "owner": alice})
    )
    b3 = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": f"b3{tag}", "org": world.org, "owner": world.users["carol"]},
        )
    )
    _ok(admin.post("/v1/admin/grants", json={"bot": b2["id"], "user": bob, "permission": "read"}))
    ch = _ok(
        admin.post(
            "/v1/admin/channels",
            json={"org": world.org, "name": f"g{tag}", "people": [alice, bob], "bots": [b2["id"]]},
        )
    )
    with world.client("alice") as a, world.client("bob") as b, world.client("carol") as c:
        direct = _ok(a.post("/v1/chats", json={"bot": world.bot}))
        group = _ok(b.post("/v1/chats", json={"channel": ch["id"]}))

        me = _ok(a.get("/v1/me"))
        assert me == {"id": alice, "name": "alice", "orgs": [world.org]}

        a_chats, _ = _all(a, "/v1/chats", 50)
        assert {x["id"] for x in a_chats} == {direct["id"], group["id"]}
        shown = next(x for x in a_chats if x["id"] == group["id"])
        assert shown["kind"] == "group" and shown["title"] == f"g{tag}"
        assert shown["bots"] == [{"id": b2["id"], "name": b2["name"]}]
        assert {p["id"] for p in shown["people"]} == {alice, bob}
        b_chats, _ = _all(b, "/v1/chats", 50)
        assert {x["id"] for x in b_chats} == {group["id"]}  # not alice's direct chat
        assert _all(c, "/v1/chats", 50)[0] == []
        assert [x["id"] for x in _ok(a.get("/v1/chats", params={"kind": "direct"}))["items"]] == [
            direct["id"]
        ]

        a_bots = {x["id"]: x for x in _all(a, "/v1/bots", 50)[0]}
        assert set(a_bots) == {world.bot, b2["id"]}
        assert a_bots[b2["id"]]["permission"] == "write"
        assert "grants" not in a_bots[b2["id"]]  # other people's grants are not shown
        b_bots = _all(b, "/v1/bots", 50)[0]
        assert [(x["id"], x["permission"]) for x in b_bots] == [(b2["id"], "read")]
        assert [x["id"] for x in _all(c, "/v1/bots", 50)[0]] == [b3["id"]]

        assert [x["id"] for x in _all(b, "/v1/channels", 50)[0]] == [ch["id"]]
        assert _all(c, "/v1/channels", 50)[0] == []

        # User tokens cannot use the admin lists; the admin token is not a user.
        for path in ("/v1/admin/orgs", "/v1/admin/users", "/v1/admin/bots", "/v1/admin/channels"):
            assert a.get(path).status_code == 403
        assert admin.get("/v1/chats").status_code == 403


def test_pagination_walks_every_record_once(world: World, admin):
    alice = world.users["alice"]
    tag = secrets.token_hex(3)
    made = {world.bot}
    for k in range(7):
        bot = admin.post(
            "/v1/admin/bots", json={"name": f"p{k}{tag}", "org": world.org, "owner": alice}
        )
        made.add(_ok(bot)["id"])
    with world.client("alice") as a:
        for k in range(5):
            _ok(a.post("/v1/chats", json={"bot": sorted(made)[k]}))
        bots, pages = _all(a, "/v1/bots", 3)
        assert [x["id"] for x in bots] == sorted(made) and pages == 3
        chats, pages = _all(a, "/v1/chats", 2)
        assert len(chats) == len({x["id"] for x in chats}) == 5 and pages == 3
        order = [(x["createdAt"], x["id"]) for x in chats]
        assert order == sorted(order)
        whole = _ok(a.get("/v1/bots", params={"limit": 200}))
        assert whole["nextCursor"] is None and len(whole["items"]) == 8

        for bad in ({"limit": 0}, {"limit": 201}, {"limit": "x"}, {"limit": "²"}):
            r = a.get("/v1/bots", params=bad)
            assert r.status_code == 422, (bad, r.text)
            assert r.json()["error"] | {"message": ""} == {
                "code": "out_of_range",
                "field": "limit",
                "message": "",
            }
        r = a.get("/v1/bots", params={"cursor": "%%"})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_cursor")
        assert a.get("/v1/chats", params={"kind": "nosuch"}).status_code == 400

    # Admin lists: one org's records, page by page.
    users, _ = _all(admin, "/v1/admin/users", 2, org=world.org)
    assert {u["id"] for u in users} == set(world.users.values())
    assert all("token" not in u for u in users)
    bots, _ = _all(admin, "/v1/admin/bots", 4, org=world.org)
    assert {b["id"] for b in bots} == made
    orgs, _ = _all(admin, "/v1/admin/orgs", 200)
    assert world.org in {o["id"] for o in orgs}
    assert _ok(admin.get(f"/v1/admin/orgs?org={world.org}"))["items"][0]["id"] == world.org
    assert _ok(admin.get(f"/v1/admin/channels?org={world.org}"))["items"] == []


def test_one_item_by_id(world: World, admin, model_stubs):
    with world.client("alice") as a, world.client("bob") as b:
        chat = _ok(a.post("/v1/chats", json={"bot": world.bot}))
        _ok(a.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "hello there"}))
        item = _ok(a.get(f"/v1/chats/{chat['id']}/items/i-1"))
        assert item["kind"] == "person" and item["text"] == "hello there"
        assert a.get(f"/v1/chats/{chat['id']}/items/i-999").status_code == 404
        for bad in ("1", "i-", "i-x", "i--1", "i-" + "9" * 30):
            assert a.get(f"/v1/chats/{chat['id']}/items/{bad}").status_code == 404, bad
        assert b.get(f"/v1/chats/{chat['id']}/items/i-1").status_code == 403


def test_a_cursor_walk_during_24_concurrent_creations_neither_repeats_nor_skips(
    world: World, admin
):
    """Pages are cut by the last record's key, not by an offset: chats made while a client pages
    through never make it see one twice or miss one that was there when it started."""
    from concurrent.futures import ThreadPoolExecutor

    with world.client("alice") as a:
        before = {_ok(a.post("/v1/chats", json={"bot": world.bot}))["id"] for _ in range(10)}

        def create(_):
            with world.client("alice") as c:
                return _ok(c.post("/v1/chats", json={"bot": world.bot}))["id"]

        with ThreadPoolExecutor(24) as pool:
            made = pool.map(create, range(24))
            walked, _ = _all(a, "/v1/chats", 3)
            made = set(made)
        ids = [x["id"] for x in walked]
        assert len(ids) == len(set(ids))
        assert before <= set(ids) <= before | made
        final, _ = _all(a, "/v1/chats", 7)
        assert {x["id"] for x in final} == before | made
