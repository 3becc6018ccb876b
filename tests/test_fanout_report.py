"""benchmarks/_fanout_report.py's verdicts: the issue's fan-out targets, rate and CPU both."""

from __future__ import annotations

from benchmarks._fanout_report import verdicts


def _system(rate: float, cpu: float) -> dict:
    phase = {
        "delivered_per_s": rate,
        "server_cpu_ms_per_1k_deliveries": cpu,
        "lost": 0,
        "duplicated": 0,
        "foreign": 0,
        "latency_ms": {"p99": 10.0},
    }
    return {"phases": {"fixed": dict(phase), "burst": dict(phase)}}


def _row(rows: list, start: str) -> tuple:
    (row,) = [r for r in rows if r[0].startswith(start) and r[0].endswith("burst")]
    return row


def test_burst_cpu_per_delivery_is_judged_against_socketio() -> None:
    rows = verdicts({"openbot": _system(16_000, 200.0), "socketio": _system(8_000, 100.0)})
    assert _row(rows, "delivered/s")[3] == "PASS"
    assert _row(rows, "server CPU")[3] == "PASS"  # 2.00x: at the limit
    rows = verdicts({"openbot": _system(16_000, 201.0), "socketio": _system(8_000, 100.0)})
    assert _row(rows, "server CPU")[3] == "MISS"
    assert _row(rows, "server CPU")[2].startswith("2.01x")
    rows = verdicts({"openbot": _system(15_000, 50.0), "socketio": _system(8_000, 100.0)})
    assert _row(rows, "delivered/s")[3] == "MISS"
    assert _row(rows, "server CPU")[3] == "PASS"
