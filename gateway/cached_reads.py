"""`GET /v1/bots/{bot}/memory` answered from this gateway's caches, below the request log and
the error containment but above the rest of the stack (token check, body limits, Starlette's
exception layer, the router, the request and response objects).

A read of a page that is cached and current is most of the route's traffic, and for it that
stack is most of the gateway's work. The shortcut asks `MemoryApi.cached_page`, which makes the
route's own checks against the same caches; anything it cannot answer (a miss, a refused
caller, a query, a request body, HEAD, a path below a root path) goes down the whole stack
unchanged, which answers it (errors included) as it always did. The answer is the route's:
the same status, headers and bytes, logged and counted under the route's template.
"""

from __future__ import annotations

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.auth import bearer
from gateway.memory_routes import MemoryApi

PREFIX, SUFFIX = "/v1/bots/", "/memory"
JSON = (b"content-type", b"application/json")


class CachedReads:
    """ASGI middleware; `route` is the full route's, named in the access log and metrics."""

    def __init__(self, app: ASGIApp, memory: MemoryApi, route: BaseRoute) -> None:
        self.app = app
        self.memory = memory
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not scope["query_string"]:
            body = self.page(scope)
            if body is not None:
                scope["route"] = self.route
                headers = [(b"content-length", str(len(body)).encode()), JSON]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    def page(self, scope: Scope) -> bytes | None:
        path: str = scope["path"]
        if not (path.startswith(PREFIX) and path.endswith(SUFFIX)) or scope.get("root_path"):
            return None
        bot = path[len(PREFIX) : -len(SUFFIX)]
        if not bot or "/" in bot:  # (the route's `{bot}` is one non-empty segment)
            return None
        auth: bytes | None = None
        org: bytes | None = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value if auth is None else auth
            elif name == b"openbot-org":
                org = value if org is None else org
            elif name in (b"content-length", b"transfer-encoding"):
                return None  # a body: the stack reads and checks it
        token = bearer(auth.decode("latin-1")) if auth is not None else None
        if token is None:
            return None
        return self.memory.cached_page(token, bot, org.decode("latin-1") if org else None)
