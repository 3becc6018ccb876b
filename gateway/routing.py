"""Route matching that skips the routes a path cannot match.

Starlette's router tries every route's regex in turn until one matches: under a load of
Remember calls (its route was the 31st of 59) that scan was 5-7% of the gateway's thread. A
route's regex begins with its path's literal prefix (the text before its first `{`), so a
route whose prefix the path does not start with cannot match; only the others are tried, in
the same order and with the same `matches`, so the route chosen (or the partial match that
answers 405) is the one Starlette would choose. A request no route matches goes to Starlette's
own code (the trailing-slash redirect, the 404).

Comparing the path with every prefix was itself most of the work (60 prefixes for the last
route): the routes a path may match are listed once per key, the path up to its third `/` (its
first two segments). A route whose prefix the path starts with has a prefix that is either a
start of the path's key or starts with that key (a longer prefix runs on past the key's end,
which is a `/` or the path's end), so the list for each key of a route's prefix holds every
route a path of that key can match; a path of any other key is compared with every prefix.

A route that does not take the request's method can at most match in part (405), which counts
only when no route matches in full: such routes are matched only then, in order, so a request
tries the routes that take its method first (a Remember's POST, listed after two GET routes
its path may match, is matched once).

The route a request's method and path led to is kept at hand (`CHOSEN` of them, paths up to
`CHOSEN_PATH` characters): the same method and path lead to the same route whatever else the
request holds, as long as every route matches by its path and method alone (no `Host` route),
so the next such request only has that route's `matches` run, for its path parameters.

`Endpoint` is a `Route` whose endpoint is called without Starlette's per-request wrapper (a
function and a tracker of sent messages, made for each request, that answer the endpoint's
errors with the app's handlers): the endpoint's errors go up to the app's `RouterErrors`
(gateway/errors.py), which answers them with the same handlers."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Mount, Route, Router, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send


def literal_prefix(route: BaseRoute) -> str:
    """What every path the route matches starts with ("" when that is not known)."""
    if type(route) in (Route, Endpoint, WebSocketRoute, Mount):
        return route.path.split("{", 1)[0]  # type: ignore[attr-defined]
    return ""


def path_key(path: str) -> str:
    """The path up to its third `/` (the whole path when it has fewer)."""
    first = path.find("/", 1)
    if first < 0:
        return path
    second = path.find("/", first + 1)
    return path if second < 0 else path[:second]


Table = tuple[tuple[str, BaseRoute], ...]
CHOSEN = 4096  # (method, path) → route pairs kept at hand; emptied when full
CHOSEN_PATH = 256  # longer paths are not kept (an id is at most 128 characters)


class PrefixRouter(Router):
    _table: Table = ()
    _by_key: dict[str, Table] = {}  # (replaced by `_prefixed`, never changed in place)
    _built_for: tuple[int, int] = (0, -1)
    _chosen: dict[tuple[str, str], BaseRoute] | None = None  # None: nothing is kept

    def _prefixed(self, path: str) -> Table:
        """The routes, with their prefixes, that a request for `path` may match, in order."""
        if self._built_for != (id(self.routes), len(self.routes)):
            self._build()
        return self._by_key.get(path_key(path), self._table)

    def _build(self) -> None:
        # Built again if the route list was replaced or grew (routes added after start-up).
        table = tuple((literal_prefix(r), r) for r in self.routes)
        keys = {path_key(prefix) for prefix, _ in table}
        self._by_key = {
            k: tuple((p, r) for p, r in table if k.startswith(p) or p.startswith(k)) for k in keys
        }
        self._table = table
        by_path = (Route, Endpoint, WebSocketRoute, Mount)  # match by path (and method) alone
        self._chosen = {} if all(type(r) in by_path for _, r in table) else None
        self._built_for = (id(self.routes), len(self.routes))

    def select(self, scope: Scope) -> tuple[BaseRoute, Scope, Match] | None:
        """The route Starlette's scan would hand the request to (a full match, else the first
        partial one), its child scope and the kind of match; None if no route matches."""
        path = get_route_path(scope)
        method = scope.get("method") if scope["type"] == "http" else None
        chosen = self._chosen
        if method is not None and chosen is not None:
            if self._built_for == (id(self.routes), len(self.routes)):
                route = chosen.get((method, path))
                if route is not None:
                    match, child_scope = route.matches(scope)
                    if match is Match.FULL:  # (always: the same path and method)
                        return route, child_scope, match
            else:
                self._build()
        other: list[BaseRoute] = []  # routes that do not take the method: a 405 at most
        for prefix, route in self._prefixed(path):
            if not path.startswith(prefix):
                continue
            methods = route.methods if method is not None and isinstance(route, Route) else None
            if methods and method not in methods:
                other.append(route)
                continue
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                self._keep(method, path, route)
                return route, child_scope, match
            if match is Match.PARTIAL:
                other.append(route)  # (not a Route's: one taking the method matches or not)
        for route in other:
            match, child_scope = route.matches(scope)
            if match is not Match.NONE:
                return route, child_scope, match
        return None

    @property
    def kept(self) -> int | None:
        """How many (method, path) pairs have their route kept at hand; None where none are
        kept (beside a `Host` route)."""
        if self._built_for != (id(self.routes), len(self.routes)):
            self._build()
        return None if self._chosen is None else len(self._chosen)

    def _keep(self, method: str | None, path: str, route: BaseRoute) -> None:
        chosen = self._chosen
        if method is None or chosen is None or len(path) > CHOSEN_PATH:
            return
        if len(chosen) >= CHOSEN:
            chosen.clear()
        chosen[(method, path)] = route

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await super().app(scope, receive, send)
            return
        chosen = self.select(scope)
        if chosen is None:  # (a redirect or a 404: Starlette's own scan finds no route either)
            await super().app(scope, receive, send)
            return
        route, child_scope, match = chosen
        scope.setdefault("router", self)
        scope["route"] = route
        scope.update(child_scope)
        if match is Match.FULL and type(route) is Endpoint:
            # `route.app`'s own steps, one coroutine less on every request (`handle` would
            # check the method again).
            response = await route.endpoint(Request(scope, receive, send))
            await response(scope, receive, send)
        else:
            await route.handle(scope, receive, send)


Handler = Callable[[Request], Awaitable[Response]]


class Endpoint(Route):
    """A `Route` to an async endpoint (`Request` → `Response`), answered without Starlette's
    per-request wrapper: its errors go up to the app's `RouterErrors`."""

    def __init__(self, path: str, endpoint: Handler, **kwargs: Any) -> None:
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError(f"{path}: an Endpoint's endpoint is an async function")
        super().__init__(path, endpoint, **kwargs)
        self.app = _answer(endpoint)


def _answer(endpoint: Handler) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        response = await endpoint(Request(scope, receive, send))
        await response(scope, receive, send)

    return app
