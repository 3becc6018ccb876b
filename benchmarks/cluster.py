"""Cluster mode under load: the engine on 1, 2 and 4 Ray nodes, then a node-failure drill.

    cd /work/main && .venv/bin/python -m benchmarks.cluster [--quick] [--nodes 1,2,4]
    .venv/bin/python -m benchmarks.cluster --address HEAD:6379 [--nodes 1,2,4]   # a real cluster

Clusters: without `--address`, a simulated cluster on this machine (`ray.cluster_utils.Cluster`,
on 127.0.0.1, `--cpus-per-node` CPUs each): it starts with one node and nodes are added for each
stage. With `--address` the real cluster is joined and each stage uses k of its nodes (k <= the
nodes alive). Simulated nodes share this machine's cores: on one machine more nodes add processes
and hops, not CPUs, so the 2- and 4-node figures show the cost of spreading, never a speed-up.
Run it on a real cluster to see scaling (the target there: >= 1.7x from 1 to 2 nodes).

A stage with k nodes: a fresh engine with k shards placed `spread` (one per node), one gateway
per node (a Ray actor running the real app under uvicorn on that node; `openbot serve
--ray-address` does the same as a process), `--accounts` accounts with a bot each (model
"talk", a zero-latency scripted model) and `--groups` group chats of 3 bots of different
accounts. Made through the admin API. The load comes from one child process (`python -m
benchmarks.cluster --load SPEC`; raw HTTP/1.1 keep-alive from benchmarks/_load.py, and
websockets), spread over every gateway, for `--seconds` after `--warmup`:
  memory      `--concurrency` closed-loop clients, each an account: GET /v1/bots/{bot}/memory,
              and every `--write-every`-th request a Remember (POST), so reads and writes over
              every account (and so every shard);
  turns       one closed-loop client per group: POST /v1/chats/{id}/turns?wait=true, 1 round,
              i.e. 3 bot steps whose memories are on up to 3 shards;
  events      `--subscribers` accounts listen on /v1/events (a gateway each, by cursor; on a
              failure they resume on the next gateway). Afterwards each must hold the event of
              every acknowledged write to its bot exactly once: lost and duplicated must be 0.
After the window every bot's memory is read back: every acknowledged write must be in it.

Drill (on the last stage's cluster, unless `--no-drill`): the same load for `--drill-seconds`;
a quarter of the way in, the node holding one shard (not the head, not the directory's node) is
killed like a crash (simulated: its processes are killed, then a node is added back 1 s later;
real cluster: the shard actor is killed, since this benchmark will not kill your machines). It
reports how long the lost shard refused requests (recovery), the requests that failed (none of
them acknowledged), acknowledged writes lost and events lost or duplicated (must be 0), and
whether every group chat takes a turn afterwards (in-flight discussions ended cleanly).

Figures per stage: requests/s (memory + turns), p50/p99 of reads, writes and turns, bot steps/s,
events delivered/lost/duplicated, the ratio of requests/s to the 1-node stage and, on a
simulated cluster, CPU seconds by process role (all roles share this machine's cores). Prints a
table and writes benchmarks/results/cluster.json. `--quick` finishes in under 2 minutes on a
2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
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
from benchmarks._load import HttpConnection, build_request, descendant_cpu, summarize

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "cluster.json"
TALK = "I agree; let us keep the scope small and measure before we add anything."
GROUP_BOTS = 3
SCALING_TARGET = 1.7  # requests/s from 1 to 2 nodes, on a real cluster


# --- the gateway actor ---------------------------------------------------------------------------


class GatewayService:
    """The real app (gateway.app) under uvicorn, in a Ray actor on one node: a gateway per node
    as `openbot serve --ray-address` would run there. One per node for the whole run: it imports
    the gateway while the stage's engine starts, then `attach` serves a stage's engine (on a
    fresh port) and `detach` stops serving it."""

    def __init__(self) -> None:
        import uvicorn  # noqa: F401  (imported now, while the engine starts elsewhere)

        import gateway.app  # noqa: F401

        self.server = None
        self.thread = None

    def attach(self, prefix: str, shards: int, admin_token: str) -> tuple[str, str]:
        import socket
        import threading

        import ray
        import uvicorn

        from actors.runtime.engine import NAMESPACE, Engine
        from gateway.app import create_app
        from gateway.server import tune_gc

        self.detach()
        directory = ray.get_actor(f"{prefix}-directory", namespace=NAMESPACE)
        handles = [ray.get_actor(f"{prefix}-shard-{k}", namespace=NAMESPACE) for k in range(shards)]
        app = create_app(Engine(directory, handles, None, prefix), admin_token)
        host = ray.util.get_node_ip_address()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind((host, 0))
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            ws_ping_interval=15.0,
            ws_ping_timeout=15.0,
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True
        )
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            thread.join(0.01)
        self.server, self.thread = server, thread
        tune_gc()
        return f"http://{host}:{sock.getsockname()[1]}", ray.get_runtime_context().get_node_id()

    def detach(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(15)
        self.server = self.thread = None


class GatewayPool:
    """One gateway actor per node (hard node affinity: it dies with its node)."""

    def __init__(self) -> None:
        self.actors: dict[str, Any] = {}

    def ensure(self) -> None:
        """Start a gateway on every alive node that has none (without waiting for it)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = ray.remote(num_cpus=0, max_restarts=0)(GatewayService)
        for n in ray.nodes():
            if n.get("Alive") and n["NodeID"] not in self.actors:
                strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                self.actors[n["NodeID"]] = actor.options(scheduling_strategy=strategy).remote()

    def kill(self) -> None:
        import ray

        for a in self.actors.values():
            ray.kill(a, no_restart=True)
        self.actors.clear()


# --- setup through the admin API ----------------------------------------------------------------


def _ok(resp) -> dict:
    if not resp.is_success:
        raise RuntimeError(
            f"{resp.request.method} {resp.request.url}: {resp.status_code} {resp.text}"
        )
    return resp.json()


def setup_world(url: str, admin_token: str, accounts: int, groups: int, shards: int) -> dict:
    """An org, `accounts` people each owning a bot (model "talk"), and `groups` group chats of
    3 bots of different accounts (the person of the group is the first bot's owner)."""
    import httpx

    from actors.runtime.placement import shard_of

    tag = secrets.token_hex(3)
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60
    ) as admin:
        org = _ok(admin.post("/v1/admin/orgs", json={"name": f"cluster bench {tag}"}))["id"]
        people = []
        for i in range(accounts):
            user = _ok(admin.post("/v1/admin/users", json={"name": f"p{i}", "orgs": [org]}))
            bot = _ok(
                admin.post(
                    "/v1/admin/bots",
                    json={"name": f"B{i}{tag}", "org": org, "owner": user["id"], "model": "talk"},
                )
            )["id"]
            people.append(
                {
                    "user": user["id"],
                    "token": user["token"],
                    "bot": bot,
                    "shard": shard_of(user["id"], shards),
                }
            )
        chats = []
        for g in range(groups):
            members = [people[(g + j) % accounts] for j in range(GROUP_BOTS)]
            channel = _ok(
                admin.post(
                    "/v1/admin/channels",
                    json={
                        "org": org,
                        "people": [members[0]["user"]],
                        "bots": [m["bot"] for m in members],
                    },
                )
            )["id"]
            token = members[0]["token"]
            chat = _ok(
                admin.post(
                    "/v1/chats",
                    json={"channel": channel},
                    headers={"Authorization": f"Bearer {token}"},
                )
            )["id"]
            chats.append({"chat": chat, "token": token})
    return {"org": org, "accounts": people, "groups": chats}


# --- the load (child process) -------------------------------------------------------------------


class Gateways:
    """The gateways' addresses; a client that fails on one moves to the next."""

    def __init__(self, urls: list[str]) -> None:
        self.hosts = []
        for url in urls:
            host, _, port = url.removeprefix("http://").partition(":")
            self.hosts.append((host, int(port)))

    def pick(self, k: int) -> tuple[str, int]:
        return self.hosts[k % len(self.hosts)]


class Recorder:
    def __init__(self, window_start: float, window_end: float) -> None:
        self.window_start = window_start
        self.window_end = window_end
        self.latency: dict[str, list[float]] = {"read": [], "write": [], "turn": []}
        self.errors: dict[str, int] = {"read": 0, "write": 0, "turn": 0}
        self.samples: list[str] = []
        self.last_done = window_start
        # (wall time, ok) per shard: when a shard refused and when it answered (the drill).
        self.timeline: dict[int, list[tuple[float, bool]]] = {}
        self.acked: dict[str, list[str]] = {}  # bot -> entry ids acknowledged (201)

    def record(self, kind: str, t0: float, t1: float, ok: bool, shard: int | None, what: str):
        if shard is not None:
            self.timeline.setdefault(shard, []).append((round(time.time(), 3), ok))
        if t0 < self.window_start or t0 >= self.window_end:
            return
        if ok:
            self.latency[kind].append(t1 - t0)
        else:
            self.errors[kind] += 1
            if len(self.samples) < 8:
                self.samples.append(f"{kind}: {what}"[:200])
        self.last_done = max(self.last_done, t1)


async def memory_client(
    k: int, account: dict, gateways: Gateways, rec: Recorder, write_every: int, end: float
) -> None:
    host, port = gateways.pick(k)
    conn = HttpConnection(host, port)
    path = f"/v1/bots/{account['bot']}/memory"
    seq = 0
    try:
        while time.perf_counter() < end:
            seq += 1
            write = seq % write_every == 0
            if write:
                body = json.dumps(
                    {"command": {"_tag": "Remember", "content": f"note {k}.{seq}: ship small"}}
                ).encode()
                raw = build_request("POST", host, port, path, account["token"], body)
            else:
                raw = build_request("GET", host, port, path, account["token"])
            t0 = time.perf_counter()
            ok, what = False, ""
            try:
                status, reply = await conn.request(raw)
                ok = status == (201 if write else 200)
                what = f"HTTP {status} {reply[:120]!r}"
                if ok and write:
                    rec.acked.setdefault(account["bot"], []).append(json.loads(reply)["id"])
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                what = f"{type(e).__name__}: {e}"
                await conn.close()
                k += 1  # this gateway is gone or failing: the next one
                host, port = gateways.pick(k)
                conn = HttpConnection(host, port)
            rec.record(
                "write" if write else "read", t0, time.perf_counter(), ok, account["shard"], what
            )
            if not ok:
                await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def turn_client(k: int, group: dict, gateways: Gateways, rec: Recorder, end: float) -> None:
    host, port = gateways.pick(k)
    conn = HttpConnection(host, port)
    path = f"/v1/chats/{group['chat']}/turns?wait=true"
    body = json.dumps({"text": "Anything blocking the release?", "rounds": 1}).encode()
    try:
        while time.perf_counter() < end:
            raw = build_request("POST", host, port, path, group["token"], body)
            t0 = time.perf_counter()
            ok, what = False, ""
            try:
                status, reply = await conn.request(raw)
                ok = status == 200
                what = f"HTTP {status} {reply[:120]!r}"
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                what = f"{type(e).__name__}: {e}"
                await conn.close()
                k += 1
                host, port = gateways.pick(k)
                conn = HttpConnection(host, port)
            rec.record("turn", t0, time.perf_counter(), ok, None, what)
            if not ok:
                await asyncio.sleep(0.1)
    finally:
        await conn.close()


class Subscriber:
    """One account on /v1/events: resumes by cursor, moving to the next gateway on failure."""

    def __init__(self, k: int, account: dict, urls: list[str]) -> None:
        self.k = k
        self.account = account
        self.urls = urls
        self.pool = f"bot:{account['bot']}"
        self.cursor: str | None = None
        self.entries: list[str] = []
        self.reconnects = 0
        self.ready = asyncio.Event()
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        from urllib.parse import quote

        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        k = self.k
        while True:
            url = self.urls[k % len(self.urls)].replace("http://", "ws://", 1) + "/v1/events"
            if self.cursor:
                url += f"?cursor={quote(self.cursor)}"
            try:
                async with connect(
                    url,
                    additional_headers={"Authorization": f"Bearer {self.account['token']}"},
                    open_timeout=10,
                    max_size=2**22,
                ) as ws:
                    async for raw in ws:
                        frame = json.loads(raw)
                        self.cursor = frame["cursor"]
                        data = frame.get("data") or {}
                        if frame["type"] == "memory.changed" and data.get("pool") == self.pool:
                            self.entries.append(data["entry"])
                        self.ready.set()
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError):
                pass
            self.reconnects += 1
            k += 1
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def run_load(spec: dict) -> dict:
    import resource

    urls = spec["gateways"]
    gateways = Gateways(urls)
    accounts = spec["accounts"]
    subs = [Subscriber(k, a, urls) for k, a in enumerate(accounts[: spec["subscribers"]])]
    await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in subs)), 60)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    window_start = start + spec["warmup"]
    end = window_start + spec["seconds"]
    rec = Recorder(window_start, end)
    wall_start = time.time() + spec["warmup"]
    # The drill times its kill from here.
    sys.stdout.write(json.dumps({"window_start": wall_start}) + "\n")
    sys.stdout.flush()
    tasks = [
        memory_client(k, accounts[k % len(accounts)], gateways, rec, spec["write_every"], end)
        for k in range(spec["concurrency"])
    ]
    tasks += [turn_client(k, g, gateways, rec, end) for k, g in enumerate(spec["groups"])]
    await asyncio.gather(*tasks)
    elapsed = rec.last_done - window_start
    # Every subscriber must now hold every acknowledged write to its bot (lost otherwise).
    deadline = time.perf_counter() + spec.get("catch_up", 20)
    for s in subs:
        wanted = set(rec.acked.get(s.account["bot"], []))
        while not wanted <= set(s.entries) and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)  # frames arrive on the subscriber's task
    await asyncio.sleep(0.3)  # room for duplicates to show
    events = {"delivered": 0, "lost": 0, "duplicated": 0, "reconnects": 0}
    for s in subs:
        acked = set(rec.acked.get(s.account["bot"], []))
        events["delivered"] += len(s.entries)
        events["lost"] += len(acked - set(s.entries))
        events["duplicated"] += len(s.entries) - len(set(s.entries))
        events["reconnects"] += s.reconnects
        await s.close()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {
        "wall_start": wall_start,
        "seconds": round(elapsed, 3),
        "kinds": {
            kind: summarize(lat, elapsed, rec.errors[kind]) for kind, lat in rec.latency.items()
        },
        "events": events,
        "error_samples": rec.samples,
        "acked": rec.acked,
        "load_cpu_s": round((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 2),
    }
    if spec.get("timeline"):
        out["timeline"] = rec.timeline
    return out


def load_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out = asyncio.run(run_load(spec))
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


# --- CPU by role (simulated clusters: every process is a descendant of this one) -----------------


def cpu_by_role() -> dict[str, float]:
    out = {"gateways": 0.0, "shards": 0.0, "directory": 0.0, "load": 0.0, "ray": 0.0, "driver": 0.0}
    for pid, (cmd, cpu) in descendant_cpu().items():
        if pid == os.getpid():
            role = "driver"
        elif "benchmarks.cluster" in cmd:
            role = "load"
        elif "GatewayService" in cmd:
            role = "gateways"
        elif "ShardService" in cmd:
            role = "shards"
        elif "DirectoryService" in cmd:
            role = "directory"
        else:
            role = "ray"  # gcs, raylets, agents, idle workers
        out[role] += cpu
    return out


# --- a stage -------------------------------------------------------------------------------------


class Stage:
    """An engine with k shards spread over k nodes and a gateway on each of those nodes."""

    def __init__(
        self, k: int, root: Path, args: argparse.Namespace, models: dict, pool: GatewayPool
    ) -> None:
        import ray

        from actors.runtime.engine import Engine

        pool.ensure()  # gateways start on new nodes while the engine starts
        self.k = k
        self.prefix = f"bcl{k}-{secrets.token_hex(2)}"
        self.admin = "bench-admin-" + secrets.token_hex(8)
        t0 = time.perf_counter()
        self.engine = Engine.start(
            root / f"data-{self.prefix}",
            shards=k,
            prefix=self.prefix,
            models_config=models,
            placement="spread",
            detached=True,
        )
        self.where = self.engine.where()
        nodes = list(dict.fromkeys(s["node"] for s in self.where["shards"]))
        self.gateways = [pool.actors[n] for n in nodes]
        attached = ray.get(
            [g.attach.remote(self.prefix, k, self.admin) for g in self.gateways], timeout=180
        )
        self.urls = [u for u, _ in attached]
        self.gateway_nodes = [n for _, n in attached]
        self.start_s = round(time.perf_counter() - t0, 1)
        t1 = time.perf_counter()
        self.world = setup_world(self.urls[0], self.admin, args.accounts, args.groups, k)
        self.setup_s = round(time.perf_counter() - t1, 1)

    def spec(self, args: argparse.Namespace, seconds: float, timeline: bool) -> dict:
        return {
            "gateways": self.urls,
            "accounts": self.world["accounts"],
            "groups": self.world["groups"],
            "concurrency": args.concurrency,
            "subscribers": min(args.subscribers, args.accounts),
            "write_every": args.write_every,
            "seconds": seconds,
            "warmup": args.warmup,
            "timeline": timeline,
        }

    def start_load(self, root: Path, spec: dict) -> subprocess.Popen:
        path = root / f"spec-{self.prefix}-{secrets.token_hex(2)}.json"
        path.write_text(json.dumps(spec))
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
        return subprocess.Popen(
            [sys.executable, "-m", "benchmarks.cluster", "--load", str(path)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def verify(self, acked: dict[str, list[str]]) -> dict:
        """Every acknowledged write is in its bot's memory."""
        import httpx

        lost = stored = unread = 0
        with httpx.Client(timeout=60) as http:
            for a in self.world["accounts"]:
                page = None
                for attempt in range(40):
                    url = self.urls[attempt % len(self.urls)]
                    try:
                        r = http.get(
                            f"{url}/v1/bots/{a['bot']}/memory",
                            headers={"Authorization": f"Bearer {a['token']}"},
                        )
                    except httpx.TransportError:
                        continue
                    if r.status_code == 200:
                        page = r.json()
                        break
                    time.sleep(0.25)
                if page is None:
                    unread += 1
                    lost += len(acked.get(a["bot"], []))
                    continue
                ids = {e["id"] for e in page["entries"]}
                stored += len(ids)
                lost += len(set(acked.get(a["bot"], [])) - ids)
        return {
            "acked": sum(len(v) for v in acked.values()),
            "stored": stored,
            "lost": lost,
            "unreadable_bots": unread,
        }

    def turns_after(self) -> dict:
        """Every group chat takes a turn now (none is left stuck by the drill)."""
        import httpx

        ok = failed = 0
        with httpx.Client(timeout=60) as http:
            for g in self.world["groups"]:
                r = None
                for attempt in range(20):
                    url = self.urls[attempt % len(self.urls)]
                    try:
                        r = http.post(
                            f"{url}/v1/chats/{g['chat']}/turns?wait=true",
                            json={"text": "Still with us?", "rounds": 1},
                            headers={"Authorization": f"Bearer {g['token']}"},
                        )
                    except httpx.TransportError:
                        continue
                    if r.status_code == 200:
                        break
                    time.sleep(0.25)
                if r is not None and r.status_code == 200:
                    ok += 1
                else:
                    failed += 1
        return {"ok": ok, "failed": failed}

    def stop(self) -> None:
        import ray

        for g in self.gateways:  # a gateway lost in the drill has nothing to stop
            with contextlib.suppress(Exception):
                ray.get(g.detach.remote(), timeout=20)
        try:
            self.engine.stop()
        except Exception as e:  # a shard lost in the drill may still be coming back
            print(f"  (stop: {type(e).__name__}: {e})", flush=True)


def finish_load(proc: subprocess.Popen, timeout: float) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"the load did not finish in {timeout:.0f} s: {err[-2000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the load failed ({proc.returncode}): {err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def summarize_stage(stage: Stage, load: dict, verified: dict, cpu: dict | None) -> dict:
    kinds = load["kinds"]
    requests = sum(kinds[k]["count"] for k in ("read", "write", "turn"))
    seconds = load["seconds"] or 1.0
    nodes = {s["node"] for s in stage.where["shards"]}
    out = {
        "nodes": len(nodes),
        "shards": stage.k,
        "gateways": len(stage.urls),
        "engine_start_s": stage.start_s,
        "setup_s": stage.setup_s,
        "requests_per_s": round(requests / seconds, 1),
        "bot_steps_per_s": round(kinds["turn"]["count"] * GROUP_BOTS / seconds, 1),
        "placement": {
            "shard_nodes": [s["node"][:8] for s in stage.where["shards"]],
            "directory_node": stage.where["directory"]["node"][:8],
        },
        "read": kinds["read"],
        "write": kinds["write"],
        "turn": kinds["turn"],
        "events": load["events"],
        "writes": verified,
        "error_samples": load["error_samples"],
        "load_cpu_s": load["load_cpu_s"],
    }
    if cpu is not None:
        out["cpu_s_by_role"] = {k: round(v, 2) for k, v in cpu.items()}
        out["cpu_ms_per_request"] = round(sum(cpu.values()) / max(1, requests) * 1000, 2)
    return out


def run_stage(stage: Stage, root: Path, args: argparse.Namespace, simulated: bool) -> dict:
    cpu0 = cpu_by_role() if simulated else None
    proc = stage.start_load(root, stage.spec(args, args.seconds, timeline=False))
    load = finish_load(proc, args.warmup + args.seconds + 180)
    cpu = None
    if cpu0 is not None:
        cpu1 = cpu_by_role()
        cpu = {k: cpu1[k] - cpu0[k] for k in cpu0}
        cpu["load"] = load["load_cpu_s"]  # the child has exited: its own figure
    return summarize_stage(stage, load, stage.verify(load["acked"]), cpu)


def run_drill(stage: Stage, root: Path, args: argparse.Namespace, cluster: Any) -> dict:
    """Kill the node of one shard (not the head's, not the directory's) a third into the load."""
    import ray

    if cluster is not None:
        head = cluster.head_node.node_id
    else:  # a real cluster: spare the node this driver runs on
        head = ray.get_runtime_context().get_node_id()
    directory_node = stage.where["directory"]["node"]
    victims = [s for s in stage.where["shards"] if s["node"] not in (head, directory_node)]
    if not victims:
        return {"skipped": "no shard on a node other than the head's and the directory's"}
    victim = victims[0]
    probe = next((a for a in stage.world["accounts"] if a["shard"] == victim["shard"]), None)
    survivors = [
        u for u, n in zip(stage.urls, stage.gateway_nodes, strict=True) if n != victim["node"]
    ]
    proc = stage.start_load(root, stage.spec(args, args.drill_seconds, timeline=True))
    # The load child connects its subscribers first, then says when its window starts.
    assert proc.stdout is not None
    window_start = json.loads(proc.stdout.readline())["window_start"]
    time.sleep(max(0.0, window_start + args.drill_seconds / 4 - time.time()))
    t_kill = time.time()
    probes: list[tuple[float, bool]] = []
    poller = threading.Thread(target=_probe, args=(probe, survivors, t_kill, probes), daemon=True)
    poller.start()
    if cluster is not None:
        node = next(n for n in cluster.worker_nodes if n.node_id == victim["node"])
        cluster.remove_node(node, allow_graceful=False)
        how = "node killed (its processes, no graceful shutdown); a node added back after 1 s"
        time.sleep(1.0)
        cluster.add_node(num_cpus=args.cpus_per_node, object_store_memory=80 << 20)
    else:
        ray.kill(stage.engine.shards[victim["shard"]], no_restart=False)
        how = "shard actor killed (real cluster: nodes are not killed by this benchmark)"
    load = finish_load(proc, args.warmup + args.drill_seconds + 180)
    poller.join(90)
    verified = stage.verify(load["acked"])
    after = stage.turns_after()
    line = load.get("timeline", {}).get(str(victim["shard"]), [])
    refused = [t for t, ok in line if not ok and t >= t_kill]
    # Back: the first answer after the last refusal, seen by this process's probe (a read of an
    # account on the lost shard every 50 ms through the surviving gateways), which goes on
    # after the load's window if it must.
    last_refused = max((t for t, ok in probes if not ok), default=t_kill)
    back = next((t for t, ok in probes if ok and t > last_refused), None)
    others = [
        (t, ok)
        for shard, rows in load.get("timeline", {}).items()
        if shard != str(victim["shard"])
        for t, ok in rows
    ]
    kinds = load["kinds"]
    return {
        "how": how,
        "victim_shard": victim["shard"],
        "killed_at_s": round(t_kill - load["wall_start"], 2),
        "recovery_s": round(back - t_kill, 2) if back else None,
        "probe_refusals": sum(1 for _, ok in probes if not ok),
        "victim_refused_requests": len(refused),
        "other_shards_refused_requests": sum(1 for t, ok in others if not ok and t >= t_kill),
        "failed_requests": {k: kinds[k]["errors"] for k in kinds},
        "requests_per_s": round(
            sum(kinds[k]["count"] for k in kinds) / (load["seconds"] or 1.0), 1
        ),
        "writes": verified,
        "acknowledged_lost": verified["lost"],
        "events": load["events"],
        "turns_after": after,
        "error_samples": load["error_samples"],
    }


# --- report --------------------------------------------------------------------------------------


def print_table(report: dict) -> None:
    stages = report["stages"]
    base = next((s for s in stages if s.get("nodes") == 1 and "failed" not in s), None)
    head = (
        f"{'nodes':>5}{'shards':>7}{'gw':>4}{'req/s':>9}{'x1':>6}"
        f"{'read p50/p99 ms':>18}{'write p50/p99':>16}{'turn p50/p99':>16}{'steps/s':>9}"
        f"{'ev lost/dup':>12}{'acked lost':>11}{'cpu ms/req':>11}"
    )
    print()
    print(
        f"cluster ({report['cluster']}): {report['params']['accounts']} accounts, "
        f"{report['params']['groups']} groups, {report['params']['concurrency']} memory clients, "
        f"{report['params']['seconds']:g}s per stage, {os.cpu_count()} CPUs on this machine"
    )
    print(head)
    print("-" * len(head))
    for s in stages:
        if "failed" in s:
            print(f"{s['k']:>5}  FAILED: {s['failed'][:100]}")
            continue
        ratio = s["requests_per_s"] / base["requests_per_s"] if base else float("nan")
        s["ratio_to_1_node"] = round(ratio, 2)
        r, w, t = s["read"], s["write"], s["turn"]
        print(
            f"{s['nodes']:>5}{s['shards']:>7}{s['gateways']:>4}{s['requests_per_s']:>9.0f}"
            f"{ratio:>6.2f}{r['p50_ms']:>9.1f}/{r['p99_ms']:<8.1f}{w['p50_ms']:>7.1f}/"
            f"{w['p99_ms']:<8.1f}{t['p50_ms']:>7.1f}/{t['p99_ms']:<8.1f}{s['bot_steps_per_s']:>9.0f}"
            f"{s['events']['lost']:>6}/{s['events']['duplicated']:<5}{s['writes']['lost']:>11}"
            f"{s.get('cpu_ms_per_request', float('nan')):>11.2f}"
        )
    d = report.get("drill")
    if d and "skipped" not in d and "failed" not in d:
        print(
            f"drill: {d['how']}; shard {d['victim_shard']} refused requests for "
            f"{d['recovery_s']} s ({d['victim_refused_requests']} refused, "
            f"{d['other_shards_refused_requests']} on other shards); acknowledged writes lost "
            f"{d['acknowledged_lost']} of {d['writes']['acked']}; events lost "
            f"{d['events']['lost']}, duplicated {d['events']['duplicated']}; group chats taking a "
            f"turn afterwards {d['turns_after']['ok']}/{sum(d['turns_after'].values())}"
        )
    elif d:
        print(f"drill: {d.get('skipped') or 'FAILED: ' + d.get('failed', '')[:200]}")
    if report["simulated"]:
        print(
            "Simulated nodes share this machine's cores: more nodes add processes, hops and "
            "gateways on the same CPUs, so x1 < 1 here is overhead, not a scaling result. "
            f"On a real cluster (--address) the target is >= {SCALING_TARGET}x from 1 to 2 nodes."
        )
    elif base:
        two = next((s for s in stages if s.get("nodes") == 2 and "failed" not in s), None)
        if two:
            verdict = "PASS" if two["ratio_to_1_node"] >= SCALING_TARGET else "MISS"
            print(f"1 -> 2 nodes: {two['ratio_to_1_node']}x (target {SCALING_TARGET}x): {verdict}")
    print()


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=__doc__)
    p.add_argument("--address", help="join this Ray cluster instead of simulating one")
    p.add_argument("--nodes", default="1,2,4", help="node counts to run, ascending")
    p.add_argument("--quick", action="store_true", help="a short run (under 2 min on 2 cores)")
    p.add_argument("--seconds", type=float, help="measured seconds per stage")
    p.add_argument("--warmup", type=float, help="warm-up seconds per stage")
    p.add_argument("--drill-seconds", type=float, help="seconds of load in the drill")
    p.add_argument("--no-drill", dest="drill", action="store_false")
    p.add_argument("--accounts", type=int, help="accounts, each with a bot")
    p.add_argument("--groups", type=int, help="group chats (3 bots each), one client each")
    p.add_argument("--concurrency", type=int, help="memory clients")
    p.add_argument("--subscribers", type=int, help="accounts listening on /v1/events")
    p.add_argument("--write-every", type=int, default=4, help="every n-th memory request writes")
    p.add_argument("--cpus-per-node", type=float, default=1.0, help="simulated nodes' CPUs")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--load", help=argparse.SUPPRESS)  # internal: run the load from a spec
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "seconds": 3.0 if quick else 10.0,
        "warmup": 0.5 if quick else 2.0,
        "drill_seconds": 8.0 if quick else 20.0,
        "accounts": 12 if quick else 32,
        "groups": 2 if quick else 6,
        "concurrency": 8 if quick else 24,
        "subscribers": 6 if quick else 16,
    }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        args.node_counts = sorted({int(n) for n in args.nodes.split(",") if n.strip()})
    except ValueError:
        p.error("--nodes takes counts like 1,2,4")
    if not args.node_counts or args.node_counts[0] < 1:
        p.error("--nodes takes counts >= 1")
    if args.accounts < GROUP_BOTS:
        p.error(f"--accounts must be at least {GROUP_BOTS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.load:
        return load_main(args.load)
    import ray

    from actors.runtime.engine import start_local_cluster, start_ray, wait_for_cluster

    t0 = time.perf_counter()
    simulated = args.address is None
    tmp = tempfile.mkdtemp(prefix="obcb", dir="/tmp")  # short: Ray's socket paths
    root = Path(tmp) / "bench"
    root.mkdir()
    script = root / "talk.toml"
    script.write_text(f"default = {json.dumps(TALK)}\n")
    models = {"talk": {"kind": "scripted", "script": str(script)}}
    report: dict[str, Any] = {
        "benchmark": "cluster",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "simulated": simulated,
        "cluster": "simulated on this machine (ray.cluster_utils)" if simulated else args.address,
        "stages": [],
    }
    load_start = os.getloadavg()
    cluster = None
    stage: Stage | None = None
    pool = GatewayPool()
    try:
        if simulated:
            cluster = start_local_cluster(1, tmp_dir=tmp, cpus_per_node=args.cpus_per_node)
            start_ray(cluster.address)
        else:
            # The benchmark's own throwaway master key, given to its actors on every node (a
            # real deployment shares its data directory or sets the key on each node instead).
            import base64

            key = base64.urlsafe_b64encode(os.urandom(32)).decode()
            os.environ["OPENBOT_MASTER_KEY"] = key
            start_ray(args.address, runtime_env={"env_vars": {"OPENBOT_MASTER_KEY": key}})
            _write_everywhere(script)
        print(f"cluster up in {time.perf_counter() - t0:.1f}s", flush=True)
        alive = _alive_nodes()
        for k in args.node_counts:
            if stage is not None:
                stage.stop()
                stage = None
            if simulated:
                while _alive_nodes() < k:
                    cluster.add_node(num_cpus=args.cpus_per_node, object_store_memory=80 << 20)
                wait_for_cluster(k)
            elif k > alive:
                report["stages"].append({"k": k, "failed": f"the cluster has {alive} nodes"})
                continue
            try:
                t_stage = time.perf_counter()
                stage = Stage(k, root, args, models, pool)
                result = run_stage(stage, root, args, simulated)
                result["stage_s"] = round(time.perf_counter() - t_stage, 1)
            except Exception as e:
                print(f"[{k} nodes] FAILED: {type(e).__name__}: {e}", flush=True)
                report["stages"].append({"k": k, "failed": f"{type(e).__name__}: {e}"[:2000]})
                continue
            report["stages"].append(result)
            print(
                f"[{k} nodes] {result['requests_per_s']:.0f} req/s, read p50 "
                f"{result['read']['p50_ms']:.1f} ms, events lost {result['events']['lost']}, "
                f"acked lost {result['writes']['lost']} (engine up in {stage.start_s}s)",
                flush=True,
            )
        if args.drill and stage is not None:
            try:
                report["drill"] = run_drill(stage, root, args, cluster)
            except Exception as e:
                report["drill"] = {"failed": f"{type(e).__name__}: {e}"[:2000]}
        elif args.drill:
            report["drill"] = {"skipped": "no stage ran"}
    finally:
        if stage is not None:
            stage.stop()
        pool.kill()
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    report["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "ray": ray.__version__,
        "loadavg_at_start": [round(x, 2) for x in load_start],
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    report["params"] = {
        k: getattr(args, k)
        for k in (
            "quick",
            "node_counts",
            "seconds",
            "warmup",
            "drill_seconds",
            "accounts",
            "groups",
            "concurrency",
            "subscribers",
            "write_every",
            "cpus_per_node",
        )
    }
    print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} (total {report['total_s']:.0f}s)")
    failed = [s for s in report["stages"] if "failed" in s]
    zero = all(
        s["events"]["lost"] == 0 and s["events"]["duplicated"] == 0 and s["writes"]["lost"] == 0
        for s in report["stages"]
        if "failed" not in s
    )
    d = report.get("drill", {})
    drill_ok = "failed" not in d and (
        "skipped" in d
        or (
            d["acknowledged_lost"] == 0
            and d["events"]["lost"] == 0
            and not d["events"]["duplicated"]
        )
    )
    return 0 if not failed and zero and drill_ok else 1


def _probe(account: dict | None, urls: list[str], since: float, out: list) -> None:
    """Read `account`'s memory through `urls` every 50 ms until it answers after refusing (or
    for 90 s); appends (time, answered) to `out`."""
    import httpx

    if account is None or not urls:
        return
    path = f"/v1/bots/{account['bot']}/memory"
    headers = {"Authorization": f"Bearer {account['token']}"}
    with httpx.Client(timeout=10) as http:
        i = 0
        while time.time() - since < 90:
            try:
                ok = http.get(urls[i % len(urls)] + path, headers=headers).status_code == 200
            except httpx.HTTPError:
                ok = False
            i += 1
            out.append((time.time(), ok))
            if ok and any(not good for _, good in out):
                return
            time.sleep(0.05)


def _alive_nodes() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive"))


def _write_everywhere(path: Path) -> None:
    """The scripted model's file on every node (a real cluster's nodes do not share /tmp)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    text = path.read_text()

    def write(p: str, t: str) -> None:
        Path(p).parent.mkdir(parents=True, exist_ok=True)
        Path(p).write_text(t)

    task = ray.remote(num_cpus=0)(write)
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    ray.get(
        [
            task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(
                str(path), text
            )
            for n in nodes
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
