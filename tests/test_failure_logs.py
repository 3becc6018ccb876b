"""A log line for every failed turn, step, learning job and chain, in the served
process's output. The shards are Ray actors: their warnings go to the workers' stderr, which
Ray keeps in its session's log files (and `openbot serve` shows through `log_to_driver`), so
the tests read those files for the line naming the failed thing."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

import pytest

from tests.conftest import learning_bot
from tests.openai_stub import OpenAIStub, bot_of, completion

WS = "/api/app/workspace"


@pytest.fixture
def mem_model(model_stubs):
    stub = model_stubs["mem"]
    yield stub
    stub.routes.clear()


def _worker_output(base: Path) -> str:
    """Everything the session's actors wrote to stderr and stdout so far, in the folder the
    session's Ray was started in (whatever RAY_TMPDIR the caller had)."""
    text = []
    for path in base.glob("session_*/logs/worker-*"):
        if path.suffix in (".err", ".out"):
            text.append(path.read_text(errors="replace"))
    return "\n".join(text)


@pytest.fixture
def logged(ray_session: Path):
    """Waits for a line matching a pattern in the actors' output; answers the line."""

    def find(pattern: str) -> str:
        return _logged(ray_session, pattern)

    return find


def _logged(base: Path, pattern: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(pattern, _worker_output(base))
        if m:
            return m.group(0)
        time.sleep(0.2)
    raise AssertionError(f"no line /{pattern}/ in the actors' output")


def _bot(world, admin, name: str) -> dict:
    r = admin.post(
        "/v1/admin/bots",
        json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
    )
    assert r.status_code == 201, r.text
    return r.json()


def _wait_chain(client, chat_id, until, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get(f"{WS}/collaboration")
        for c in r.json().get("items", []) if r.status_code == 200 else []:
            if c["rootChat"] == chat_id and until(c):
                return c
        time.sleep(0.05)
    raise AssertionError("the chain never reached the state")


def test_a_failed_direct_turn_and_its_step_are_logged(world, admin, bot_model, logged):
    bot = _bot(world, admin, f"Broken{secrets.token_hex(3)}")
    bot_model.routes.append(lambda body: 500 if bot_of(body) == bot["name"] else None)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": bot["id"]}).json()["id"]
        r = alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "hello"})
        assert r.status_code == 200, r.text
    turn = r.json()["turn"]
    assert turn["status"] == "failed"
    logged(rf"step of bot {bot['id']} in chat {chat} \(turn {turn['id']}\) failed: .+")
    logged(rf"turn {turn['id']} in chat {chat} failed: .+")


def test_a_failed_group_turn_and_each_failed_step_are_logged(world, admin, bot_model, logged):
    tag = secrets.token_hex(3)
    bots = [_bot(world, admin, f"Down{k}{tag}") for k in range(2)]
    names = {b["name"] for b in bots}
    bot_model.routes.append(lambda body: 500 if bot_of(body) in names else None)
    channel = admin.post(
        "/v1/admin/channels",
        json={
            "org": world.org,
            "people": [world.users["alice"]],
            "bots": [b["id"] for b in bots],
        },
    ).json()["id"]
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"channel": channel}).json()["id"]
        r = alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "hi", "rounds": 1})
        assert r.status_code == 200, r.text
    turn = r.json()["turn"]
    assert turn["status"] == "failed"
    for b in bots:
        logged(rf"step of bot {b['id']} in chat {chat} \(turn {turn['id']}\) failed: .+")
    logged(rf"group turn {turn['id']} in chat {chat} failed: 2 step\(s\) failed")


def test_a_failed_learning_job_is_logged(world, admin, bot_model, mem_model, logged):
    bot, name = learning_bot(world, admin, "Learner")
    bot_model.routes.append(lambda body: completion("Noted.") if bot_of(body) == name else None)
    mem_model.routes.append(
        lambda body: OpenAIStub.GARBAGE if "evidence" in str(body["messages"][-1]) else None
    )
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": bot}).json()["id"]
        alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "I moved to Oslo"})
        deadline = time.monotonic() + 30
        jobs = []
        while time.monotonic() < deadline:
            jobs = [j for j in alice.get(f"{WS}/memory-jobs").json()["jobs"] if j["chat"] == chat]
            if jobs and jobs[0]["status"] == "failed":
                break
            time.sleep(0.1)
    assert jobs and jobs[0]["status"] == "failed", jobs
    logged(rf"learning job {re.escape(jobs[0]['id'])} \(bot:{bot}, chat {chat}\) failed: .+")


def test_a_stopped_and_a_capped_chain_are_logged(world, admin, bot_model, logged):
    tag = secrets.token_hex(3)
    boss, slow = _bot(world, admin, f"Boss{tag}"), _bot(world, admin, f"Slow{tag}")
    ping, pong = _bot(world, admin, f"Ping{tag}"), _bot(world, admin, f"Pong{tag}")
    counter = iter(range(10_000))

    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name == boss["name"]:
            if last["role"] == "tool":
                return completion("Asked.")
            msg = {"agent": slow["name"], "message": "Write the report"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == slow["name"]:
            return ("delay", 1.0, completion("Here is the report."))
        if name in (ping["name"], pong["name"]):
            if last["role"] == "tool":
                return completion("Delegated.")
            other = pong if name == ping["name"] else ping
            msg = {"agent": other["name"], "message": f"please handle part {next(counter)}"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        return None

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": boss["id"]}).json()["id"]
        alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "Report please"})
        running = _wait_chain(alice, chat, lambda c: c["links"] != [])
        r = alice.post(f"{WS}/collaboration/{running['id']}/stop")
        assert r.status_code == 200, r.text
        loop = alice.post("/v1/chats", json={"bot": ping["id"]}).json()["id"]
        alice.post(f"/v1/chats/{loop}/turns?wait=true", json={"text": "Go"})
        capped = _wait_chain(alice, loop, lambda c: c["status"] != "running")
    assert capped["status"] == "capped"
    logged(rf"collaboration {running['id']} stopped: .+")
    logged(rf"collaboration {capped['id']} capped: .+")
