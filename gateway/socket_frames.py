"""Event frames written to a websocket's socket as ready-made bytes, once encoded for everyone.

A server's websocket frames are not masked, so an event's frame is the same bytes for every
client that gets it: the hub builds them once per event (`text_frame`) and hands each socket
those bytes. Through ASGI each client's send would go down the middleware's send wrappers,
Starlette's state checks and uvicorn's framing of the same text again: about 16 µs a frame
against 7.5 for the write itself (measured with 500 clients on loopback).

uvicorn has no ASGI extension for that, so `FramingProtocol` is its websockets-sansio protocol
offering one more, `openbot.ws.frames`: a `FrameWriter` that writes whole frames to the
transport only while the connection is open and its buffer has room; otherwise the caller uses
the ordinary ASGI send (which waits for room, or fails for a connection that is gone). Every
write goes to the transport in the loop's order, whole frames only, so frames written this way
and those uvicorn writes itself (hello, pings, close) never interleave within a frame. Under a
server without the extension the event stream simply uses ASGI sends.
"""

from __future__ import annotations

import struct
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

FRAMES = "openbot.ws.frames"
# Read once: an Enum member looked up on its class costs as much as the rest of a write's checks.
_OPEN = State.OPEN


def text_frame(text: str) -> bytes:
    """One unmasked, unfragmented text frame (RFC 6455 §5.2) carrying `text`."""
    return utf8_frame(text.encode())


def utf8_frame(data: bytes) -> bytes:
    """`text_frame` of a text already encoded as UTF-8."""
    n = len(data)
    if n < 126:
        return bytes((0x81, n)) + data
    if n < 1 << 16:
        return struct.pack("!BBH", 0x81, 126, n) + data
    return struct.pack("!BBQ", 0x81, 127, n) + data


class FrameWriter:
    """Writes whole frames to one connection's transport, when it can take them at once."""

    __slots__ = ("_p",)

    def __init__(self, protocol: FramingProtocol) -> None:
        self._p = protocol

    def write(self, frame: bytes) -> bool | None:
        """True: written. False: the socket's buffer is full (send through ASGI, which waits
        for room). None: the connection is closing or gone (nothing more reaches the client)."""
        p = self._p
        transport = p.transport
        if p.disconnected or p.close_sent or p.conn.state is not _OPEN or transport.is_closing():
            return None
        if p.frames_paused:
            return False
        transport.write(frame)
        return True

    def forget_handshake(self) -> None:
        """Drop the handshake's parsed request and response once the connection is accepted:
        uvicorn keeps both for the connection's life but reads them only until then, and they
        are a good part of what an idle connection holds. The request's headers are emptied
        too: websockets' parser keeps the request for the connection's life as well."""
        p = self._p
        if p.handshake_complete and p.request is not None:
            p.request.headers.clear()
            p.request = p.response = None


class FramingProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol offering the `openbot.ws.frames` extension."""

    # The transport asked to stop writing (uvicorn's `writable` event cleared): as a plain
    # attribute, which the writer reads for every frame without a call.
    frames_paused = False

    def pause_writing(self) -> None:
        super().pause_writing()
        self.frames_paused = True

    def resume_writing(self) -> None:
        super().resume_writing()
        self.frames_paused = False

    async def run_asgi(self) -> None:
        # Frames as they are: only with nothing negotiated to apply to them, and only while
        # uvicorn's protocol keeps the state the writer reads (tests/test_socket_frames.py).
        if not self.conn.extensions and all(hasattr(self, name) for name in _STATE):
            scope: Any = self.scope
            scope.setdefault("extensions", {})[FRAMES] = FrameWriter(self)
        await super().run_asgi()


_STATE = (
    "disconnected",
    "close_sent",
    "writable",
    "transport",
    "handshake_complete",
    "request",
    "response",
)
