"""The engine's own overhead in group discussions and collaboration chains, with a zero-latency
`scripted` model, so every millisecond measured is the engine's (and HTTP's), never a model's.

    cd /work/main && .venv/bin/python -m benchmarks.discussion [--quick] [--runs N] [--profile]
        [--only floor,discussion,chains,groups] [--check]

Scenarios (one local Ray, one engine with 2 shards, a real gateway served by uvicorn from a thread
of this process on 127.0.0.1, set up through the admin API):

  floor      an 8-bot, 12-round discussion (96 bot steps) on one ShardService in this process:
             no Ray, no HTTP; DuckDB files, group commit and encryption are real. The engine's
             floor, with each DuckDB transaction timed on the database thread; `--profile`
             prints where the event loop's time goes (cProfile).
  discussion the same discussion through HTTP (`POST /v1/chats/{id}/turns?wait=true`, 12 rounds),
             once with the 8 bots' memory on both shards ("spread": 4 steps per round cross
             shards) and once all on the group chat's home shard ("colocated"): wall time of the
             turn and per bot step (turn / 96), p50/p99 over `--runs` turns in the same chat
             after one warm-up turn; gaps between consecutive items' timestamps (ms resolution).
  chain      collaboration chains started by a person's turn in a direct chat: "linear" (each
             bot sends to the next, so the chain is capped at depth 8 after 8 deliveries) and
             "tree" (each bot sends to two others, so it is capped at 32 deliveries). Time from
             the POST until a `collaboration.changed` event with a status other than "running"
             reaches a websocket client, and per delivery; then until the chain's work is idle.
  groups     100 group chats of 3 bots each, 1 round per turn, all at once: waves of one turn
             in every group (a child process over raw HTTP/1.1, a connection per turn; the
             first wave, on cold chats, is a warm-up): discussions/s, bot steps/s, the
             amortized ms per bot step and each discussion's latency.

Target: engine overhead <= 5 ms per bot turn on this machine (2 cores): p50 per step (floor and
discussion), per delivery (chains), and 1000 / (bot steps per second) under concurrency (groups).
CPU time per step is by process: the shard actors, the directory actor and this process (the
gateway's thread, the Ray driver and the HTTP client). Writes benchmarks/results/discussion.json.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import platform
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import actors.runtime.engine  # noqa: F401  (sets Ray's environment before anything imports ray)
from actors.runtime.placement import shard_of
from benchmarks._load import (
    HttpConnection,
    build_request,
    descendant_cpu,
    percentile,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "discussion.json"
TARGET_MS = 5.0
SHARDS = 2
BOTS, ROUNDS = 8, 12
STEPS = BOTS * ROUNDS
CHAIN_BOTS = 8
MAX_DEPTH = 8  # engine/collaboration.py
TREE_LABEL_MAX = 6  # labels deeper than the 32-delivery cap can reach
GROUPS, GROUP_BOTS = 100, 3
REPLY = (
    "I agree with the direction so far; let us keep the scope small, ship the first part this "
    "week and measure it before we add anything else."
)
DISCUSS_TEXT = "Plan the next release together and settle on the first milestone."
GROUP_TEXT = "Quick check before the release: anything blocking?"
CHAIN_TEXT = {"linear": "start the chain", "tree": "start the tree"}
CHAIN_NAMES = {"linear": "Link", "tree": "Node"}


# --- scripts for the scripted model ------------------------------------------------------------


def _q(s: str) -> str:
    return json.dumps(s)  # a JSON string of ASCII text is a valid TOML basic string


def _send(agent: str, message: str) -> str:
    args = f"{{ agent = {_q(agent)}, message = {_q(message)} }}"
    return f'{{ name = "workspace_send_to_agent", arguments = {args} }}'


def _rule(match: str, sends: list[str]) -> str:
    return f"[[rules]]\nmatch = '{match}'\ntool_calls = [{', '.join(sends)}]\n"


# Neither reply may be a bare acknowledgement, or the chain would suppress it as a result.
_CHAIN_HEAD = (
    f"default = {_q('Result received and merged into my work.')}\n"
    f"after_tool = {_q('Handed on; the answer will follow.')}\n"
)


def talk_script() -> str:
    return f"default = {_q(REPLY)}\n"


def linear_script() -> str:
    """Link0 (the root chat's bot) sends "hop 1" to Link1; whoever gets "hop k" sends "hop k+1"
    to Link(k+1 mod 8). The 9th send is at depth 9: refused, the chain is capped."""
    name = CHAIN_NAMES["linear"]
    rules = [_rule(f"^{CHAIN_TEXT['linear']}$", [_send(f"{name}1", "hop 1")])]
    for k in range(1, MAX_DEPTH + 1):
        rules.append(
            _rule(rf"\] hop {k}$", [_send(f"{name}{(k + 1) % CHAIN_BOTS}", f"hop {k + 1}")])
        )
    return _CHAIN_HEAD + "\n".join(rules)


def tree_script() -> str:
    """A binary tree of sends with unique labels (no duplicate suppression): Node0 sends
    "node 0" to Node1 and "node 1" to Node2; the bot b that gets "node L" sends "node L0" to
    Node(b+1) and "node L1" to Node(b+2). 2+4+8+16 sends, then the 32nd delivery caps it."""
    name = CHAIN_NAMES["tree"]
    receiver = {"0": 1, "1": 2}
    rules = [
        _rule(
            f"^{CHAIN_TEXT['tree']}$",
            [_send(f"{name}1", "node 0"), _send(f"{name}2", "node 1")],
        )
    ]
    frontier = ["0", "1"]
    for _ in range(TREE_LABEL_MAX - 1):
        nxt = []
        for label in frontier:
            b = receiver[label]
            kids = [(label + "0", (b + 1) % CHAIN_BOTS), (label + "1", (b + 2) % CHAIN_BOTS)]
            sends = []
            for kid, to in kids:
                receiver[kid] = to
                sends.append(_send(f"{name}{to}", f"node {kid}"))
                nxt.append(kid)
            rules.append(_rule(rf"\] node {label}$", sends))
        frontier = nxt
    return _CHAIN_HEAD + "\n".join(rules)


def write_scripts(root: Path) -> dict[str, dict[str, str]]:
    scripts = {"talk": talk_script(), "linear": linear_script(), "tree": tree_script()}
    config = {}
    for name, text in scripts.items():
        path = root / f"{name}.toml"
        path.write_text(text)
        config[name] = {"kind": "scripted", "script": str(path)}
    return config


# --- figures -----------------------------------------------------------------------------------


def dist(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    if not v:
        return {"n": 0}
    return {
        "n": len(v),
        "p50": round(statistics.median(v), 3),
        "p99": round(percentile(v, 0.99), 3),
        "mean": round(statistics.fmean(v), 3),
        "min": round(v[0], 3),
        "max": round(v[-1], 3),
    }


def verdict(ms: float) -> str:
    return "PASS" if ms <= TARGET_MS else "MISS"


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far by process role (see memory_ops): "driver" is this process."""
    out = {"shard": 0.0, "directory": 0.0, "driver": 0.0, "ray_system": 0.0}
    for pid, (cmd, cpu) in descendant_cpu().items():
        if pid == os.getpid():
            role = "driver"
        elif "benchmarks.discussion" in cmd:
            continue  # the load generator reports its own CPU
        elif "ShardService" in cmd:
            role = "shard"
        elif "DirectoryService" in cmd:
            role = "directory"
        else:
            role = "ray_system"
        out[role] += cpu
    return out


def cpu_per(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    return {k: round((after[k] - before[k]) * 1000 / n, 3) for k in before} if n else {}


def shard_stats(engine: Any) -> dict[str, int]:
    import ray

    stats = ray.get([s.stats.remote() for s in engine.shards])
    return {k: sum(s[k] for s in stats) for k in ("transactions", "batches")}


def item_gaps(items: list[dict]) -> list[float]:
    """ms between consecutive items of a turn (the person's item, then each bot's)."""
    ats = [i["at"] for i in items]
    return [float(b - a) for a, b in itertools.pairwise(ats)]


# --- floor: one shard in this process ----------------------------------------------------------


async def floor_async(data: Path, config: dict, runs: int, profile: bool) -> dict[str, Any]:
    from actors.contracts import TurnStart
    from actors.models.registry import ScriptedModel
    from actors.shard.service import ShardService
    from engine.directory import Bot, Channel, Chat, Org

    models = {"talk": ScriptedModel.from_file("talk", config["talk"]["script"])}
    svc = ShardService(data, 0, models=models)
    org = Org(id="o_floor", name="floor")
    bots = tuple(
        Bot(id=f"b_floor{k}", name=f"Floor{k}", org=org.id, owner="u_floor", model="talk")
        for k in range(BOTS)
    )
    channel = Channel(
        id="ch_floor", org=org.id, people=("u_floor",), bots=tuple(b.id for b in bots)
    )
    chat = Chat(
        id="chat_floor",
        kind="group",
        owner="u_floor",
        org=org.id,
        channel=channel.id,
        home=channel.id,
    )
    start = TurnStart(
        chat=chat,
        bot=None,
        org=org,
        operator="u_floor",
        text=DISCUSS_TEXT,
        channel=channel,
        members=bots,
        rounds=ROUNDS,
    )

    async def one() -> tuple[float, list[float]]:
        t0 = time.perf_counter()
        turn = await svc.start_turn(start)
        result = await svc.wait_turn(chat.id, turn.id)
        dt = (time.perf_counter() - t0) * 1000
        said = [i for i in result.items if i.kind == "bot"]
        if result.turn.status != "done" or len(said) != STEPS:
            raise RuntimeError(f"floor turn: {result.turn.status} {result.turn.error} {len(said)}")
        return dt, item_gaps([{"at": i.at} for i in result.items])

    # Time each transaction on the database thread (wall and that thread's CPU).
    commits = {"n": 0, "wall": 0.0, "cpu": 0.0, "rows": 0}
    inner = svc.committer._commit

    def timed_commit(batches, con):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return inner(batches, con)
        finally:
            commits["n"] += 1
            commits["wall"] += time.perf_counter() - w
            commits["cpu"] += time.thread_time() - c
            commits["rows"] += sum(len(b) for b in batches)

    svc.committer._commit = timed_commit
    try:
        cold, _ = await one()
        commits.update(n=0, wall=0.0, cpu=0.0, rows=0)
        txn0, batches0 = svc.committer.transactions, svc.committer.batches
        cpu0 = time.process_time()
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        turns, gaps = [], []
        for _ in range(runs):
            dt, g = await one()
            turns.append(dt)
            gaps.extend(g[1:])
        if prof is not None:
            prof.disable()
        cpu = time.process_time() - cpu0
        steps = runs * STEPS
        out = {
            "cold_turn_ms": round(cold, 2),
            "turn_ms": dist(turns),
            "step_ms": dist([t / STEPS for t in turns]),
            "item_gap_ms": dist(gaps),
            "txn_per_step": round((svc.committer.transactions - txn0) / steps, 2),
            "batches_per_step": round((svc.committer.batches - batches0) / steps, 2),
            "cpu_ms_per_step": {"driver": round(cpu * 1000 / steps, 3)},
            "commit": {
                "per_txn_wall_ms": round(commits["wall"] * 1000 / max(commits["n"], 1), 3),
                "per_txn_cpu_ms": round(commits["cpu"] * 1000 / max(commits["n"], 1), 3),
                "writes_per_txn": round(commits["rows"] / max(commits["n"], 1), 1),
                "wall_ms_per_step": round(commits["wall"] * 1000 / steps, 3),
                "cpu_ms_per_step": round(commits["cpu"] * 1000 / steps, 3),
            },
        }
        if prof is not None:
            out["profile_top"] = profile_top(prof)
        return out
    finally:
        await svc.close()


def profile_top(prof: Any, n: int = 25) -> list[str]:
    import io
    import pstats

    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(n)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    return lines[-(n + 1) :]


# --- the HTTP world ----------------------------------------------------------------------------


class Api:
    """Admin and user calls over httpx (setup and the low-rate scenarios)."""

    def __init__(self, url: str, admin_token: str) -> None:
        import httpx

        self.admin = admin_token
        self.http = httpx.Client(base_url=url, timeout=300)

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token or self.admin}"}
        resp = self.http.request(method, path, json=body, headers=headers)
        if not resp.is_success:
            raise RuntimeError(f"{method} {path}: {resp.status_code} {resp.text[:500]}")
        return resp.json()

    def post(self, path: str, body: Any, token: str | None = None) -> Any:
        return self.call("POST", path, body, token)

    def close(self) -> None:
        self.http.close()


def id_on(prefix: str, shard: int) -> str:
    """A fresh id whose account lands on `shard`."""
    while True:
        candidate = f"{prefix}_{secrets.token_hex(4)}"
        if shard_of(candidate, SHARDS) == shard:
            return candidate


class World:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.org = api.post("/v1/admin/orgs", {"name": "discussion bench"})["id"]
        # One bot owner per shard; the first is also the person who talks to the bots.
        self.owners = [
            api.post(
                "/v1/admin/users",
                {"id": id_on(f"u_s{k}", k), "name": f"owner{k}", "orgs": [self.org]},
            )
            for k in range(SHARDS)
        ]
        self.person = self.owners[0]

    def bot(self, name: str, owner: int, model: str) -> str:
        body = {"name": name, "org": self.org, "owner": self.owners[owner]["id"], "model": model}
        return self.api.post("/v1/admin/bots", body)["id"]

    def group_chat(self, bots: list[str], channel_id: str | None = None) -> str:
        body: dict[str, Any] = {"org": self.org, "people": [self.person["id"]], "bots": bots}
        if channel_id:
            body["id"] = channel_id
        channel = self.api.post("/v1/admin/channels", body)["id"]
        return self.api.post("/v1/chats", {"channel": channel}, self.person["token"])["id"]


# --- scenario: one 8-bot, 12-round discussion ----------------------------------------------------


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


# --- scenario: collaboration chains --------------------------------------------------------------


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
                await one_chain(http, ws, engine, root, kind)  # warm-up
                cpu0, stats0 = cpu_by_role(), shard_stats(engine)
                samples = [await one_chain(http, ws, engine, root, kind) for _ in range(runs)]
                cpu1, stats1 = cpu_by_role(), shard_stats(engine)
                n = sum(s["deliveries"] for s in samples)
                extra = {
                    "cpu_ms_per_delivery": cpu_per(cpu0, cpu1, n),
                    "txn_per_delivery": round(
                        (stats1["transactions"] - stats0["transactions"]) / n, 2
                    ),
                }
                out[kind] = summarize_chains(kind, samples) | extra
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
    while status is None:
        frame = json.loads(await asyncio.wait_for(ws.recv(), 120))
        data = frame.get("data") or {}
        if frame["type"] != "collaboration.changed" or data.get("chat") != chat:
            continue
        events += 1
        chain_id = chain_id or data["collaboration"]
        if data["status"] != "running":
            status = data["status"]
    t_end = time.perf_counter()
    resp = await post
    if resp.status_code != 200:
        raise RuntimeError(f"root turn: {resp.status_code} {resp.text[:300]}")
    await asyncio.gather(*[s.chains_idle.remote() for s in engine.shards])
    t_idle = time.perf_counter()
    listing = (await http.get("/api/app/workspace/collaboration")).json()["collaborations"]
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
        "until_idle_ms": dist([s["until_idle_ms"] for s in samples]),
        "samples": samples,
    }


def short_chain(r: dict[str, Any]) -> str:
    return (
        f"{r['status']} ({r['reason']}) after {r['deliveries']} deliveries, {r['links']} links; "
        f"ended p50 {r['until_ended_ms']['p50']:.1f} ms = {r['per_delivery_ms']['p50']:.2f} "
        f"ms/delivery; idle p50 {r['until_idle_ms']['p50']:.1f} ms"
    )


# --- scenario: 100 groups at once ----------------------------------------------------------------


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


# --- report --------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    s = report["scenarios"]
    m = report["machine"]
    print()
    print(
        f"discussion: engine overhead with a zero-latency model; {m['cpus']} CPUs, "
        f"load {m['loadavg_at_start'][0]:.1f} -> {m['loadavg_at_end'][0]:.1f}; "
        f"target <= {TARGET_MS:g} ms per bot turn"
    )
    head = "{:<40}{:>6}{:>11}{:>11}{:>10}{:>10}{:>9}{:>28}  {}"
    if any(k in s for k in ("floor", "discussion_spread", "discussion_colocated")):
        print(
            head.format(
                "8 bots x 12 rounds (96 steps)", "runs", "turn p50", "turn p99", "step p50",
                "step p99", "txn/st", "cpu ms/step shard/dir/drv", "result",
            )
        )  # fmt: skip
    labels = {
        "floor": "floor: 1 shard in-process, no Ray/HTTP",
        "discussion_spread": "HTTP, bots on both shards",
        "discussion_colocated": "HTTP, bots on the chat's shard",
    }
    for key, label in labels.items():
        r = s.get(key)
        if r is None:
            continue
        if "failed" in r:
            print(f"{label:<40}FAILED: {r['failed'][:100]}")
            continue
        cpu = r["cpu_ms_per_step"]
        cpu_s = "{:.2f}/{:.2f}/{:.2f}".format(
            cpu.get("shard", 0), cpu.get("directory", 0), cpu.get("driver", 0)
        )
        print(
            head.format(
                label, r["turn_ms"]["n"], f"{r['turn_ms']['p50']:.1f}",
                f"{r['turn_ms']['p99']:.1f}", f"{r['step_ms']['p50']:.2f}",
                f"{r['step_ms']['p99']:.2f}", r["txn_per_step"], cpu_s,
                verdict(r["step_ms"]["p50"]),
            )
        )  # fmt: skip
    for key in ("floor", "discussion_spread", "discussion_colocated"):
        r = s.get(key)
        if r and "failed" not in r:
            g = r["item_gap_ms"]
            print(
                f"  {key}: gap between consecutive replies p50 {g['p50']:.0f} ms, p99 "
                f"{g['p99']:.0f} ms (ms timestamps); cold first turn {r['cold_turn_ms']:.0f} ms"
            )
    c = (s.get("floor") or {}).get("commit")
    if c:
        f = s["floor"]
        print(
            f"  floor: its DuckDB transactions took {c['per_txn_wall_ms']:.1f} ms wall, "
            f"{c['per_txn_cpu_ms']:.1f} ms CPU each ({c['writes_per_txn']:g} writes) = "
            f"{c['wall_ms_per_step']:.1f} ms of the {f['step_ms']['p50']:.1f} ms per step"
        )
    print()
    chead = "{:<40}{:>6}{:>8}{:>12}{:>12}{:>12}{:>12}{:>9}{:>28}  {}"
    if any(k in s for k in ("chain_linear", "chain_tree")):
        print(
            chead.format(
                "collaboration chain", "runs", "deliv", "ended p50", "ended p99", "ms/dlv p50",
                "ms/dlv p99", "txn/dlv", "cpu ms/dlv shard/dir/drv", "result",
            )
        )  # fmt: skip
    for kind in ("linear", "tree"):
        r = s.get(f"chain_{kind}")
        label = {"linear": "linear (capped at depth 8)", "tree": "fan-out 2 (capped at 32 deliv.)"}[
            kind
        ]
        if r is None:
            continue
        if "failed" in r:
            print(f"{label:<40}FAILED: {r['failed'][:100]}")
            continue
        cpu = r["cpu_ms_per_delivery"]
        cpu_s = "{:.2f}/{:.2f}/{:.2f}".format(cpu["shard"], cpu["directory"], cpu["driver"])
        print(
            chead.format(
                label, r["runs"], r["deliveries"], f"{r['until_ended_ms']['p50']:.1f}",
                f"{r['until_ended_ms']['p99']:.1f}", f"{r['per_delivery_ms']['p50']:.2f}",
                f"{r['per_delivery_ms']['p99']:.2f}", r["txn_per_delivery"], cpu_s,
                verdict(r["per_delivery_ms"]["p50"]),
            )
        )  # fmt: skip
        print(
            f"  {kind}: {r['status']} ({r['reason']}), links {r['links_by_status']}, depth "
            f"{r['max_depth']};"
            f" all work idle p50 {r['until_idle_ms']['p50']:.0f} ms"
            + ("" if r["consistent"] else "; WARNING: runs ended differently")
        )
    print()
    r = s.get("groups")
    if r is not None:
        if "failed" in r:
            print(f"groups: FAILED: {r['failed'][:200]}")
        else:
            ld, lat, cpu = r["load"], r["discussion_latency_ms"], r["cpu_ms_per_step"]
            print(
                f"{GROUPS} groups x {GROUP_BOTS} bots x 1 round, all at once, {ld['waves']} waves: "
                f"{r['discussions_per_s']:.1f} discussions/s = {r['steps_per_s']:.0f} bot steps/s"
                f" -> {r['amortized_ms_per_step']:.2f} ms per step "
                f"[{verdict(r['amortized_ms_per_step'])}]"
            )
            print(
                f"  discussion latency p50 {lat['p50']:.0f} ms, p99 {lat['p99']:.0f} ms "
                f"(n={lat['n']}); wave p50 {ld['wave_s']['p50']:.2f} s; txn/step "
                f"{r['txn_per_step']}; cpu ms/step shard {cpu['shard']:.2f} dir "
                f"{cpu['directory']:.2f} driver {cpu['driver']:.2f} ray {cpu['ray_system']:.2f} "
                f"(+ load client {r['load_cpu_ms_per_step']:.2f})"
            )
            print(
                f"  engine CPU {r['engine_cpu_ms_per_step']:.2f} ms per step: at most "
                f"{r['cpu_bound_steps_per_s']:.0f} steps/s on {report['machine']['cpus']} idle "
                f"cores ({1000 / r['cpu_bound_steps_per_s']:.2f} ms per step)"
            )
    print(
        "step = turn / 96; chains: from the POST until a non-running collaboration.changed "
        "reaches the websocket client; groups: 1000 / (bot steps per second)."
    )
    print("cpu: shard = both shard actors, dir = directory actor, drv = this process (gateway, "
          "Ray driver, client).")  # fmt: skip
    top = (s.get("floor") or {}).get("profile_top")
    if top:
        print("\nfloor profile (cProfile, by own time):")
        for line in top:
            print("  " + line)
    print()


# --- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.discussion", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a short smoke run")
    p.add_argument("--runs", type=int, default=None, help="measured discussion turns (10)")
    p.add_argument("--chain-runs", type=int, default=None, help="measured chains of each kind (5)")
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
    args.chain_runs = args.chain_runs or (2 if q else 5)
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
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "ray": ray.__version__,
            "loadavg_at_start": [round(x, 2) for x in load_start],
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        },
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


def verdicts(s: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, r in s.items():
        if "failed" in r:
            out[key] = "ERROR"
        elif "step_ms" in r:
            out[key] = verdict(r["step_ms"]["p50"])
        elif "per_delivery_ms" in r:
            out[key] = verdict(r["per_delivery_ms"]["p50"])
        elif "amortized_ms_per_step" in r:
            out[key] = verdict(r["amortized_ms_per_step"])
    return out


def short_disc(r: dict[str, Any]) -> str:
    if "failed" in r:
        return "FAILED " + r["failed"][:300]
    return (
        f"turn p50 {r['turn_ms']['p50']:.1f} ms, p99 {r['turn_ms']['p99']:.1f} ms; per step p50 "
        f"{r['step_ms']['p50']:.2f} ms, p99 {r['step_ms']['p99']:.2f} ms; "
        f"{r['txn_per_step']} txn/step -> {verdict(r['step_ms']['p50'])}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
