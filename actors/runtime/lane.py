"""A direct lane to a shard from the processes of its node: a bot's step asked by a sibling
shard, a gateway's turn starts and event polls.

A collaboration hop asks the shard that holds the peer's memory for the peer's step, and in a
chain whose bots live on both shards every other hop is such a call. Over Ray an actor-to-actor
call goes through both processes' core-worker threads, and its round trip costs many times
the peer's step itself, more so under load; a Unix socket between the same two event loops
costs a small fraction of that (docs/benchmarks.md, "Design measurements").

So a shard listens on a socket of its own (`LaneServer`, in a directory only its user may
enter, like Ray's own sockets, named by the shard's pid: a killed shard's is removed by the
next shard that opens a lane, `sweep`) and its sibling shards send it their `run_step` calls there
(`LanedRayShard`), one msgpack frame each way. A gateway on the same node does the same with the
two calls every person's turn and every event it hands out wait for: `start_turn` and the event
pump's long poll (then a chain's end reaches the websocket without a Ray hop either). The
address is asked for once over Ray and only a process on the same node uses it; every other
call, and any call for which no lane can be opened, goes over Ray as before. The answer is the
same either way, or the engine's error as the class it was raised as. A lane that breaks while
a call is under way fails that call with `Unavailable` (as a Ray call to a dead actor does: it
may have run), and the next call asks for the address again (a restarted shard listens
somewhere else). One connection per event loop: its futures belong to that loop.

Trust: the folder is made only under a temp dir others cannot swap it out of (owned by this
user or root, and not writable by others unless sticky): Ray's (which Ray leaves 0777), else
the system's; with neither, the shard opens no lane, with one warning. Each end checks the
other's uid (`SO_PEERCRED`) and drops a connection from or to another user: the shard before
reading a call, the caller before sending one (its calls then go over Ray).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import os
import shutil
import struct
import tempfile
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec

from actors.contracts import (
    EVENT_BATCH,
    CallError,
    EventBatch,
    LaneAddress,
    Mirrored,
    PackedCall,
    PollCall,
    StepCall,
    StepInput,
    StepOutcome,
    TurnCall,
    TurnResult,
    TurnStart,
)
from actors.runtime.lane_folder import (
    PATH_MAX,
    PREFIX,
    PeerUid,
    lane_root,
    peer_uid,
    sweep,
)
from actors.runtime.lock_guard import assert_no_pool_lock
from actors.runtime.proxy import remote
from actors.runtime.shard_proxy import RayShard
from engine.chat_records import Turn
from engine.errors import OpenBotError, Unavailable
from storage.stats import STATS

log = logging.getLogger("openbot.lane")
_HEAD = struct.Struct("<I")  # each frame: its length, then one msgpack message
MAX_FRAME = 64 << 20
# No lane could be opened (mostly a shard Ray is restarting): Ray until then. Short, so that a
# restarted shard has its callers back on the lane about a second after it answers again; each
# try costs one failed actor call.
RETRY_S = 1.0
CLOSED_RETRY_S = 60.0  # the shard has no lane (closed, or it could open none): asked again then
LOST = "the engine is restarting; try again"
# OPENBOT_SHARD_LANE=0: every step over Ray (to compare, or if a host forbids Unix sockets).
ENABLED = os.environ.get("OPENBOT_SHARD_LANE", "1") != "0"


class _Ask(msgspec.Struct, frozen=True, array_like=True):
    id: int  # one of the calls:
    step: StepCall | None = None
    poll: PollCall | None = None
    turn: TurnCall | None = None
    packed: PackedCall | None = None


class _Answer(msgspec.Struct, frozen=True, array_like=True):
    id: int  # one of the answers, or the error:
    outcome: StepOutcome | None = None
    events: bytes | None = None  # a packed EventBatch
    turn: Turn | None = None
    result: TurnResult | None = None
    error: CallError | None = None
    replies: bytes | None = None  # a packed write call's replies


class LaneHost(Protocol):
    """What a shard answers on its lane (actors/runtime/hosting.py)."""

    async def lane_step(self, call: StepCall) -> StepOutcome: ...

    async def lane_poll(self, call: PollCall) -> bytes: ...

    async def lane_turn(self, call: TurnCall) -> Turn | TurnResult: ...

    async def lane_packed(self, call: PackedCall) -> bytes: ...


_encode = msgspec.msgpack.Encoder().encode
_asks = msgspec.msgpack.Decoder(_Ask)
_answers = msgspec.msgpack.Decoder(_Answer)


def _frame(message: Any) -> bytes:
    body = _encode(message)
    return _HEAD.pack(len(body)) + body


async def _read(reader: asyncio.StreamReader) -> bytes:
    (size,) = _HEAD.unpack(await reader.readexactly(_HEAD.size))
    if size > MAX_FRAME:
        raise ConnectionError(f"a lane frame of {size} bytes")
    return await reader.readexactly(size)


class LaneServer:
    """A shard's end: every call is run as its own task (as Ray runs an async actor's calls),
    in a fresh context, and answered when it ends, in whatever order they end."""

    def __init__(self, node: str, host: LaneHost, *, peer: PeerUid = peer_uid) -> None:
        self.node = node
        self._host = host
        self._peer = peer  # a test may stand in for another user
        self._refused = 0
        self._server: asyncio.AbstractServer | None = None
        self._dir: str | None = None
        self._address: LaneAddress | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._closed = False

    async def open(self) -> LaneAddress | None:
        """The socket's address, opened on first use; None (every call over Ray) once closed,
        or where no socket could be opened (a path over the AF_UNIX limit, a host without
        Unix sockets): said once, never retried (a folder left by each try would pile up)."""
        if self._address is None and not self._closed:
            base, unsafe = lane_root()
            if base is None:
                return self._give_up(unsafe)
            sweep(base)
            if (
                len(os.fsencode(os.path.join(base, f"{PREFIX}{os.getpid()}-xxxxxxxx", "s")))
                > PATH_MAX
            ):
                return self._give_up(f"the socket's path under {base!r} is too long")
            folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=base)  # 0700
            path = os.path.join(folder, "s")
            try:
                self._server = await asyncio.start_unix_server(self._serve, path)
                os.chmod(path, 0o600)
            except (OSError, ValueError) as e:
                if self._server is not None:
                    self._server.close()
                    self._server = None
                shutil.rmtree(folder, ignore_errors=True)
                return self._give_up(repr(e))
            self._dir = folder
            self._address = LaneAddress(node=self.node, path=path)
        return self._address

    def _give_up(self, why: str) -> None:
        log.warning("no lane for this shard (%s): its calls go over Ray", why)
        self._closed = True
        return None

    def close(self) -> None:
        """Stop listening and drop the open connections (their callers' steps fail as a dead
        actor's would); steps running here end on their own. For good: a later `open` answers
        None (Ray), so no folder is made that nothing would remove."""
        self._closed = True
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._address = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        uid = self._peer(writer.get_extra_info("socket"))
        if uid != os.getuid():
            self._refused += 1
            level = logging.WARNING if self._refused == 1 else logging.DEBUG
            log.log(level, "the lane refused a connection from uid %s (%d so far)", uid,
                    self._refused)  # fmt: skip
            writer.close()
            return
        self._writers.add(writer)
        try:
            while True:
                ask = _asks.decode(await _read(reader))
                task = asyncio.get_running_loop().create_task(
                    self._answer(ask, writer), context=contextvars.Context()
                )
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, msgspec.DecodeError):
            pass  # the caller went away (or spoke nonsense): its open steps still end
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, ask: _Ask, writer: asyncio.StreamWriter) -> None:
        """Every call is answered, whatever it raised (a caller waits for its answer): the
        answer is encoded inside the guard, and one over MAX_FRAME fails that call only."""
        stop: BaseException | None = None
        try:
            frame = _frame(await self._run(ask))
            if len(frame) - _HEAD.size > MAX_FRAME:
                raise Unavailable(
                    f"an answer of {len(frame) - _HEAD.size} bytes, over the lane's limit "
                    f"of {MAX_FRAME}",
                    code="engine_error",
                )
        except OpenBotError as e:
            frame = _error_frame(ask.id, e)
        except Exception:
            log.exception("a call over the lane failed")
            failed = Unavailable("the engine failed to handle the request", code="engine_error")
            frame = _error_frame(ask.id, failed)
        except BaseException as e:  # cancelled (the shard stops), or the process exits
            stop = e
            frame = _error_frame(ask.id, Unavailable(LOST, code="engine_unavailable"))
        if not writer.is_closing():
            writer.write(frame)
        if stop is not None:
            raise stop

    async def _run(self, ask: _Ask) -> _Answer:
        host = self._host
        if ask.step is not None:
            return _Answer(id=ask.id, outcome=await host.lane_step(ask.step))
        if ask.poll is not None:
            return _Answer(id=ask.id, events=await host.lane_poll(ask.poll))
        if ask.turn is not None:
            turn = await host.lane_turn(ask.turn)
            if isinstance(turn, TurnResult):
                return _Answer(id=ask.id, result=turn)
            return _Answer(id=ask.id, turn=turn)
        if ask.packed is not None:
            return _Answer(id=ask.id, replies=await host.lane_packed(ask.packed))
        raise Unavailable("an empty lane call", code="engine_error")


def _error_frame(ask: int, e: OpenBotError) -> bytes:
    try:
        return _frame(_Answer(id=ask, error=CallError.of(e)))
    except (TypeError, ValueError, msgspec.EncodeError):  # details msgpack cannot carry
        bare = CallError.of(e)
        bare = CallError(
            kind=bare.kind, module=bare.module, message=str(e.message), code=str(e.code)
        )
        return _frame(_Answer(id=ask, error=bare))


class LaneClient:
    """A connection to one shard's lane, opened on first use (one event loop's)."""

    def __init__(
        self,
        address: Callable[[], Awaitable[LaneAddress | None]],
        node: str,
        *,
        peer: PeerUid = peer_uid,
    ) -> None:
        self._address = address
        self.node = node
        self._peer = peer  # a test may stand in for another user
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._waiting: dict[int, asyncio.Future[_Answer]] = {}
        self._ids = itertools.count(1)
        self._opening: asyncio.Lock | None = None
        self._retry_at = 0.0
        self.calls = 0  # calls answered over the lane (tests, benchmarks)

    async def step(self, call: StepCall) -> StepOutcome | None:
        """The step's outcome over the lane; None when there is no lane (ask over Ray)."""
        answer = await self._ask(lambda i: _Ask(id=i, step=call))
        return None if answer is None else answer.outcome

    async def poll(self, call: PollCall) -> EventBatch | None:
        answer = await self._ask(lambda i: _Ask(id=i, poll=call))
        return None if answer is None else EVENT_BATCH.decode(answer.events or b"")

    async def turn(self, call: TurnCall) -> Turn | TurnResult | None:
        answer = await self._ask(lambda i: _Ask(id=i, turn=call))
        return None if answer is None else (answer.result or answer.turn)

    async def packed(self, call: PackedCall) -> bytes | None:
        """A coalesced write call's packed replies; None when there is no lane."""
        answer = await self._ask(lambda i: _Ask(id=i, packed=call))
        return None if answer is None else (answer.replies or b"")

    async def _ask(self, make: Callable[[int], _Ask]) -> _Answer | None:
        writer = self._writer if self._writer is not None else await self._open()
        if writer is None:
            return None
        ask = make(next(self._ids))
        frame = _frame(ask)
        if len(frame) - _HEAD.size > MAX_FRAME:
            return None  # not sent, so not run: over Ray (the shard would drop the lane)
        fut: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._waiting[ask.id] = fut
        try:
            writer.write(frame)
            answer = await fut
        finally:
            self._waiting.pop(ask.id, None)
        self.calls += 1
        if answer.error is not None:
            raise answer.error.error()
        return answer

    async def _open(self) -> asyncio.StreamWriter | None:
        if time.monotonic() < self._retry_at:
            return None
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._writer is not None:
                return self._writer
            try:
                address = await self._address()
                if address is None:  # no lane there (closing, or none could open): Ray for
                    self._retry_at = time.monotonic() + CLOSED_RETRY_S  # now; a restart opens
                    return None
                if address.node != self.node:
                    self._retry_at = float("inf")  # another node: Ray only
                    return None
                reader, writer = await asyncio.open_unix_connection(address.path)
            except (OSError, OpenBotError) as e:
                log.info("no lane to a shard for now (%r): calls go over Ray", e)
                self._retry_at = time.monotonic() + RETRY_S
                return None
            uid = self._peer(writer.get_extra_info("socket"))
            if uid != os.getuid():  # not the shard: nothing is sent to it
                writer.close()
                log.warning("the lane at %s is held by uid %s: calls go over Ray", address.path,
                            uid)  # fmt: skip
                self._retry_at = time.monotonic() + CLOSED_RETRY_S
                return None
            self._writer = writer
            self._reader_task = asyncio.get_running_loop().create_task(self._read_answers(reader))
            return writer

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                answer = _answers.decode(await _read(reader))
                fut = self._waiting.get(answer.id)
                if fut is not None and not fut.done():
                    fut.set_result(answer)
        except (asyncio.IncompleteReadError, ConnectionError, msgspec.DecodeError) as e:
            log.info("the lane to a shard closed (%r)", e)
        finally:
            self._lost()

    def _lost(self) -> None:
        """The connection is gone: calls still waiting fail (they may have run), the next call
        asks for the address again."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(Unavailable(LOST, code="engine_unavailable"))

    async def close(self) -> None:
        task, self._reader_task = self._reader_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._lost()


def this_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"


class LanedRayShard(RayShard):
    """`ShardPort` of a shard: steps (from a sibling shard), turn starts, event polls and
    coalesced writes (from a gateway) over the lane where one can be opened; every other call,
    and those without a lane, over Ray."""

    def __init__(self, name: str, namespace: str, handle: Any = None) -> None:
        super().__init__(name, namespace, handle)
        self._node: str | None = None
        self._lanes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LaneClient] = (
            weakref.WeakKeyDictionary()
        )

    def lane(self) -> LaneClient | None:
        """This event loop's connection (None: lanes are turned off)."""
        if not ENABLED:
            return None
        loop = asyncio.get_running_loop()
        found = self._lanes.get(loop)
        if found is None:
            if self._node is None:
                self._node = this_node()
            found = self._lanes[loop] = LaneClient(self._lane_address, self._node)
        return found

    def lanes_open(self) -> int:
        """Lane connections this proxy opened (one per event loop that asked for one)."""
        return len(self._lanes)

    async def _lane_address(self) -> LaneAddress | None:
        return await remote(self._actor().lane_address)

    @staticmethod
    def _counted(kind: str) -> None:
        # Counted as the actor call it is (benchmarks report actor calls per delivery).
        STATS.inc("openbot_actor_calls_total", help="Actor calls this process made")
        STATS.inc(f"openbot_lane_{kind}_total", help=f"{kind.capitalize()} asked over a lane")

    async def run_step(
        self, step: StepInput, mirror: tuple[Mirrored, ...] = (), learn_upto: int = 0
    ) -> StepOutcome:
        assert_no_pool_lock("a step on another shard")
        lane = self.lane()
        call = StepCall(step=step, mirror=mirror, learn_upto=learn_upto)
        outcome = None if lane is None else await lane.step(call)
        if outcome is None:
            return await super().run_step(step, mirror, learn_upto)
        self._counted("steps")
        return outcome

    async def start_turn(self, start: TurnStart, wait: bool = False) -> Turn | TurnResult:
        lane = self.lane()
        turn = None if lane is None else await lane.turn(TurnCall(start=start, wait=wait))
        if turn is None:
            return await super().start_turn(start, wait)
        self._counted("turns")
        return turn

    async def _packed(self, method: str, call: bytes) -> bytes:
        lane = self.lane()
        replies = None if lane is None else await lane.packed(PackedCall(method=method, call=call))
        if replies is None:
            return await super()._packed(method, call)
        self._counted("writes")
        return replies

    async def _poll(self, since: int, limit: int, wait: float, follower: str) -> EventBatch:
        lane = self.lane()
        call = PollCall(since=since, limit=limit, wait=wait, follower=follower)
        batch = None if lane is None else await lane.poll(call)
        if batch is None:
            return await super()._poll(since, limit, wait, follower)
        self._counted("polls")
        return batch
