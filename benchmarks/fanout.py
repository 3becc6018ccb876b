"""Live-event fan-out under load: 1,000 websocket clients on loopback, events produced through the
public API, 10% of the clients dropped at random and resuming; OpenBot against two references.

    cd /work/main && .venv/bin/python -m benchmarks.fanout [--quick] [--seconds N] [--rate R]

Systems, one after the other, each with the same clients, the same producer and the same load:
  openbot     the real gateway (uvicorn in a thread of this process, the Ray driver, configured as
              `openbot serve` runs it) on a real engine (2 shards, DuckDB files in a temp dir, one
              local Ray session). Setup through the admin API: one org, `--users` users, one bot
              owned by user 0 with a read grant for every other user. Each user has
              `--clients-per-user` websocket clients on GET /v1/events (`gateway.client.
              EventClient`). An event is a Remember (POST /v1/bots/{bot}/memory) with the user's
              token: the entry is visible to its author only, so its `memory.changed` goes to
              exactly that user's clients (the fan-out ratio is --clients-per-user).
  websockets  the ceiling: a plain `websockets` server that broadcasts each message to the user's
              connections (benchmarks/_fanout_refs.py); no log and no resume.
  socketio    python-socketio (AsyncServer, ASGI, under uvicorn), a room per user, clients are
              socketio.AsyncClient on the websocket transport; no resume either.
For the references an event is `POST /publish {"user", "id"}` on the reference server, answered
once the message is handed to the user's connections: the publish path includes an HTTP request
as OpenBot's does (but no authentication, no storage and no commit).

Processes: the clients run in `--client-procs` child processes, the producer in another, the
references' servers in one more (python -m benchmarks._fanout_load / _fanout_refs); none shares a
GIL with a server. Everything listens on 127.0.0.1.

Phases, per system, after every client is connected and subscribed (so every client must get
every event of its user):
  fixed   `--rate` events/s for `--seconds` s, open loop (event i due at i/rate, round-robin over
          the users, on 32 keep-alive connections); meanwhile every `--drop-every` s a fresh
          random `--drop-percent`% of the clients is dropped, each at a random moment (OpenBot:
          `EventClient.drop()`; it must reconnect and resume by cursor on its own).
  burst   `--burst` events as fast as the system takes them (closed loop, `--burst-concurrency`
          POSTs in flight, 32 by default: one per keep-alive connection), no drops: the
          delivered rate when the producer is not the limit. With 16 in flight it was, for
          OpenBot: its POSTs went in waves of 16 (each wave one or two coalesced writes and
          their commit), and on a quiet machine (the figures in README.md) it left ~0.5 of
          its 2 CPUs idle, while python-socketio used both (its clients alone ~1): a
          CPU-bound server is not sped up by more in flight, a waiting one is. The report's
          "CPUs busy" line shows which each one was; `--burst-concurrency 16` gives the old
          figures.
Each phase ends when every client holds every event of its user, or when all clients are
connected and nothing arrived for 1.5 s, or after a deadline.

Measures, per phase: delivered events/s = distinct (client, event) deliveries / (last receive -
first send); latency = receive time at the client - the moment the producer wrote the POST
(end to end: request, commit, publication, fan-out; `monotonic_ns`, one clock for all processes
on Linux), and also receive - POST response (negative when the frame beat the response); lost =
events of the client's user it never got; duplicated = the same event received again; foreign =
an event of another user (an audience leak). CPU per process role from /proc; server CPU is
everything but the clients and the producer, so OpenBot's includes each event's Remember (an
authenticated, durable write: the shard's commit and the gateway's request) where the
references' publish stores nothing; with 20 clients per event that write is about half of
OpenBot's server CPU per delivery, and in the burst the write path, not the fan-out, sets the
delivered rate (the table splits OpenBot's CPU by gateway and shard).

Memory: the server process's resident memory (VmRSS) just before the clients connect and once
all are connected and subscribed, per connected client (OpenBot: this process, the gateway and the
Ray driver; a reference: its server process). `--users 500` makes it 10,000 clients.

Prints a table with the targets, each PASS or MISS: zero lost, duplicated or foreign deliveries;
fixed-phase p99 <= 10 ms at 1,000 clients (<= 50 ms at more); the gateway's memory per connected
client <= 20 KiB; in the burst, delivered/s >= 0.7x the raw websockets server's and server CPU per
1,000 deliveries <= 2x its (and, when python-socketio runs, >= 2x and <= 2x its). Ratios are
against references measured in the same run: on a shared machine they move less than the
absolute figures; the 1-minute load average at each phase's start is printed with them.
`--profile FILE` writes a cProfile of the gateway's event loop over OpenBot's burst phase.
Writes benchmarks/results/fanout.json (with a per-second timeline of each phase: events, drops,
p50/p99 of the events sent that second).

Why the burst phase: at a fixed rate that every system sustains, all three deliver the offered
rate and the ratio to python-socketio is ~1 by construction; the burst shows each one's ceiling
with this fan-out. Why 25 events/s by default: with 1,000 clients connected OpenBot took
~60-75 Remembers/s at most on the 2-core machine (the write path, not the fan-out, is the
limit), and at 50/s the POSTs were already queueing (p50 ~200 ms); 25/s x 20 clients = 500
deliveries/s is what it sustains with room to spare. The references are given the same load.
The machine is shared and noisy: compare the CPU per 1,000 deliveries as well as latencies.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import queue
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import actors.runtime.engine  # noqa: F401  (sets Ray's environment before anything imports ray)
from benchmarks._fanout_load import raise_nofile
from benchmarks._fanout_report import (
    SYSTEMS,
    TARGETS,
    print_table,
    score,
    verdicts,
)
from benchmarks._load import descendant_cpu, machine
from gateway.live_server import LiveServer
from gateway.server import tune_gc

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "fanout.json"


# --- child processes ---------------------------------------------------------------------------


class Child:
    """A child process speaking JSON lines on stdin/stdout; stderr goes to a file."""

    def __init__(self, name: str, module: str, args: list[str], logdir: Path) -> None:
        self.name = name
        self.log_path = logdir / f"{name}.stderr"
        self._log = open(self.log_path, "wb")  # noqa: SIM115  (closed in stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
            # A session of its own, as Ray starts OpenBot's actors in theirs: with the kernel's
            # autogroups each session gets an equal share of a busy machine, and a reference
            # server sharing one with its clients and the producer (while OpenBot's shard had
            # its own) got a fraction of OpenBot's CPU under other load.
            start_new_session=True,
        )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float) -> dict[str, Any]:
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{self.name}: no answer within {timeout:.0f}s") from None
        if msg is None:
            raise RuntimeError(f"{self.name} exited ({self.proc.poll()}): {self.stderr_tail()}")
        return msg

    def stderr_tail(self, n: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


# --- CPU accounting ----------------------------------------------------------------------------


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far by role ("gateway": this process, the gateway's thread and the Ray
    driver; the others: its descendants)."""
    out = dict.fromkeys(
        ("gateway", "shard", "directory", "ray_system", "ref_server", "clients", "producer"), 0.0
    )
    for pid, (cmd, cpu) in descendant_cpu().items():
        if pid == os.getpid():
            role = "gateway"
        elif "_fanout_refs" in cmd:
            role = "ref_server"
        elif "_fanout_load clients" in cmd:
            role = "clients"
        elif "_fanout_load produce" in cmd:
            role = "producer"
        elif "ShardService" in cmd:
            role = "shard"
        elif "DirectoryService" in cmd:
            role = "directory"
        else:
            role = "ray_system"
        out[role] += cpu
    return out


def wakeups(children: list[Child]) -> int:
    """How often these processes went to sleep waiting (voluntary context switches, from /proc):
    a client process pays one event-loop wakeup each time, and that, more than each frame's own
    handling, is what a frame costs it when frames come one by one (`benchmarks.fanout_clients`)."""
    total = 0
    for child in children:
        try:
            with open(f"/proc/{child.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except OSError:
            pass
    return total


# --- the OpenBot gateway -----------------------------------------------------------------------


class LogCounter(logging.Handler):
    """Counts warnings and errors of the gateway's loggers (and keeps a few)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[f"{record.name}:{record.levelname}"] += 1
        if len(self.samples) < 8:
            msg = record.getMessage()
            if record.exc_info and record.exc_info[1] is not None:
                msg += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
            self.samples.append(f"{record.name} {record.levelname}: {msg}"[:400])


def openbot_setup(port: int, admin_token: str, users: int) -> tuple[str, list[dict[str, Any]]]:
    """One org, `users` users, one bot owned by user 0 with a read grant for each other user."""
    import httpx

    with httpx.Client(
        base_url=f"http://127.0.0.1:{port}",
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=60,
    ) as http:

        def post(path: str, body: dict) -> dict:
            resp = http.post(path, json=body)
            if not resp.is_success:
                raise RuntimeError(f"POST {path}: {resp.status_code} {resp.text}")
            return resp.json()

        tag = secrets.token_hex(3)
        org = post("/v1/admin/orgs", {"name": f"fanout org {tag}"})["id"]
        made = [post("/v1/admin/users", {"name": f"user {i}", "orgs": [org]}) for i in range(users)]
        bot = post(
            "/v1/admin/bots", {"name": f"fanout bot {tag}", "org": org, "owner": made[0]["id"]}
        )["id"]
        for u in made[1:]:
            post("/v1/admin/grants", {"bot": bot, "user": u["id"], "permission": "read"})
    return bot, [{"index": i, "id": u["id"], "token": u["token"]} for i, u in enumerate(made)]


# --- one system --------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` (VmRSS, from /proc; Linux only)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def run_load(
    system: str,
    url: str,
    publish_port: int,
    users: list[dict[str, Any]],
    bot: str | None,
    args: argparse.Namespace,
    work: Path,
    server_pid: int,
    profiler: Any = None,
) -> dict[str, Any]:
    """Connect the clients, run the phases, collect and score the records. `server_pid`: the
    process whose resident memory per connected client is reported; `profiler` (OpenBot with
    --profile): enabled in the server's loop for the burst phase."""
    n_users = len(users)
    per = args.clients_per_user
    everyone = [
        {"index": i, "user": i // per, "token": users[i // per].get("token")}
        for i in range(n_users * per)
    ]
    children: list[Child] = []
    rss_before = rss_bytes(server_pid)
    try:
        clients: list[Child] = []
        for k in range(args.client_procs):
            cfg = {
                "system": system,
                "client": args.openbot_client,
                "url": url,
                "clients": everyone[k :: args.client_procs],
                "seed": args.seed * 100 + k,
                "connect_concurrency": 50,
                "out": str(work / f"{system}-clients-{k}.json"),
            }
            path = work / f"{system}-clients-{k}.cfg.json"
            path.write_text(json.dumps(cfg))
            child = Child(
                f"{system}-clients-{k}", "benchmarks._fanout_load", ["clients", str(path)], work
            )
            children.append(child)
            clients.append(child)
        pcfg = {
            "system": system,
            "host": "127.0.0.1",
            "port": publish_port,
            "users": [{"index": u["index"], "token": u.get("token")} for u in users],
            "bot": bot,
            "connections": max(32, args.burst_concurrency),
            "out": str(work / f"{system}-producer.json"),
        }
        ppath = work / f"{system}-producer.cfg.json"
        ppath.write_text(json.dumps(pcfg))
        producer = Child(
            f"{system}-producer", "benchmarks._fanout_load", ["produce", str(ppath)], work
        )
        children.append(producer)

        t0 = time.perf_counter()
        ready = [c.recv(180 + len(everyone) / 20) for c in clients]
        connect_s = time.perf_counter() - t0
        producer.recv(60)
        time.sleep(0.5)  # connections' last frames (hello) out, their tasks parked
        rss_after = rss_bytes(server_pid)
        n_ready = sum(r["ready"] for r in ready)
        total = sum(r["clients"] for r in ready)
        print(
            f"[{system}] {n_ready}/{total} clients connected and subscribed in {connect_s:.1f}s"
            + (
                f" ({sum(r['failed'] for r in ready)} failed: {ready[0]['failures'][:1]})"
                if n_ready < total
                else ""
            ),
            flush=True,
        )
        if n_ready < total:
            raise RuntimeError(f"only {n_ready} of {total} clients connected")

        phases: dict[str, dict[str, Any]] = {}
        plan = [
            (
                "fixed",
                {"cmd": "fixed", "phase": "fixed", "rate": args.rate, "seconds": args.seconds},
            ),
            (
                "burst",
                {
                    "cmd": "burst",
                    "phase": "burst",
                    "count": args.burst,
                    "concurrency": args.burst_concurrency,
                },
            ),
        ]
        for name, cmd in plan:
            load = os.getloadavg()[0]
            cpu0 = cpu_by_role()
            woke0 = wakeups(clients)
            t_phase = time.perf_counter()
            if name == "fixed" and args.drop_percent > 0:
                for c in clients:
                    c.send(
                        {
                            "cmd": "drops",
                            "seconds": args.seconds,
                            "percent": args.drop_percent,
                            "every": args.drop_every,
                        }
                    )
            if profiler is not None and name == "burst":
                profiler.start()
            producer.send(cmd)
            done = producer.recv(args.seconds + args.burst / 5 + 120)
            # Each phase waits for its own events only: a reference loses what a dropped client
            # missed in the fixed phase for good, and expecting those too kept its burst phase
            # (and its CPU window) open for the whole quiet period.
            settle_cmd = {
                "cmd": "settle",
                "ids": done["ids"],
                "quiet": 1.5,
                "deadline": args.deadline,
            }
            for c in clients:
                c.send(settle_cmd)
            settled = [c.recv(args.deadline + 60) for c in clients]
            cpu1 = cpu_by_role()
            woke1 = wakeups(clients)
            if profiler is not None and name == "burst":
                profiler.stop()
            phases[name] = {
                "producer": {
                    k: v for k, v in done.items() if k not in ("event", "per_user", "ids")
                },
                "settle": settled,
                "wall_s": round(time.perf_counter() - t_phase, 2),
                "cpu_s": {k: round(cpu1[k] - cpu0[k], 3) for k in cpu0},
                "client_wakeups": woke1 - woke0,
                "loadavg_1m_at_start": round(load, 2),
            }
            reasons = ",".join(sorted({s["reason"] for s in settled}))
            print(
                f"[{system}] {name}: produced {done['ok']}/{done['sent']} "
                f"in {done['send_s']:.1f}s; "
                f"settled ({reasons}) after {max(s['s'] for s in settled):.1f}s",
                flush=True,
            )
        for c in children:
            c.send({"cmd": "report"})
        for c in children:
            c.recv(60)
        client_data = []
        for k in range(args.client_procs):
            client_data.extend(
                json.loads((work / f"{system}-clients-{k}.json").read_bytes())["clients"]
            )
        records = json.loads((work / f"{system}-producer.json").read_bytes())["records"]
        out = score(system, client_data, records, phases)
        out["connect"] = {"clients": total, "seconds": round(connect_s, 2)}
        out["memory"] = {
            "rss_before_mib": round(rss_before / 2**20, 1),
            "rss_connected_mib": round(rss_after / 2**20, 1),
            "kib_per_client": round((rss_after - rss_before) / 1024 / total, 1),
        }
        errors = {}
        for c in children:
            c.stop()
            tail = c.stderr_tail(3000)
            if tail.strip():
                errors[c.name] = tail
        if errors:
            out["child_stderr"] = errors
        return out
    finally:
        for c in children:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait(5)


class LoopProfiler:
    """cProfile in the gateway's event loop thread (uvicorn's), from start() to stop(); the
    stats go to `path` (read them with `python -m pstats PATH`)."""

    def __init__(self, server: LiveServer, path: Path) -> None:
        import cProfile

        self.server = server
        self.path = path
        self.prof = cProfile.Profile()

    def _in_loop(self, fn: Any) -> None:
        done = threading.Event()

        def call() -> None:
            fn()
            done.set()

        self.server.loop.call_soon_threadsafe(call)
        done.wait(10)

    def start(self) -> None:
        self._in_loop(self.prof.enable)

    def stop(self) -> None:
        self._in_loop(self.prof.disable)
        self.prof.dump_stats(str(self.path))
        print(f"[openbot] gateway loop profile of the burst phase in {self.path}", flush=True)


def run_openbot(args: argparse.Namespace, data_dir: Path, work: Path) -> dict[str, Any]:
    from actors.runtime.engine import Engine
    from gateway.app import create_app

    admin_token = "bench-admin-" + secrets.token_hex(8)
    t0 = time.perf_counter()
    engine = Engine.start(data_dir, shards=2, prefix="bench-fanout")
    # Default cache_ttl and GC settings, as `openbot serve`; lifespan on so the hub stops with
    # the server.
    if not os.environ.get("OPENBOT_BENCH_NO_GC_TUNING"):
        tune_gc()
    server = LiveServer(create_app(engine, admin_token), lifespan="on")  # uvicorn as served
    logs = LogCounter()
    for name in ("openbot", "uvicorn", "uvicorn.error", "starlette"):
        logging.getLogger(name).addHandler(logs)
    try:
        bot, users = openbot_setup(server.port, admin_token, args.users)
        print(
            f"[openbot] engine and gateway up, {args.users} users and a bot made in "
            f"{time.perf_counter() - t0:.1f}s",
            flush=True,
        )
        profiler = LoopProfiler(server, args.profile) if args.profile else None
        out = run_load(
            "openbot",
            f"http://127.0.0.1:{server.port}",
            server.port,
            users,
            bot,
            args,
            work,
            os.getpid(),
            profiler,
        )
        out["server_log"] = {"counts": dict(logs.counts), "samples": logs.samples}
        return out
    finally:
        for name in ("openbot", "uvicorn", "uvicorn.error", "starlette"):
            logging.getLogger(name).removeHandler(logs)
        server.stop()
        engine.stop()


def run_reference(system: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    server = Child(f"{system}-server", "benchmarks._fanout_refs", [system], work)
    try:
        ports = server.recv(60)
        users = [{"index": i} for i in range(args.users)]
        out = run_load(
            system,
            f"http://127.0.0.1:{ports['port']}",
            ports["publish_port"],
            users,
            None,
            args,
            work,
            server.proc.pid,
        )
        server.stop()
        tail = server.stderr_tail(3000)
        if tail.strip():
            out["server_stderr"] = tail
        return out
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait(5)


# --- report ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="short phases (5 s fixed, 500-event burst), the same 1,000 clients: the issue's "
        "fan-out targets are stated for 1,000",
    )
    p.add_argument("--users", type=int, default=50, help="users (x --clients-per-user clients)")
    p.add_argument("--clients-per-user", type=int, default=20)
    p.add_argument("--client-procs", type=int, default=2)
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help="events/s in the fixed phase (default 25: what the engine sustains here, see below)",
    )
    p.add_argument("--seconds", type=float, default=None, help="fixed phase (default 20; quick 5)")
    p.add_argument("--burst", type=int, default=None, help="events in the burst phase")
    p.add_argument(
        "--burst-concurrency",
        type=int,
        default=32,
        help="POSTs in flight in the burst, for every system (default 32; was 16, see above)",
    )
    p.add_argument("--drop-percent", type=float, default=10.0)
    p.add_argument("--drop-every", type=float, default=None, help="s between drop rounds")
    p.add_argument("--deadline", type=float, default=None, help="max s to wait for stragglers")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument(
        "--openbot-client",
        choices=("eventclient", "raw"),
        default="eventclient",
        help="OpenBot's clients: gateway.client.EventClient, or the raw websockets client the "
        "reference gets (no resume: use with --drop-percent 0), to tell a client's CPU from "
        "what the server's pace makes it",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="cProfile the gateway's event loop during OpenBot's burst phase into this file",
    )
    args = p.parse_args(argv)
    q = args.quick
    args.rate = args.rate or 25.0
    args.seconds = args.seconds or (5.0 if q else 20.0)
    args.burst = args.burst or (500 if q else 1000)
    args.drop_every = args.drop_every or (2.5 if q else 5.0)
    args.deadline = args.deadline or (10.0 if q else 20.0)
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if any(s not in SYSTEMS for s in args.systems):
        p.error(f"--systems: choose from {','.join(SYSTEMS)}")
    if not 0 < args.seconds <= 120 or not 0 < args.rate <= 5000:
        p.error("--seconds must be in (0, 120] and --rate in (0, 5000]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nofile = raise_nofile()
    import ray

    from actors.runtime.engine import start_ray

    ray_tmp = tempfile.mkdtemp(prefix="obf", dir="/tmp")  # short: Ray's socket paths
    work = Path(tempfile.mkdtemp(prefix="openbot-fanout-"))
    results: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    load_start = os.getloadavg()
    try:
        for system in args.systems:
            try:
                if system == "openbot":
                    start_ray(tmp_dir=ray_tmp)
                    try:
                        results[system] = run_openbot(args, work / "data", work)
                    finally:
                        ray.shutdown()  # the references run without Ray's processes around
                else:
                    results[system] = run_reference(system, args, work)
            except Exception as e:
                print(f"[{system}] FAILED: {type(e).__name__}: {e}", flush=True)
                results[system] = {"system": system, "failed": f"{type(e).__name__}: {e}"[:3000]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    total = time.perf_counter() - t0

    print_table(results, args)
    rows = verdicts(results, args.users * args.clients_per_user)
    report = {
        "benchmark": "fanout",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(load_start, nofile=nofile),
        "params": {
            "clients": args.users * args.clients_per_user,
            "users": args.users,
            "clients_per_user": args.clients_per_user,
            "client_procs": args.client_procs,
            "rate_events_per_s": args.rate,
            "deliveries_per_s_offered": args.rate * args.clients_per_user,
            "seconds": args.seconds,
            "burst_events": args.burst,
            "burst_concurrency": args.burst_concurrency,
            "drop_percent": args.drop_percent,
            "openbot_client": args.openbot_client,
            "drop_every_s": args.drop_every,
            "seed": args.seed,
            "quick": args.quick,
            "latency": "POST written by the producer -> frame received by the client",
        },
        "targets": TARGETS,
        "verdicts": [{"what": w, "target": t, "measured": m, "result": v} for w, t, m, v in rows],
        "systems": results,
        "total_s": round(total, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} (total {total:.0f}s)")
    if any("failed" in r for r in results.values()):
        return 1
    if args.check and any(v == "MISS" for *_, v in rows):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
