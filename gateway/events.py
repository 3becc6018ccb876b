"""`GET /v1/events`: the live, resumable event stream (docs/design.md §8, contract).

Per gateway process one `Hub` (gateway/fanout.py) long-polls every shard for published events,
decides each event's audience once and writes its frame, encoded once, to every connected client
it may tell about it (gateway/subscriber.py). A client that connects with a cursor first replays
what it missed from the shards' durable logs, then goes live; the switch happens without an
await between "caught up" and "live", so nothing is skipped or sent twice. A client that reads
too slowly falls behind a bounded backlog, is closed and resumes by cursor.

Access is re-checked as it changes: when the directory's access revision moves, every open
socket's token is read again before this gateway acknowledges the change (gateway/auth.py
`on_access_change`), so by the time a revocation returns (a grant removed, a token replaced) the
socket hears nothing more of what it lost, or is closed (4403). A periodic re-read besides
covers a watch that is not answering.

Close codes (`CLOSE_CODES`, also in the OpenAPI document's `EventFrame`): 4400 bad frame,
unknown message type or bad cursor · 4401 missing or bad token · 4403 the token stopped working
while connected (replaced or revoked: connect with the new one) · 4408 no auth message in time ·
4409 cursor fell out of the kept window while catching up (reconnect) · 4429 too slow (resume
with your last cursor) · 1009 frame too large · 1011 server error (or access could not be
re-checked: reconnect).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import msgspec
from starlette._utils import get_route_path
from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from engine.errors import InvalidInput, OpenBotError, TooLarge, Unauthenticated
from engine.events import Listener
from gateway.auth import Auth, bearer_token
from gateway.errors import RouterErrors
from gateway.fanout import Hub
from gateway.metrics import WS_CLIENTS
from gateway.socket_frames import FRAMES
from gateway.subscriber import TOO_SLOW, Closed, Frame, Outlet, Subscriber
from gateway.wire import check_json

__all__ = ["EventsEndpoint", "Hub", "StreamFirst", "Subscriber"]

PATH = "/v1/events"

MAX_CLIENT_FRAME = 64 * 1024
AUTH_TIMEOUT = 10.0
LISTENER_REFRESH = 30.0
REREAD_SLICE = 1000  # sockets re-checked before the re-read lets others run
REREAD_CALLS = 16  # tokens read at once by a re-read
REVOKED = 4403  # the token stopped working while the socket was open
UNCHECKED = 1011  # access changed and could not be re-read
# Every code this endpoint closes with (documented with `EventFrame`, gateway/openapi_shapes.py).
CLOSE_CODES: dict[int, str] = {
    4400: "bad frame, unknown message type or bad cursor",
    4401: "missing or bad token",
    REVOKED: "the token stopped working while connected (replaced or revoked; closed by the time "
    "the replacement returns): connect with the new one",
    4408: "no auth message in time",
    4409: "the cursor fell out of the kept window while catching up: reconnect",
    TOO_SLOW: "too slow: resume with your last cursor",
    1009: "frame too large",
    UNCHECKED: "server error, or access changed and could not be re-checked: reconnect",
}
_REASONS = {
    TOO_SLOW: "too slow: reconnect with your last cursor",
    REVOKED: "the token was replaced or revoked: connect with a valid token",
    UNCHECKED: "access changed and could not be re-checked: reconnect",
}


class ClientMessage(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    token: str | None = None


_enc = msgspec.json.Encoder()
_client_dec = msgspec.json.Decoder(ClientMessage)


def _now() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class EventsEndpoint:
    hub: Hub
    auth: Auth
    refresh_every: float = LISTENER_REFRESH
    _open: dict[Subscriber, str] = field(default_factory=dict, init=False)  # → its token
    _changes: int = field(default=0, init=False)  # access changes this endpoint was told of
    _refresher: asyncio.Task[None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.auth.on_access_change(self._recheck)

    async def _recheck(self) -> None:
        """Access changed: read every open socket's token again (once per token) and drop what
        it may no longer hear, or close it; awaited before the change is acknowledged."""
        self._changes += 1
        await self._reread()

    def _refresh_soon(self) -> None:
        """Re-read who every client is now and then (one task for all of them, not one per
        connection): grants and channels added since a client connected apply from then on; a
        token that stopped working ends its stream (4403)."""
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_all())

    async def _refresh_all(self) -> None:
        while self._open:
            await asyncio.sleep(self.refresh_every)
            await self._reread()

    async def _reread(self) -> None:
        """Every open socket's token read again, once per token, a few tokens at a time (a
        token the cache no longer holds is a directory call, and requests wait behind those);
        each socket's listener is compared with the one its token gives now, built once per
        token (tens of thousands of sockets re-read at once must not stall the loop)."""
        by_token: dict[str, list[Subscriber]] = {}
        for sub, token in list(self._open.items()):
            by_token.setdefault(token, []).append(sub)
        tokens = list(by_token)
        done = 0
        for start in range(0, len(tokens), REREAD_CALLS):
            some = tokens[start : start + REREAD_CALLS]
            found = await asyncio.gather(
                *(self.auth.principal_for(t) for t in some), return_exceptions=True
            )
            for token, principal in zip(some, found, strict=True):
                subs = by_token[token]
                self._apply(subs, principal)
                done += len(subs)
            if done >= REREAD_SLICE:
                done = 0
                await asyncio.sleep(0)  # others run between slices; gone sockets are skipped

    def _apply(self, subs: list[Subscriber], principal: object) -> None:
        listener = None if isinstance(principal, BaseException) else _listener(principal)
        for sub in subs:
            if sub not in self._open:
                continue  # gone meanwhile
            if isinstance(principal, Unauthenticated):
                self._end(sub, REVOKED)
            elif listener is None:
                self._end(sub, UNCHECKED)
            elif listener != sub.listener:
                self.hub.relisten(sub, listener)

    def _end(self, sub: Subscriber, code: int) -> None:
        """Stop writing to `sub` now; its connection closes with `code`."""
        self._open.pop(sub, None)
        self.hub.unsubscribe(sub)
        sub.outlet.end(code)

    def _relisten(self, sub: Subscriber, principal) -> None:
        listener = _listener(principal)
        if listener != sub.listener:
            self.hub.relisten(sub, listener)

    async def handle(self, websocket: WebSocket) -> None:
        await websocket.accept()
        sub: Subscriber | None = None
        # Revocations wait for this gateway (its sockets) once its watch runs: started before
        # the token is read, so a change after that read is either waited for or re-checked.
        self.auth.watch()
        seen = self._changes
        # The server's ready-made frame writer where it offers one (gateway/socket_frames.py).
        writer = websocket.scope.get("extensions", {}).get(FRAMES)
        if writer is not None:
            writer.forget_handshake()
        outlet = Outlet(websocket.send, writer=writer)
        WS_CLIENTS.labels("events").inc()
        try:
            principal, token = await self._authenticate(websocket)
            listener = _listener(principal)
            try:
                sub, reset = await self.hub.subscribe(
                    listener, websocket.query_params.get("cursor"), outlet
                )
            except InvalidInput as e:
                raise Closed(4400, e.message) from e
            self._open[sub] = token
            headers = websocket.scope.get("headers")
            if isinstance(headers, list):
                # Read (token, cursor) and not needed again; held for the connection's life.
                headers.clear()
            while seen != self._changes:  # access changed while this client authenticated
                seen = self._changes
                try:
                    self._relisten(sub, await self.auth.principal_for(token))
                except Unauthenticated as e:
                    raise Closed(REVOKED, _REASONS[REVOKED]) from e
            kind = "reset" if reset else "hello"
            # Text frames, like every event: a browser's `JSON.parse(ev.data)` needs a string.
            await websocket.send_text(
                _enc.encode(Frame(type=kind, cursor=sub.cursor(), at=_now())).decode()
            )
            self._refresh_soon()
            await self._run(websocket, sub)
        except Closed as c:
            outlet.close()
            await _close(websocket, c.code, c.reason)
        except WebSocketDisconnect:
            pass
        except OpenBotError as e:
            outlet.close()
            await _close(websocket, 1011, e.message[:120])
        finally:
            outlet.close()
            WS_CLIENTS.labels("events").dec()
            if sub is not None:
                self._open.pop(sub, None)
                self.hub.unsubscribe(sub)

    async def _authenticate(self, websocket: WebSocket):
        try:
            if websocket.headers.get("authorization"):
                token = bearer_token(websocket)
            else:
                try:
                    msg = await asyncio.wait_for(_next_message(websocket), AUTH_TIMEOUT)
                except TimeoutError as e:
                    raise Closed(4408, 'send {"type":"auth","token":…} first') from e
                if msg.type != "auth" or not msg.token:
                    raise Closed(4401, 'the first message must be {"type":"auth","token":…}')
                token = msg.token
            principal = await self.auth.principal_for(token)
        except Unauthenticated as e:
            raise Closed(4401, e.message) from e
        if principal.user is None:
            raise Closed(4401, "events are per user; use a user token")
        return principal, token

    async def _run(self, websocket: WebSocket, sub: Subscriber) -> None:
        """Replay what the client missed, then read its messages until it goes or its outlet
        is over. Frames are written by the hub (gateway/subscriber.py); the outlet ending (a
        slow or gone client, a revocation) interrupts the read, so no task waits per
        connection besides this one."""
        outlet = sub.outlet
        async with _Interrupted(outlet):
            await self.hub.catch_up(sub)
            if not outlet.over:
                await _read_client(websocket)
        if outlet.over:
            code = outlet.code
            if code is None:
                raise WebSocketDisconnect(1006)  # a send failed: the peer is gone
            raise Closed(code, _REASONS.get(code, _REASONS[TOO_SLOW]))


class _Interrupted:
    """Within the block, the outlet ending cancels this task's wait and the block ends quietly
    (as `asyncio.timeout` does for a deadline); a cancellation from elsewhere goes through."""

    __slots__ = ("_cancelling", "_fired", "_outlet", "_task")

    def __init__(self, outlet: Outlet) -> None:
        self._outlet = outlet
        self._fired = False

    async def __aenter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._outlet.on_end(self._fire)

    def _fire(self) -> None:
        # Ended by this very task (a write failing while it replays): it looks at the outlet
        # before it waits again, and nothing is pending to cancel.
        if asyncio.current_task() is not self._task:
            self._fired = True
            self._task.cancel()

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        self._outlet.on_end(None)
        if self._fired:
            self._fired = False
            if self._task.uncancel() <= self._cancelling and kind is asyncio.CancelledError:
                return True
        return False


class StreamFirst(Starlette):
    """The gateway's Starlette app, handing the event stream's websockets straight to their
    endpoint. The middlewares let websockets through untouched, but each would stay suspended
    for the connection's whole life: a chain of frames per connected client. HTTP requests go
    down the middleware stack as in Starlette."""

    events: EventsEndpoint | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self
        events = self.events
        if events is not None and scope["type"] == "websocket" and get_route_path(scope) == PATH:
            await events.handle(WebSocket(scope, receive, send))
            return
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        await self.middleware_stack(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        """The app's middlewares around the router, without Starlette's outermost layer (its
        500 answer: `RequestLog`, among the app's own, gives it and keeps the connection)
        and with `RouterErrors` for its exception layer, straight around the router's stack."""
        # The router's own stack, as its `__call__` would await it: one coroutine less.
        app: ASGIApp = RouterErrors(self.router.middleware_stack, self.exception_handlers)
        for cls, args, kwargs in reversed(self.user_middleware):
            app = cls(app, *args, **kwargs)
        return app


def _listener(principal) -> Listener:
    user = principal.user
    return Listener(
        user=user.id,
        orgs=frozenset(user.orgs),
        channels=principal.channels,
        bots=principal.bots,
        unshared=principal.unshared,
    )


def _parse(raw: str) -> ClientMessage:
    if len(raw) > MAX_CLIENT_FRAME:
        raise Closed(1009, "frame too large")
    try:
        check_json(raw, limit=MAX_CLIENT_FRAME)
    except TooLarge as e:
        raise Closed(1009, "frame too large") from e
    except InvalidInput as e:
        raise Closed(4400, e.message) from e
    try:
        return _client_dec.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise Closed(4400, "malformed frame: expected a JSON object with a type") from e


async def _next_message(websocket: WebSocket) -> ClientMessage:
    """The client's next message, from a text frame or (tolerated) a binary one."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    raw = message.get("text")
    if raw is None:
        data = message.get("bytes") or b""
        if len(data) > MAX_CLIENT_FRAME:
            raise Closed(1009, "frame too large")
        try:
            raw = data.decode()
        except UnicodeDecodeError as e:
            raise Closed(4400, "malformed frame") from e
    return _parse(raw)


async def _read_client(websocket: WebSocket) -> None:
    while True:
        msg = await _next_message(websocket)
        if msg.type == "ping":
            continue
        raise Closed(4400, f"unknown message type {msg.type!r}")


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await websocket.close(code=code, reason=reason)
