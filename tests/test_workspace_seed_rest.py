"""Issue 15, the workspace side, through the public API: the sent side of bot-to-bot
communication (UI-1), the server's team/collaboration permission on the bot profile and the
auto-record pause (WS-1), a creator's rename and archive rights and archiving (WS-3)."""

from __future__ import annotations

import re
import secrets
import time

import pytest

from tests.openai_stub import completion

WS = "/api/app/workspace"


@pytest.fixture
def bot_model(model_stubs):
    stub = model_stubs["bot"]
    yield stub
    stub.routes.clear()


def _name(body) -> str:
    m = re.match(r"You are (\S+)\.", body["messages"][0]["content"])
    return m.group(1) if m else ""


def _bot(world, admin, name: str, **extra) -> dict:
    body = {"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"}
    r = admin.post("/v1/admin/bots", json={**body, **extra})
    assert r.status_code == 201, r.text
    return r.json()


def _wait(predicate, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} never held")


def _items(client, chat_id) -> list[dict]:
    r = client.get(f"/v1/chats/{chat_id}/items")
    assert r.status_code == 200, r.text
    return r.json()["items"]


def _chain_of(client, chat_id) -> dict | None:
    for c in client.get(f"{WS}/collaboration").json()["collaborations"]:
        if c["rootChat"] == chat_id and c["status"] == "done":
            return c
    return None


def test_ui1_the_asking_chat_gets_a_sent_record_and_ordinary_words_never_do(
    world, admin, bot_model
):
    """UI-1: when a bot sends to another, its chat shows a `sent` communication record (the
    peer's identity and avatar, the actual body); the chain's audit record keeps the request
    as it was; a person's message that merely reads like one is never communication."""
    tag = secrets.token_hex(3)
    asker = _bot(world, admin, f"Asker{tag}")
    helper = _bot(world, admin, f"Helper{tag}", avatar="https://example.test/helper.png")
    message = "Please check the build, thanks to you all"

    def route(body):
        name, last = _name(body), body["messages"][-1]
        if name == asker["name"]:
            if last["role"] == "tool":
                return completion("I asked.")
            if "[delivery from" in str(last["content"]):
                return completion("The build is green.")
            if "Sent to" in str(last["content"]):
                return completion("Noted.")
            args = {"agent": helper["name"], "message": message}
            return completion(None, tool_calls=[("workspace_send_to_agent", args)])
        if name == helper["name"]:
            return completion("Green.")
        return None

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": asker["id"]}).json()["id"]
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "CI?"}).is_success
        chain = _wait(lambda: _chain_of(alice, chat), what="the chain to end")
        items = _wait(lambda: i if len(i := _items(alice, chat)) >= 5 else None)
        # An ordinary message worded like a communication record.
        fake = f"Sent to {helper['name']}: {message}"
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": fake}).is_success
        later = _items(alice, chat)
    sent = [i for i in items if (i["communication"] or {}).get("direction") == "sent"]
    assert len(sent) == 1
    (record,) = sent
    assert record["author"] == asker["id"] and record["text"] == message
    assert record["communication"] == {
        "direction": "sent",
        "peer": helper["id"],
        "body": message,
        "name": helper["name"],
        "avatar": "https://example.test/helper.png",
    }
    received = [i for i in items if (i["communication"] or {}).get("direction") == "received"]
    assert [i["communication"]["peer"] for i in received] == [helper["id"]]
    assert chain["links"][0]["request"] == message  # the audit record is not rewritten
    person = [i for i in later if i["kind"] == "person"]
    assert person[-1]["text"] == fake and person[-1]["communication"] is None
    assert all(i["communication"] is None for i in later if i["kind"] != "delivery")
