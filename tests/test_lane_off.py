"""OPENBOT_SHARD_LANE=0 end to end: an engine whose shards (and gateway) have the lane turned
off runs a collaboration whose peer lives on the other shard, every call over Ray."""

from __future__ import annotations

import asyncio
import secrets

import httpx

from actors.runtime import engine as engine_mod
from actors.runtime import lane as lane_mod
from gateway.client import EventClient
from tests.conftest import ADMIN, LiveServer, World
from tests.openai_stub import bot_of, completion
from tests.test_shard_lane import _here, _lane_steps, _user_on

OFF = {"env_vars": {"OPENBOT_SHARD_LANE": "0"}}


def test_with_the_lane_off_a_cross_shard_chain_goes_over_ray(
    ray_session, tmp_path, model_stubs, bot_model, monkeypatch
):
    from actors.runtime.engine import Engine
    from gateway.app import create_app

    real = engine_mod.actor_options
    # The shards' processes start with the switch off (as `openbot serve` would with it in
    # the environment); this process, the gateway, too.
    monkeypatch.setattr(
        engine_mod, "actor_options", lambda *a, **k: {**real(*a, **k), "runtime_env": OFF}
    )
    monkeypatch.setattr(lane_mod, "ENABLED", False)
    models = {"bot": {"kind": "openai", "base_url": model_stubs["bot"].url, "model": "b"}}
    prefix = f"nolane{secrets.token_hex(2)}"
    eng = Engine.start(tmp_path / "data", shards=2, prefix=prefix, models_config=models)
    live = LiveServer(create_app(eng, ADMIN, cache_ttl=0.0, listener_refresh=0.2))
    admin = httpx.Client(
        base_url=live.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    )
    try:
        world = World(admin, live)
        _chain(world, admin, bot_model, eng)
    finally:
        admin.close()
        live.stop()
        eng.stop()


def _chain(world, admin, bot_model, engine, *, lanes_off: bool = True) -> None:
    alice = world.users["alice"]
    home = engine.shard_index(alice)
    other = _user_on(admin, world, 1 - home, len(engine.shards))
    tag = secrets.token_hex(3)
    asker = admin.post(
        "/v1/admin/bots",
        json={"name": f"OAsker{tag}", "org": world.org, "owner": alice, "model": "bot"},
    ).json()
    helper = admin.post(
        "/v1/admin/bots",
        json={"name": f"OHelper{tag}", "org": world.org, "owner": other, "model": "bot"},
    ).json()
    assert engine.shard_index(other) != home

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
    turns = _here("openbot_lane_turns_total")

    async def scenario() -> dict:
        events = EventClient(world.server.url, world.tokens["alice"])
        it = aiter(events)
        first = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(0.3)
        with world.client("alice") as client:
            chat = client.post("/v1/chats", json={"bot": asker["id"]}).json()
            r = await asyncio.to_thread(
                client.post, f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "go"}
            )
            assert r.status_code == 200, r.text
            seen = await asyncio.wait_for(first, 20)
            while not (seen.type == "collaboration.changed" and seen.data["status"] == "done"):
                seen = await asyncio.wait_for(it.__anext__(), 20)
            chains = client.get("/api/app/workspace/collaboration").json()["items"]
        await events.close()
        return next(c for c in chains if c["rootChat"] == chat["id"])

    chain = asyncio.run(scenario())
    assert chain["status"] == "done" and chain["links"][0]["result"] == "All green here."
    # Nothing over a lane: the peer's step went shard to shard over Ray, the turn start and
    # the event pump's polls from here too.
    assert [_lane_steps(engine, k) for k in range(len(engine.shards))] == [0, 0]
    assert _here("openbot_lane_turns_total") == turns
    # (This process's poll counter may still move: another engine's long poll, begun over its
    # lane before the switch went off, can end meanwhile.) This engine's ports opened no lane.
    if lanes_off:
        assert [port.lanes_open() for port in engine.shard_ports] == [0] * len(engine.shard_ports)
