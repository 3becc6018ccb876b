"""The shards' direct lane (actors/runtime/lane.py): a real Unix socket between a `LaneServer`
and a `LaneClient` in this process, and, end to end, a collaboration whose peer lives on the
other shard asking for its step over the lane while the gateway starts the turn and polls the
events over it."""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import stat

import pytest

from actors.contracts import (
    EventBatch,
    LaneAddress,
    Mirrored,
    PackedCall,
    PollCall,
    StepCall,
    StepInput,
    StepOutcome,
    TurnCall,
    TurnResult,
    TurnStart,
)
from actors.runtime import lane as lane_mod
from actors.runtime.lane import LaneClient, LaneServer
from actors.runtime.placement import shard_of
from engine.chat_records import Turn
from engine.directory import Bot, BotRules, Chat, Org, OrgSettings
from engine.errors import Conflict, InvalidInput, Unavailable
from engine.events import ShardHead
from engine.models import Message
from gateway.client import EventClient
from tests.openai_stub import bot_of, completion

NODE = "node-a"


def _call(text: str = "hello", n: int = 0) -> StepCall:
    org = Org(id="o_1", name="o", settings=OrgSettings(botMemory=False))
    bot = Bot(
        id="b_peer",
        name="Peer",
        org=org.id,
        owner="u_ann",
        model="s",
        rules=BotRules(name="Peer", description="helps"),
        grants={"u_bob": "read"},
    )
    chat = Chat(id="chat_agent_dlv_1", kind="agent", owner="u_ann", org=org.id, bot=bot.id)
    step = StepInput(
        chat=chat,
        bot=bot,
        org=org,
        operator="u_ann",
        turn="turn_1",
        text=text,
        wake="delivery",
        history=(Message(role="user", content="earlier"), Message(role="assistant", content="ok")),
    )
    mirror = (Mirrored(seq=1, turn="turn_1", kind="person", author="u_ann", at=5, text="hi"),)
    return StepCall(step=step, mirror=mirror, learn_upto=n)


class Host:
    """A shard's side of the lane: `step` answers the steps; polls and turns are echoed."""

    def __init__(self, step) -> None:
        self.step = step

    async def lane_step(self, call: StepCall) -> StepOutcome:
        return await self.step(call)

    async def lane_poll(self, call: PollCall) -> bytes:
        import msgspec

        head = ShardHead(epoch="e1", oldest=0, head=call.since + call.limit)
        return msgspec.msgpack.encode(EventBatch(head=head, events=[]))

    async def lane_turn(self, call: TurnCall) -> Turn | TurnResult:
        turn = Turn(id="turn_1", chat=call.start.chat.id, operator="u_ann", status="running", at=1)
        return TurnResult(turn=turn, items=[]) if call.wait else turn


async def _echo(call: StepCall) -> StepOutcome:
    await asyncio.sleep(random.random() * 0.02)  # answers come back out of order
    return StepOutcome(status="done", reply=f"{call.step.text}/{call.learn_upto}")


def _client(server: LaneServer, asked: list[int] | None = None) -> LaneClient:
    async def address() -> LaneAddress | None:
        if asked is not None:
            asked.append(1)
        return await server.open()

    return LaneClient(address, NODE)


def test_a_step_goes_over_the_lane_and_comes_back_whole():
    asyncio.run(_a_step_goes_over_the_lane_and_comes_back_whole())


async def _a_step_goes_over_the_lane_and_comes_back_whole():
    seen: list[StepCall] = []

    async def step(call: StepCall) -> StepOutcome:
        seen.append(call)
        return StepOutcome(status="done", reply="fine", confided=True)

    server = LaneServer(NODE, Host(step))
    client = _client(server)
    try:
        call = _call()
        outcome = await client.step(call)
        assert outcome == StepOutcome(status="done", reply="fine", confided=True)
        assert seen == [call]  # every field (bot, org, history, mirror) arrived as sent
        assert client.calls == 1
    finally:
        await client.close()
        server.close()


def test_a_gateways_turn_starts_and_event_polls_go_over_the_lane():
    asyncio.run(_turns_and_polls())


async def _turns_and_polls():
    server = LaneServer(NODE, Host(_echo))
    client = _client(server)
    call = _call()
    start = TurnStart(
        chat=call.step.chat, bot=call.step.bot, org=call.step.org, operator="u_ann", text="hi"
    )
    try:
        turn = await client.turn(TurnCall(start=start))
        assert isinstance(turn, Turn) and turn.chat == start.chat.id
        result = await client.turn(TurnCall(start=start, wait=True))
        assert isinstance(result, TurnResult) and result.turn.id == "turn_1"
        batch = await client.poll(PollCall(since=7, limit=3, wait=0.5, follower="f1"))
        assert batch is not None and batch.head.head == 10 and batch.events == []
        assert client.calls == 3
    finally:
        await client.close()
        server.close()


def test_concurrent_steps_each_get_their_own_answer():
    asyncio.run(_concurrent_steps_each_get_their_own_answer())


async def _concurrent_steps_each_get_their_own_answer():
    server = LaneServer(NODE, Host(_echo))
    asked: list[int] = []
    client = _client(server, asked)
    try:
        calls = [_call(f"t{k}", k) for k in range(40)]
        outcomes = await asyncio.wait_for(asyncio.gather(*(client.step(c) for c in calls)), 10)
        assert [o.reply for o in outcomes] == [f"t{k}/{k}" for k in range(40)]
        assert len(asked) == 1  # one connection for all of them
    finally:
        await client.close()
        server.close()


def test_the_engines_errors_come_back_as_raised_and_others_as_unavailable():
    asyncio.run(_the_engines_errors_come_back_as_raised_and_others_as_unavailable())


async def _the_engines_errors_come_back_as_raised_and_others_as_unavailable():
    async def step(call: StepCall) -> StepOutcome:
        if call.step.text == "ok":
            return StepOutcome(status="done", reply="ok")
        if call.step.text == "conflict":
            raise Conflict("stale", code="stale_revision", details={"currentRevision": 3})
        raise RuntimeError("a bug")

    server = LaneServer(NODE, Host(step))
    client = _client(server)
    try:
        with pytest.raises(Conflict) as e:
            await client.step(_call("conflict"))
        assert (e.value.code, e.value.message, e.value.details) == (
            "stale_revision",
            "stale",
            {"currentRevision": 3},
        )
        with pytest.raises(Unavailable) as e2:
            await client.step(_call("bug"))
        assert e2.value.code == "engine_error"
        # The connection survives failed steps.
        outcome = await client.step(_call("ok"))
        assert outcome is not None and outcome.reply == "ok"
        assert client.calls == 3
    finally:
        await client.close()
        server.close()


def test_a_lane_lost_mid_step_fails_that_step_and_the_next_call_reconnects():
    asyncio.run(_a_lane_lost_mid_step_fails_that_step_and_the_next_call_reconnects())


async def _a_lane_lost_mid_step_fails_that_step_and_the_next_call_reconnects():
    started, release = asyncio.Event(), asyncio.Event()

    async def hang(call: StepCall) -> StepOutcome:
        if call.step.text == "hang":
            started.set()
            await release.wait()
        return StepOutcome(status="done", reply="second server")

    first = LaneServer(NODE, Host(hang))
    second = LaneServer(NODE, Host(hang))
    servers = [first]

    async def address() -> LaneAddress | None:
        return await servers[-1].open()

    client = LaneClient(address, NODE)
    try:
        pending = asyncio.ensure_future(client.step(_call("hang")))
        await asyncio.wait_for(started.wait(), 5)
        first.close()  # the shard went away (its connections with it)
        with pytest.raises(Unavailable) as e:
            await asyncio.wait_for(pending, 5)
        assert e.value.code == "engine_unavailable"
        servers.append(second)  # restarted elsewhere: the next call asks for the address
        outcome = await asyncio.wait_for(client.step(_call("again")), 5)
        assert outcome is not None and outcome.reply == "second server"
    finally:
        release.set()
        await client.close()
        first.close()
        second.close()


def test_no_lane_means_ray(monkeypatch, tmp_path):
    asyncio.run(_no_lane_means_ray(monkeypatch, tmp_path))


async def _no_lane_means_ray(monkeypatch, tmp_path):
    monkeypatch.setattr(lane_mod, "RETRY_S", 0.2)

    async def none() -> LaneAddress | None:
        return None

    client = LaneClient(none, NODE)
    assert await client.step(_call()) is None

    asked: list[int] = []

    async def elsewhere() -> LaneAddress | None:
        asked.append(1)
        return LaneAddress(node="node-b", path=str(tmp_path / "s"))

    other = LaneClient(elsewhere, NODE)
    assert await other.step(_call()) is None
    assert await other.step(_call()) is None
    assert len(asked) == 1  # another node's shard is never asked again

    async def gone() -> LaneAddress | None:
        asked.append(2)
        return LaneAddress(node=NODE, path=str(tmp_path / "missing"))

    broken = LaneClient(gone, NODE)
    assert await broken.step(_call()) is None
    assert await broken.step(_call()) is None
    assert asked.count(2) == 1  # not again before RETRY_S
    await asyncio.sleep(0.25)
    assert await broken.step(_call()) is None
    assert asked.count(2) == 2


def test_the_socket_is_this_users_only_and_goes_with_the_server():
    asyncio.run(_the_socket_is_this_users_only_and_goes_with_the_server())


async def _the_socket_is_this_users_only_and_goes_with_the_server():
    server = LaneServer(NODE, Host(_echo))
    address = await server.open()
    assert await server.open() == address  # opened once
    folder = os.path.dirname(address.path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(address.path).st_mode) == 0o600
    server.close()
    assert not os.path.exists(folder)


# --- end to end: a peer on the other shard ------------------------------------------------


def _user_on(admin, world, shard: int, shards: int) -> str:
    while True:
        candidate = f"u_lane_{secrets.token_hex(4)}"
        if shard_of(candidate, shards) == shard:
            body = {"id": candidate, "name": "lane", "orgs": [world.org]}
            r = admin.post("/v1/admin/users", json=body)
            assert r.is_success, r.text
            return candidate


def _lane_steps(engine, index: int) -> float:
    import ray

    counters = ray.get(engine.shards[index].metrics.remote())["counters"]
    return sum(v for n, _, v in counters if n == "openbot_lane_steps_total")


def _here(name: str) -> float:
    """A lane counter of this process (the gateway's)."""
    from storage.stats import STATS

    return sum(v for n, _, v in STATS.snapshot()["counters"] if n == name)


def test_a_peer_on_the_other_shard_is_asked_over_the_lane(world, admin, bot_model, engine):
    alice = world.users["alice"]
    home = engine.shard_index(alice)
    other = _user_on(admin, world, 1 - home, len(engine.shards))
    tag = secrets.token_hex(3)
    asker = admin.post(
        "/v1/admin/bots",
        json={"name": f"LAsker{tag}", "org": world.org, "owner": alice, "model": "bot"},
    ).json()
    helper = admin.post(
        "/v1/admin/bots",
        json={"name": f"LHelper{tag}", "org": world.org, "owner": other, "model": "bot"},
    ).json()

    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name == asker["name"]:
            if last["role"] == "tool":
                return completion("Asked.")
            if "[delivery from" in str(last["content"]):
                return completion("Thanks, noted.")
            msg = {"agent": helper["name"], "message": "What is the status?"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == helper["name"]:
            return completion("All green here.")
        return None

    bot_model.routes.append(route)
    before = _lane_steps(engine, home)
    turns, polls = _here("openbot_lane_turns_total"), _here("openbot_lane_polls_total")

    async def scenario() -> dict:
        events = EventClient(world.server.url, world.tokens["alice"])
        it = aiter(events)
        first = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(0.3)  # connected and live (the gateway's event pumps run)
        with world.client("alice") as client:
            chat = client.post("/v1/chats", json={"bot": asker["id"]}).json()
            r = await asyncio.to_thread(
                client.post, f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "go"}
            )
            assert r.status_code == 200, r.text
            seen = await asyncio.wait_for(first, 10)
            while not (seen.type == "collaboration.changed" and seen.data["status"] == "done"):
                seen = await asyncio.wait_for(it.__anext__(), 10)
            assert seen.data["chat"] == chat["id"]
            chains = client.get("/api/app/workspace/collaboration").json()["items"]
        await events.close()
        return next(c for c in chains if c["rootChat"] == chat["id"])

    chain = asyncio.run(scenario())
    assert chain["status"] == "done" and chain["links"][0]["result"] == "All green here."
    assert _lane_steps(engine, home) >= before + 1  # the peer's step
    assert _here("openbot_lane_turns_total") >= turns + 1  # the gateway's turn start
    assert _here("openbot_lane_polls_total") >= polls + 1  # and its event pump


def test_a_gateways_coalesced_writes_go_over_the_lane(world):
    """A Remember and a workspace memory creation leave the gateway as coalesced calls on the
    shard's lane, and come back answered as over Ray."""
    writes = _here("openbot_lane_writes_total")
    with world.client("alice") as alice:
        body = {"command": {"_tag": "Remember", "content": "The lane carries this note."}}
        r = alice.post(f"/v1/bots/{world.bot}/memory", json=body)
        assert r.status_code == 201, r.text
        memory = {
            "requestId": secrets.token_hex(8),
            "scope": "bot",
            "bot": world.bot,
            "content": "The lane carries this memory too.",
        }
        r = alice.post("/api/app/workspace/memories", json=memory)
        assert r.status_code == 201, r.text
        page = alice.get(f"/v1/bots/{world.bot}/memory").json()
    assert _here("openbot_lane_writes_total") >= writes + 2
    texts = [e["content"] for e in page["entries"]]
    assert "The lane carries this note." in texts


def test_a_lane_carries_only_the_shards_write_calls(engine):
    """The lane answers the packed write calls by name; any other name is refused there and
    runs nothing."""

    async def scenario() -> None:
        port = engine.shard_ports[0]
        lane = port.lane()
        try:
            with pytest.raises(InvalidInput):
                await lane.packed(PackedCall(method="purge", call=b""))
            with pytest.raises(InvalidInput):
                await lane.packed(PackedCall(method="lane_packed", call=b""))
            replies = await lane.packed(PackedCall(method="remember_many", call=b"\x90"))
            assert replies is not None
        finally:
            await lane.close()

    asyncio.run(scenario())
