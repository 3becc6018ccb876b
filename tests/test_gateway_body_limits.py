"""No body makes the server fail. JSON nested 1,000 deep used to answer 500 (a
RecursionError in the parser) and sometimes reset the keep-alive connection. Now every route
that takes a body (found from the running app, so new routes are covered) answers 400
`too_deep`, an oversized body 413, nothing changes, and the same connection serves the next
request. Websocket messages get the same limits (close 4400 / 1009, never a server error)."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.routing import Route
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.errors import InvalidInput, TooLarge
from gateway.wire import MAX_BODY, MAX_DEPTH, check_json
from tests.conftest import ADMIN

DEEP_ARRAY = b"[" * 1000 + b"]" * 1000
DEEP_OBJECT = b'{"a":' * 1000 + b"1" + b"}" * 1000
DEEP_INSIDE = b'{"settings": ' + b'{"a":' * 1000 + b"1" + b"}" * 1001  # deep below a field


def _body_calls(server) -> list[tuple[str, str]]:
    calls = []
    for route in server.server.config.app.routes:
        if isinstance(route, Route):
            for method in sorted((route.methods or set()) & {"POST", "PUT", "PATCH", "DELETE"}):
                calls.append((method, re.sub(r"\{[^}]+\}", "x1", route.path)))
    return calls


def _local_port(r: httpx.Response) -> int:
    return r.extensions["network_stream"].get_extra_info("client_addr")[1]


def test_every_body_route_refuses_deep_json_with_400_and_keeps_the_connection(server, world):
    calls = _body_calls(server)
    assert len(calls) >= 20
    named = {p for _, p in calls}
    for path in ("/api/app/workspace/memories", "/api/app/workspace/projects"):
        assert path in named  # the routes of the report
    for token in (ADMIN, world.tokens["alice"]):
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
            port = _local_port(c.get("/healthz"))
            for method, path in calls:
                for body in (DEEP_ARRAY, DEEP_OBJECT, DEEP_INSIDE):
                    r = c.request(method, path, content=body)
                    assert r.status_code == 400, (method, path, r.status_code, r.text[:200])
                    assert r.json()["error"]["code"] == "too_deep"
                    assert r.headers.get("connection") != "close"
                after = c.get("/healthz")
                assert after.status_code == 200
                assert _local_port(after) == port, (method, path)  # the same connection


def test_the_routes_of_the_report_refuse_deep_json_and_change_nothing(world, admin):
    with world.client("alice") as alice:
        url = f"/v1/bots/{world.bot}/memory"
        alice.post(url, json={"command": {"_tag": "Remember", "content": "kept"}})
        before = alice.get(url).json()
        targets = [
            ("POST", "/api/app/workspace/memories"),
            ("POST", "/api/app/workspace/projects"),
            ("PATCH", f"/api/app/workspace/bots/{world.bot}/rules"),
            ("POST", url),
        ]
        for method, path in targets:
            r = alice.request(method, path, content=DEEP_OBJECT)
            assert (r.status_code, r.json()["error"]["code"]) == (400, "too_deep"), path
        assert alice.get(url).json() == before
    r = admin.patch(f"/v1/admin/orgs/{world.org}", content=DEEP_INSIDE)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "too_deep")


def test_an_oversized_body_is_413_and_the_client_goes_on(world):
    with world.client("alice") as alice:
        big = json.dumps({"command": {"_tag": "Remember", "content": "x" * (MAX_BODY + 10)}})
        port = _local_port(alice.get("/healthz"))
        for _ in range(2):
            r = alice.post(f"/v1/bots/{world.bot}/memory", content=big)
            assert (r.status_code, r.json()["error"]["code"]) == (413, "body_too_large")
            after = alice.get(f"/v1/bots/{world.bot}/memory")
            assert after.status_code == 200 and after.json()["version"] == 0
            assert _local_port(after) == port  # drained: the connection was kept


def test_depth_within_the_limit_is_not_refused_for_depth(world):
    nested: object = "t"
    for _ in range(MAX_DEPTH - 4):
        nested = [nested]
    body = {"command": {"_tag": "Remember", "content": "x", "tags": [nested]}}
    with world.client("alice") as alice:
        r = alice.post(f"/v1/bots/{world.bot}/memory", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_body"  # shape, not depth


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=60,
)


@settings(max_examples=300, deadline=None)
@given(_json, st.integers(min_value=0, max_value=8))
def test_check_json_measures_depth_as_a_parser_does(value, limit):
    """Brackets inside strings (escaped quotes included) never count; real nesting does."""
    text = json.dumps(value)
    try:
        check_json(text, depth=limit)
        refused = False
    except InvalidInput as e:
        assert e.code == "too_deep"
        refused = True
    assert refused == (_depth(value) > limit), text


def test_check_json_size_and_unbalanced_input():
    with pytest.raises(TooLarge):
        check_json(b" " * 11, limit=10)
    with pytest.raises(InvalidInput):
        check_json(b"[" * (MAX_DEPTH + 1))  # truncated: a parser descends before it fails
    check_json(b"]" * 5000)  # malformed but flat: left to the parser (400 invalid_json)


def test_websocket_messages_have_the_same_limits(server, world):
    base = server.url.replace("http://", "ws://")
    deep = '{"type": "auth", "token": ' + "[" * 1000 + "]" * 1000 + "}"

    async def code_after(path: str, headers: dict, frames: list[str]) -> int | None:
        async with connect(base + path, additional_headers=headers) as ws:
            try:
                for frame in frames:
                    await ws.send(frame)
                while True:
                    await asyncio.wait_for(ws.recv(), 15)
            except ConnectionClosed as e:
                return e.rcvd.code if e.rcvd else None

    async def scenario():
        user = {"Authorization": f"Bearer {world.tokens['alice']}"}
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert await code_after("/v1/events", {}, [deep]) == 4400  # the first (auth) message
        assert await code_after("/v1/events", user, [deep]) == 4400  # a later message
        big = json.dumps({"type": "ping", "pad": "x" * 70_000})
        assert await code_after("/v1/events", user, [big]) == 1009
        hello = json.dumps({"type": "hello", "node": "limits-node"})
        assert await code_after("/v1/nodes", admin, [deep]) == 4400  # the hello
        assert await code_after("/v1/nodes", admin, [hello, deep]) == 4400  # an answer

    asyncio.run(scenario())
    with world.client("alice") as alice:  # and the server is fine
        assert alice.get(f"/v1/bots/{world.bot}/memory").status_code == 200


def test_an_unexpected_error_is_a_500_that_keeps_the_connection():
    """Starlette re-raises after its 500 and uvicorn then drops the connection (the reset of
    the report); `RequestLog` stops the error there. A tiny app with the gateway's error
    handling and a route that fails, on a real uvicorn."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from gateway.errors import HANDLERS
    from gateway.live_server import LiveServer
    from gateway.metrics import RequestLog

    async def boom(request):
        await request.body()
        raise RuntimeError("a bug")

    async def ok(request):
        return PlainTextResponse("ok")

    routes = [Route("/boom", boom, methods=["POST"]), Route("/ok", ok)]
    app = Starlette(routes=routes, exception_handlers=HANDLERS, middleware=[Middleware(RequestLog)])
    live = LiveServer(app)
    try:
        with httpx.Client(base_url=live.url, timeout=10) as c:
            port = _local_port(c.get("/ok"))
            for _ in range(3):
                r = c.post("/boom", content=b"x" * 100_000)
                assert r.status_code == 500 and r.json()["error"]["code"] == "internal"
                after = c.get("/ok")
                assert after.text == "ok" and _local_port(after) == port
    finally:
        live.stop()


def test_a_backup_into_an_impossible_directory_is_400(admin):
    for bad in ("/tmp/nul\u0000byte", "/proc/openbot-backup"):
        r = admin.post("/v1/admin/backup", json={"dir": bad})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "backup_dir"), bad
