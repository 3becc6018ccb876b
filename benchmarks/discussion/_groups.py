"""100 group chats at once: waves of one turn in every group from a child process
(`python -m benchmarks.discussion _load`) over raw HTTP/1.1."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._load import HttpConnection, build_request
from benchmarks.discussion._figures import cpu_by_role, cpu_per, dist, shard_stats
from benchmarks.discussion._scripts import GROUP_BOTS, GROUP_TEXT, GROUPS, SHARDS
from benchmarks.discussion._world import World

ROOT = Path(__file__).resolve().parents[2]


def groups(engine: Any, world: World, port: int, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    chats = []
    for g in range(GROUPS):
        bots = [world.bot(f"G{g}x{k}", (g + k) % SHARDS, "talk") for k in range(GROUP_BOTS)]
        chats.append(world.group_chat(bots))
    setup = time.perf_counter() - t0
    job = {
        "port": port,
        "token": world.person["token"],
        "paths": [f"/v1/chats/{c}/turns?wait=true" for c in chats],
        "body": {"text": GROUP_TEXT, "rounds": 1},
        "steps": GROUP_BOTS,
        "waves": args.waves,
    }
    stats0, cpu0 = shard_stats(engine), cpu_by_role()
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.discussion", "_load"],
        cwd=ROOT,
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    stats1, cpu1 = shard_stats(engine), cpu_by_role()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode}): {proc.stderr[-2000:]}")
    load = json.loads(proc.stdout.strip().splitlines()[-1])
    if load["errors"]:
        raise RuntimeError(f"{load['errors']} discussions failed: {load['error_samples'][:2]}")
    steps = load["turns_incl_warmup"] * GROUP_BOTS
    cpu = cpu_per(cpu0, cpu1, steps)
    total_cpu = sum(cpu.values())
    steps_per_s = load["discussions_per_s"] * GROUP_BOTS
    return {
        "groups": GROUPS,
        "bots_per_group": GROUP_BOTS,
        "rounds": 1,
        "setup_s": round(setup, 1),
        "load": load,
        "discussions_per_s": load["discussions_per_s"],
        "steps_per_s": round(steps_per_s, 1),
        "amortized_ms_per_step": round(1000 / steps_per_s, 3),
        "discussion_latency_ms": load["latency_ms"],
        "txn_per_step": round((stats1["transactions"] - stats0["transactions"]) / steps, 2),
        "cpu_ms_per_step": cpu,
        "engine_cpu_ms_per_step": round(total_cpu, 3),
        # What 2 otherwise idle cores could sustain at this CPU cost per step.
        "cpu_bound_steps_per_s": round((os.cpu_count() or 1) * 1000 / total_cpu, 1),
        "load_cpu_ms_per_step": round(load["client_cpu_s"] * 1000 / steps, 3),
    }


async def group_load(job: dict[str, Any]) -> dict[str, Any]:
    """The child process: waves of one turn in every group at once, over a connection per
    turn; the first wave (cold chats) is a warm-up. Throughput is the measured
    turns over the measured waves' time; latency is each turn's, POST to response."""
    host, port, token = "127.0.0.1", job["port"], job["token"]
    body = json.dumps(job["body"]).encode()
    requests = [build_request("POST", host, port, p, token, body) for p in job["paths"]]
    errors: list[str] = []

    async def one(k: int) -> float:
        # A connection per turn: a wave can outlast uvicorn's keep-alive timeout (5 s), which
        # would close the idle connections of the groups that finished early.
        conn = HttpConnection(host, port)
        t0 = time.perf_counter()
        try:
            status, raw = await conn.request(requests[k])
        finally:
            await conn.close()
        dt = time.perf_counter() - t0
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {raw[:200]!r}")
        result = json.loads(raw)
        said = sum(1 for i in result["items"] if i["kind"] == "bot")
        if result["turn"]["status"] != "done" or said != job["steps"]:
            raise RuntimeError(f"turn {result['turn']['status']} {result['turn'].get('error')}")
        return dt

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    latencies: list[float] = []
    waves: list[float] = []
    turns = 0
    for w in range(job["waves"] + 1):
        t0 = time.perf_counter()
        done = await asyncio.gather(*(one(k) for k in range(len(requests))), return_exceptions=True)
        elapsed = time.perf_counter() - t0
        turns += len(done)
        for d in done:
            if isinstance(d, BaseException):
                errors.append(f"{type(d).__name__}: {d}"[:300])
            elif w:
                latencies.append(d * 1000)
        if w:
            waves.append(elapsed)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "waves": len(waves),
        "turns": len(latencies),
        "turns_incl_warmup": turns,
        "errors": len(errors),
        "error_samples": errors[:5],
        "wave_s": dist(waves),
        "discussions_per_s": round(len(latencies) / sum(waves), 2) if waves else 0.0,
        "latency_ms": dist(latencies),
        "client_cpu_s": round((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 3),
    }
