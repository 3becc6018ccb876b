"""Every route needs a token except the explicit public allowlist (`/healthz`, and
what the console adds to `gateway.auth.PUBLIC_PATHS`/`PUBLIC_PREFIXES`). The routes are taken
from the running app itself, so a route added later is covered without editing this test."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from starlette.routing import Route, WebSocketRoute
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.auth import PUBLIC_PATHS, PUBLIC_PREFIXES, is_public


def _routes(server) -> list:
    return list(server.server.config.app.routes)


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x1", path)


def _http_calls(server) -> list[tuple[str, str]]:
    calls = []
    for route in _routes(server):
        if isinstance(route, Route):
            for method in sorted(route.methods or ()):
                if method != "HEAD":
                    calls.append((method, _concrete(route.path)))
    return calls


def test_the_allowlist_is_small_and_keeps_the_api_out():
    assert "/healthz" in PUBLIC_PATHS and len(PUBLIC_PATHS) + len(PUBLIC_PREFIXES) <= 6
    for public in (*PUBLIC_PATHS, *PUBLIC_PREFIXES):
        assert not public.startswith(("/v1", "/api", "/openapi")), public
    for path in ("/v1/capabilities", "/openapi.json", "/v1/admin/orgs", "/healthz/x", "/v1/"):
        assert not is_public(path), path


def test_every_route_but_the_allowlist_answers_401_without_a_valid_token(server):
    calls = _http_calls(server)
    assert len(calls) >= 30  # the app's routes were found
    body = b'{"name": "x"}'
    seen_public = []
    for headers in ({}, {"Authorization": "Bearer not-a-token"}, {"Authorization": "Basic eA=="}):
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
            for method, path in calls:
                r = c.request(method, path, content=body if method != "GET" else None)
                if is_public(path):
                    seen_public.append(path)
                    assert r.status_code == 200, (method, path, r.status_code)
                    continue
                assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
                assert r.json()["error"]["code"] in ("missing_token", "bad_token")
                assert r.headers["www-authenticate"] == "Bearer"
            # Paths no route serves are not a way around it either.
            for path in ("/v1/nope", "/api/app/workspace/nope", "/", "/v1/capabilities/"):
                if not is_public(path):
                    assert c.get(path).status_code == 401, path
    assert "/healthz" in seen_public


def test_capabilities_need_a_token_and_list_nodes_to_a_user(world):
    with httpx.Client(base_url=world.server.url) as stranger:
        r = stranger.get("/v1/capabilities")
        assert r.status_code == 401 and "nodes" not in r.text
    with world.client("alice") as alice:
        r = alice.get("/v1/capabilities")
        assert r.status_code == 200 and "nodes" in r.json()


def test_every_websocket_route_refuses_without_a_token(server):
    ws_paths = [r.path for r in _routes(server) if isinstance(r, WebSocketRoute)]
    assert {"/v1/events", "/v1/nodes"} <= set(ws_paths)
    base = server.url.replace("http://", "ws://")

    async def close_code(path: str, headers: dict, first: str | None) -> int | None:
        async with connect(base + path, additional_headers=headers) as ws:
            try:
                if first is not None:
                    await ws.send(first)
                while True:
                    frame = await asyncio.wait_for(ws.recv(), 15)
                    assert "welcome" not in str(frame) and "hello" not in str(frame), frame
            except ConnectionClosed as e:
                return e.rcvd.code if e.rcvd else None

    async def scenario():
        for path in ws_paths:
            bad = {"Authorization": "Bearer not-a-token"}
            assert await close_code(path, bad, None) == 4401, path
            hello = json.dumps({"type": "auth", "token": "not-a-token"})
            node_hello = json.dumps({"type": "hello", "node": "intruder"})
            first = node_hello if path == "/v1/nodes" else hello
            assert await close_code(path, {}, first) in (4401, 4400), path

    asyncio.run(scenario())


@pytest.mark.parametrize("path", ["/openapi.json", "/v1/capabilities"])
def test_any_valid_token_reads_the_discovery_routes(admin, path):
    assert admin.get(path).status_code == 200
