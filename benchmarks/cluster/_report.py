"""The printed table of a cluster run."""

from __future__ import annotations

import os

SCALING_TARGET = 1.7  # requests/s from 1 to 2 nodes, on a real cluster


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
