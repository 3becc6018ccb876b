"""Fewer hops: what a turn costs in actor calls made by the gateway.

The gateway's calls are counted at its ports (`EnginePort.directory_port`, `shard_ports`), by
the actor method's name: a direct or group turn with `?wait=true` is one directory call for its
whole context (chat, org, bot or channel and bots) and one shard call, besides resolving the
token.
"""

from __future__ import annotations

import secrets

import pytest

from tests.conftest import count_gateway_calls
from tests.openai_stub import completion


@pytest.fixture
def counted(monkeypatch, engine):
    """The actor methods the gateway calls, by name, while the test runs."""
    return count_gateway_calls(monkeypatch, engine)


def _bot(world, admin, owner="alice") -> str:
    r = admin.post(
        "/v1/admin/bots",
        json={
            "name": f"H{secrets.token_hex(3)}",
            "org": world.org,
            "owner": world.users[owner],
            "model": "bot",
        },
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_a_direct_turn_with_wait_is_one_directory_call_and_one_shard_call(
    world, admin, bot_model, counted
):
    bot = _bot(world, admin)
    bot_model.answer(completion("hello"))
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": bot}).json()["id"]
        counted.clear()
        r = alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "hi"})
    assert r.status_code == 200, r.text
    assert [i["kind"] for i in r.json()["items"]] == ["person", "bot"]
    calls = dict(counted)
    calls.pop("authenticate_at", None)  # the token (the tests' gateway caches nothing)
    assert calls == {"chat_context_at": 1, "start_turn": 1}


def test_a_group_turn_with_wait_costs_the_same_whatever_the_number_of_bots(
    world, admin, bot_model, counted
):
    bots = [_bot(world, admin, owner) for owner in ("alice", "bob", "carol")]
    channel = admin.post(
        "/v1/admin/channels",
        json={"org": world.org, "people": [world.users["alice"]], "bots": bots},
    ).json()["id"]
    bot_model.answer(*[completion(f"reply {k}") for k in range(3)])
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"channel": channel}).json()["id"]
        counted.clear()
        r = alice.post(
            f"/v1/chats/{chat}/turns?wait=true", json={"text": "all of you", "rounds": 1}
        )
    assert r.status_code == 200, r.text
    assert sum(i["kind"] == "bot" for i in r.json()["items"]) == 3
    calls = dict(counted)
    calls.pop("authenticate_at", None)
    assert calls == {"chat_context_at": 1, "start_turn": 1}
