"""One connected client of the event stream: who it is, where it stands per shard, and its way
out — text frames written to its websocket without a task per frame.

A send on an ASGI websocket is a coroutine, but one that finishes without ever suspending while
the socket's buffer has room (uvicorn's protocols wait only when the transport paused writing).
So the fan-out runs each send inline, to its end, in the loop that dispatches the event: no
queue, no task and no wake-up per client and frame. Only a send that does suspend (a client that
reads slowly) hands its rest to a task, and the frames that follow wait behind it in a bounded
queue, in order; a client that falls a whole queue behind is told to go and resume by cursor
(close 4429), so one slow client never holds up the others. Where the server offers it
(gateway/socket_frames.py), a frame goes to the socket as the bytes built once per event, past the
ASGI send; a socket that cannot take them at once gets the ASGI send as before.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import msgspec

from engine.casing import camel, to_wire
from engine.events import Event, Listener, Position, ShardHead, admits, encode_cursor
from gateway.metrics import EVENTS_DELIVERED, EVENTS_DROPPED
from gateway.socket_frames import FrameWriter, text_frame

QUEUE_LIMIT = 2048
TOO_SLOW = 4429

Send = Callable[[dict[str, Any]], Awaitable[None]]


class Frame(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    type: str
    cursor: str
    at: int
    data: dict | None = None


_enc = msgspec.json.Encoder()


class Closed(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _Encoded(msgspec.Struct, frozen=True, kw_only=True):
    """A `Frame` whose data is JSON already."""

    type: str
    cursor: str
    at: int
    data: msgspec.Raw


# Payload type → (its tag, the length of its JSON's `{"type":"<tag>"` start), or None when its
# own JSON is not its frame's data (see `_plan`). Decided once per type, not per key per event.
_PLANS: dict[type, tuple[str, int] | None] = {}
_SCALARS = (
    msgspec.inspect.StrType,
    msgspec.inspect.IntType,
    msgspec.inspect.FloatType,
    msgspec.inspect.BoolType,
    msgspec.inspect.NoneType,
    msgspec.inspect.LiteralType,
)


def _scalar(t: msgspec.inspect.Type) -> bool:
    while isinstance(t, msgspec.inspect.Metadata):
        t = t.type
    if isinstance(t, msgspec.inspect.UnionType):
        return all(_scalar(option) for option in t.types)
    return isinstance(t, _SCALARS)


def _plan(kind: type) -> tuple[str, int] | None:
    """For a payload Struct whose fields all hold scalars under names camelCase leaves as they
    are, `to_wire` only drops its tag: its own JSON after the tag is the frame's data, key for
    key and in the same order. Anything else (a nested value, a snake_case name, an array-like
    Struct) takes the general way."""
    info = msgspec.inspect.type_info(kind)
    if (
        not isinstance(info, msgspec.inspect.StructType)
        or info.array_like
        or info.tag_field != "type"
        or not isinstance(info.tag, str)
    ):
        return None
    for f in info.fields:
        if camel(f.encode_name) != f.encode_name or not _scalar(f.type):
            return None
    return info.tag, len(_enc.encode({"type": info.tag})) - 1


def event_json(event: Event, cursor: str) -> bytes:
    """The text frame of `event` as JSON bytes (keys in camelCase, the payload's tag as the
    frame type)."""
    kind = type(event.data)
    plan = _PLANS.get(kind, False)
    if plan is False:
        plan = _PLANS[kind] = _plan(kind)
    if plan is None:
        data = to_wire(event.data)
        data.pop("type", None)
        frame = Frame(type=event.data.__struct_config__.tag, cursor=cursor, at=event.at, data=data)
        return _enc.encode(frame)
    tag, start = plan
    own = _enc.encode(event.data)  # `{"type":"<tag>"` then `,"field":…` or nothing, then `}`
    body = b"{" + own[start + 1 :] if len(own) > start + 1 else b"{}"
    return _enc.encode(_Encoded(type=tag, cursor=cursor, at=event.at, data=msgspec.Raw(body)))


def event_text(event: Event, cursor: str) -> str:
    """`event_json` as text."""
    return event_json(event, cursor).decode()


class Subscriber:
    """One connected client: who it is, where it stands per shard, and its outlet."""

    __slots__ = ("in_step", "listener", "live", "outlet", "positions")

    def __init__(self, listener: Listener, positions: list[Position], outlet: Outlet) -> None:
        self.listener = listener
        self.positions = positions
        self.live = [False] * len(positions)
        self.outlet = outlet
        # In step with the hub: gets the shared frames; `positions` are then no longer kept.
        self.in_step = False

    def cursor(self) -> str:
        return encode_cursor(self.positions)

    def offer(self, shard: int, event: Event, heads: list[ShardHead | None] | None = None) -> bool:
        """Send `event` if the client may hear of it (a frame of its own). `heads` (the hub's
        dispatched positions) bring the cursor's other shards up to date: everything there up
        to the head was already sent to this client, so its cursor may say so — it would
        otherwise lag behind on shards it rarely hears from, and fall out of the kept window.
        True if the frame was written at once."""
        pos = self.positions[shard]
        if event.seq <= pos.seq:
            return False
        self.positions[shard] = Position(pos.epoch, event.seq)
        if not admits(event.audience, self.listener):
            return False
        if heads is not None:
            for j, head in enumerate(heads):
                mine = self.positions[j]
                if (
                    j != shard
                    and self.live[j]
                    and head is not None
                    and head.epoch == mine.epoch
                    and head.head > mine.seq
                ):
                    self.positions[j] = Position(mine.epoch, head.head)
        return self.outlet.deliver(event_text(event, self.cursor()))


class Outlet:
    """Frames for one websocket, in order; `over` once it can take no more (the client fell
    `limit` frames behind: `code` 4429; or a send failed: the connection is gone), and then
    `on_end` is called (the connection's handler is woken without a task of its own waiting).

    Kept small: one of these lives per connected client, so its queue and its `ended` event
    exist only once something needs them."""

    __slots__ = (
        "_drainer",
        "_ended",
        "_limit",
        "_on_end",
        "_send",
        "_waiting",
        "_writer",
        "code",
        "over",
    )

    def __init__(
        self, send: Send, limit: int | None = None, writer: FrameWriter | None = None
    ) -> None:
        self._send = send
        self._writer = writer
        self._limit = QUEUE_LIMIT if limit is None else limit
        self._waiting: collections.deque[str] | None = None  # behind a send that waits
        self._drainer: asyncio.Task[None] | None = None
        self._ended: asyncio.Event | None = None
        self._on_end: Callable[[], None] | None = None
        self.code: int | None = None
        self.over = False

    @property
    def ended(self) -> asyncio.Event:
        """Set once the outlet is over (for callers that wait on it rather than on `on_end`)."""
        if self._ended is None:
            self._ended = asyncio.Event()
            if self.over:
                self._ended.set()
        return self._ended

    def on_end(self, callback: Callable[[], None] | None) -> None:
        """Call `callback` (once) when the outlet is over; None: call nothing."""
        self._on_end = callback

    def deliver(self, text: str, frame: bytes | None = None) -> bool:
        """Send `text` now if the socket takes it, else queue it behind the send that waits.
        `frame`: `text` as a websocket frame, if the caller built it (once for many outlets).
        True if it was written at once (the caller counts those; queued ones count when sent)."""
        if self.over:
            return False
        if self._drainer is not None:
            waiting = self._waiting
            if waiting is None:
                waiting = self._waiting = collections.deque()
            if len(waiting) >= self._limit:
                EVENTS_DROPPED.inc()
                self.end(TOO_SLOW)
                return False
            waiting.append(text)
            return False
        if self._writer is not None:
            written = self._writer.write(text_frame(text) if frame is None else frame)
            if written:
                return True
            if written is None:  # closing or gone: as an ASGI send that fails
                self.end(None)
                return False
            # The socket is full: the ASGI send below waits for room, in a task.
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

    def deliver_all(self, frames: list[tuple[str, bytes]]) -> int:
        """Several (text, frame) pairs in order, in one write when the socket takes them all at
        once; how many were written at once."""
        writer = self._writer
        if len(frames) > 1 and writer is not None and self._drainer is None:
            if self.over:
                return 0
            written = writer.write(b"".join(frame for _, frame in frames))
            if written is None:
                self.end(None)
                return 0
            if written:
                return len(frames)
        return sum(self.deliver(text, frame) for text, frame in frames)

    def end(self, code: int | None) -> None:
        if not self.over:
            self.code = code
            self.over = True
            self._waiting = None
            if self._ended is not None:
                self._ended.set()
            callback, self._on_end = self._on_end, None
            if callback is not None:
                callback()

    def close(self) -> None:
        """Stop writing (the connection is being torn down); `on_end` is not called."""
        self._on_end = None
        self.end(self.code)
        if self._drainer is not None:
            self._drainer.cancel()

    @property
    def backlog(self) -> int:
        return len(self._waiting or ()) + (self._drainer is not None)

    async def _drain(self, coro: Coroutine[Any, Any, None], waits_on: Any) -> None:
        try:
            await _finish(coro, waits_on)
            EVENTS_DELIVERED.inc()
            while self._waiting and not self.over:
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
