"""`GET /v1/events`: the live, resumable event stream (DESIGN §8, contract).

Per gateway process one `Hub` long-polls every shard for published events and hands them to the
connected clients it may tell about them. A client that connects with a cursor first replays
what it missed from the shards' durable logs, then goes live; the switch happens without an
await between "caught up" and "live", so nothing is skipped or sent twice. Each client has a
bounded queue: one that falls behind is closed and resumes by cursor.

Close codes: 4400 bad frame, unknown message type or bad cursor · 4401 missing or bad token ·
4408 no auth message in time · 4429 too slow (resume with your last cursor) · 1009 frame too
large · 1011 server error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from actors.runtime.engine import Engine, call
from engine.casing import to_wire
from engine.errors import InvalidInput, OpenBotError, TooLarge, Unauthenticated
from engine.events import (
    Event,
    Listener,
    MemoryChanged,
    Position,
    ShardHead,
    admits,
    decode_cursor,
    encode_cursor,
    needs_reset,
)
from gateway.auth import Auth, bearer_token
from gateway.metrics import EVENTS_DELIVERED, EVENTS_DROPPED, WS_CLIENTS
from gateway.wire import check_json

log = logging.getLogger("openbot.events")

MAX_CLIENT_FRAME = 64 * 1024
AUTH_TIMEOUT = 10.0
QUEUE_LIMIT = 2048
POLL_WAIT = 10.0
LISTENER_REFRESH = 30.0


class Frame(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    type: str
    cursor: str
    at: int
    data: dict | None = None


class ClientMessage(msgspec.Struct, frozen=True, kw_only=True):
    type: str
    token: str | None = None


_enc = msgspec.json.Encoder()
_client_dec = msgspec.json.Decoder(ClientMessage)


class Closed(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _now() -> int:
    return time.time_ns() // 1_000_000


def _data(event: Event) -> dict:
    data = to_wire(event.data)
    data.pop("type", None)
    return data


class Subscriber:
    """One connected client: its positions per shard, its audience view and its queue."""

    def __init__(self, listener: Listener, positions: list[Position]) -> None:
        self.listener = listener
        self.positions = positions
        self.live = [False] * len(positions)
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE_LIMIT)
        self.overflowed = asyncio.Event()

    def cursor(self) -> str:
        return encode_cursor(self.positions)

    def offer(self, shard: int, event: Event, heads: list[ShardHead | None] | None = None) -> None:
        """Queue `event` if the client may hear of it. `heads` (the hub's dispatched positions)
        bring the cursor's other shards up to date: everything there up to the head was already
        queued for this client, so its cursor may say so — it would otherwise lag behind on
        shards it rarely hears from, and fall out of the kept window."""
        pos = self.positions[shard]
        if event.seq <= pos.seq:
            return
        self.positions[shard] = Position(pos.epoch, event.seq)
        if not admits(event.audience, self.listener):
            return
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
        frame = Frame(
            type=event.data.__struct_config__.tag,
            cursor=self.cursor(),
            at=event.at,
            data=_data(event),
        )
        self.push(_enc.encode(frame))

    def push(self, raw: bytes) -> None:
        try:
            self.queue.put_nowait(raw)
        except asyncio.QueueFull:
            EVENTS_DROPPED.inc()
            self.overflowed.set()


class Hub:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.heads: list[ShardHead | None] = [None] * len(engine.shards)
        self.subscribers: set[Subscriber] = set()
        # Who may hear of what, so that an event is offered to its audience, not to everyone.
        self._by_user: dict[str, set[Subscriber]] = {}
        self._by_channel: dict[str, set[Subscriber]] = {}
        self._by_bot: dict[str, set[Subscriber]] = {}
        self._pumps: list[asyncio.Task[None]] = []
        self._ready: asyncio.Future[None] | None = None
        self._pump_ok = [False] * len(engine.shards)
        self.pool_changed: dict[str, int] = {}  # pool → seq of its last memory.changed

    def fresh(self, shard: int, epoch: str, pool: str, fill: int) -> bool:
        """Whether a page that reflects `pool` up to event `fill` is still current, as far as
        this hub has seen (the read cache's test)."""
        head = self.heads[shard]
        return (
            self._pump_ok[shard]
            and head is not None
            and head.epoch == epoch
            and head.head >= fill
            and self.pool_changed.get(pool, 0) <= fill
        )

    async def start(self) -> None:
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            try:
                heads = [await call(s.event_head) for s in self.engine.shards]
            except BaseException as e:
                self._ready.set_exception(e)
                self._ready.exception()
                self._ready = None
                raise
            self.heads = list(heads)
            # The heads were just read: this hub is current until a poll says otherwise.
            self._pump_ok = [True] * len(heads)
            self._pumps = [asyncio.create_task(self._pump(k)) for k in range(len(heads))]
            self._ready.set_result(None)
        await self._ready

    async def stop(self) -> None:
        for task in self._pumps:
            task.cancel()
        for task in self._pumps:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _pump(self, k: int) -> None:
        shard = self.engine.shards[k]
        delay = 0.05
        while True:
            head = self.heads[k]
            assert head is not None
            try:
                new_head, events = await call(shard.events_after, head.head, 1000, POLL_WAIT)
            except Exception:  # whatever Ray raises: the pump must live on, and say it lags
                self._pump_ok[k] = False
                log.warning("event pump for shard %d failed; retrying", k, exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.05
            self._pump_ok[k] = True
            if new_head.epoch != head.epoch:
                # The shard's data were replaced: every client must refetch.
                self.heads[k] = new_head
                for sub in list(self.subscribers):
                    sub.overflowed.set()
                continue
            heads = self.heads
            for event in events:
                if isinstance(event.data, MemoryChanged):
                    self.pool_changed[event.data.pool] = event.seq
                for sub in self._audience(event):
                    if sub.live[k]:
                        sub.offer(k, event, heads)
            last = events[-1].seq if events else head.head
            self.heads[k] = ShardHead(epoch=new_head.epoch, oldest=new_head.oldest, head=last)

    def _audience(self, event: Event) -> set[Subscriber]:
        a = event.audience
        out: set[Subscriber] = set()
        for user in a.users:
            out |= self._by_user.get(user, set())
        for channel in a.channels:
            out |= self._by_channel.get(channel, set())
        if a.bot is not None:
            out |= self._by_bot.get(a.bot, set())
        return out

    async def subscribe(self, listener: Listener, cursor: str | None) -> tuple[Subscriber, bool]:
        """A subscriber positioned at `cursor` (or at the present); True if it had to be reset.

        Uses the heads this hub already dispatched (no actor call per connection), except for a
        cursor ahead of them (it came from a faster gateway): then the shards are asked."""
        await self.start()
        heads = [h for h in self.heads if h is not None]
        positions = decode_cursor(cursor) if cursor is not None else None
        if (
            positions is not None
            and len(positions) == len(heads)
            and any(p.seq > h.head for p, h in zip(positions, heads, strict=True))
        ):
            heads = [await call(s.event_head) for s in self.engine.shards]
        here = [Position(h.epoch, h.head) for h in heads]
        reset = False
        if positions is None:
            positions = here
        elif needs_reset(positions, heads):
            positions, reset = here, True
        sub = Subscriber(listener, list(positions))
        self.subscribers.add(sub)
        self._index(sub)
        return sub, reset

    def _index(self, sub: Subscriber) -> None:
        listener = sub.listener
        self._by_user.setdefault(listener.user, set()).add(sub)
        for channel in listener.channels:
            self._by_channel.setdefault(channel, set()).add(sub)
        for bot in listener.bots:
            self._by_bot.setdefault(bot, set()).add(sub)

    def relisten(self, sub: Subscriber, listener: Listener) -> None:
        """The client's grants or channels changed: index it under the new ones."""
        self._unindex(sub)
        sub.listener = listener
        self._index(sub)

    async def catch_up(self, sub: Subscriber) -> None:
        """Replay from the shards until each is level with this hub's pump, then go live."""
        for k, shard in enumerate(self.engine.shards):
            while True:
                pumped = self.heads[k]
                assert pumped is not None
                if sub.positions[k].seq >= pumped.head:
                    sub.live[k] = True  # no await since the check: no gap, no duplicate
                    break
                head, events = await call(shard.events_after, sub.positions[k].seq, 1000, 0.0)
                if sub.positions[k].seq < head.oldest - 1:
                    # Pruned while this client caught up: it must come back and be reset.
                    raise Closed(4409, "cursor fell out of the kept window: reconnect")
                if not events:
                    # Nothing is published between here and the pump: level with it.
                    pos = sub.positions[k]
                    sub.positions[k] = Position(pos.epoch, max(pos.seq, pumped.head))
                    continue
                for event in events:
                    sub.offer(k, event)

    def unsubscribe(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        self._unindex(sub)

    def _unindex(self, sub: Subscriber) -> None:
        keys = [
            (self._by_user, [sub.listener.user]),
            (self._by_channel, sub.listener.channels),
            (self._by_bot, sub.listener.bots),
        ]
        for index, names in keys:
            for name in names:
                subs = index.get(name)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del index[name]


@dataclass
class EventsEndpoint:
    hub: Hub
    auth: Auth
    refresh_every: float = LISTENER_REFRESH

    async def handle(self, websocket: WebSocket) -> None:
        await websocket.accept()
        sub: Subscriber | None = None
        WS_CLIENTS.labels("events").inc()
        try:
            principal, token = await self._authenticate(websocket)
            listener = _listener(principal)
            try:
                sub, reset = await self.hub.subscribe(
                    listener, websocket.query_params.get("cursor")
                )
            except InvalidInput as e:
                raise Closed(4400, e.message) from e
            kind = "reset" if reset else "hello"
            # Text frames, like every event: a browser's `JSON.parse(ev.data)` needs a string.
            await websocket.send_text(
                _enc.encode(Frame(type=kind, cursor=sub.cursor(), at=_now())).decode()
            )
            await self._run(websocket, sub, token)
        except Closed as c:
            await _close(websocket, c.code, c.reason)
        except WebSocketDisconnect:
            pass
        except OpenBotError as e:
            await _close(websocket, 1011, e.message[:120])
        finally:
            WS_CLIENTS.labels("events").dec()
            if sub is not None:
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

    async def _refresh(self, sub: Subscriber, token: str) -> None:
        """Re-read who the client is now and then: grants and channels added since it connected
        apply from then on; a token that stopped working ends the stream."""
        while True:
            await asyncio.sleep(self.refresh_every)
            try:
                principal = await self.auth.principal_for(token)
            except Unauthenticated as e:
                raise Closed(4401, e.message) from e
            listener = _listener(principal)
            if listener != sub.listener:
                self.hub.relisten(sub, listener)

    async def _run(self, websocket: WebSocket, sub: Subscriber, token: str) -> None:
        catch_up = asyncio.create_task(self.hub.catch_up(sub))
        reader = asyncio.create_task(_read_client(websocket))
        overflow = asyncio.create_task(sub.overflowed.wait())
        sender = asyncio.create_task(_send(websocket, sub))
        refresh = asyncio.create_task(self._refresh(sub, token))
        tasks = {catch_up, reader, overflow, sender, refresh}
        try:
            while True:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                if overflow in done:
                    raise Closed(4429, "too slow: reconnect with your last cursor")
                for task in done & {reader, sender, refresh}:
                    task.result()  # raises Closed or WebSocketDisconnect
                if catch_up in done:
                    catch_up.result()
                    tasks.discard(catch_up)
        finally:
            for task in tasks:
                task.cancel()


def _listener(principal) -> Listener:
    user = principal.user
    return Listener(
        user=user.id, orgs=frozenset(user.orgs), channels=principal.channels, bots=principal.bots
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


async def _send(websocket: WebSocket, sub: Subscriber) -> None:
    while True:
        raw = await sub.queue.get()
        await websocket.send_text(raw.decode())
        EVENTS_DELIVERED.inc()


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(Exception):
            await websocket.close(code=code, reason=reason)
