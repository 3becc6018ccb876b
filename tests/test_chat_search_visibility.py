"""Property: chat history search never returns an item its caller cannot read by the chat
routes' read rule, and finds every readable item holding the word.

Hypothesis draws bots (owners, grants), channels (people, bots), chats (direct ones with a bot
the person may use, group ones of a channel they are in), the words said in each, and grants
revoked afterwards; the real server answers (real Ray actors, DuckDB files, uvicorn). The oracle
is the existing read rule itself: what `GET /v1/chats/{chat}/items` lists for that person."""

from __future__ import annotations

import secrets

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.conftest import _ok, user_client

pytestmark = pytest.mark.ray

PEOPLE = ("ann", "ben", "cat")
WORDS = ("zorblax", "quibbet", "flenmar")

world_shape = st.fixed_dictionaries(
    {
        "owners": st.lists(st.sampled_from(range(3)), min_size=1, max_size=2),
        "grants": st.sets(st.tuples(st.integers(0, 1), st.integers(0, 2)), max_size=3),
        "channels": st.lists(
            st.tuples(
                st.sets(st.integers(0, 2), min_size=1, max_size=3),
                st.sets(st.integers(0, 1), min_size=1, max_size=2),
            ),
            max_size=2,
        ),
        "chats": st.lists(
            st.tuples(
                st.integers(0, 2),  # who creates it
                st.sampled_from(("bot", "channel")),
                st.integers(0, 1),  # which bot or channel
                st.lists(st.sampled_from(WORDS), min_size=1, max_size=2),  # what is said
            ),
            min_size=1,
            max_size=4,
        ),
        "revoked": st.sets(st.tuples(st.integers(0, 1), st.integers(0, 2)), max_size=2),
    }
)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape=world_shape)
@example(  # a grantee's chat with a bot, then the grant revoked: listed, no longer readable
    shape={
        "owners": [0],
        "grants": {(0, 1)},
        "channels": [({0, 1}, {0})],
        "chats": [(1, "bot", 0, ["zorblax"]), (0, "channel", 0, ["zorblax"])],
        "revoked": {(0, 1)},
    }
)
def test_search_returns_only_and_all_readable_items(admin, server, shape):
    org = _ok(admin.post("/v1/admin/orgs", json={"name": f"o {secrets.token_hex(3)}"}))["id"]
    people = [_ok(admin.post("/v1/admin/users", json={"name": n, "orgs": [org]})) for n in PEOPLE]
    ids = [p["id"] for p in people]
    clients = [user_client(server, p["token"]) for p in people]
    try:
        bots = [
            _ok(
                admin.post(
                    "/v1/admin/bots",
                    json={"name": f"b{k}", "org": org, "owner": ids[o], "model": "bot"},
                )
            )["id"]
            for k, o in enumerate(shape["owners"])
        ]
        grants = {(bots[b % len(bots)], ids[u]) for b, u in shape["grants"]}
        for bot, user in grants:
            _ok(
                admin.post(
                    "/v1/admin/grants", json={"bot": bot, "user": user, "permission": "read"}
                )
            )
        channels = [
            _ok(
                admin.post(
                    "/v1/admin/channels",
                    json={
                        "org": org,
                        "people": [ids[p] for p in sorted(who)],
                        "bots": sorted({bots[b % len(bots)] for b in with_bots}),
                    },
                )
            )["id"]
            for who, with_bots in shape["channels"]
        ]
        chats: list[str] = []
        for n, (creator, kind, which, words) in enumerate(shape["chats"]):
            pool = bots if kind == "bot" else channels
            if which >= len(pool):
                continue
            r = clients[creator].post("/v1/chats", json={kind: pool[which]})
            if r.status_code != 201:  # a bot they may not use, a channel they are not in
                continue
            chat = r.json()["id"]
            chats.append(chat)
            text = f"said {n}: " + " ".join(words)
            turn = clients[creator].post(f"/v1/chats/{chat}/turns?wait=true", json={"text": text})
            assert turn.status_code == 200, turn.text
        for bot, user in grants & {(bots[b % len(bots)], ids[u]) for b, u in shape["revoked"]}:
            _ok(admin.delete(f"/v1/admin/bots/{bot}/grants/{user}"))

        for client in clients:
            readable: dict[str, set[str]] = {}
            for chat in chats:
                listed = client.get(f"/v1/chats/{chat}/items")
                by_q = client.get(f"/v1/chats/{chat}/items", params={"q": WORDS[0]})
                assert by_q.status_code == listed.status_code, (by_q.text, listed.text)
                if listed.status_code == 200:
                    readable[chat] = {i["id"] for i in listed.json()["items"]}
                    assert {i["id"] for i in by_q.json()["items"]} <= readable[chat]
            texts = {
                (chat, i["id"]): i["text"]
                for chat in readable
                for i in client.get(f"/v1/chats/{chat}/items").json()["items"]
            }
            for word in WORDS:
                body = _ok(client.get("/v1/search", params={"q": word, "limit": 100}))
                found = {(i["chat"], i["id"]) for i in body["items"]}
                assert found <= set(texts), found - set(texts)
                holding = {key for key, text in texts.items() if word in text.split()}
                assert holding <= found, holding - found
    finally:
        for client in clients:
            client.close()
