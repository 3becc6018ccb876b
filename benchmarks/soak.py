"""Soak: the server's resident memory under long, churning load.

    python -m benchmarks.soak            # 10 minutes, 10,000 accounts
    python -m benchmarks.soak --quick    # about a minute
    python -m benchmarks.soak --quick --compare   # also a run with eviction off, side by side

Starts a real `openbot serve` (its own local Ray, a fresh data directory), creates `--accounts`
accounts (a user and a bot each) through the admin API, then drives writes and reads through the
public HTTP API on loopback: Remember, memory reads and chat turns, by accounts drawn from an
active window of `--active` accounts that slides over all of them (churn: accounts go quiet and
come back). Every `--sample` seconds it records the resident memory of the server's whole process
tree (the serve process, Ray's gcs/raylet and every actor worker): RSS (what most monitors show)
and PSS (shared pages counted once).

It reports the samples and, after the warm-up (the first third of the run), the growth: the
least-squares slope in MB per minute and the spread. Flat means the slope stays near zero while
writes go on; with `--compare` the same load runs against a server whose budget is so large that
nothing is evicted (what the engine did before eviction existed). Writes
benchmarks/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._load import HttpConnection, build_request

ADMIN = "soak-admin-" + secrets.token_hex(6)


# --- memory of a process tree ----------------------------------------------------------------


def _tree(root: int) -> list[int]:
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rpartition(")")[2].split()[1])
        except OSError:
            continue
    mine, grew = {root}, True
    while grew:
        new = {p for p, pp in parent.items() if pp in mine and p not in mine}
        mine |= new
        grew = bool(new)
    return sorted(mine)


def _kb(path: str, field: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "gateway"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    for key, role in (
        ("ShardService", "shards"),
        ("DirectoryService", "directory"),
        ("raylet", "raylet"),
        ("gcs_server", "gcs"),
    ):
        if key in cmd:
            return role
    return "ray other"


def tree_memory(root: int) -> dict[str, Any]:
    """RSS and PSS (MB) summed over `root` and all its descendants, how many they are, and RSS
    by role (gateway, shards, directory, raylet, gcs, other Ray processes)."""
    pids = _tree(root)
    rss = {p: _kb(f"/proc/{p}/status", "VmRSS:") for p in pids}
    pss = sum(_kb(f"/proc/{p}/smaps_rollup", "Pss:") for p in pids)
    roles: dict[str, float] = {}
    for p, kb in rss.items():
        role = _role(p, root)
        roles[role] = round(roles.get(role, 0) + kb / 1024, 1)
    return {
        "rss_mb": round(sum(rss.values()) / 1024, 1),
        "pss_mb": round(pss / 1024, 1),
        "procs": len(pids),
        "rss_by_role": roles,
    }


# --- the server ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`openbot serve` in a child process with its own data directory and Ray."""

    def __init__(self, shards: int, cache_records: int | None, keep: bool = False) -> None:
        self.keep = keep
        self.dir = Path(tempfile.mkdtemp(prefix="obsoak", dir="/tmp"))
        self.port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
        env |= {"OPENBOT_ADMIN_TOKEN": ADMIN, "RAY_TMPDIR": str(self.dir / "ray")}
        (self.dir / "ray").mkdir()
        if cache_records is not None:
            env["OPENBOT_CACHE_RECORDS"] = str(cache_records)
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--data-dir", str(self.dir / "data")]
        cmd += ["--port", str(self.port), "--shards", str(shards)]
        self.log = open(self.dir / "serve.log", "w")  # noqa: SIM115  (closed in stop)
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    async def ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        conn = HttpConnection("127.0.0.1", self.port)
        # Another process coming up: nothing to await but its port answering.
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited; see {self.dir / 'serve.log'}")
            try:
                status, _ = await conn.request(
                    build_request("GET", "127.0.0.1", self.port, "/healthz", None)
                )
                if status == 200:
                    await conn.close()
                    return
            except OSError:
                await conn.close()
            await asyncio.sleep(0.5)
        raise RuntimeError("serve did not come up")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        kept = Path(__file__).parent / "results" / "soak-serve.log"
        kept.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.dir / "serve.log", kept)  # the server's own log, for errors
        if not self.keep:  # --keep leaves the data and Ray's logs for a look
            shutil.rmtree(self.dir, ignore_errors=True)


# --- the load ------------------------------------------------------------------------------------


class Client:
    """Keep-alive connections and JSON requests on them."""

    def __init__(self, port: int) -> None:
        self.port = port

    def conn(self) -> HttpConnection:
        return HttpConnection("127.0.0.1", self.port)

    async def call(
        self, conn: HttpConnection, method: str, path: str, token: str, body: Any = None
    ) -> tuple[int, Any]:
        raw = None if body is None else json.dumps(body).encode()
        status, out = await conn.request(
            build_request(method, "127.0.0.1", self.port, path, token, raw)
        )
        return status, (json.loads(out) if out else None)


async def create_accounts(client: Client, accounts: int, concurrency: int) -> list[dict]:
    conn = client.conn()
    status, org = await client.call(conn, "POST", "/v1/admin/orgs", ADMIN, {"name": "soak"})
    assert status == 201, org
    await conn.close()
    made: list[dict | None] = [None] * accounts
    todo = iter(range(accounts))

    async def worker() -> None:
        c = client.conn()
        for n in todo:
            body = {"name": f"person {n}", "orgs": [org["id"]]}
            status, user = await client.call(c, "POST", "/v1/admin/users", ADMIN, body)
            assert status == 201, user
            body = {"name": f"bot {n}", "org": org["id"], "owner": user["id"]}
            status, bot = await client.call(c, "POST", "/v1/admin/bots", ADMIN, body)
            assert status == 201, bot
            made[n] = {"token": user["token"], "bot": bot["id"], "chat": None}
        await c.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [m for m in made if m is not None]


async def soak(
    server: Server, args: argparse.Namespace, label: str, seconds: float
) -> dict[str, Any]:
    client = Client(server.port)
    t0 = time.monotonic()
    accounts = await create_accounts(client, args.accounts, args.concurrency)
    setup_s = time.monotonic() - t0
    print(f"[{label}] {len(accounts)} accounts in {setup_s:.0f}s", flush=True)
    counts = {"remember": 0, "read": 0, "turn": 0, "errors": 0}
    samples: list[dict[str, Any]] = []
    rng = random.Random(args.seed)
    start = time.monotonic()
    end = start + seconds
    # The active window goes round all accounts `--cycles` times during the run.
    speed = args.cycles * len(accounts) / seconds

    def account() -> dict:
        base = int((time.monotonic() - start) * speed)
        return accounts[(base + rng.randrange(args.active)) % len(accounts)]

    async def worker() -> None:
        conn = client.conn()
        while time.monotonic() < end:
            a = account()
            roll = rng.random()
            try:
                if roll < args.turns:
                    if a["chat"] is None:
                        status, chat = await client.call(
                            conn, "POST", "/v1/chats", a["token"], {"bot": a["bot"]}
                        )
                        if status != 201:
                            raise RuntimeError(f"chat {status} {chat}")
                        a["chat"] = chat["id"]
                    path = f"/v1/chats/{a['chat']}/turns"
                    status, got = await client.call(
                        conn, "POST", path, a["token"], {"text": f"hello {rng.random()}"}
                    )
                    kind, want = "turn", 202
                elif roll < args.turns + args.reads:
                    path = f"/v1/bots/{a['bot']}/memory"
                    status, got = await client.call(conn, "GET", path, a["token"])
                    kind, want = "read", 200
                else:
                    cmd = {"_tag": "Remember", "content": f"soak note {rng.random()}"}
                    path = f"/v1/bots/{a['bot']}/memory"
                    status, got = await client.call(
                        conn, "POST", path, a["token"], {"command": cmd}
                    )
                    kind, want = "remember", 201
                if status != want:
                    raise RuntimeError(f"{kind}: HTTP {status} {got}")
                counts[kind] += 1
            except Exception as e:
                counts["errors"] += 1
                if counts["errors"] <= 3:
                    print(f"[{label}] error: {e!r}"[:300], flush=True)
                await conn.close()
        await conn.close()

    async def sampler() -> None:
        while True:
            m = tree_memory(server.proc.pid)
            writes = counts["remember"] + counts["turn"]
            sample = {"t": round(time.monotonic() - start, 1), **counts, "writes": writes, **m}
            samples.append(sample)
            print(
                f"[{label}] t={sample['t']:6.0f}s writes={writes:7d} "
                f"reads={counts['read']:7d} rss={m['rss_mb']:7.1f}MB pss={m['pss_mb']:7.1f}MB "
                f"procs={m['procs']} {m['rss_by_role']}",
                flush=True,
            )
            if time.monotonic() >= end:
                return
            await asyncio.sleep(min(args.sample, max(0.0, end - time.monotonic())))

    sampling = asyncio.create_task(sampler())
    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    await sampling
    await asyncio.sleep(args.idle)  # idle: is memory given back, or at least not growing?
    idle = tree_memory(server.proc.pid)
    return {
        "label": label,
        "setup_s": round(setup_s, 1),
        "samples": samples,
        "idle_after": idle,
        **summary(samples, seconds),
    }


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (per second) of (t, y) points."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (y - my) for t, y in points) / den if den else 0.0


def summary(samples: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    after = [s for s in samples if s["t"] >= seconds / 3]
    if len(after) < 2:
        return {}
    out: dict[str, Any] = {"warmup_s": round(seconds / 3), "writes": samples[-1]["writes"]}
    for key in ("rss_mb", "pss_mb"):
        values = [s[key] for s in after]
        slope = _slope([(s["t"], s[key]) for s in after]) * 60
        out[key] = {
            "at_warmup_end": values[0],
            "end": values[-1],
            "min": min(values),
            "max": max(values),
            "slope_mb_per_min": round(slope, 2),
        }
    writes = after[-1]["writes"] - after[0]["writes"]
    grew = after[-1]["rss_mb"] - after[0]["rss_mb"]
    out["rss_mb_per_10k_writes_after_warmup"] = round(grew / writes * 10_000, 2) if writes else None
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__)
    p.add_argument("--seconds", type=float, default=600.0)
    p.add_argument("--quick", action="store_true", help="about a minute in all")
    p.add_argument("--accounts", type=int, default=10_000)
    p.add_argument("--active", type=int, default=500, help="accounts in the active window")
    p.add_argument("--cycles", type=float, default=2.0, help="times the window goes round")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--cache-records", type=int, default=None, help="per shard (server default)")
    p.add_argument("--compare", action="store_true", help="also run with eviction off")
    p.add_argument("--turns", type=float, default=0.1, help="share of chat turns")
    p.add_argument("--reads", type=float, default=0.3, help="share of memory reads")
    p.add_argument("--sample", type=float, default=15.0)
    p.add_argument("--idle", type=float, default=10.0, help="seconds idle after the load")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the server's directory (logs)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "soak.json")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds = min(args.seconds, 60.0)
        args.sample = min(args.sample, 5.0)
        args.idle = min(args.idle, 5.0)
        args.cycles = min(args.cycles, 1.0)
    return args


def run(args: argparse.Namespace, label: str, cache_records: int | None) -> dict[str, Any]:
    server = Server(args.shards, cache_records, args.keep)
    try:
        asyncio.run(server.ready())
        result = asyncio.run(soak(server, args, label, args.seconds))
        result["cache_records"] = cache_records
        return result
    finally:
        server.stop()


def _line(r: dict[str, Any]) -> str:
    if "rss_mb" not in r:
        return f"{r['label']}: too few samples"
    rss, pss = r["rss_mb"], r["pss_mb"]
    return (
        f"{r['label']:>12}: writes {r['writes']}, RSS {rss['at_warmup_end']} -> {rss['end']} MB "
        f"(slope {rss['slope_mb_per_min']} MB/min, {r['rss_mb_per_10k_writes_after_warmup']} "
        f"MB per 10k writes), PSS {pss['at_warmup_end']} -> {pss['end']} MB "
        f"(slope {pss['slope_mb_per_min']} MB/min); idle after: {r['idle_after']['rss_mb']} MB"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = [run(args, "eviction", args.cache_records)]
    if args.compare:
        results.append(run(args, "no eviction", 10**9))
    print("\nafter warm-up (the first third of the run):")
    for r in results:
        print(_line(r))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, "runs": results}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
