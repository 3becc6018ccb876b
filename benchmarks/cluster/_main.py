"""Options, the stages in order, the drill, and the report file."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import actors.runtime.engine  # noqa: F401  (sets Ray's environment before anything imports ray)
from benchmarks._load import machine
from benchmarks.cluster import __doc__ as DOC
from benchmarks.cluster._clients import load_main
from benchmarks.cluster._drill import run_drill
from benchmarks.cluster._gateways import GatewayPool
from benchmarks.cluster._report import print_table
from benchmarks.cluster._stage import Stage, run_stage
from benchmarks.cluster._world import GROUP_BOTS

RESULTS = Path(__file__).resolve().parents[1] / "results" / "cluster.json"
TALK = "I agree; let us keep the scope small and measure before we add anything."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cluster", description=DOC)
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
    report["machine"] = machine(load_start)
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
