"""Figures: distributions, verdicts against the target, CPU by process role and the shards'
transaction counters."""

from __future__ import annotations

import itertools
import os
import statistics
from typing import Any

from benchmarks._load import descendant_cpu, percentile

TARGET_MS = 5.0
CHAIN_TARGET_MS = 8.0  # a collaboration delivery, p50


def chain_verdict(ms: float) -> str:
    return "PASS" if ms <= CHAIN_TARGET_MS else "MISS"


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


def verdicts(s: dict[str, Any]) -> dict[str, str]:
    out = {}
    for key, r in s.items():
        if "failed" in r:
            out[key] = "ERROR"
        elif "step_ms" in r:
            out[key] = verdict(r["step_ms"]["p50"])
        elif "per_delivery_ms" in r:
            out[key] = chain_verdict(r["per_delivery_ms"]["p50"])
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
    out = {k: sum(s[k] for s in stats) for k in ("transactions", "batches")}
    # Calls the shards made to other actors (storage/stats.py counter, per shard process).
    metrics = ray.get([s.metrics.remote() for s in engine.shards])
    out["actor_calls"] = int(
        sum(v for m in metrics for n, _, v in m["counters"] if n == "openbot_actor_calls_total")
    )
    return out


def item_gaps(items: list[dict]) -> list[float]:
    """ms between consecutive items of a turn (the person's item, then each bot's)."""
    ats = [i["at"] for i in items]
    return [float(b - a) for a, b in itertools.pairwise(ats)]
