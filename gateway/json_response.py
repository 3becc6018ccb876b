"""JSON answers and bounded request bodies, shared by every route module.

`BodyLimits` checks every HTTP request body before routing: over `wire.MAX_BODY`
bytes → 413, JSON nested deeper than `wire.MAX_DEPTH` → 400 `too_deep`, so no route, present
or future, can hand a parser a body that makes it recurse out of the stack. The rest of an
oversized body is read and dropped (up to `DRAIN`) so that the keep-alive connection stays
usable for the client's next request.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.casing import to_wire
from engine.errors import OpenBotError, TooLarge
from gateway import wire
from gateway.errors import error_response, status_of

_enc = msgspec.json.Encoder()
DRAIN = 16 * wire.MAX_BODY  # beyond this an oversized body is not read: the connection closes


_CONTENT_TYPE = (b"content-type", b"application/json")


class JsonBytes(Response):
    """A JSON answer from bytes already encoded, with the headers Starlette's `Response` gives
    it (`content-length` where a body may go, then `content-type`), made at once: Starlette
    works them out from its arguments on every answer."""

    media_type = "application/json"

    def __init__(self, body: bytes, status_code: int = 200) -> None:
        self.status_code = status_code
        self.background = None
        self.body = body
        if status_code < 200 or status_code in (204, 304):
            self.raw_headers = [_CONTENT_TYPE]
        else:
            self.raw_headers = [(b"content-length", b"%d" % len(body)), _CONTENT_TYPE]


def json(obj: Any, status: int = 200) -> Response:
    """A JSON answer, its keys in camelCase (one casing on the wire)."""
    return JsonBytes(_enc.encode(to_wire(obj)), status)


CHECKED = "openbot.body"  # where `BodyLimits` leaves the body it read and checked


async def read_body(request: Request) -> bytes:
    """The request's body, within `wire.MAX_BODY` bytes and `wire.MAX_DEPTH` levels: as
    `BodyLimits` checked it, or read and checked here (an app without that middleware)."""
    checked = request.scope.get(CHECKED)
    if checked is not None:
        return checked
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > wire.MAX_BODY:
        raise TooLarge(f"request body over {wire.MAX_BODY} bytes", code="body_too_large")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > wire.MAX_BODY:
            raise TooLarge(f"request body over {wire.MAX_BODY} bytes", code="body_too_large")
        chunks.append(chunk)
    body = b"".join(chunks)
    wire.check_json(body)
    return body


class BodyLimits:
    """ASGI middleware: the whole body is read and checked first, then replayed to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        disconnected: Message | None = None
        while more:
            message = await receive()
            if message["type"] != "http.request":
                disconnected = message
                break
            body = message.get("body", b"")
            more = message.get("more_body", False)
            size += len(body)
            if size <= wire.MAX_BODY:
                chunks.append(body)
            elif size > DRAIN:
                break
        try:
            if size > wire.MAX_BODY:
                raise TooLarge(f"request body over {wire.MAX_BODY} bytes", code="body_too_large")
            whole = b"".join(chunks)
            wire.check_json(whole)
        except OpenBotError as e:
            await error_response(status_of(e), e.code, e.message, e.details)(scope, receive, send)
            return
        if disconnected is None:
            scope[CHECKED] = whole
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                if disconnected is not None:
                    return disconnected
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
