"""benchmarks/_fanout_report.py's verdicts: the issue's fan-out targets, rate and CPU both."""

from __future__ import annotations

from benchmarks._fanout_report import client_cost, verdicts


def _system(rate: float, cpu: float, p99: float = 10.0, kib: float | None = None) -> dict:
    phase = {
        "delivered_per_s": rate,
        "server_cpu_ms_per_1k_deliveries": cpu,
        "lost": 0,
        "duplicated": 0,
        "foreign": 0,
        "latency_ms": {"p99": p99},
        "latency_after_response_ms": {"p99": 1.0},
    }
    out: dict = {"phases": {"fixed": dict(phase), "burst": dict(phase)}}
    if kib is not None:
        out["memory"] = {"kib_per_client": kib}
    return out


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


def test_burst_rate_and_cpu_are_judged_against_raw_websockets() -> None:
    rows = verdicts({"openbot": _system(7_000, 200.0), "websockets": _system(10_000, 100.0)})
    assert _row(rows, "delivered/s vs websockets")[3] == "PASS"  # 0.70x: at the limit
    assert _row(rows, "server CPU/1k deliv. vs websockets")[3] == "PASS"  # 2.00x
    rows = verdicts({"openbot": _system(6_900, 201.0), "websockets": _system(10_000, 100.0)})
    assert _row(rows, "delivered/s vs websockets")[3] == "MISS"
    assert _row(rows, "server CPU/1k deliv. vs websockets")[3] == "MISS"


def _named(rows: list, start: str) -> tuple:
    (row,) = [r for r in rows if r[0].startswith(start)]
    return row


def test_the_latency_target_depends_on_the_clients_and_memory_is_judged_at_10k() -> None:
    at_1k = verdicts({"openbot": _system(1, 1.0, p99=10.5, kib=19.0)}, 1000)
    assert _named(at_1k, "p99 publish-to-receive")[1:] == ("<= 10 ms", "10.5 ms", "MISS")
    assert _named(at_1k, "gateway memory")[3] == "(info)"
    at_10k = verdicts({"openbot": _system(1, 1.0, p99=49.0, kib=20.5)}, 10_000)
    assert _named(at_10k, "p99 publish-to-receive")[3] == "PASS"
    assert _named(at_10k, "gateway memory")[2:] == ("20.5 KiB", "MISS")
    at_10k = verdicts({"openbot": _system(1, 1.0, p99=49.0, kib=20.0)}, 10_000)
    assert _named(at_10k, "gateway memory")[3] == "PASS"


def test_the_clients_cost_is_given_per_1000_deliveries_with_their_wakeups() -> None:
    phase = {"delivered": 40_000, "cpu_s": {"clients": 1.2}, "client_wakeups": 2_000}
    assert client_cost(phase) == {"cpu_ms": 30.0, "wakeups": 50.0}
    assert client_cost({"delivered": 40_000, "cpu_s": {"clients": 1.2}}) is None  # not counted
    assert client_cost(phase | {"delivered": 0}) is None
