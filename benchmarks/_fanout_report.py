"""Scoring and reporting for benchmarks/fanout.py: loss, duplicates and latency per phase,
the verdicts against the fan-out targets, and the printed table."""

from __future__ import annotations

import argparse
import collections
import math
import os
from typing import Any

from benchmarks._load import percentile

SYSTEMS = ("openbot", "websockets", "socketio")
LABELS = {"openbot": "OpenBot", "websockets": "websockets (ceiling)", "socketio": "python-socketio"}
TARGETS = {
    "lost": 0,
    "duplicated": 0,
    "p99_ms_max_1k": 10.0,  # fixed phase, at 1,000 clients
    "p99_ms_max_10k": 50.0,  # fixed phase, at 10,000 clients (--users 500)
    "vs_websockets_min": 0.7,  # burst deliveries/s against the raw websockets server
    "cpu_vs_websockets_max": 2.0,  # burst server CPU per 1,000 deliveries, against it
    "kib_per_client_max": 20.0,  # the gateway's resident memory per connected client
    "vs_socketio_min": 2.0,
    "cpu_vs_socketio_max": 2.0,  # server CPU per 1,000 deliveries, burst
}
SERVER_ROLES = ("gateway", "shard", "directory", "ray_system", "ref_server")


def score(
    system: str,
    clients: list[dict[str, Any]],
    records: list[list[Any]],
    phases: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Per phase: deliveries, loss, duplicates, foreign events, latencies, rates."""
    by_entry: dict[str, tuple[str, int, int, int]] = {}
    ids: dict[tuple[int, str], set[str]] = collections.defaultdict(set)
    post_lat: dict[str, list[float]] = collections.defaultdict(list)
    failed_posts: collections.Counter[str] = collections.Counter()
    first_send: dict[str, int] = {}
    for phase, entry, user, t_send, t_resp, _status in records:
        if entry is None:
            failed_posts[phase] += 1
            continue
        by_entry[entry] = (phase, user, t_send, t_resp)
        ids[(user, phase)].add(entry)
        post_lat[phase].append((t_resp - t_send) / 1e6)
        first_send[phase] = min(first_send.get(phase, t_send), t_send)

    out: dict[str, Any] = {"system": system, "phases": {}}
    for phase, info in phases.items():
        lat: list[float] = []
        lat_resp: list[float] = []
        lat_at: list[float] = []
        delivered = dup = foreign = unknown = lost = expected = 0
        last_recv = 0
        lost_clients = 0
        for c in clients:
            want = ids.get((c["user"], phase), set())
            expected += len(want)
            got: set[str] = set()
            for entry, t, after_at in c["received"]:
                rec = by_entry.get(entry)
                if rec is None:
                    if phase == "fixed":
                        unknown += 1  # counted once, under the first phase
                    continue
                if rec[0] != phase:
                    continue
                if rec[1] != c["user"]:
                    foreign += 1
                    continue
                if entry in got:
                    dup += 1
                    continue
                got.add(entry)
                delivered += 1
                lat.append((t - rec[2]) / 1e6)
                lat_resp.append((t - rec[3]) / 1e6)
                lat_at.append(float(after_at))
                last_recv = max(last_recv, t)
            missing = len(want - got)
            lost += missing
            lost_clients += missing > 0
        timeline = _timeline(phase, clients, by_entry, first_send.get(phase))
        lat.sort()
        lat_resp.sort()
        lat_at.sort()
        posts = sorted(post_lat.get(phase, []))
        span = (last_recv - first_send[phase]) / 1e9 if phase in first_send and last_recv else 0
        server_cpu = sum(info["cpu_s"][r] for r in SERVER_ROLES)
        out["phases"][phase] = {
            "events": len(posts),
            "failed_posts": failed_posts.get(phase, 0),
            "expected_deliveries": expected,
            "delivered": delivered,
            "lost": lost,
            "clients_with_loss": lost_clients,
            "duplicated": dup,
            "foreign": foreign,
            "unknown": unknown,
            "delivered_per_s": round(delivered / span, 1) if span > 0 else 0.0,
            "span_s": round(span, 3),
            "latency_ms": _pcts(lat),
            "latency_after_response_ms": _pcts(lat_resp),
            # the frame's `at` (OpenBot: when the shard queued the event, before its commit;
            # references: when the server built the frame) -> received, wall clock, 1 ms steps
            "latency_after_at_ms": _pcts(lat_at),
            "post_ms": _pcts(posts),
            "server_cpu_ms_per_1k_deliveries": round(server_cpu / delivered * 1e6, 1)
            if delivered
            else None,
            **info,
            "cpus_busy": burst_busy(info) if info.get("wall_s") else None,
            "timeline": timeline,
        }
    out["drops"] = sum(c["drops"] for c in clients)
    out["connects"] = sum(c["connects"] for c in clients)
    out["reconnects"] = out["connects"] - len(clients)
    closes: collections.Counter[str] = collections.Counter()
    for c in clients:
        closes.update(c["closes"])
    out["close_codes"] = dict(closes)
    out["resets"] = sum(c["resets"] for c in clients)
    errs = [e for c in clients for e in c["errors"]]
    out["client_errors"] = {"count": len(errs), "samples": errs[:5]}
    return out


def _timeline(
    phase: str,
    clients: list[dict[str, Any]],
    by_entry: dict[str, tuple[str, int, int, int]],
    start: int | None,
) -> list[dict[str, Any]]:
    """Per second of the phase (by the events' send time): events sent, drops, and the latency
    of the deliveries of those events; shows whether slow deliveries follow drops."""
    if start is None:
        return []
    sent: collections.Counter[int] = collections.Counter()
    for ph, _user, t_send, _t_resp in by_entry.values():
        if ph == phase:
            sent[(t_send - start) // 1_000_000_000] += 1
    lat: dict[int, list[float]] = collections.defaultdict(list)
    seen: set[tuple[int, str]] = set()
    for c in clients:
        for entry, t, _ in c["received"]:
            rec = by_entry.get(entry)
            if rec is None or rec[0] != phase or (c["index"], entry) in seen:
                continue
            seen.add((c["index"], entry))
            lat[(rec[2] - start) // 1_000_000_000].append((t - rec[2]) / 1e6)
    drops: collections.Counter[int] = collections.Counter()
    horizon = max(sent, default=-1)
    for c in clients:
        for t in c.get("drop_times", []):
            second = (t - start) // 1_000_000_000
            if 0 <= second <= horizon:
                drops[second] += 1
    out = []
    for second in range(horizon + 1):
        values = sorted(lat.get(second, []))
        out.append(
            {
                "second": second,
                "events": sent.get(second, 0),
                "drops": drops.get(second, 0),
                "deliveries": len(values),
                "p50_ms": round(percentile(values, 0.5), 1) if values else None,
                "p99_ms": round(percentile(values, 0.99), 1) if values else None,
            }
        )
    return out


def burst_busy(p: dict[str, Any]) -> dict[str, float]:
    """CPUs busy on average over a phase: the server, the clients, the producer, and all."""
    wall = p["wall_s"]
    cpu = p["cpu_s"]
    server = sum(cpu[k] for k in SERVER_ROLES)
    out = {"server": server / wall, "clients": cpu["clients"] / wall}
    out["producer"] = cpu["producer"] / wall
    out["total"] = out["server"] + out["clients"] + out["producer"]
    return {k: round(v, 2) for k, v in out.items()}


def _loads(results: dict[str, dict[str, Any]]) -> str:
    return ", ".join(
        f"{LABELS[system]} {phase} {p['loadavg_1m_at_start']:.1f}"
        for system, r in results.items()
        for phase, p in r.get("phases", {}).items()
    )


def _busy(p: dict[str, Any]) -> str:
    b = burst_busy(p)
    cpu = b["total"] * p["wall_s"]
    per_cpu_s = p["delivered"] / cpu if cpu > 0 else 0.0
    out = (
        f"server {b['server']:.2f} + clients {b['clients']:.2f} + producer "
        f"{b['producer']:.2f} = {b['total']:.2f}  over {p['wall_s']:.2f} s; "
        f"{per_cpu_s:,.0f} deliveries per CPU-second"
    )
    cost = client_cost(p)
    if cost is not None:
        out += f"; clients per 1,000: {cost['cpu_ms']:.1f} ms CPU, {cost['wakeups']:.0f} wakeups"
    return out


def client_cost(p: dict[str, Any]) -> dict[str, float] | None:
    """The client processes' CPU (ms) and wakeups per 1,000 deliveries of a phase: the more
    often they wake for few frames, the more each frame costs them."""
    if p.get("client_wakeups") is None or not p.get("delivered"):
        return None
    per_1k = 1000 / p["delivered"]
    return {
        "cpu_ms": round(p["cpu_s"]["clients"] * 1000 * per_1k, 2),
        "wakeups": round(p["client_wakeups"] * per_1k, 1),
    }


def _pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p99": math.nan, "max": math.nan, "n": 0}
    return {
        "p50": round(percentile(values, 0.50), 2),
        "p90": round(percentile(values, 0.90), 2),
        "p99": round(percentile(values, 0.99), 2),
        "max": round(values[-1], 2),
        "n": len(values),
    }


def _ratio_row(
    ob: dict[str, Any],
    ref: dict[str, Any],
    phase: str,
    key: str,
    what: str,
    limit: float,
    low: bool,
) -> tuple[str, str, str, str] | None:
    """OpenBot's `key` in `phase` against a reference's in the same run: a ratio judged
    against `limit` (`low`: at most it, else at least it); judged in the burst only."""
    if "phases" not in ref or phase not in ref["phases"]:
        return None
    mine = ob["phases"][phase][key]
    theirs = ref["phases"][phase][key]
    ratio = mine / theirs if mine and theirs else math.nan
    ok = ratio <= limit if low else ratio >= limit
    unit = "ms" if low else "/s"
    return (
        f"{what}, {phase}",
        f"{'<=' if low else '>='} {limit:g}x",
        f"{ratio:.2f}x ({mine:.0f} vs {theirs:.0f} {unit})",
        ("PASS" if ok else "MISS") if phase == "burst" else "(info)",
    )


def p99_target(clients: int) -> float:
    """The fixed phase's p99 target for this many clients (the issue states 1,000 and 10,000)."""
    return TARGETS["p99_ms_max_1k"] if clients <= 1000 else TARGETS["p99_ms_max_10k"]


def verdicts(
    results: dict[str, dict[str, Any]], clients: int = 1000
) -> list[tuple[str, str, str, str]]:
    """(what, target, measured, PASS/MISS/-) for the fan-out targets, on OpenBot: against the
    raw websockets server and python-socketio, each measured in the same run."""
    ob = results.get("openbot", {})
    rows: list[tuple[str, str, str, str]] = []
    if "phases" not in ob:
        return [("OpenBot", "-", "not measured", "ERROR")]
    fx = ob["phases"]["fixed"]
    loss = sum(ob["phases"][p]["lost"] for p in ob["phases"])
    dup = sum(ob["phases"][p]["duplicated"] for p in ob["phases"])
    foreign = sum(ob["phases"][p]["foreign"] for p in ob["phases"])
    rows.append(("lost events (all phases)", "0", str(loss), "PASS" if loss == 0 else "MISS"))
    rows.append(("duplicated events (all phases)", "0", str(dup), "PASS" if dup == 0 else "MISS"))
    rows.append(
        ("foreign events (audience)", "0", str(foreign), "PASS" if foreign == 0 else "MISS")
    )
    p99 = fx["latency_ms"]["p99"]
    limit = p99_target(clients)
    rows.append(
        (
            f"p99 publish-to-receive, fixed, {clients:,} cl.",
            f"<= {limit:g} ms",
            f"{p99:.1f} ms",
            "PASS" if p99 <= limit else "MISS",
        )
    )
    ws = results.get("websockets", {})
    if "phases" in ws:
        theirs = ws["phases"]["fixed"]["latency_ms"]["p99"]
        after = fx["latency_after_response_ms"]["p99"]
        rows.append(
            (
                "p99 fixed vs websockets (same run)",
                "-",
                f"{p99 / theirs:.2f}x ({p99:.1f} vs {theirs:.1f} ms)" if theirs else "-",
                "(info)",
            )
        )
        rows.append(
            (
                "p99 fixed, POST answered -> received",
                "-",
                f"{after:.1f} ms (websockets "
                f"{ws['phases']['fixed']['latency_after_response_ms']['p99']:.1f} ms)",
                "(info)",
            )
        )
    memory = ob.get("memory")
    if memory is not None:
        kib = memory["kib_per_client"]
        verdict = "PASS" if kib <= TARGETS["kib_per_client_max"] else "MISS"
        rows.append(
            (
                f"gateway memory per client, {clients:,} cl.",
                f"<= {TARGETS['kib_per_client_max']:g} KiB",
                f"{kib:.1f} KiB",
                # The target is stated at 10,000 clients (--users 500); fewer: shown only.
                verdict if clients >= 10_000 else "(info)",
            )
        )
    refs = (
        (
            "websockets",
            "vs websockets",
            TARGETS["vs_websockets_min"],
            TARGETS["cpu_vs_websockets_max"],
        ),
        (
            "socketio",
            "vs python-socketio",
            TARGETS["vs_socketio_min"],
            TARGETS["cpu_vs_socketio_max"],
        ),
    )
    for name, label, rate_min, cpu_max in refs:
        ref = results.get(name, {})
        for phase in ("burst", "fixed"):
            for row in (
                _ratio_row(
                    ob, ref, phase, "delivered_per_s", f"delivered/s {label}", rate_min, False
                ),
                _ratio_row(
                    ob,
                    ref,
                    phase,
                    "server_cpu_ms_per_1k_deliveries",
                    f"server CPU/1k deliv. {label}",
                    cpu_max,
                    True,
                ),
            ):
                if row is not None:
                    rows.append(row)
    return rows


def print_table(results: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    n = args.users * args.clients_per_user
    print()
    print(
        f"fanout: {n} websocket clients ({args.users} users x {args.clients_per_user}) in "
        f"{args.client_procs} processes; fixed: {args.rate:g} events/s x {args.seconds:g}s "
        f"(= {args.rate * args.clients_per_user:g} deliveries/s), {args.drop_percent:g}% of "
        f"clients dropped every {args.drop_every:g}s; burst: {args.burst} events, "
        f"{args.burst_concurrency} in flight; {os.cpu_count()} CPUs"
    )
    if getattr(args, "openbot_client", "eventclient") == "raw":
        print("OpenBot's clients: the raw websockets client (no EventClient, no resume)")
    head = (
        f"{'system':<21}{'phase':<7}{'events':>7}{'deliv.':>8}{'lost':>6}{'dup':>5}"
        f"{'deliv/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'POST p50/p99 ms':>17}"
        f"{'drops':>7}{'reconn':>7}{'srv cpu ms/1k':>14}"
    )
    print(head)
    print("-" * len(head))
    for system, r in results.items():
        label = LABELS[system]
        if "phases" not in r:
            print(f"{label:<21}FAILED: {r.get('failed', '?')[:100]}")
            continue
        for phase, p in r["phases"].items():
            lat, post = p["latency_ms"], p["post_ms"]
            drops = f"{r['drops']}" if phase == "fixed" else ""
            reconn = f"{r['reconnects']}" if phase == "fixed" else ""
            cpu = p["server_cpu_ms_per_1k_deliveries"]
            print(
                f"{label:<21}{phase:<7}{p['events']:>7}{p['delivered']:>8}{p['lost']:>6}"
                f"{p['duplicated']:>5}{p['delivered_per_s']:>9.0f}{lat['p50']:>8.1f}"
                f"{lat['p99']:>8.1f}{lat['max']:>8.1f}"
                f"{post['p50']:>8.1f}/{post['p99']:<8.1f}"
                f"{drops:>7}{reconn:>7}{(f'{cpu:.0f}' if cpu is not None else '-'):>14}"
            )
    print(
        "deliv/s: distinct deliveries / (last receive - first POST sent); latency: POST written "
        "-> frame received; srv cpu: server-side CPU (OpenBot: gateway + Ray actors and system "
        "processes) per 1,000 deliveries."
    )
    print()
    print(
        f"{'latency breakdown, ms (p50/p99)':<29}{'POST->rx':>14}{'POST->resp':>14}"
        f"{'resp->rx':>14}{'at->rx':>14}   cpu s: server / clients / producer"
    )
    for system, r in results.items():
        for phase, p in r.get("phases", {}).items():
            cells = [
                p["latency_ms"],
                p["post_ms"],
                p["latency_after_response_ms"],
                p["latency_after_at_ms"],
            ]
            cpu = p["cpu_s"]
            server = sum(cpu[k] for k in SERVER_ROLES)
            print(
                f"{LABELS[system] + ' ' + phase:<29}"
                + "".join(f"{c['p50']:>7.1f}/{c['p99']:<6.1f}" for c in cells)
                + f"   {server:.1f} / {cpu['clients']:.1f} / {cpu['producer']:.1f}"
                + (
                    f"  (gateway {cpu['gateway']:.1f}, shard {cpu['shard']:.1f}, "
                    f"directory {cpu['directory']:.1f}, ray {cpu['ray_system']:.1f})"
                    if system == "openbot"
                    else ""
                )
            )
    print(
        "at->rx: from the frame's `at` (OpenBot: the shard queued the event, before its commit; "
        "references: the server built the frame) to receipt, wall clock, 1 ms steps."
    )
    print()
    cpus = os.cpu_count() or 1
    print(f"burst, CPUs busy on average over the phase (of {cpus}): what bounds the rate")
    for system, r in results.items():
        p = r.get("phases", {}).get("burst")
        if p is None or not p.get("wall_s"):
            continue
        print(f"  {LABELS[system]:<21}" + _busy(p))
    print(
        "  a system whose total is near the CPU count is CPU-bound; one well below it waits "
        f"(latency-bound: {args.burst_concurrency} POSTs in flight, each answered after its "
        "commit or hand-over). Deliveries per CPU-second (all roles) bound what the CPUs "
        "would give if nothing waited, and move less with other load than deliv/s. A client "
        "process pays more per frame the more often it wakes for few frames (a server that "
        "writes them out slowly): compare wakeups before blaming a client."
    )
    print()
    for system, r in results.items():
        if "phases" not in r:
            continue
        extra = []
        if r.get("close_codes"):
            extra.append(f"close codes {r['close_codes']}")
        if r.get("resets"):
            extra.append(f"resets {r['resets']}")
        fx = r["phases"]["fixed"]
        if fx["foreign"] or fx["unknown"]:
            extra.append(f"foreign {fx['foreign']} unknown {fx['unknown']}")
        failed_posts = sum(p["failed_posts"] for p in r["phases"].values())
        if failed_posts:
            extra.append(f"failed POSTs {failed_posts}")
        if r["client_errors"]["count"]:
            extra.append(f"client errors {r['client_errors']['count']}")
        if r.get("server_log", {}).get("counts"):
            extra.append(f"server log {r['server_log']['counts']}")
        extra.append(f"connect {r['connect']['clients']} clients {r['connect']['seconds']}s")
        print(f"  {LABELS[system]}: " + "; ".join(extra))
        steps = fx.get("timeline", [])
        if system == "openbot" and steps:
            cells = " ".join("-" if s["p99_ms"] is None else f"{s['p99_ms']:.0f}" for s in steps)
            print(f"    fixed phase, p99 ms of the events sent in each second: {cells}")
    print()
    for system, r in results.items():
        if "memory" in r:
            m = r["memory"]
            print(
                f"  {LABELS[system]}: server RSS {m['rss_before_mib']:.0f} MiB before the clients, "
                f"{m['rss_connected_mib']:.0f} MiB with {n:,} connected: "
                f"{m['kib_per_client']:.1f} KiB per client"
            )
    print(f"load average (1 min) at each phase's start: {_loads(results)}")
    print()
    print(f"{'target (OpenBot)':<44}{'target':<12}{'measured':<30}result")
    for what, target, measured, verdict in verdicts(results, n):
        print(f"{what:<44}{target:<12}{measured:<30}{verdict}")
    loads = [
        p["loadavg_1m_at_start"] for r in results.values() for p in r.get("phases", {}).values()
    ]
    if loads and max(loads) > (os.cpu_count() or 1):
        print(
            f"WARNING: 1-min load average reached {max(loads):.1f} on {os.cpu_count()} CPUs "
            "during the run: other processes competed for the CPUs; latencies are inflated."
        )
    print()
