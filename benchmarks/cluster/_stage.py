"""A stage: an engine with k shards spread over k nodes, a gateway on each, one load window,
then every acknowledged write read back; and CPU by process role on a simulated cluster."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._load import descendant_cpu
from benchmarks.cluster._gateways import GatewayPool
from benchmarks.cluster._world import GROUP_BOTS, setup_world

ROOT = Path(__file__).resolve().parents[2]


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
