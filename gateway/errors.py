"""Errors on the wire (DESIGN §9): `{"error": {"code", "message"}}` with the right status.

The only place that knows HTTP status codes.
"""

from __future__ import annotations

import logging

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

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
