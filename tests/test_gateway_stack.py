"""The gateway's middleware stack around its router (gateway/app.py, gateway/events.py
`StreamFirst`), without Ray: a directory that knows no user token and answers at once, real
uvicorn, real HTTP. What each layer owes every route: an unexpected error ends as the
gateway's 500 with the request's id, counted, on a connection that stays usable; the router's
404 and 405 and an endpoint's refusal in the gateway's error shape; the first `Authorization`
header is the one that counts; a body reaches the route whole and checked, and a route in an
app without the body limits still checks what it reads."""

from __future__ import annotations

import types

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from benchmarks.gateway_cpu import QuietAccessWatch
from engine.errors import Forbidden
from gateway.app import create_app
from gateway.errors import HANDLERS
from gateway.json_response import read_body
from gateway.live_server import LiveServer
from gateway.metrics import REGISTRY
from gateway.routing import Endpoint
from gateway.wire import MAX_DEPTH
from tests.conftest import ADMIN


class _Directory(QuietAccessWatch):
    """Knows no user token; its access watch answers once, then waits."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def authenticate_at(self, key: str):
        self.asked.append(key)
        return 1, None


async def _boom(request: Request) -> Response:
    await read_body(request)
    raise RuntimeError("a bug")


async def _refuse(request: Request) -> Response:
    raise Forbidden("not for you", code="not_for_you")


async def _echo(request: Request) -> Response:
    body = await read_body(request)
    return Response(str(len(body)), media_type="text/plain")


@pytest.fixture(scope="module")
def gateway():
    directory = _Directory()
    engine = types.SimpleNamespace(shard_ports=[], node_hub=None, directory_port=directory)
    app = create_app(engine, ADMIN)  # type: ignore[arg-type]
    app.router.routes.extend(
        [
            Endpoint("/test/boom", _boom, methods=["POST"]),
            Endpoint("/test/refuse", _refuse, methods=["GET"]),
            Endpoint("/test/echo", _echo, methods=["POST"]),
        ]
    )
    live = LiveServer(app)
    yield live, directory
    live.stop()


def _client(live: LiveServer, token: str = ADMIN) -> httpx.Client:
    return httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def _local_port(r: httpx.Response) -> int:
    return r.extensions["network_stream"].get_extra_info("client_addr")[1]


def _counted(route: str, status: int) -> float:
    labels = {"method": "POST", "route": route, "status": str(status)}
    return REGISTRY.get_sample_value("openbot_http_requests_total", labels) or 0.0


def test_an_unexpected_error_is_the_gateways_500_and_the_connection_stays(gateway):
    live, _ = gateway
    before = _counted("/test/boom", 500)
    with _client(live) as c:
        port = _local_port(c.get("/healthz"))
        for k in range(3):
            r = c.post("/test/boom", content=b'{"a": 1}', headers={"X-Request-Id": f"boom-{k}"})
            assert r.status_code == 500 and r.json()["error"]["code"] == "internal", r.text
            assert r.headers["x-request-id"] == f"boom-{k}"
            after = c.get("/healthz")
            assert after.status_code == 200 and _local_port(after) == port
    assert _counted("/test/boom", 500) == before + 3


def test_router_and_endpoint_refusals_in_the_gateways_error_shape(gateway):
    """The router's 404 and 405, and an endpoint's own error (its route has no wrapper of its
    own: `RouterErrors` answers it)."""
    live, _ = gateway
    with _client(live) as c:
        r = c.get("/test/nothing-here")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "route_not_found")
        r = c.delete("/test/echo")
        assert (r.status_code, r.json()["error"]["code"]) == (405, "method_not_allowed")
        r = c.get("/test/refuse")
        assert (r.status_code, r.json()["error"]["code"]) == (403, "not_for_you")


def test_the_first_authorization_header_counts(gateway):
    live, directory = gateway
    first_bad = [("Authorization", "Bearer not-a-token"), ("Authorization", f"Bearer {ADMIN}")]
    first_good = [("Authorization", f"Bearer {ADMIN}"), ("Authorization", "Bearer not-a-token")]
    with httpx.Client(base_url=live.url, timeout=10) as c:
        r = c.post("/test/echo", content=b"{}", headers=first_bad)
        assert (r.status_code, r.json()["error"]["code"]) == (401, "bad_token")
        assert directory.asked  # the bad token was looked up, not the admin's
        r = c.post("/test/echo", content=b"{}", headers=first_good)
        assert (r.status_code, r.text) == (200, "2")
        r = c.post("/test/echo", content=b"{}", headers=[("Authorization", "Basic abc")])
        assert (r.status_code, r.json()["error"]["code"]) == (401, "missing_token")


def test_a_body_in_many_chunks_reaches_the_route_whole(gateway):
    live, _ = gateway
    parts = [b'{"content": "', b"x" * 70_000, b'", "more": [1, 2, 3]}']

    def chunks():
        yield from parts

    with _client(live) as c:
        r = c.post("/test/echo", content=chunks())
        assert (r.status_code, r.text) == (200, str(sum(map(len, parts))))
        deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
        r = c.post("/test/echo", content=iter([deep[:10], deep[10:]]))
        assert (r.status_code, r.json()["error"]["code"]) == (400, "too_deep")


def test_a_route_without_the_body_limits_checks_what_it_reads():
    app = Starlette(routes=[Route("/echo", _echo, methods=["POST"])], exception_handlers=HANDLERS)
    live = LiveServer(app)
    try:
        with httpx.Client(base_url=live.url, timeout=10) as c:
            deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
            r = c.post("/echo", content=deep)
            assert (r.status_code, r.json()["error"]["code"]) == (400, "too_deep")
            r = c.post("/echo", content=b"[1]")
            assert (r.status_code, r.text) == (200, "3")
    finally:
        live.stop()


def test_an_endpoint_must_be_async():
    """`Endpoint` awaits its endpoint with no wrapper: a plain function is refused when the app
    is built, not answered with a 500 on every request."""

    def plain(request: Request) -> Response:
        return Response("no")

    with pytest.raises(TypeError, match="async"):
        Endpoint("/plain", plain, methods=["GET"])  # type: ignore[arg-type]


def test_a_json_answer_from_bytes_has_the_headers_starlette_would_give_it():
    """`JsonBytes` (gateway/json_response.py) answers as `Response(body, status,
    media_type="application/json")`: the same body and headers, in order, for every status
    (no content-length where no body may go)."""
    from gateway.json_response import JsonBytes

    for status in (100, 200, 201, 204, 304, 400, 404, 500):
        body = b'{"id":"m1"}' if status not in (204, 304) else b""
        ours = JsonBytes(body, status)
        theirs = Response(body, status, media_type="application/json")
        assert (ours.status_code, ours.body, ours.raw_headers) == (
            theirs.status_code,
            theirs.body,
            theirs.raw_headers,
        ), status
        assert ours.headers["content-type"] == "application/json" and ours.background is None


@pytest.mark.parametrize("trusted", [None, "127.0.0.1"])
def test_forwarded_headers_count_only_from_the_proxies_the_operator_names(monkeypatch, trusted):
    """A proxy's `X-Forwarded-Proto` shows in what the scheme reaches (a redirect's Location)
    only where FORWARDED_ALLOW_IPS names the proxy; otherwise the server ignores it (and pays
    nothing for it on every request)."""

    async def page(request: Request) -> Response:
        return Response("ok")

    if trusted is None:
        monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    else:
        monkeypatch.setenv("FORWARDED_ALLOW_IPS", trusted)
    live = LiveServer(Starlette(routes=[Route("/page", page)]))
    try:
        with httpx.Client(base_url=live.url, timeout=10) as c:
            r = c.get("/page/", headers={"X-Forwarded-Proto": "https"})
    finally:
        live.stop()
    assert r.status_code == 307
    scheme = "https" if trusted else "http"
    assert r.headers["location"] == f"{scheme}://127.0.0.1:{live.port}/page"
