"""The fan-out split's fit (benchmarks/fanout_split.py): CPU per event and per delivery from
two bursts of the same events at different fan-outs."""

from __future__ import annotations

from benchmarks.fanout_split import fit, per_1k


def _burst(events: int, ratio: int, per_event: dict, per_delivery: dict) -> dict:
    deliveries = events * ratio
    roles = ("gateway", "shard", "directory", "ray_system", "ref_server")
    cpu = {
        r: (per_event.get(r, 0) * events + per_delivery.get(r, 0) * deliveries) / 1e6 for r in roles
    }
    return {"events": events, "delivered": deliveries, "cpu_s": cpu}


def test_the_fit_recovers_what_a_delivery_and_an_event_cost():
    per_event = {"gateway": 200.0, "shard": 300.0, "directory": 0.1}
    per_delivery = {"gateway": 9.0}
    hi = _burst(2000, 20, per_event, per_delivery)
    lo = _burst(2000, 2, per_event, per_delivery)
    split = fit(lo, hi)
    assert set(split) == {"gateway", "shard"}  # roles with (next to) no CPU are left out
    assert split["gateway"] == {"us_per_delivery": 9.0, "us_per_event": 200.0}
    assert split["shard"] == {"us_per_delivery": 0.0, "us_per_event": 300.0}
    # at 20 deliveries per event: 200/20 + 9 and 300/20 ms per 1,000 deliveries
    assert per_1k(split, 20) == {"gateway": 19.0, "shard": 15.0}
    # a burst with a few failed POSTs has fewer events and deliveries: the same costs
    assert fit(_burst(1990, 2, per_event, per_delivery), hi) == split
