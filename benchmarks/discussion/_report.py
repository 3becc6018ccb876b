"""The printed report of a discussion run."""

from __future__ import annotations

from typing import Any

from benchmarks.discussion._figures import TARGET_MS, chain_verdict, verdict
from benchmarks.discussion._scripts import GROUP_BOTS, GROUPS


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
                chain_verdict(r["per_delivery_ms"]["p50"]),
            )
        )  # fmt: skip
        print(
            f"  {kind}: {r['status']} ({r['reason']}), links {r['links_by_status']}, depth "
            f"{r['max_depth']};"
            f" all work idle p50 {r['until_idle_ms']['p50']:.0f} ms; ms/dlv first chain "
            f"{r['first_per_delivery_ms']:.2f}, max {r['per_delivery_ms']['max']:.2f}, "
            f"warm-up chain {r['warmup']['per_delivery_ms']:.2f}"
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
