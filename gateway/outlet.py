"""One client's way out: text frames written to a websocket without a task per frame.

A send on an ASGI websocket is a coroutine, but one that finishes without ever suspending while
the socket's buffer has room (uvicorn's protocols wait only when the transport paused writing).
So the fan-out runs each send inline, to its end, in the loop that dispatches the event: no
queue, no task and no wake-up per client and frame. Only a send that does suspend (a client that
reads slowly) hands its rest to a task, and the frames that follow wait behind it in a bounded
queue, in order; a client that falls a whole queue behind is told to go and resume by cursor
(close 4429), so one slow client never holds up the others.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gateway.metrics import EVENTS_DELIVERED, EVENTS_DROPPED

QUEUE_LIMIT = 2048
TOO_SLOW = 4429

Send = Callable[[dict[str, Any]], Awaitable[None]]


class Outlet:
    """Frames for one websocket, in order; `ended` is set once it can take no more (the client
    fell `limit` frames behind: `code` 4429; or a send failed: the connection is gone)."""

    def __init__(self, send: Send, limit: int = QUEUE_LIMIT) -> None:
        self._send = send
        self._limit = limit
        self._waiting: collections.deque[str] = collections.deque()
        self._drainer: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()
        self.code: int | None = None

    def deliver(self, text: str) -> bool:
        """Send `text` now if the socket takes it, else queue it behind the send that waits.
        True if it was written at once (the caller counts those; queued ones count when sent)."""
        if self.ended.is_set():
            return False
        if self._drainer is not None:
            if len(self._waiting) >= self._limit:
                EVENTS_DROPPED.inc()
                self.end(TOO_SLOW)
                return False
            self._waiting.append(text)
            return False
        coro = self._send({"type": "websocket.send", "text": text})
        try:
            waits_on = coro.send(None)
        except StopIteration:
            return True
        except Exception:
            self.end(None)
            return False
        self._drainer = asyncio.get_running_loop().create_task(self._drain(coro, waits_on))
        return False

    def end(self, code: int | None) -> None:
        if not self.ended.is_set():
            self.code = code
            self._waiting.clear()
            self.ended.set()

    def close(self) -> None:
        """Stop writing (the connection is being torn down)."""
        self.end(self.code)
        if self._drainer is not None:
            self._drainer.cancel()

    @property
    def backlog(self) -> int:
        return len(self._waiting) + (self._drainer is not None)

    async def _drain(self, coro: Coroutine[Any, Any, None], waits_on: Any) -> None:
        try:
            await _finish(coro, waits_on)
            EVENTS_DELIVERED.inc()
            while self._waiting and not self.ended.is_set():
                await self._send({"type": "websocket.send", "text": self._waiting.popleft()})
                EVENTS_DELIVERED.inc()
        except asyncio.CancelledError:
            raise
        except Exception:
            self.end(None)
        finally:
            self._drainer = None


async def _finish(coro: Coroutine[Any, Any, None], waits_on: Any) -> None:
    """Run a coroutine that already suspended once to its end, as an asyncio Task would have:
    it yields the future it waits for (or None to just let others run), and is resumed when
    that future is done; the coroutine itself reads the future's result or exception."""
    loop = asyncio.get_running_loop()
    try:
        while True:
            if waits_on is None:
                await asyncio.sleep(0)
            else:
                done = loop.create_future()
                waits_on.add_done_callback(functools.partial(_wake, done))
                await done
            try:
                waits_on = coro.send(None)
            except StopIteration:
                return
    finally:
        # Cancelled (the connection is being closed) or failed: let the send unwind.
        with contextlib.suppress(Exception):
            coro.close()


def _wake(waiter: asyncio.Future[None], _done: object) -> None:
    if not waiter.done():
        waiter.set_result(None)
