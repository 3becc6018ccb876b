"""Coalescing a caller's requests to one actor method: many requests, one Ray call.

A Ray call costs CPU on each side whatever it carries, as much as a Remember's own work in the
shard. A `Coalescer` (one per actor method and event loop, kept by `RayShard`)
sends the first request at once when none of its calls is in flight, so an idle caller waits
for nothing extra; requests that come while a call is in flight queue and all go in the next
call, as soon as one returns (Nagle-like, no timer). Under load a call carries as many requests
as came during the previous round trip. With `max_calls` above one, another call goes while
some are in flight once as many requests wait as the smallest of those carries: the shard
decides and queues its writes while the earlier call's group syncs, and calls keep their size.

The call is one msgpack array of the requests, each packed as it would be sent alone; the reply
says, per request and in order, its answer's bytes or its own error (`CallError`,
actors/contracts.py): one request's failure is never another's. A call that fails as a whole
(the actor restarting) fails the requests it carried, each with that error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import msgspec

from actors.contracts import REPLIES, CallError
from actors.runtime.lock_guard import assert_no_pool_lock
from engine.errors import Unavailable
from storage.stats import SIZES, STATS

_packer = msgspec.msgpack.Encoder()

Send = Callable[[bytes], Awaitable[bytes]]


class Coalescer:
    """Requests (bytes) to one coalesced actor method (`send`: one packed array in, the packed
    replies out). Bound to the event loop it is first used on."""

    def __init__(self, send: Send, *, max_requests: int = 64, max_calls: int = 1) -> None:
        self.send = send
        self.max_requests = max_requests
        self.max_calls = max_calls  # calls in flight at once
        self._queue: list[tuple[bytes, asyncio.Future[bytes]]] = []
        self._calls = 0
        self._sizes: list[int] = []  # requests carried by each call in flight
        # The loop keeps only weak references to tasks: a running call must not be collected
        # while its callers wait on it.
        self._running: set[asyncio.Task[None]] = set()
        self.calls = 0  # figures for tests and benchmarks
        self.requests = 0

    async def call(self, request: bytes) -> bytes:
        """Send `request` (alone or with others) and return its own answer, or raise its error."""
        # Checked here, in the caller's task: the call itself runs in a task of its own.
        assert_no_pool_lock("an actor call")
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._queue.append((request, fut))
        # Another call goes while others are in flight only once as many requests wait as the
        # smallest of them carries: calls keep their size (a Ray call's cost is per call), and
        # an idle caller's second request still goes at once.
        # (A call whose task has not taken its requests yet takes these too.)
        if self._calls < self.max_calls and (
            not self._calls
            or (len(self._sizes) == self._calls and len(self._queue) >= min(self._sizes))
        ):
            self._calls += 1
            task = asyncio.get_running_loop().create_task(self._run())
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return await fut

    async def _run(self) -> None:
        try:
            while self._queue:
                taken = self._queue[: self.max_requests]
                del self._queue[: len(taken)]
                taken = [(r, f) for r, f in taken if not f.done()]  # cancelled while queued
                if taken:
                    self._sizes.append(len(taken))
                    try:
                        await self._one_call(taken)
                    finally:
                        self._sizes.remove(len(taken))
        finally:
            self._calls -= 1

    async def _one_call(self, taken: list[tuple[bytes, asyncio.Future[bytes]]]) -> None:
        self.calls += 1
        self.requests += len(taken)
        STATS.observe(
            "openbot_coalesced_requests",
            len(taken),
            buckets=SIZES,
            help="Requests carried by one coalesced actor call",
        )
        try:
            packed = _packer.encode([r for r, _ in taken])
            replies = REPLIES.decode(await self.send(packed))
            if len(replies) != len(taken):
                raise Unavailable(
                    "the engine answered a coalesced call wrongly", code="engine_error"
                )
        except BaseException as e:
            # The whole call failed: each request it carried fails with it (a cancelled call,
            # at shutdown, must not leave its callers waiting forever).
            error = e if isinstance(e, Exception) else Unavailable("the call was cancelled")
            for _, fut in taken:
                if not fut.done():
                    fut.set_exception(error)
            if not isinstance(e, Exception):
                raise
            return
        for (_, fut), reply in zip(taken, replies, strict=True):
            if fut.done():
                continue  # its caller went away
            if isinstance(reply, CallError):
                fut.set_exception(reply.error())
            else:
                fut.set_result(reply)
