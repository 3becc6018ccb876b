"""Memory operations under load: reads over HTTP, reads as direct actor calls, Remember over HTTP,
with group commit on and off.

    cd /work/main && .venv/bin/python -m benchmarks.memory_ops [--quick] [--seconds N]

Setup, per group-commit mode (one engine at a time, each with its own data dir and actor names, in
one local Ray session): a real gateway (uvicorn in a thread of this process, on 127.0.0.1, default
`cache_ttl` as `openbot serve` uses), an org, the bot's owner and a reader with a read grant, made
through the admin API; then a pool of `--entries` pinned entries seeded straight into the shard
actor (`add_entries`, chunks of 1000), of which `--visible` percent carry `for:person:<reader>`
and the rest are spread over fake users `u_other_<n>`.

Scenarios, each `--concurrency` closed-loop clients for `--seconds` after `--warmup`:
  http_read      GET /v1/bots/{bot}/memory              (load from a child process, raw HTTP/1.1)
  actor_read     await shard.read_memory_json.remote(...)  (this process, the Ray driver; no cache)
  http_remember  POST /v1/bots/{bot}/memory Remember    (load from a child process)
  http_remember_single  the same with the gateway's coalescing off (one Ray call per Remember;
                 with the floors only: the side-by-side comparison, actors/runtime/coalesce.py;
                 `--ab-rounds N` adds N alternating rounds of these three, fairer on a busy
                 machine)
  http_remember_polled  coalesced, but each commit's events reach the gateway by its event
                 pump's poll only, not with the write replies (actors/runtime/follow.py; with
                 the floors only: the side-by-side comparison)
  http_workspace_write  POST /api/app/workspace/memories, a bot-scope memory of the bot by its
                 owner, a fresh requestId each (load from a child process)
The reads run before the writes so they see exactly the seeded pool. Two floors run once, in the
first mode (`--no-baselines` skips them): GET /healthz (HTTP, no actor call) and shard.ping() (an
actor call, no work).

`--ab-rounds N` (3 with `--quick`) runs, in the first mode, N rounds that alternate Remember
(coalesced; not coalesced; events polled; two coalesced calls in flight; coalesced over Ray
instead of the shard's lane; with a requestId each, as every workspace memory carries one),
shard.ping() and the workspace write (`--ab-ways` picks some), and
sums each over the rounds: on a machine whose load changes, the fairer side by side. The ratio
targets (Remember >= 1.0 x shard.ping(), workspace write >= 1.0 x Remember) come from those
rounds, else from the single windows. GET memory >= 0.75 x GET /healthz comes from N alternating
rounds of the two of its own, right after the single read windows and before any write (the
reads must see the seeded pool alone); the same rounds read the page from a second gateway
without the shortcut for cached pages (`read_whole_stack`, reported beside the target:
gateway/cached_reads.py).

Prints a table with each scenario's target and PASS/MISS and CPU per request by process role,
the ratio targets with PASS/FAIL and the load at each round's start, and writes the figures to
benchmarks/results/memory_ops.json (`--check`: exit 1 if a target is missed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import actors.runtime.engine  # noqa: F401  (sets Ray's environment before anything imports ray)
from benchmarks._load import closed_loop, machine
from benchmarks._rounds import (
    RATIO_TARGETS,
    coalesced,
    cpu_by_role,
    cpu_per_op,
    polled,
    ratio_verdicts,
    remember_ab,
    uncoalesced,
)
from gateway.live_server import LiveServer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "memory_ops.json"
SEED_CHUNK = 1000

# Targets from the issue (a 2-core machine). None: reported, no target.
TARGETS: dict[str, dict[str, float] | None] = {
    "http_health": None,
    "actor_ping": None,
    "http_read": {"p50_ms_max": 5.0, "throughput_min": 1000.0},
    "actor_read": None,
    "http_remember": {"throughput_min": 800.0},
    "http_remember_single": None,
    "http_remember_polled": None,
    "http_workspace_write": None,
}
LABELS = {
    "http_health": "baseline: GET /healthz",
    "actor_ping": "baseline: shard.ping()",
    "http_read": "GET memory (HTTP)",
    "actor_read": "read_memory (actor call)",
    "http_remember": "Remember (HTTP POST)",
    "http_remember_single": "Remember, not coalesced",
    "http_remember_polled": "Remember, events polled",
    "http_workspace_write": "workspace write (HTTP)",
}


# --- the server --------------------------------------------------------------------------------


class Admin:
    """The few admin and user calls of the setup (not measured), over plain httpx."""

    def __init__(self, port: int, admin_token: str) -> None:
        import httpx

        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=60,
        )

    def post(self, path: str, body: dict) -> dict:
        resp = self.http.post(path, json=body)
        if not resp.is_success:
            raise RuntimeError(f"POST {path}: {resp.status_code} {resp.text}")
        return resp.json()

    def get_as(self, token: str, path: str) -> dict:
        resp = self.http.get(path, headers={"Authorization": f"Bearer {token}"})
        if not resp.is_success:
            raise RuntimeError(f"GET {path}: {resp.status_code} {resp.text}")
        return resp.json()

    def close(self) -> None:
        self.http.close()


# --- seeding -----------------------------------------------------------------------------------


def seed_pool(shard: Any, pool: str, org: str, reader: str, entries: int, visible: int) -> float:
    """Store `entries` pinned entries straight into the shard; `visible` of them for `reader`,
    spread evenly through the pool. Returns the seconds it took."""
    import ray

    from engine.memory_entries import EntryMeta, Layer

    step = max(1, entries // visible) if visible else entries + 1
    others = max(1, entries // 20)  # ~20 entries per fake user
    base = time.time_ns() // 1_000_000 - entries
    filler = "; remembered for the load benchmark, roughly one line of prose like a real note"
    chunk: list[tuple[Any, str]] = []
    t0 = time.perf_counter()
    made_visible = 0
    for i in range(entries):
        if made_visible < visible and i % step == 0:
            user = reader
            made_visible += 1
        else:
            user = f"u_other_{i % others}"
        meta = EntryMeta(
            id="mem_" + secrets.token_hex(12),
            pool=pool,
            layer=Layer.PINNED,
            tags=(f"from:{user}", f"for:person:{user}", f"org:{org}", "bench"),
            created_at=base + i,
            updated_at=base + i,
        )
        chunk.append((meta, f"seed note {i} of {user}{filler}"))
        if len(chunk) == SEED_CHUNK:
            ray.get(shard.add_entries.remote(pool, chunk))
            chunk = []
    if chunk:
        ray.get(shard.add_entries.remote(pool, chunk))
    return time.perf_counter() - t0


# --- scenarios ---------------------------------------------------------------------------------


def http_scenario(
    port: int,
    token: str,
    path: str,
    *,
    remember: bool,
    args: argparse.Namespace,
    workspace_bot: str | None = None,
    request_ids: bool = False,
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks._load",
        "http",
        "--port",
        str(port),
        "--path",
        path,
        "--concurrency",
        str(args.concurrency),
        "--warmup",
        str(args.warmup),
        "--seconds",
        str(args.seconds),
    ]
    if remember:
        cmd += ["--method", "POST", "--remember", "--expect", "201"]
        cmd += ["--request-ids"] if request_ids else []
    elif workspace_bot is not None:
        cmd += ["--method", "POST", "--ws-memory", workspace_bot, "--expect", "201"]
    env = {**os.environ, "OPENBOT_BENCH_TOKEN": token}
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=args.warmup + args.seconds + 60,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def actor_scenario(
    shard: Any, pool: str, reader: Any, args: argparse.Namespace, *, ping: bool = False
) -> dict[str, Any]:
    async def make_op(index: int):
        async def op(seq: int) -> None:
            if ping:
                await shard.ping.remote()
                return
            # The same read the gateway makes (the page as JSON bytes), minus HTTP and the cache.
            _, _, body = await shard.read_memory_json.remote(pool, reader, ())
            if b'"entries":[{' not in body:
                raise RuntimeError("empty page")

        async def close() -> None:
            return None

        return op, close

    return asyncio.run(
        closed_loop(make_op, concurrency=args.concurrency, warmup=args.warmup, seconds=args.seconds)
    )


def verdict(name: str, r: dict[str, Any]) -> tuple[str, str]:
    target = TARGETS.get(name)
    if r.get("failed"):
        return ("-" if target is None else describe(target), "ERROR")
    if target is None:
        return "-", "-"
    ok = r["errors"] == 0 and r["count"] > 0
    if "p50_ms_max" in target:
        ok = ok and r["p50_ms"] <= target["p50_ms_max"]
    if "throughput_min" in target:
        ok = ok and r["throughput_per_s"] >= target["throughput_min"]
    return describe(target), "PASS" if ok else "MISS"


def describe(target: dict[str, float]) -> str:
    parts = []
    if "p50_ms_max" in target:
        parts.append(f"p50<={target['p50_ms_max']:g}ms")
    if "throughput_min" in target:
        parts.append(f">={target['throughput_min']:g}/s")
    return " ".join(parts)


# --- one engine, one mode ----------------------------------------------------------------------


def run_mode(
    group_commit: bool, data_dir: Path, args: argparse.Namespace, *, baselines: bool
) -> dict[str, Any]:
    import ray

    from actors.runtime.engine import Engine
    from engine.memory_entries import Reader
    from gateway.app import create_app

    mode = "on" if group_commit else "off"
    admin_token = "bench-admin-" + secrets.token_hex(8)
    t0 = time.perf_counter()
    engine = Engine.start(
        data_dir, shards=args.shards, group_commit=group_commit, prefix=f"bench-gc-{mode}"
    )
    server = LiveServer(create_app(engine, admin_token, cache_ttl=args.cache_ttl), lifespan="auto")
    admin = Admin(server.port, admin_token)
    out: dict[str, Any] = {"group_commit": group_commit, "scenarios": {}}
    try:
        started = time.perf_counter() - t0
        tag = secrets.token_hex(3)
        org = admin.post("/v1/admin/orgs", {"name": f"bench org {tag}"})["id"]
        owner = admin.post("/v1/admin/users", {"name": "owner", "orgs": [org]})
        reader = admin.post("/v1/admin/users", {"name": "reader", "orgs": [org]})
        bot = admin.post(
            "/v1/admin/bots", {"name": f"bench bot {tag}", "org": org, "owner": owner["id"]}
        )["id"]
        admin.post("/v1/admin/grants", {"bot": bot, "user": reader["id"], "permission": "read"})

        pool = f"bot:{bot}"
        shard = engine.shard_for(owner["id"])
        visible = round(args.entries * args.visible / 100)
        seed_s = seed_pool(shard, pool, org, reader["id"], args.entries, visible)
        path = f"/v1/bots/{bot}/memory"
        page = admin.get_as(reader["token"], path)
        if len(page["entries"]) != visible:
            raise RuntimeError(f"reader sees {len(page['entries'])} entries, expected {visible}")
        out["setup"] = {
            "engine_start_s": round(started, 2),
            "seed_s": round(seed_s, 2),
            "entries": args.entries,
            "visible_to_reader": visible,
            "response_bytes": len(json.dumps(page, separators=(",", ":"))),
        }
        print(
            f"[gc {mode}] engine up in {started:.1f}s; seeded {args.entries} entries "
            f"({visible} visible) in {seed_s:.2f}s",
            flush=True,
        )

        def workspace_write() -> dict[str, Any]:
            # The bot's owner writes the bot's workspace memories (a fresh requestId each).
            return http_scenario(
                server.port,
                owner["token"],
                "/api/app/workspace/memories",
                remember=False,
                args=args,
                workspace_bot=bot,
            )

        def health() -> dict[str, Any]:
            return http_scenario(
                server.port, reader["token"], "/healthz", remember=False, args=args
            )

        direct_reader = Reader(user=reader["id"], org=org, channels=frozenset(), uses_bot=True)
        runs = [
            ("http_read", lambda: http_scenario(
                server.port, reader["token"], path, remember=False, args=args)),
            ("actor_read", lambda: actor_scenario(shard, pool, direct_reader, args)),
            ("http_remember", lambda: http_scenario(
                server.port, reader["token"], path, remember=True, args=args)),
            ("http_workspace_write", workspace_write),
        ]  # fmt: skip
        if baselines:  # the floors: HTTP without an actor call, an actor call without work
            runs.append(("http_remember_single", lambda: uncoalesced(engine, lambda: http_scenario(
                server.port, reader["token"], path, remember=True, args=args))))  # fmt: skip
            runs.append(("http_remember_polled", lambda: polled(engine, lambda: http_scenario(
                server.port, reader["token"], path, remember=True, args=args))))  # fmt: skip
            runs[:0] = [
                ("http_health", health),
                ("actor_ping", lambda: actor_scenario(shard, pool, direct_reader, args, ping=True)),
            ]  # fmt: skip
        runs_by_name = dict(runs)
        if args.only:
            runs = [(name, run) for name, run in runs if name in args.only]
        for name, run in runs:
            before = ray.get(shard.stats.remote())
            load = os.getloadavg()[0]
            coalesced0 = coalesced()
            cpu0 = cpu_by_role()
            try:
                result = run()
            except Exception as e:
                result = {"failed": f"{type(e).__name__}: {e}"[:2000]}
            cpu1 = cpu_by_role()
            after = ray.get(shard.stats.remote())
            result["loadavg_1m_at_start"] = round(load, 2)
            if "failed" not in result:
                # CPU per operation (warm-up included) by process role: ms of CPU each role spent
                # per request, which contention from other processes inflates far less than
                # latency.
                result["cpu_ms_per_op"] = cpu_per_op(cpu0, cpu1, result["ops_incl_warmup"])
            if name.startswith(("http_remember", "http_workspace")) and "failed" not in result:
                txns = after["transactions"] - before["transactions"]
                batches = after["batches"] - before["batches"]
                ops = result["ops_incl_warmup"]
                requests, calls = (b - a for a, b in zip(coalesced0, coalesced(), strict=True))
                result["commit"] = {
                    "transactions": txns,
                    "batches": batches,
                    "batches_per_transaction": round(batches / txns, 2) if txns else None,
                    # Remembers (warm-up included) per group commit: a coalesced call's share
                    # of one pool is one batch, so batches undercount the writes.
                    "remembers_per_transaction": round(ops / txns, 2) if txns else None,
                    "coalesced_calls": calls,
                    "remembers_per_call": round(requests / calls, 2) if calls else None,
                }
            result["target"], result["verdict"] = verdict(name, result)
            out["scenarios"][name] = result
            print(f"[gc {mode}] {name}: {short(result)}", flush=True)
            if name == "http_read" and baselines and args.ab_rounds and "failed" not in result:
                # The same read from a second gateway on the same engine without the shortcut
                # for cached pages (gateway/cached_reads.py): what the shortcut saves.
                whole = LiveServer(
                    create_app(engine, admin_token, cache_ttl=args.cache_ttl, cached_reads=False),
                    lifespan="auto",
                )
                try:
                    out["read_ab"] = remember_ab(
                        engine, runs_by_name["http_read"], args.ab_rounds,
                        only={"read", "read_whole_stack", "health"},
                        more={
                            "read": runs_by_name["http_read"],
                            "read_whole_stack": lambda port=whole.port: http_scenario(
                                port, reader["token"], path, remember=False, args=args),
                            "health": health,
                        },
                    )  # fmt: skip
                finally:
                    whole.stop()
                print(f"[gc {mode}] read A/B: {out['read_ab']}", flush=True)
        if baselines and args.ab_rounds:
            out["remember_ab"] = remember_ab(
                engine, lambda: http_scenario(
                    server.port, reader["token"], path, remember=True, args=args),
                args.ab_rounds,
                ping=lambda: actor_scenario(shard, pool, direct_reader, args, ping=True),
                workspace=workspace_write,
                # A workspace memory always carries a requestId (its receipt is stored with
                # it); a Remember only when its client asks: this way is the like for like.
                more={"with_ids": lambda: http_scenario(
                    server.port, reader["token"], path, remember=True, args=args,
                    request_ids=True)},
                only=args.ab_ways,
                shard_stats=lambda: ray.get(shard.stats.remote()),
            )  # fmt: skip
            print(f"[gc {mode}] remember A/B: {out['remember_ab']}", flush=True)
        out["ratios"] = ratio_verdicts(out)
        final = admin.get_as(reader["token"], path)
        out["setup"]["visible_after_remember"] = len(final["entries"])
    finally:
        admin.close()
        server.stop()
        engine.stop()
    return out


def short(r: dict[str, Any]) -> str:
    if r.get("failed"):
        return "FAILED " + r["failed"]
    return (
        f"n={r['count']} err={r['errors']} p50={r['p50_ms']:.2f}ms p99={r['p99_ms']:.2f}ms "
        f"{r['throughput_per_s']:.0f}/s -> {r['verdict']} "
        f"(shard cpu {r['cpu_ms_per_op'].get('shard', 0):.2f} ms/op, "
        f"load {r['loadavg_1m_at_start']})"
    )


def print_table(modes: list[dict[str, Any]], args: argparse.Namespace) -> None:
    head = (
        f"{'group commit':<13}{'scenario':<27}{'n':>7}{'err':>5}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'ops/s':>9}  {'target':<22}{'result':<8}{'cpu ms/op: shard  driver':>24}"
    )
    print()
    print(
        f"memory_ops: {args.entries} entries, {args.visible:g}% visible to the reader, "
        f"{args.concurrency} clients, {args.seconds:g}s after {args.warmup:g}s warm-up, "
        f"{os.cpu_count()} CPUs"
    )
    print(head)
    print("-" * len(head))
    for m in modes:
        gc = "on" if m["group_commit"] else "off"
        if m.get("failed"):
            print(f"{gc:<13}{'(setup)':<27}{'FAILED: ' + m['failed'][:80]}")
        for name, r in m["scenarios"].items():
            if r.get("failed"):
                print(f"{gc:<13}{LABELS[name]:<27}{'FAILED: ' + r['failed'][:60]}")
                continue
            cpu = r["cpu_ms_per_op"]
            print(
                f"{gc:<13}{LABELS[name]:<27}{r['count']:>7}{r['errors']:>5}"
                f"{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}{r['throughput_per_s']:>9.0f}  "
                f"{r['target']:<22}{r['verdict']:<8}"
                f"{cpu.get('shard', 0):>17.2f}{cpu.get('driver', 0):>8.2f}"
            )
    for m in modes:
        rem = m["scenarios"].get("http_remember", {})
        if "commit" in rem:
            c = rem["commit"]
            gc = "on" if m["group_commit"] else "off"
            print(
                f"group commit {gc}: Remember used {c['transactions']} transactions for "
                f"{rem['ops_incl_warmup']} writes ({c['remembers_per_transaction']} per "
                f"transaction), in {c['coalesced_calls']} coalesced calls "
                f"({c['remembers_per_call']} per call)"
            )
    for m in modes:
        sc = m["scenarios"]
        ping = sc.get("actor_ping", {}).get("throughput_per_s")
        if not ping:
            continue
        for name in ("http_remember", "http_remember_single", "http_remember_polled"):
            if sc.get(name, {}).get("throughput_per_s"):
                r = sc[name]
                cpu = r["cpu_ms_per_op"]
                print(
                    f"{LABELS[name]}: {r['throughput_per_s'] / ping:.0%} of the shard.ping() "
                    f"ceiling; CPU ms per Remember: shard {cpu.get('shard', 0):.2f}, gateway "
                    f"and driver {cpu.get('driver', 0):.2f}, ray system "
                    f"{cpu.get('ray_system', 0):.2f}"
                )
    for m in modes:
        for ab in (m.get("read_ab"), m.get("remember_ab")):
            if not ab:
                continue
            print(
                f"alternating rounds (loads at each round's start: "
                f"{ab.get('loadavg_1m_per_round')}): "
                + ", ".join(
                    f"{k} {v['per_s']:.0f}/s (shard {v['shard_cpu_ms']:.2f} ms, gateway "
                    f"{v['gateway_cpu_ms']:.2f} ms"
                    + (f", {v['evictions']} evictions" if v.get("evictions") else "")
                    + ")"
                    for k, v in ab.items()
                    if isinstance(v, dict)
                )
            )
        gc = "on" if m["group_commit"] else "off"
        for label, r in m.get("ratios", {}).items():
            print(
                f"group commit {gc}: target {label} >= {r['min']:g} x: {r['ratio']:.2f} x "
                f"({r['from']}) -> {r['verdict']}"
            )
        writes = m.get("remember_ab") or {}
        if writes.get("workspace", {}).get("per_s") and writes.get("with_ids", {}).get("per_s"):
            ratio = writes["workspace"]["per_s"] / writes["with_ids"]["per_s"]
            print(
                f"group commit {gc}: workspace write / Remember with a requestId: {ratio:.2f} x "
                "(alternating rounds; like for like, beside the target)"
            )
        rounds = m.get("read_ab") or {}
        if "read_whole_stack" in rounds and rounds.get("health", {}).get("per_s"):
            ratio = rounds["read_whole_stack"]["per_s"] / rounds["health"]["per_s"]
            print(
                f"group commit {gc}: GET memory without the cached-read shortcut / GET /healthz: "
                f"{ratio:.2f} x (alternating rounds; beside the target, not one)"
            )
    print(
        "cpu ms/op: CPU time per request of the shard actors and of this process (the gateway "
        "thread and Ray driver; for actor calls also the load)."
    )
    loads = [r.get("loadavg_1m_at_start", 0) for m in modes for r in m["scenarios"].values()]
    if loads and max(loads) > (os.cpu_count() or 1):
        print(
            f"WARNING: 1-min load average reached {max(loads):.1f} on {os.cpu_count()} CPUs "
            "during the run: other processes competed for the CPUs; latencies are inflated."
        )
    print()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory_ops", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a short smoke run (1 s per scenario)")
    p.add_argument("--seconds", type=float, default=None, help="measured seconds per scenario")
    p.add_argument("--warmup", type=float, default=None, help="warm-up seconds per scenario")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--entries", type=int, default=10_000)
    p.add_argument("--visible", type=float, default=1.0, help="percent visible to the reader")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--cache-ttl", type=float, default=2.0, help="gateway directory cache (s)")
    p.add_argument(
        "--group-commit", choices=["both", "on", "off"], default="both", help="modes to run"
    )
    p.add_argument(
        "--ab-rounds",
        type=int,
        default=None,
        help="also run Remember with coalescing on and off, shard.ping() and the workspace write "
        "in N alternating rounds (first mode; the ratio targets come from them; default 3 with "
        "--quick, else 0)",
    )
    p.add_argument(
        "--ab-ways",
        type=lambda s: set(s.split(",")),
        default=None,
        help="run only these in the alternating rounds (comma-separated: coalesced, "
        "not_coalesced, events_polled, one_call, two_calls, over_ray, with_ids, ping, "
        "workspace)",
    )
    p.add_argument(
        "--only",
        type=lambda s: set(s.split(",")),
        default=None,
        help="run only these scenarios (comma-separated names, e.g. actor_ping,http_remember)",
    )
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    p.add_argument(
        "--no-baselines",
        dest="baselines",
        action="store_false",
        help="skip the /healthz and shard.ping() floors",
    )
    args = p.parse_args(argv)
    if args.seconds is None:
        args.seconds = 1.0 if args.quick else 5.0
    if args.warmup is None:
        args.warmup = 0.3 if args.quick else 1.0
    if args.ab_rounds is None:
        args.ab_rounds = 3 if args.quick else 0
    if not 0 < args.seconds <= 60 or not 0 <= args.warmup <= 10:
        p.error("--seconds must be in (0, 60] and --warmup in [0, 10]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray

    from actors.runtime.engine import start_ray

    ray_tmp = tempfile.mkdtemp(prefix="obb", dir="/tmp")  # short: Ray's socket paths
    data_root = Path(tempfile.mkdtemp(prefix="openbot-bench-"))
    modes = {"both": [True, False], "on": [True], "off": [False]}[args.group_commit]
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    try:
        start_ray(tmp_dir=ray_tmp)
        for gc in modes:
            data_dir = data_root / f"gc-{'on' if gc else 'off'}"
            baselines = args.baselines and not results  # once: they do not depend on the mode
            try:
                results.append(run_mode(gc, data_dir, args, baselines=baselines))
            except Exception as e:  # keep the other mode's figures; report this one as failed
                print(f"[gc {'on' if gc else 'off'}] FAILED: {type(e).__name__}: {e}", flush=True)
                failed = f"{type(e).__name__}: {e}"[:2000]
                results.append({"group_commit": gc, "failed": failed, "scenarios": {}})
    finally:
        ray.shutdown()
        shutil.rmtree(data_root, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    total = time.perf_counter() - t0

    print_table(results, args)
    report = {
        "benchmark": "memory_ops",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(load_start),
        "params": {
            "entries": args.entries,
            "visible_percent": args.visible,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "shards": args.shards,
            "cache_ttl": args.cache_ttl,
            "quick": args.quick,
        },
        "targets": TARGETS,
        "ratio_targets": RATIO_TARGETS,
        "modes": {("gc_on" if m["group_commit"] else "gc_off"): m for m in results},
        "total_s": round(total, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} (total {total:.0f}s)")
    verdicts = [r["verdict"] for m in results for r in m["scenarios"].values()]
    verdicts += [
        "MISS" for m in results for r in m.get("ratios", {}).values() if r["verdict"] == "FAIL"
    ]
    if any(m.get("failed") for m in results):
        verdicts.append("ERROR")
    if "ERROR" in verdicts or (args.check and "MISS" in verdicts):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
