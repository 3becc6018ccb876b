"""The gateway's router (gateway/routing.py) hands every request to the route Starlette's own
linear scan would: the same full match, the same partial match (405), none where it finds none
(redirect or 404), for every route and method of the app, websockets, and odd paths. No Ray."""

from __future__ import annotations

import re
import time
import types

import pytest
from starlette.routing import BaseRoute, Match, Route, Router, WebSocketRoute
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.routing import PrefixRouter

METHODS = ("GET", "HEAD", "POST", "PATCH", "DELETE", "PUT", "OPTIONS")


def _app():
    engine = types.SimpleNamespace(shard_ports=[], node_hub=None)
    return create_app(engine, "admin-token")  # type: ignore[arg-type]


def _starlette_choice(routes: list[BaseRoute], scope: dict):
    """Starlette's Router.app scan (starlette/routing.py), without handling the request."""
    partial = None
    for route in routes:
        match, child = route.matches(scope)
        if match is Match.FULL:
            return route, child, match
        if match is Match.PARTIAL and partial is None:
            partial = (route, child, match)
    return partial


def _scope(kind: str, path: str, method: str = "GET", root_path: str = "") -> dict:
    scope = {"type": kind, "path": path, "root_path": root_path, "headers": [], "query_string": b""}
    if kind == "http":
        scope["method"] = method
    return scope


def _paths(app) -> list[str]:
    """Each route's path with its parameters filled in, and near misses of it."""
    out = []
    for route in app.routes:
        path = re.sub(r"\{[^}]+\}", "x1", getattr(route, "path", "/"))
        out += [path, path + "/", path + "\n", path + "/more", path.rstrip("/") + "x", path[:-1]]
    out += ["/", "", "/console/app.js", "/console", "/nope", "/v1", "/v1/", "/v1/bots/b/memory"]
    return out


def test_every_route_and_method_resolves_as_starlettes_scan_does():
    app = _app()
    router = app.router
    assert isinstance(router, PrefixRouter)
    routes = list(app.routes)
    assert len(routes) == 65  # a route added or lost shows here (update with the table)
    checked = 0
    for path in _paths(app):
        scopes = [_scope("http", path, m) for m in METHODS] + [_scope("websocket", path)]
        scopes += [_scope("http", "/base" + path, "GET", root_path="/base")]
        for scope in scopes:
            want = _starlette_choice(routes, dict(scope))
            got = router.select(dict(scope))
            assert (got is None) == (want is None), (scope, want, got)
            if want is not None:
                assert got[0] is want[0] and got[1] == want[1] and got[2] is want[2], scope
            checked += 1
    assert checked > 3000
    # And each declared route and method reaches that very route.
    for route in routes:
        path = re.sub(r"\{[^}]+\}", "x1", route.path)  # type: ignore[attr-defined]
        if isinstance(route, WebSocketRoute):
            assert router.select(_scope("websocket", path))[0] is route
        elif isinstance(route, Route):
            for method in route.methods or ():
                chosen = router.select(_scope("http", path, method))
                assert chosen is not None and chosen[2] is Match.FULL
                # The first route declaring this path and method (routes share paths by method).
                assert chosen[0] is next(
                    r
                    for r in routes
                    if isinstance(r, Route) and r.path == route.path and method in (r.methods or ())
                )


def test_the_app_answers_through_it_as_before():
    """The same answers (status, body, location) as the app with Starlette's own router."""
    fast, plain = _app(), _app()
    plain.router = Router(list(plain.routes), lifespan=plain.router.lifespan_context)
    token = {"authorization": "Bearer admin-token"}
    asks = [
        ("GET", "/healthz", {}),
        ("PUT", "/healthz", {}),  # a partial match: 405
        ("GET", "/no/such/path", token),  # 404
        ("GET", "/healthz/", token),  # the trailing-slash redirect
        ("GET", "/v1/capabilities", token),
        ("DELETE", "/v1/capabilities", token),
        ("GET", "/console/nothing-here.js", {}),
    ]
    answers = []
    for app in (fast, plain):
        with TestClient(app, follow_redirects=False) as client:
            answers.append(
                [
                    (r.status_code, r.content, r.headers.get("location"))
                    for r in (client.request(m, p, headers=h) for m, p, h in asks)
                ]
            )
    assert answers[0] == answers[1]
    assert [a[0] for a in answers[0]][:4] == [200, 405, 404, 307]


@pytest.mark.parametrize("path", ["/v1/bots/b1/memory"])
def test_it_tries_fewer_routes_for_remember(path: str):
    """Remember's route is the 32nd: its request is matched with a few regexes, not 32."""
    app = _app()
    scope = _scope("http", path, "POST")
    plain = Router(list(app.routes))
    rounds = 2000

    def timed(choose) -> float:
        start = time.perf_counter()
        for _ in range(rounds):
            choose(dict(scope))
        return time.perf_counter() - start

    fast = min(timed(app.router.select) for _ in range(3))
    slow = min(timed(lambda s: _starlette_choice(plain.routes, s)) for _ in range(3))
    assert app.router.select(dict(scope))[0] is _starlette_choice(plain.routes, dict(scope))[0]
    assert fast < slow, (fast, slow)


def test_a_kept_choice_is_the_scans_on_every_later_request():
    """Every request again, now through the routes kept at hand: the same choices, and the
    same child scopes (each request's own path parameters)."""
    app = _app()
    router = app.router
    routes = list(app.routes)
    scopes = [_scope("http", p, m) for p in _paths(app) for m in METHODS]
    scopes += [_scope("http", "/v1/bots/other/memory", "POST")]
    for _ in range(2):
        for scope in scopes:
            want = _starlette_choice(routes, dict(scope))
            got = router.select(dict(scope))
            assert (got is None) == (want is None), scope
            if want is not None:
                assert got[0] is want[0] and got[1] == want[1] and got[2] is want[2], scope
    assert router.kept  # (the second pass went through them)
    given = dict(_scope("http", "/v1/bots/b9/memory", "POST"), path_params={"outer": "1"})
    assert router.select(given)[1]["path_params"] == {"outer": "1", "bot": "b9"}


async def _one(request):
    return None


async def _two(request):
    return None


def test_kept_choices_go_with_the_routes_they_were_made_for():
    first, second = Route("/a/{x}", _one), Route("/a/{x}", _two)
    router = PrefixRouter([first])
    scope = _scope("http", "/a/1")
    assert router.select(dict(scope))[0] is first
    assert router.select(dict(scope))[0] is first
    router.routes = [second, first]  # replaced
    assert router.select(dict(scope))[0] is second
    router.routes.insert(0, Route("/a/{x}", _one, methods=["POST"]))  # grew
    assert router.select(dict(scope))[0] is second
    assert router.select(dict(_scope("http", "/a/1", "POST")))[0] is router.routes[0]


def test_nothing_is_kept_beside_a_host_route_or_for_a_long_path():
    from starlette.routing import Host

    router = PrefixRouter([Host("example.com", Router([Route("/a", _one)])), Route("/a", _two)])
    assert router.select(dict(_scope("http", "/a")))[0] is router.routes[1]
    assert router.kept is None  # a Host route matches by a header: choices depend on it
    plain = PrefixRouter([Route("/a/{x}", _one)])
    assert plain.select(dict(_scope("http", "/a/" + "x" * 300))) is not None
    assert plain.kept == 0
    assert plain.select(dict(_scope("http", "/a/b"))) is not None
    assert plain.kept == 1


def test_the_kept_choices_start_again_when_full(monkeypatch):
    monkeypatch.setattr("gateway.routing.CHOSEN", 2)
    router = PrefixRouter([Route("/a/{x}", _one)])
    for n, kept in ((1, 1), (2, 2), (3, 1)):
        assert router.select(dict(_scope("http", f"/a/{n}")))[1]["path_params"] == {"x": str(n)}
        assert router.kept == kept
