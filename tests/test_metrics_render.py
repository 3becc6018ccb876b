"""The gateway's request figures (gateway/metrics.py `HttpFigures`) render as prometheus_client's
own Counter and Histogram would for the same requests: the same text, sample for sample."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.metrics import (
    LATENCY_HELP,
    LATENCY_NAME,
    REQUESTS_HELP,
    REQUESTS_NAME,
    HttpFigures,
)


def test_request_figures_render_as_a_prometheus_counter_and_histogram():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    figures = HttpFigures()
    ours.register(figures)  # type: ignore[arg-type]
    requests = Counter(REQUESTS_NAME, REQUESTS_HELP, ["method", "route", "status"], registry=theirs)
    latency = Histogram(LATENCY_NAME, LATENCY_HELP, ["method", "route"], registry=theirs)
    pick = random.Random(7)
    # On each bucket's bound, just past it, past the last one, and anywhere between.
    times = [0.005, 0.0051, 0.1, 1.0, 10.0, 10.5, 0.0]
    for _ in range(3000):
        method = pick.choice(["GET", "POST"])
        route = pick.choice(["/v1/bots/{bot}/memory", "/healthz", "unmatched"])
        status = pick.choice([200, 201, 404, 500])
        seconds = pick.choice([*times, pick.random() * 3, pick.random() / 50])
        figures.record(method, route, status, seconds)
        requests.labels(method, route, str(status)).inc()
        latency.labels(method, route).observe(seconds)
    assert generate_latest(ours) == generate_latest(theirs)
    labels = {"method": "GET", "route": "/healthz", "status": "200"}
    assert ours.get_sample_value(f"{REQUESTS_NAME}_total", labels) == theirs.get_sample_value(
        f"{REQUESTS_NAME}_total", labels
    )
