"""`GET /metrics` (admin token) in the Prometheus text format, and the access log.

Two kinds of figures:
- the gateway's own, in this module's registry: requests by route template and status with a
  latency histogram, websocket clients, events delivered to clients and dropped for slow ones;
- each shard's, kept in its actor's process (storage/stats.py: commit latency and batch size,
  pool lock waits, learning jobs by status, model calls by model with latency, errors and cost),
  fetched with one actor call per shard at scrape time and rendered here with a `shard` label.

`RequestLog` is plain ASGI middleware (not BaseHTTPMiddleware, which would buffer streaming
responses and websockets): one access log line per request with method, route template, status,
milliseconds and the request id (`X-Request-Id`: the client's when it sends a sane one, else a new
one; returned on every response).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import re
import secrets
import time
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString
from starlette.requests import Request
from starlette.responses import Response

from actors.ports import EnginePort
from gateway.auth import Auth
from gateway.errors import unexpected

access_log = logging.getLogger("openbot.access")
disable_created_metrics()  # the *_created series only double the output
REGISTRY = CollectorRegistry(auto_describe=True)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SCRAPE_TIMEOUT = 10.0

REQUESTS_NAME, REQUESTS_LABELS = "openbot_http_requests", ["method", "route", "status"]
REQUESTS_HELP = "HTTP requests by method, route template and status"
LATENCY_NAME, LATENCY_LABELS = "openbot_http_request_seconds", ["method", "route"]
LATENCY_HELP = "HTTP request latency by method and route template"
BUCKETS = Histogram.DEFAULT_BUCKETS  # seconds (the last is +Inf)


class HttpFigures:
    """Requests by method, route template and status, and their latency by method and route,
    rendered as a prometheus_client `Counter` and `Histogram` of these names render (the same
    samples, labels and order), but kept as plain numbers: a request's record is one dict
    look-up and three additions, where the client library's children take a lock and make
    several calls per observation on every request. Written from the event loop that serves
    (one per gateway process), so it takes no lock."""

    def __init__(self) -> None:
        # (method, route, status) → [its count, the latency row of (method, route)]
        self.requests: dict[tuple[str, str, int], list[Any]] = {}
        # (method, route) → a count per bucket (not cumulative), then the sum of the seconds
        self.latency: dict[tuple[str, str], list[float]] = {}

    def record(self, method: str, route: str, status: int, seconds: float) -> None:
        series = self.requests.get((method, route, status))
        if series is None:
            series = self._series(method, route, status)
        series[0] += 1
        row = series[1]
        row[bisect.bisect_left(BUCKETS, seconds)] += 1  # the first bound it is <= to
        row[-1] += seconds

    def _series(self, method: str, route: str, status: int) -> list[Any]:
        row = self.latency.get((method, route))
        if row is None:
            row = self.latency[(method, route)] = [0] * (len(BUCKETS) + 1)
        series = self.requests[(method, route, status)] = [0, row]
        return series

    def describe(self):
        yield CounterMetricFamily(REQUESTS_NAME, REQUESTS_HELP, labels=REQUESTS_LABELS)
        yield HistogramMetricFamily(LATENCY_NAME, LATENCY_HELP, labels=LATENCY_LABELS)

    def collect(self):
        requests = CounterMetricFamily(REQUESTS_NAME, REQUESTS_HELP, labels=REQUESTS_LABELS)
        for (method, route, status), (n, _) in list(self.requests.items()):
            requests.add_metric([method, route, str(status)], float(n))
        yield requests
        latency = HistogramMetricFamily(LATENCY_NAME, LATENCY_HELP, labels=LATENCY_LABELS)
        for labels, row in list(self.latency.items()):  # (in the order they were first seen)
            cumulative = 0.0
            buckets = []
            for bound, n in zip(BUCKETS, row, strict=False):
                cumulative += n
                buckets.append((floatToGoString(bound), cumulative))
            latency.add_metric(labels, buckets, row[-1])
        yield latency


HTTP = HttpFigures()
REGISTRY.register(HTTP)  # type: ignore[arg-type]
WS_CLIENTS = Gauge(
    "openbot_websocket_clients",
    "Connected websocket clients by endpoint",
    ["endpoint"],
    registry=REGISTRY,
)
for _endpoint in ("events", "nodes"):
    WS_CLIENTS.labels(_endpoint)  # shown as 0 before the first client
EVENTS_DELIVERED = Counter(
    "openbot_events_delivered", "Event frames sent to /v1/events clients", registry=REGISTRY
)
EVENTS_DROPPED = Counter(
    "openbot_events_dropped",
    "Event frames a slow /v1/events client's full queue could not take (it is closed, 4429)",
    registry=REGISTRY,
)

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# A request's id when the client sends none: unique, not secret (it names a request in the logs),
# so a counter after a random prefix per process instead of a read of the OS's randomness each.
_ID_PREFIX = secrets.token_hex(4)
_ids = itertools.count()


def route_of(scope: dict) -> str:
    """The route template (`/v1/bots/{bot}/memory`), never the raw path: ids would make every
    request a series of its own."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


class RequestLog:
    """The outermost layer of every HTTP request: its id, its access log line and figures, and
    an unexpected error contained (gateway/errors.py `unexpected`): it ends as a 500 answer
    when none started, and goes no further. Starlette's own last handler answers 500 too but
    then re-raises, and uvicorn, seeing the exception, drops the connection: a keep-alive
    client's next request on it would be reset. One layer for both, with one send wrapper, since
    every request pays for each layer it goes through."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = _header(scope, b"x-request-id")
        rid = given if given and _REQUEST_ID.fullmatch(given) else f"{_ID_PREFIX}{next(_ids):08x}"
        status = 0  # until the answer starts
        started = time.perf_counter()
        logged = False

        def record() -> None:
            nonlocal logged
            logged = True
            seconds = time.perf_counter() - started
            route, method, answered = route_of(scope), scope["method"], status or 500
            HTTP.record(method, route, answered, seconds)
            if access_log.isEnabledFor(logging.INFO):  # (its arguments only for a line)
                access_log.info(
                    "%s %s %d %.1fms rid=%s", method, route, answered, seconds * 1000, rid
                )

        async def send_with_id(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", rid.encode()))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                record()  # before the last bytes go: a client that has the answer sees the line
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            answer = unexpected(scope)
            if not status:
                await answer(scope, receive, send_with_id)
        finally:
            if not logged:  # failed before the answer was complete
                record()


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class _Shards:
    """A collector over the shards' snapshots of one scrape."""

    def __init__(self, snapshots: list[tuple[int, dict]]) -> None:
        self.snapshots = snapshots

    def collect(self):
        counters: dict[str, CounterMetricFamily] = {}
        histograms: dict[str, HistogramMetricFamily] = {}
        for shard, snap in self.snapshots:
            helps = snap.get("help", {})
            for name, labels, value in snap["counters"]:
                keys = ["shard", *sorted(labels)]
                family = counters.get(name) or counters.setdefault(
                    name, CounterMetricFamily(name, helps.get(name, name), labels=keys)
                )
                family.add_metric([str(shard), *(labels[k] for k in keys[1:])], value)
            for name, labels, bounds, counts, total, _count in snap["histograms"]:
                keys = ["shard", *sorted(labels)]
                family = histograms.get(name) or histograms.setdefault(
                    name, HistogramMetricFamily(name, helps.get(name, name), labels=keys)
                )
                cumulative, buckets = 0, []
                for bound, n in zip([*bounds, float("inf")], counts, strict=True):
                    cumulative += n
                    buckets.append(
                        ("+Inf" if bound == float("inf") else repr(float(bound)), cumulative)
                    )
                family.add_metric([str(shard), *(labels[k] for k in keys[1:])], buckets, total)
        yield from counters.values()
        yield from histograms.values()


class MetricsApi:
    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth

    async def metrics(self, request: Request) -> Response:
        await self.auth.admin(request)
        answers = await asyncio.wait_for(
            asyncio.gather(*(s.metrics() for s in self.engine.shard_ports), return_exceptions=True),
            SCRAPE_TIMEOUT,
        )
        snapshots = [(k, a) for k, a in enumerate(answers) if isinstance(a, dict)]
        shards = CollectorRegistry(auto_describe=False)
        shards.register(_Shards(snapshots))  # type: ignore[arg-type]
        down = len(answers) - len(snapshots)
        tail = f"# {down} shard(s) did not answer\n".encode() if down else b""
        return Response(
            generate_latest(REGISTRY) + generate_latest(shards) + tail, media_type=CONTENT_TYPE
        )
