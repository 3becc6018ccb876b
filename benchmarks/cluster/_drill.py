"""The node-failure drill: the node of one shard is killed a quarter into the load; how long the
shard refused, what failed, and that nothing acknowledged was lost."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.cluster._stage import Stage, finish_load


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
