"""Bearer authentication and the gateway's short directory cache.

Every request names its caller with `Authorization: Bearer <token>`: the admin token, or a user
token the directory issued (stored there only as a hash). Principals and bot records are cached
for `ttl` seconds so that a request costs one actor call, not three. The cache can only be stale
in the safe direction today: the directory grows (new grants, channels) but never revokes, and
changes made through this gateway drop the affected entries at once. When revocation arrives,
replace the TTL with pushed invalidation.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from actors.runtime.engine import Engine, call
from engine.directory import Bot, Principal
from engine.errors import Forbidden, OpenBotError, Unauthenticated
from gateway.errors import error_response, status_of
from storage.directory_store import hash_token

# The only HTTP paths answered without a token (issue 12): exact paths, and path prefixes (the
# web console's static files go here). Everything else, known route or not, needs a valid
# admin or user token before any endpoint runs; endpoints then check what the caller may do.
PUBLIC_PATHS: frozenset[str] = frozenset({"/healthz", "/"})  # "/": the console's page
PUBLIC_PREFIXES: tuple[str, ...] = ("/console/",)  # the console's scripts and styles (no data)
_PRINCIPAL = "openbot.principal"  # where the middleware leaves the caller for the endpoint


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


class _TTLCache:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[str, tuple[float, Any]] = {}

    def get(self, key: str) -> Any:
        hit = self._items.get(key)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def put(self, key: str, value: Any) -> None:
        if len(self._items) > 50_000:
            self._items.clear()
        self._items[key] = (time.monotonic() + self.ttl, value)

    def drop(self, key: str | None = None) -> None:
        if key is None:
            self._items.clear()
        else:
            self._items.pop(key, None)


def bearer_token(conn: HTTPConnection) -> str:
    header = conn.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("send Authorization: Bearer <token>", code="missing_token")
    return token.strip()


class Auth:
    def __init__(self, engine: Engine, admin_token: str, ttl: float = 2.0) -> None:
        self.engine = engine
        self.admin_token = admin_token
        self._principals = _TTLCache(ttl)
        self._bots = _TTLCache(ttl)

    async def principal_for(self, token: str) -> Principal:
        if hmac.compare_digest(token.encode(), self.admin_token.encode()):
            return Principal(admin=True)
        key = hash_token(token)
        principal = self._principals.get(key)
        if principal is None:
            principal = await call(self.engine.directory.authenticate, key)
            if principal is None:
                raise Unauthenticated("unknown token", code="bad_token")
            self._principals.put(key, principal)
        return principal

    async def caller(self, conn: HTTPConnection) -> Principal:
        """The request's principal, resolved once per request."""
        principal = conn.scope.get(_PRINCIPAL)
        if principal is None:
            principal = await self.principal_for(bearer_token(conn))
            conn.scope[_PRINCIPAL] = principal
        return principal

    async def user(self, conn: HTTPConnection) -> Principal:
        principal = await self.caller(conn)
        if principal.user is None:
            raise Forbidden("this route acts for a user; use a user token", code="user_only")
        return principal

    async def admin(self, conn: HTTPConnection) -> None:
        principal = await self.caller(conn)
        if not principal.admin:
            raise Forbidden("this route needs the admin token", code="admin_only")

    async def bot(self, bot_id: str) -> Bot:
        bot = self._bots.get(bot_id)
        if bot is None:
            bot = await call(self.engine.directory.get_bot, bot_id)
            self._bots.put(bot_id, bot)
        return bot

    def directory_changed(self, bot_id: str | None = None) -> None:
        """Drop what an admin change made stale (principals carry channel memberships)."""
        self._principals.drop()
        if bot_id is not None:
            self._bots.drop(bot_id)


class TokenRequired:
    """ASGI middleware: an HTTP request outside `PUBLIC_PATHS`/`PUBLIC_PREFIXES` without a valid
    token gets 401 before routing, so a route added later cannot forget its check. Websockets
    pass: browsers send their token as the first message, and each endpoint refuses without
    one (close 4401)."""

    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_public(scope["path"]):
            try:
                await self.auth.caller(HTTPConnection(scope))
            except OpenBotError as e:  # a bad token, or the directory unavailable (503)
                response = error_response(status_of(e), e.code, e.message, e.details)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
