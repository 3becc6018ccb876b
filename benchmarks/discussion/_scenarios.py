"""The low-rate scenarios over HTTP: one 8-bot, 12-round discussion (bots spread over the shards
or colocated) and collaboration chains (linear and tree), timed until a websocket client sees the
chain end."""

from __future__ import annotations

import asyncio
import collections
import json
import secrets
import time
from typing import Any

from benchmarks.discussion._figures import cpu_by_role, cpu_per, dist, item_gaps, shard_stats
from benchmarks.discussion._scripts import (
    BOTS,
    CHAIN_BOTS,
    CHAIN_NAMES,
    CHAIN_TEXT,
    DISCUSS_TEXT,
    ROUNDS,
    SHARDS,
    STEPS,
)
from benchmarks.discussion._world import World, id_on


def discussion(engine: Any, world: World, variant: str, runs: int) -> dict[str, Any]:
    home = 0
    channel = id_on(f"ch_{variant}", home)  # the group chat's home shard
    tag = secrets.token_hex(2)
    owners = [home] * BOTS if variant == "colocated" else [k % SHARDS for k in range(BOTS)]
    bots = [world.bot(f"D{variant[0]}{tag}x{k}", owners[k], "talk") for k in range(BOTS)]
    chat = world.group_chat(bots, channel)
    path = f"/v1/chats/{chat}/turns?wait=true"
    body = {"text": DISCUSS_TEXT, "rounds": ROUNDS}
    token = world.person["token"]

    def one() -> tuple[float, list[float]]:
        t0 = time.perf_counter()
        result = world.api.post(path, body, token)
        dt = (time.perf_counter() - t0) * 1000
        said = [i for i in result["items"] if i["kind"] == "bot"]
        turn = result["turn"]
        if turn["status"] != "done" or len(said) != STEPS:
            raise RuntimeError(f"turn {turn['status']} {turn.get('error')}: {len(said)} bot items")
        return dt, item_gaps(result["items"])

    cold, _ = one()
    stats0, cpu0 = shard_stats(engine), cpu_by_role()
    turns, gaps = [], []
    for _ in range(runs):
        dt, g = one()
        turns.append(dt)
        gaps.extend(g[1:])  # bot to bot (the first gap is the person's item to the first reply)
    stats1, cpu1 = shard_stats(engine), cpu_by_role()
    steps = runs * STEPS
    return {
        "variant": variant,
        "cross_shard_steps_per_round": sum(1 for o in owners if o != home),
        "cold_turn_ms": round(cold, 2),
        "turn_ms": dist(turns),
        "step_ms": dist([t / STEPS for t in turns]),
        "item_gap_ms": dist(gaps),
        "txn_per_step": round((stats1["transactions"] - stats0["transactions"]) / steps, 2),
        "batches_per_step": round((stats1["batches"] - stats0["batches"]) / steps, 2),
        "cpu_ms_per_step": cpu_per(cpu0, cpu1, steps),
    }


def chain_bots(world: World, kind: str) -> str:
    """The chain's 8 bots (memory alternating between the shards); returns the root bot's id."""
    ids = [
        world.bot(f"{CHAIN_NAMES[kind]}{k}", k % SHARDS, kind) for k in range(CHAIN_BOTS)
    ]  # bot 0 belongs to the person, so the person can chat with it
    return ids[0]


async def chains_async(url: str, engine: Any, world: World, runs: int) -> dict[str, Any]:
    import httpx
    from websockets.asyncio.client import connect

    token = world.person["token"]
    roots = {kind: chain_bots(world, kind) for kind in ("linear", "tree")}
    ws = await connect(
        url.replace("http://", "ws://") + "/v1/events",
        additional_headers={"Authorization": f"Bearer {token}"},
        max_size=2**22,
    )
    out: dict[str, Any] = {}
    try:
        hello = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if hello["type"] != "hello":
            raise RuntimeError(f"event stream: {hello}")
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300
        ) as http:
            for kind, root in roots.items():
                warmup = await one_chain(http, ws, engine, root, kind)  # pools load, etc.
                cpu0, stats0 = cpu_by_role(), shard_stats(engine)
                samples = [await one_chain(http, ws, engine, root, kind) for _ in range(runs)]
                cpu1, stats1 = cpu_by_role(), shard_stats(engine)
                n = sum(s["deliveries"] for s in samples)
                extra = {
                    "cpu_ms_per_delivery": cpu_per(cpu0, cpu1, n),
                    "txn_per_delivery": round(
                        (stats1["transactions"] - stats0["transactions"]) / n, 2
                    ),
                    # Calls the shards made to other actors (the gateway's are not counted).
                    "actor_calls_per_delivery": round(
                        (stats1["actor_calls"] - stats0["actor_calls"]) / n, 2
                    ),
                }
                out[kind] = summarize_chains(kind, samples) | extra | {"warmup": warmup}
                print(f"[chain {kind}] {short_chain(out[kind])}", flush=True)
    finally:
        await ws.close()
    return out


async def one_chain(http: Any, ws: Any, engine: Any, root_bot: str, kind: str) -> dict[str, Any]:
    chat = (await http.post("/v1/chats", json={"bot": root_bot})).json()["id"]
    t0 = time.perf_counter()
    post = asyncio.create_task(
        http.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": CHAIN_TEXT[kind]})
    )
    chain_id = None
    status = None
    events = 0
    t_first = None  # the chain's first event: the person's turn (with its sends) is durable
    while status is None:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
        data = frame.get("data") or {}
        if frame["type"] != "collaboration.changed" or data.get("chat") != chat:
            continue
        events += 1
        t_first = t_first or time.perf_counter()
        chain_id = chain_id or data["collaboration"]
        if data["status"] != "running":
            status = data["status"]
    t_end = time.perf_counter()
    resp = await post
    if resp.status_code != 200:
        raise RuntimeError(f"root turn: {resp.status_code} {resp.text[:300]}")
    await asyncio.gather(*[s.chains_idle.remote() for s in engine.shards])
    t_idle = time.perf_counter()
    page = await http.get("/api/app/workspace/collaboration", params={"limit": "200"})
    listing = page.json()["items"]  # (newest first: the chain just run is on the first page)
    chain = next(c for c in listing if c["id"] == chain_id)
    if chain["status"] != status:
        raise RuntimeError(f"chain {chain_id}: event said {status}, listing {chain['status']}")
    total = (t_end - t0) * 1000
    deliveries = chain["deliveries"]
    return {
        "status": chain["status"],
        "reason": chain["reason"],
        "deliveries": deliveries,
        "links": len(chain["links"]),
        "max_depth": max((link["depth"] for link in chain["links"]), default=0),
        "links_by_status": dict(
            sorted(collections.Counter(link["status"] for link in chain["links"]).items())
        ),
        "events": events,
        "until_ended_ms": round(total, 2),
        "per_delivery_ms": round(total / max(deliveries, 1), 3),
        # Without the person's turn before the chain (its chat's first read, its step, its
        # commits): the deliveries alone, from the chain's first event to its end.
        "chain_per_delivery_ms": round((t_end - (t_first or t0)) * 1000 / max(deliveries, 1), 3),
        "until_idle_ms": round((t_idle - t0) * 1000, 2),
    }


def summarize_chains(kind: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    first = samples[0]
    same = all(
        (s["status"], s["deliveries"]) == (first["status"], first["deliveries"]) for s in samples
    )
    return {
        "kind": kind,
        "runs": len(samples),
        "status": first["status"],
        "reason": first["reason"],
        "deliveries": first["deliveries"],
        "links": first["links"],
        "max_depth": first["max_depth"],
        "links_by_status": first["links_by_status"],
        "consistent": same,
        "until_ended_ms": dist([s["until_ended_ms"] for s in samples]),
        "per_delivery_ms": dist([s["per_delivery_ms"] for s in samples]),
        # The first measured chain alone (the median hides a slow first chain; judged too).
        "first_per_delivery_ms": first["per_delivery_ms"],
        "chain_per_delivery_ms": dist([s["chain_per_delivery_ms"] for s in samples]),
        "until_idle_ms": dist([s["until_idle_ms"] for s in samples]),
        "samples": samples,
    }


def short_chain(r: dict[str, Any]) -> str:
    return (
        f"{r['status']} ({r['reason']}) after {r['deliveries']} deliveries, {r['links']} links; "
        f"ended p50 {r['until_ended_ms']['p50']:.1f} ms = {r['per_delivery_ms']['p50']:.2f} "
        f"ms/delivery ({r['chain_per_delivery_ms']['p50']:.2f} from the chain's first event; "
        f"first chain {r['first_per_delivery_ms']:.2f}, max {r['per_delivery_ms']['max']:.2f}, "
        f"warm-up {r['warmup']['per_delivery_ms']:.2f}); "
        f"idle p50 {r['until_idle_ms']['p50']:.1f} ms; per delivery "
        f"{r.get('txn_per_delivery')} transactions, {r.get('actor_calls_per_delivery')} actor calls"
    )
