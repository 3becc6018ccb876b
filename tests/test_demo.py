"""`openbot demo` end to end: over HTTP and the event websocket against the session's server, with
the bots' model served by the OpenAI-compatible stub answering from examples/demo-bots.toml
through the real scripted engine; and once in embedded mode, on a server of its own with the
`demo-bots` scripted model of examples/openbot.toml."""

from __future__ import annotations

import asyncio
import re
import socket
import tempfile
from pathlib import Path

import pytest

from actors.models.registry import ScriptedModel, load_models
from engine.models import Message
from gateway import cli
from gateway.demo import ASKER, BOTS, HELPER, DemoResult, embedded_server, run_demo
from gateway.server import load_settings
from tests.conftest import ADMIN
from tests.openai_stub import completion

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NAMES = {name for name, _ in BOTS}


def _finished(coro):
    """The result of a coroutine that never waits (the scripted model's `complete`)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("the scripted model waited for something")


@pytest.fixture
def demo_bots(model_stubs):
    """The stub answers the demo's bots as the `scripted` kind would, from the demo's script."""
    script = ScriptedModel.from_file("demo-bots", EXAMPLES / "demo-bots.toml")
    stub = model_stubs["bot"]

    def route(body):
        m = re.match(r"You are (\w+)\.", body["messages"][0].get("content") or "")
        if m is None or m.group(1) not in NAMES:
            return None
        messages = [Message(role=x["role"], content=x.get("content")) for x in body["messages"]]
        done = _finished(script.complete(messages))
        calls = [(c.name, c.arguments) for c in done.tool_calls]
        return completion(done.text, tool_calls=calls)

    stub.routes.append(route)
    yield stub
    stub.routes.remove(route)


def _check_result(result: DemoResult) -> None:
    bots = result.bots
    names = {bot_id: name for name, bot_id in bots.items()}
    # The discussion: three rounds, every bot once per round, a new first speaker each round.
    turn = result.discussion["turn"]
    assert turn["status"] == "done" and turn["rounds"] == 3, turn
    said = [i for i in result.discussion["items"] if i["kind"] == "bot"]
    assert len(said) == 9
    rounds = [said[k : k + 3] for k in range(0, 9, 3)]
    assert all({i["author"] for i in r} == set(bots.values()) for r in rounds)
    assert len({r[0]["author"] for r in rounds}) == 3
    # Each bot speaks with its own lines (the script's per-bot rules), a new one every round,
    # never starting with its own name (the live view already shows who speaks).
    assert all(not i["text"].startswith(f"{names[i['author']]}:") for i in said)
    assert len({i["text"] for i in said}) == 9
    # The chain: the asker sent to the helper, who answered; the answer came back to the group
    # as a delivery and the asker brought it to the others.
    chain = result.collaboration
    assert chain is not None and chain["status"] == "done", chain
    assert chain["rootChat"] == result.chat and chain["rootBot"] == bots[ASKER]
    (link,) = chain["links"]
    assert (link["fromBot"], link["toBot"], link["status"]) == (
        bots[ASKER],
        bots[HELPER],
        "answered",
    )
    assert "test plan" in link["request"] and link["result"].startswith("Test plan:")
    tail = [i for i in result.chat_items if i["turn"] == chain["topic"]]
    assert [(i["kind"], names.get(i["author"], "person")) for i in tail] == [
        ("person", "person"),
        ("bot", ASKER),
        ("delivery", ASKER),  # UI-1: the asker's record of what it sent
        ("delivery", HELPER),
        ("bot", ASKER),
    ]
    assert tail[2]["communication"]["direction"] == "sent" and tail[2]["text"] == link["request"]
    assert tail[3]["text"] == link["result"]
    assert tail[4]["text"].startswith(f"{HELPER}'s test plan is in")
    # The live view: one line per event; every item of the group chat and of the helper's
    # agent chat was shown with its author's name and its text.
    lines = result.lines
    assert len(lines) == sum(result.events.values())
    for item in result.chat_items:
        who = names.get(item["author"], "Pat")
        if (item["communication"] or {}).get("direction") == "sent":
            who = f"{who} to {names[item['communication']['peer']]}"
        elif item["kind"] == "delivery":
            who = f"from {who}"
        assert any(
            " group " in ln and f" {item['id']} " in ln and f"{who}: {item['text']}" in ln
            for ln in lines
        ), item
    agent = [ln for ln in lines if f"agent:{HELPER}" in ln or link["agentChat"] in ln]
    assert any(f"from {ASKER}: {link['request']}" in ln for ln in agent), lines
    assert any(f"{HELPER}: {link['result']}" in ln for ln in agent), lines
    assert not any(f"{n}: {n}:" in ln for ln in lines for n in NAMES), lines
    collab = [ln for ln in lines if "collaboration.changed" in ln]
    assert collab and f"done: {ASKER} -> {HELPER} answered" in collab[-1]
    # A line tells the chain as its event left it: the send's line never shows the answer.
    assert not any("running:" in ln and "answered" in ln for ln in collab), collab
    assert result.events["chat.item.created"] == len(result.chat_items) + 2
    assert not any("not readable" in ln for ln in lines)


def test_demo_against_a_running_server(server, demo_bots):
    printed: list[str] = []
    result = asyncio.run(run_demo(server.url, ADMIN, model="bot", out=printed.append, timeout=30))
    _check_result(result)
    assert printed[-1].startswith("  took ")
    text = "\n".join(printed)
    assert "discussion: 9 replies in 3 rounds from" in text
    assert f"collaboration {result.collaboration['id']}: done" in text


def test_demo_command_line(server, demo_bots, capsys):
    argv = ["demo", "--url", server.url, "--admin-token", ADMIN, "--model", "bot"]
    assert cli.main([*argv, "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert "chat.item.created" in out and "collaboration.changed" in out
    assert re.search(r"collaboration col_\w+: done", out), out
    # A model the server does not have: refused when the bots are made (422), exit 1.
    assert cli.main([*argv[:-1], "no-such-model", "--timeout", "30"]) == 1
    err = capsys.readouterr().err
    assert "HTTP 422" in err and "unknown model 'no-such-model'" in err, err


def test_demo_script_answers_from_the_example_config():
    settings = load_settings(config=str(EXAMPLES / "openbot.toml"))
    model = load_models(settings.models, base_dir=Path(settings.config_dir))["demo-bots"]

    def answer(*said: str, bot: str = "Zed"):  # Zed has no lines of its own: the shared rules
        messages = [Message(role="system", content=f"You are {bot}.")]
        messages += [Message(role="user", content=s) for s in said]
        return _finished(model.complete(messages))

    assert answer("Discuss!", "(round 1 of 3: your turn)").text.startswith("Opening thought")
    assert answer("(round 2 of 3: your turn)").text.startswith("Building on")
    assert answer("(round 3 of 3: your turn)").text.startswith("To close")
    assert answer("(round 12 of 12: your turn)").text.startswith("To close")
    cato = [answer(f"(round {r} of 3: your turn)", bot="Cato").text for r in (1, 2, 3)]
    assert cato[0].startswith("Let's pick one number") and len(set(cato)) == 3
    send = answer("Ada, please ask Brook for a test plan.")
    (call,) = send.tool_calls
    assert call.name == "workspace_send_to_agent" and '"agent":"Brook"' in call.arguments
    request = re.search(r'"message":"([^"]+)"', call.arguments).group(1)
    reply = answer(f"[delivery from b_1, receipt dlv_1] {request}").text
    assert reply.startswith("Test plan:")
    assert answer(f"[delivery from b_2, receipt dlv_1] {reply}").text.startswith("Brook's")
    receipt = Message(role="tool", content='{"receipt":"dlv_1"}', tool_call_id="call_0")
    after = _finished(model.complete([Message(role="user", content="ask Brook"), receipt]))
    assert after.text.startswith("I've passed that on")


@pytest.mark.slow
def test_demo_embedded(ray_session):
    """The embedded mode on the session's Ray: its own engine, data and port, the real
    scripted model; everything it started is gone afterwards."""
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("openbot-demo-*"))
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with embedded_server(port=port) as (url, token):
        assert url == f"http://127.0.0.1:{port}"
        result = asyncio.run(run_demo(url, token, out=lambda _: None, timeout=60))
        made = set(tmp.glob("openbot-demo-*")) - before
    _check_result(result)
    assert made and not any(d.exists() for d in made)
