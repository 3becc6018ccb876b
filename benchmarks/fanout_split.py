"""Where the fan-out benchmark's server CPU goes: per delivery (the fan-out) or per event (the
write that publishes it), by running its burst at two fan-out ratios.

    cd /work/main && .venv/bin/python -m benchmarks.fanout_split [--burst N] [--ratios 20,2]

`benchmarks.fanout` counts server CPU per 1,000 deliveries, and OpenBot's includes each event's
Remember (an authenticated, durable write) where the references' publish stores nothing. This
runs the same burst (`--users` users, the same events) with `--ratios` clients per user, for
OpenBot and the raw websockets server, each ratio a `benchmarks.fanout` run of its own, and per
CPU role fits cpu = per_event x events + per_delivery x deliveries from the two runs: the
per-delivery figure is what one more client costs (framing, the socket write, the kernel's
loopback send), the per-event figure what the write and its publication cost whatever the
audience. Then, at the higher ratio, server CPU per 1,000 deliveries = per_event x 1,000 /
ratio + per_delivery x 1,000, split by role, against the websockets server's.

Both are differences of CPU seconds read from /proc over short phases on a shared machine: run it
on a quiet one, repeat, and compare the per-delivery figures of the two systems in the same run.
Writes benchmarks/results/fanout_split.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._fanout_report import SERVER_ROLES

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "fanout_split.json"
SYSTEMS = ("openbot", "websockets")
# A role using less CPU than this in both bursts is left out: its difference is a /proc tick or
# two. (For a reference, "gateway" is the benchmark's own process.)
IDLE_S = 0.03


def fit(lo: dict[str, Any], hi: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per role, CPU µs per delivery and per event from two bursts of the same events with
    different fan-outs (`lo`, `hi`: a burst phase of benchmarks.fanout's report)."""
    d_lo, d_hi = lo["delivered"], hi["delivered"]
    e_lo, e_hi = lo["events"], hi["events"]  # the same unless a POST failed
    det = d_hi * e_lo - d_lo * e_hi
    if not det or not e_hi:
        raise ValueError("two bursts with different fan-outs are needed")
    out: dict[str, dict[str, float]] = {}
    for role in SERVER_ROLES:
        c_lo, c_hi = lo["cpu_s"][role], hi["cpu_s"][role]
        if max(c_lo, c_hi) < IDLE_S:
            continue
        # cpu = per_event x events + per_delivery x deliveries, for both bursts
        per_delivery = (c_hi * e_lo - c_lo * e_hi) / det
        per_event = (c_hi - per_delivery * d_hi) / e_hi
        out[role] = {
            "us_per_delivery": round(per_delivery * 1e6, 2),
            "us_per_event": round(per_event * 1e6, 1),
        }
    return out


def per_1k(split: dict[str, dict[str, float]], ratio: int) -> dict[str, float]:
    """Server CPU ms per 1,000 deliveries (µs per delivery) at `ratio` deliveries per event,
    by role."""
    return {
        role: round(f["us_per_event"] / ratio + f["us_per_delivery"], 1)
        for role, f in split.items()
    }


def run(args: argparse.Namespace, ratio: int, out: Path) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.fanout",
        "--systems",
        ",".join(SYSTEMS),
        "--users",
        str(args.users),
        "--clients-per-user",
        str(ratio),
        "--seconds",
        "1",
        "--drop-percent",
        "0",
        "--burst",
        str(args.burst),
        "--out",
        str(out),
    ]
    print(f"[split] {ratio} clients per user: {' '.join(cmd[2:])}", flush=True)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks.fanout failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fanout_split",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--users", type=int, default=50)
    p.add_argument("--burst", type=int, default=2000, help="events in each burst")
    p.add_argument("--ratios", default="20,2", help="clients per user: the high and low fan-out")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    hi_ratio, lo_ratio = (int(x) for x in args.ratios.split(","))
    if hi_ratio <= lo_ratio or lo_ratio < 1:
        p.error("--ratios: the high fan-out first, both at least 1")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="openbot-fanout-split-") as tmp:
        hi = run(args, hi_ratio, Path(tmp) / "hi.json")
        lo = run(args, lo_ratio, Path(tmp) / "lo.json")
    report: dict[str, Any] = {
        "benchmark": "fanout_split",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "params": {"users": args.users, "burst_events": args.burst, "ratios": [hi_ratio, lo_ratio]},
        "loadavg_1m_at_end": round(os.getloadavg()[0], 2),
        "systems": {},
    }
    print(
        f"\nburst of {args.burst} events, {args.users} users, at {hi_ratio} and {lo_ratio} "
        "clients per user: server CPU by role"
    )
    print(f"{'system':<11} {'role':<11} {'us/delivery':>12} {'us/event':>9} {'ms/1k deliv.':>13}")
    totals: dict[str, float] = {}
    for system in SYSTEMS:
        b_hi = hi["systems"][system]["phases"]["burst"]
        b_lo = lo["systems"][system]["phases"]["burst"]
        split = fit(b_lo, b_hi)
        at_hi = per_1k(split, hi_ratio)
        totals[system] = sum(at_hi.values())
        report["systems"][system] = {
            "roles": split,
            "ms_per_1k_deliveries": at_hi,
            "loads": [b_hi["loadavg_1m_at_start"], b_lo["loadavg_1m_at_start"]],
        }
        for role, f in split.items():
            print(
                f"{system:<11} {role:<11} {f['us_per_delivery']:>12.2f} "
                f"{f['us_per_event']:>9.1f} {at_hi[role]:>13.1f}"
            )
        print(f"{system:<11} {'server':<11} {'':>12} {'':>9} {totals[system]:>13.1f}")
    if totals.get("websockets"):
        ratio = totals["openbot"] / totals["websockets"]
        print(f"OpenBot / websockets, server CPU per 1,000 deliveries: {ratio:.2f}x")
    print(
        "us/delivery: CPU one more client costs per event; us/event: CPU per event whatever its "
        f"audience; ms/1k deliv.: at {hi_ratio} clients per user. Load (1 min) at the bursts: "
        + ", ".join(f"{s} {v['loads']}" for s, v in report["systems"].items())
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} (total {time.perf_counter() - t0:.0f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
