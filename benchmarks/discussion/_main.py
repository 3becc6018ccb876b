"""Options, the scenarios in order on one engine and gateway, and the report file."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import actors.runtime.engine  # noqa: F401  (sets Ray's environment before anything imports ray)
from benchmarks._load import machine
from benchmarks.discussion import __doc__ as DOC
from benchmarks.discussion._figures import TARGET_MS, short_disc, verdicts
from benchmarks.discussion._floor import floor_async
from benchmarks.discussion._groups import group_load, groups
from benchmarks.discussion._report import print_report
from benchmarks.discussion._scenarios import chains_async, discussion
from benchmarks.discussion._scripts import BOTS, GROUP_BOTS, GROUPS, ROUNDS, SHARDS, write_scripts
from benchmarks.discussion._world import Api, World

RESULTS = Path(__file__).resolve().parents[1] / "results" / "discussion.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.discussion", description=DOC)
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--runs", type=int, default=None, help="measured discussion turns (10)")
    p.add_argument(
        "--chain-runs", type=int, default=None, help="measured chains of each kind (15; quick 7)"
    )
    p.add_argument("--waves", type=int, default=None, help="measured waves of 100 groups (5)")
    p.add_argument("--profile", action="store_true", help="cProfile the floor discussion")
    p.add_argument(
        "--only",
        default="floor,discussion,chains,groups",
        help="comma-separated scenarios to run (floor, discussion, chains, groups)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = p.parse_args(argv)
    q = args.quick
    args.runs = args.runs or (3 if q else 10)
    # Odd and several: one slow chain (a cold cache, a checkpoint) cannot decide the median;
    # the first measured chain and the warm-up are reported beside it (_scenarios.py).
    args.chain_runs = args.chain_runs or (7 if q else 15)
    args.waves = args.waves or (2 if q else 5)
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    return args


def attempt(name: str, fn) -> dict[str, Any]:
    try:
        return fn()
    except Exception as e:
        print(f"[{name}] FAILED: {type(e).__name__}: {e}", flush=True)
        return {"failed": f"{type(e).__name__}: {e}"[:2000]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_load"]:
        out = asyncio.run(group_load(json.loads(sys.stdin.read())))
        sys.stdout.write(json.dumps(out) + "\n")
        return 0
    args = parse_args(argv)

    import ray

    from actors.runtime.engine import Engine, start_ray
    from gateway.app import create_app
    from gateway.live_server import LiveServer
    from gateway.server import tune_gc

    root = Path(tempfile.mkdtemp(prefix="openbot-disc-"))
    ray_tmp = tempfile.mkdtemp(prefix="obd", dir="/tmp")  # short: Ray's socket paths
    config = write_scripts(root)
    scenarios: dict[str, Any] = {}
    load_start = os.getloadavg()
    t_all = time.perf_counter()
    try:
        if "floor" in args.only:
            scenarios["floor"] = attempt(
                "floor",
                lambda: asyncio.run(floor_async(root / "floor", config, args.runs, args.profile)),
            )
            print(f"[floor] {short_disc(scenarios['floor'])}", flush=True)
        start_ray(tmp_dir=ray_tmp)
        t0 = time.perf_counter()
        engine = Engine.start(
            root / "data", shards=SHARDS, prefix="bench-disc", models_config=config
        )
        admin_token = "bench-admin-" + secrets.token_hex(8)
        server = LiveServer(create_app(engine, admin_token, cache_ttl=2.0), lifespan="auto")
        api = Api(server.url, admin_token)
        tune_gc()  # as `openbot serve` runs its gateway
        print(f"engine and gateway up in {time.perf_counter() - t0:.1f}s", flush=True)
        try:
            world = World(api)
            if "discussion" in args.only:
                for variant in ("spread", "colocated"):
                    key = f"discussion_{variant}"
                    scenarios[key] = attempt(
                        key, lambda v=variant: discussion(engine, world, v, args.runs)
                    )
                    print(f"[{key}] {short_disc(scenarios[key])}", flush=True)
            # Before the chains: their websocket client starts the gateway's event pumps.
            if "groups" in args.only:
                scenarios["groups"] = attempt(
                    "groups", lambda: groups(engine, world, server.port, args)
                )
                r = scenarios["groups"]
                if "failed" not in r:
                    print(
                        f"[groups] {r['discussions_per_s']:.1f} discussions/s, "
                        f"{r['amortized_ms_per_step']:.2f} ms/step, "
                        f"latency p50 {r['discussion_latency_ms']['p50']:.0f} ms",
                        flush=True,
                    )
            if "chains" in args.only:
                chains = attempt(
                    "chains",
                    lambda: asyncio.run(chains_async(server.url, engine, world, args.chain_runs)),
                )
                if "failed" in chains:
                    scenarios["chain_linear"] = scenarios["chain_tree"] = chains
                else:
                    scenarios["chain_linear"], scenarios["chain_tree"] = (
                        chains["linear"],
                        chains["tree"],
                    )
        finally:
            api.close()
            server.stop()
            engine.stop()
    finally:
        ray.shutdown()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)

    report = {
        "benchmark": "discussion",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(load_start),
        "params": {
            "bots": BOTS,
            "rounds": ROUNDS,
            "runs": args.runs,
            "chain_runs": args.chain_runs,
            "groups": GROUPS,
            "group_bots": GROUP_BOTS,
            "waves": args.waves,
            "shards": SHARDS,
            "quick": args.quick,
        },
        "target_ms_per_step": TARGET_MS,
        "verdicts": verdicts(scenarios),
        "scenarios": scenarios,
        "total_s": round(time.perf_counter() - t_all, 1),
    }
    print_report(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} (total {report['total_s']:.0f}s)")
    results = report["verdicts"].values()
    if "ERROR" in results or (args.check and "MISS" in results):
        return 1
    return 0
