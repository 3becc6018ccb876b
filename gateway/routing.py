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
route a path of that key can match; a path of any other key is compared with every prefix."""

from __future__ import annotations

from starlette._utils import get_route_path
from starlette.routing import BaseRoute, Match, Mount, Route, Router, WebSocketRoute
from starlette.types import Receive, Scope, Send


def literal_prefix(route: BaseRoute) -> str:
    """What every path the route matches starts with ("" when that is not known)."""
    if type(route) in (Route, WebSocketRoute, Mount):
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


class PrefixRouter(Router):
    _table: Table = ()
    _by_key: dict[str, Table] = {}  # (replaced by `_prefixed`, never changed in place)
    _built_for: tuple[int, int] = (0, -1)

    def _prefixed(self, path: str) -> Table:
        """The routes, with their prefixes, that a request for `path` may match, in order."""
        # Built again if the route list was replaced or grew (routes added after start-up).
        if self._built_for != (id(self.routes), len(self.routes)):
            table = tuple((literal_prefix(r), r) for r in self.routes)
            keys = {path_key(prefix) for prefix, _ in table}
            self._by_key = {
                k: tuple((p, r) for p, r in table if k.startswith(p) or p.startswith(k))
                for k in keys
            }
            self._table = table
            self._built_for = (id(self.routes), len(self.routes))
        return self._by_key.get(path_key(path), self._table)

    def select(self, scope: Scope) -> tuple[BaseRoute, Scope, Match] | None:
        """The route Starlette's scan would hand the request to (a full match, else the first
        partial one), its child scope and the kind of match; None if no route matches."""
        path = get_route_path(scope)
        partial = None
        for prefix, route in self._prefixed(path):
            if not path.startswith(prefix):
                continue
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                return route, child_scope, match
            if match is Match.PARTIAL and partial is None:
                partial = (route, child_scope, match)
        return partial

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await super().app(scope, receive, send)
            return
        chosen = self.select(scope)
        if chosen is None:  # (a redirect or a 404: Starlette's own scan finds no route either)
            await super().app(scope, receive, send)
            return
        route, child_scope, _ = chosen
        scope.setdefault("router", self)
        scope["route"] = route
        scope.update(child_scope)
        await route.handle(scope, receive, send)
