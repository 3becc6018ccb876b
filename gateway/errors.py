"""Errors on the wire (docs/design.md §9): `{"error": {"code", "message"}}` with the right status.

The only place that knows HTTP status codes.
"""

from __future__ import annotations

import logging

import msgspec
from starlette.exceptions import HTTPException
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from engine.casing import camel_keys
from engine.errors import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    OpenBotError,
    RateLimited,
    TooLarge,
    Unauthenticated,
    Unavailable,
    Unprocessable,
)

log = logging.getLogger("openbot.gateway")

STATUS: dict[type[OpenBotError], int] = {
    InvalidInput: 400,
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    Unprocessable: 422,
    TooLarge: 413,
    RateLimited: 429,
    Unavailable: 503,
}

_HTTP_CODES = {404: "route_not_found", 405: "method_not_allowed"}


def status_of(error: OpenBotError) -> int:
    for cls in type(error).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


def error_response(status: int, code: str, message: str, details: dict | None = None) -> Response:
    body = msgspec.json.encode(
        {"error": {**camel_keys(details or {}), "code": code, "message": message}}
    )
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return Response(body, status_code=status, media_type="application/json", headers=headers)


async def on_openbot_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, OpenBotError)
    return error_response(status_of(exc), exc.code, exc.message, exc.details)


async def on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error_response(
        exc.status_code, _HTTP_CODES.get(exc.status_code, "http_error"), exc.detail
    )


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal", "internal error")


HANDLERS = {
    OpenBotError: on_openbot_error,
    HTTPException: on_http_exception,
    Exception: on_unexpected,
}


def unexpected(scope: Scope) -> Response:
    """An error no handler answers, logged; the 500 to answer it with, if no answer started
    (gateway/metrics.py `RequestLog` contains it there: the connection stays usable)."""
    log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
    return error_response(500, "internal", "internal error")


class RouterErrors:
    """ASGI middleware (innermost, around the router), in place of Starlette's
    `ExceptionMiddleware`: the handlers of `HANDLERS` but `Exception`'s (that one is
    `RequestLog`'s, gateway/metrics.py) answer what the router raises (an unknown route's 404,
    a method's 405) and what an `Endpoint` raises (gateway/routing.py: it has no wrapper of
    its own); a plain Starlette route's wrapper finds the same handlers in the scope.

    Unlike Starlette's, it does not follow each message sent to know whether an answer started:
    an endpoint fails before its answer starts (it returns its whole answer, sent after). An
    error after a start (a streamed answer failing) would be answered once more: the server
    refuses that second start and its error goes on to `RequestLog`, which logs it.
    Websockets keep Starlette's layer."""

    def __init__(self, app: ASGIApp, handlers: dict) -> None:
        self.app = app
        kept = {k: v for k, v in handlers.items() if k not in (500, Exception)}
        by_class = {k: v for k, v in kept.items() if not isinstance(k, int)}
        self.handlers = (by_class, {k: v for k, v in kept.items() if isinstance(k, int)})
        self.sockets = ExceptionMiddleware(app, handlers=kept)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.sockets(scope, receive, send)
            return
        scope["starlette.exception_handlers"] = self.handlers
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            handler = None
            if isinstance(exc, HTTPException):
                handler = self.handlers[1].get(exc.status_code)
            for cls in type(exc).__mro__ if handler is None else ():
                handler = self.handlers[0].get(cls)
                if handler is not None:
                    break
            if handler is None:
                raise
            response = await handler(Request(scope, receive), exc)
            await response(scope, receive, send)
            exc.__traceback__ = None  # (one instance raised on many requests piles up frames)
