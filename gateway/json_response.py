"""JSON answers and bounded request bodies, shared by every route module."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from engine.casing import to_wire
from engine.errors import TooLarge
from gateway import wire

_enc = msgspec.json.Encoder()


def json(obj: Any, status: int = 200) -> Response:
    """A JSON answer, its keys in camelCase (issue 14: one casing on the wire)."""
    return Response(_enc.encode(to_wire(obj)), status_code=status, media_type="application/json")


async def read_body(request: Request) -> bytes:
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
    return b"".join(chunks)
