"""The alternating rounds of `benchmarks.memory_ops` and what they are read with: the CPU of each
process role, the gateway's ways of writing (coalesced or not, events polled, calls in flight),
the rounds themselves and the ratio targets' verdicts.

On a machine whose load changes, one window per scenario compares two scenarios measured at
different loads; rounds that alternate them, summed, compare them at the same ones.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks._load import descendant_cpu

# Targets on ratios of two scenarios measured side by side in the same rounds (`--ab-rounds`,
# or the single windows without them): (numerator, denominator, minimum ratio).
RATIO_TARGETS: dict[str, tuple[str, str, float]] = {
    "Remember / shard.ping()": ("coalesced", "ping", 1.0),
    "workspace write / Remember": ("workspace", "coalesced", 1.0),
    # In rounds of their own, before any write: the reads see the seeded pool alone.
    "GET memory / GET /healthz": ("read", "health", 0.75),
}


# --- CPU accounting -----------------------------------------------------------------------------


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far by role ("driver": this process, the gateway's thread, Ray's driver and,
    for actor calls, the load; the others: its descendants)."""
    out = {"driver": 0.0, "shard": 0.0, "directory": 0.0, "ray_system": 0.0}
    for pid, (cmd, cpu) in descendant_cpu().items():
        if pid == os.getpid():
            role = "driver"
        elif "benchmarks._load" in cmd:
            continue  # the HTTP load generator reports its own CPU
        elif "ShardService" in cmd:
            role = "shard"
        elif "DirectoryService" in cmd:
            role = "directory"
        else:
            role = "ray_system"  # gcs, raylet, idle workers, monitors
        out[role] += cpu
    return out


def cpu_per_op(before: dict[str, float], after: dict[str, float], ops: int) -> dict[str, float]:
    if not ops:
        return {}
    return {k: round((after[k] - before[k]) / ops * 1000, 3) for k in before}


def coalesced() -> tuple[float, int]:
    """Requests and Ray calls of the gateway's coalescers so far (it runs in this process)."""
    from storage.stats import STATS

    for h in STATS.snapshot()["histograms"]:
        if h[0] == "openbot_coalesced_requests":
            return h[-2], h[-1]
    return 0.0, 0


def uncoalesced(engine: Any, run: Any) -> dict[str, Any]:
    """Run a scenario with the gateway's coalescing off: one Ray call per write."""
    ports = engine.shard_ports
    for port in ports:
        port.coalesce = False
    try:
        return run()
    finally:
        for port in ports:
            port.coalesce = True


def write_calls(engine: Any, run: Any, calls: int) -> dict[str, Any]:
    """Run a scenario with `calls` coalesced calls of a kind in flight per shard (instead of
    `RayShard.write_calls`): with one, no write reaches the shard while its previous call's
    group syncs; with two, the next call's writes are decided meanwhile."""
    ports = engine.shard_ports
    kept = [(port, port.write_calls) for port in ports]
    coalescers = [
        c
        for port in ports
        for w in list(port._writes.values())
        for c in (w.remember, w.workspace_create)
    ]
    kept_c = [(c, c.max_calls) for c in coalescers]
    for port in ports:
        port.write_calls = calls
    for c in coalescers:
        c.max_calls = calls
    try:
        return run()
    finally:
        for port, n in kept:
            port.write_calls = n
        for c, n in kept_c:
            c.max_calls = n


def polled(engine: Any, run: Any) -> dict[str, Any]:
    """Run a scenario with the coalesced writes' replies carrying no events: the gateway gets
    each commit's events by its pump's poll alone (actors/runtime/follow.py)."""
    ports = engine.shard_ports
    for port in ports:
        port.follow = False
    try:
        return run()
    finally:
        for port in ports:
            port.follow = True


def over_ray(run: Any) -> dict[str, Any]:
    """Run a scenario with the shards' lanes off in this process: the gateway's coalesced
    writes (and its event polls) go over Ray, as they do to a shard on another node."""
    from actors.runtime import lane

    kept, lane.ENABLED = lane.ENABLED, False
    try:
        return run()
    finally:
        lane.ENABLED = kept


def remember_ab(
    engine: Any,
    run: Any,
    rounds: int,
    ping: Any = None,
    workspace: Any = None,
    only: set[str] | None = None,
    more: dict[str, Any] | None = None,
    shard_stats: Any = None,
) -> dict[str, dict[str, float]]:
    """Remember with the gateway's coalescing on and off, coalesced with the events polled
    (not with the write replies), coalesced with the other number of calls in flight than
    the default (`RayShard.write_calls`: one_call or two_calls), and coalesced over Ray instead
    of the shard's lane (over_ray), in alternating rounds, summed:
    a fairer side by side than one window each on a machine whose load changes. With `ping`
    and `workspace`: the ceiling and the workspace write in the same rounds (the ratio
    targets). With `shard_stats` (the written shard's `stats()`): each way's evictions, so a
    way that pays for reloading what another way pushed out of the residency budget shows."""
    from actors.runtime.shard_proxy import RayShard

    ways = {
        "coalesced": run,
        "not_coalesced": lambda: uncoalesced(engine, run),
        "events_polled": lambda: polled(engine, run),
        "one_call": lambda: write_calls(engine, run, 1),
        "two_calls": lambda: write_calls(engine, run, 2),
        "over_ray": lambda: over_ray(run),
    }
    if only is None:  # (the way that equals the default is "coalesced" itself)
        del ways["one_call" if RayShard.write_calls == 1 else "two_calls"]
    if ping is not None:  # the ceiling, in the same rounds
        ways["ping"] = ping
    if workspace is not None:
        ways["workspace"] = workspace
    ways |= more or {}
    if only:
        ways = {k: v for k, v in ways.items() if k in only}
    sums = {k: {"count": 0, "seconds": 0.0, "ops": 0, "shard": 0.0, "driver": 0.0, "evictions": 0}
            for k in ways}  # fmt: skip
    # Each round's shard CPU per request, by way: a cost that grows over a run shows here.
    per_round: dict[str, list[float]] = {k: [] for k in ways}
    loads = []
    for _ in range(rounds):
        loads.append(round(os.getloadavg()[0], 2))
        for name in sums:
            evicted = shard_stats()["evictions"] if shard_stats else 0
            cpu0 = cpu_by_role()
            r = ways[name]()
            cpu1 = cpu_by_role()
            t = sums[name]
            if shard_stats:
                t["evictions"] += shard_stats()["evictions"] - evicted
            t["count"] += r["count"]
            t["seconds"] += r["seconds"]
            t["ops"] += r["ops_incl_warmup"]
            t["shard"] += cpu1["shard"] - cpu0["shard"]
            t["driver"] += cpu1["driver"] - cpu0["driver"]
            shard_ms = (cpu1["shard"] - cpu0["shard"]) / max(r["ops_incl_warmup"], 1) * 1000
            per_round[name].append(round(shard_ms, 3))
    out = {
        name: {
            "per_s": round(t["count"] / t["seconds"], 1),
            "shard_cpu_ms": round(t["shard"] / t["ops"] * 1000, 3),
            "gateway_cpu_ms": round(t["driver"] / t["ops"] * 1000, 3),
            "shard_cpu_ms_per_round": per_round[name],
        }
        | ({"evictions": t["evictions"]} if shard_stats else {})
        for name, t in sums.items()
    }
    if "ping" in out:
        for name in ways:
            if name != "ping":
                out[name]["of_ping"] = round(out[name]["per_s"] / out["ping"]["per_s"], 3)
    out["loadavg_1m_per_round"] = loads  # type: ignore[assignment]
    return out


def ratio_verdicts(m: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The ratio targets of one mode: from the alternating rounds where they ran, else from the
    single windows (a rougher side by side on a busy machine)."""
    ab = {**(m.get("read_ab") or {}), **(m.get("remember_ab") or {})}
    sc = m["scenarios"]
    single = {
        "coalesced": "http_remember",
        "ping": "actor_ping",
        "workspace": "http_workspace_write",
        "read": "http_read",
        "health": "http_health",
    }
    out: dict[str, dict[str, Any]] = {}
    for label, (num, den, minimum) in RATIO_TARGETS.items():
        if num in ab and den in ab:
            a, b, source = ab[num]["per_s"], ab[den]["per_s"], "alternating rounds"
        else:
            a = sc.get(single[num], {}).get("throughput_per_s")
            b = sc.get(single[den], {}).get("throughput_per_s")
            source = "single windows"
        if not a or not b:
            continue
        ratio = a / b
        out[label] = {
            "ratio": round(ratio, 3),
            "min": minimum,
            "verdict": "PASS" if ratio >= minimum else "FAIL",
            "from": source,
        }
    return out
