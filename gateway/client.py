"""A Python client for the event stream, built on `websockets`.

    async with EventClient("http://127.0.0.1:8765", token) as events:
        async for frame in events:
            ...  # frame.type, frame.cursor, frame.at, frame.data

It reconnects on its own with exponential backoff and resumes from the last cursor it saw, so
the frames it yields have no gap and no duplicate across drops. A `reset` frame means the server
could not resume (cursor too old, or the data were replaced): refetch state, then go on. Closes
that retrying cannot fix (bad token, bad frame) raise `EventStreamClosed`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from urllib.parse import quote

import msgspec
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

FINAL_CODES = {4400, 4401, 4403, 1009}


class EventFrame(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    cursor: str
    at: int
    data: dict | None = None


class EventStreamClosed(Exception):
    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"event stream closed ({code}): {reason}")
        self.code = code
        self.reason = reason


_dec = msgspec.json.Decoder(EventFrame)


class EventClient:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        cursor: str | None = None,
        max_backoff: float = 5.0,
        header_auth: bool = True,
        on_status: Callable[[str], None] | None = None,
    ) -> None:
        base = url.rstrip("/")
        self.url = base.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        self.token = token
        self.cursor = cursor
        self.max_backoff = max_backoff
        self.header_auth = header_auth
        self.reconnects = 0
        # Told "connected …" on each (re)connect and "… retrying in N s" before each retry.
        self.on_status = on_status
        self._ws: ClientConnection | None = None
        self._closed = False

    async def __aenter__(self) -> EventClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._ws is not None:
            await self._ws.close()

    async def drop(self) -> None:
        """Drop the connection as a network failure would (tests, benchmarks): the iterator
        reconnects and resumes."""
        if self._ws is not None:
            await self._ws.close(code=4000, reason="client drop")

    async def _connect(self) -> ClientConnection:
        url = f"{self.url}/v1/events"
        if self.cursor:
            url += f"?cursor={quote(self.cursor)}"
        headers = {"Authorization": f"Bearer {self.token}"} if self.header_auth else None
        ws = await connect(url, additional_headers=headers, open_timeout=10, max_size=2**22)
        if not self.header_auth:
            await ws.send(msgspec.json.encode({"type": "auth", "token": self.token}).decode())
        return ws

    def _status(self, text: str) -> None:
        if self.on_status is not None:
            self.on_status(text)

    def __aiter__(self) -> AsyncIterator[EventFrame]:
        return self._frames()

    async def _frames(self) -> AsyncIterator[EventFrame]:
        delay = 0.05
        while not self._closed:
            try:
                self._ws = await self._connect()
                self._status(f"connected to {self.url}/v1/events")
                async for raw in self._ws:
                    frame = _dec.decode(raw)
                    self.cursor = frame.cursor
                    delay = 0.05
                    if frame.type == "hello":
                        continue
                    yield frame
                # The server ended the stream cleanly: treat like a drop unless we closed.
                code = self._ws.close_code
                reason = self._ws.close_reason or ""
                if code in FINAL_CODES:
                    raise EventStreamClosed(code, reason)
                why = f"the server closed the stream ({code})"
            except ConnectionClosed as e:
                code = e.rcvd.code if e.rcvd else None
                if code in FINAL_CODES:
                    raise EventStreamClosed(code, e.rcvd.reason if e.rcvd else "") from e
                why = f"connection closed ({code})"
            except InvalidStatus as e:
                if e.response.status_code in (401, 403):
                    raise EventStreamClosed(e.response.status_code, "refused") from e
                why = f"the server answered {e.response.status_code}"
            except (OSError, InvalidHandshake, TimeoutError) as e:
                why = f"cannot connect ({type(e).__name__}: {e})"
            if self._closed:
                return
            self.reconnects += 1
            wait = delay * (0.5 + random.random())
            self._status(f"{why}; retrying in {wait:.1f} s")
            await asyncio.sleep(wait)
            delay = min(delay * 2, self.max_backoff)
