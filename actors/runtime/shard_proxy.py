"""`ShardPort` over a shard actor (`RayShard`, derived from the port: actors/runtime/proxy.py),
with what a gateway does on its side of the calls it makes most: Remembers and workspace memory
creations coalesced many to a call (actors/runtime/coalesce.py), and the shard's events followed
through their replies and a long poll with one bytes reply (actors/runtime/follow.py).
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import msgspec
from msgspec import Raw

from actors.contracts import (
    EVENT_BATCH,
    FOLLOWED,
    WORKSPACE_ENTRY_VIEW,
    EventBatch,
    FollowingCall,
    WorkspaceAccess,
    WorkspaceCreateCall,
)
from actors.ports import ShardPort
from actors.runtime.coalesce import Coalescer
from actors.runtime.follow import Follower
from actors.runtime.proxy import NamedActor, remote
from engine.events import Event, ShardHead
from engine.scoped_memory import (
    WorkspaceEntryView,
    WorkspaceMemoryCreate,
)

_packer = msgspec.msgpack.Encoder()


class _Writes:
    """A gateway's coalesced writes to one shard, on one event loop (actors/runtime/coalesce.py):
    Remembers, and workspace memory creations, go many to a call while one is in flight; and
    its view of the shard's events, which their replies feed (actors/runtime/follow.py)."""

    def __init__(self, remember: Coalescer, workspace_create: Coalescer, follow: Follower) -> None:
        self.remember = remember
        self.workspace_create = workspace_create
        self.follow = follow


class RayShard(NamedActor, ShardPort):
    """`ShardPort` over the shard actor named `name`."""

    coalesce = True  # False: one call per write (benchmarks compare the two)
    # Coalesced calls of one kind in flight at once. The shard answers a call only once its
    # group's journal record is synced, and with one call in flight nothing reaches it
    # meanwhile; with two, the next call's writes are decided and queued while that sync runs
    # (actors/runtime/coalesce.py), so the shard and the gateway work at once instead of in
    # turn. But each call then carries fewer writes, and each call costs CPU on both sides
    # whatever it carries: where the CPUs are the limit, one call in flight gives more writes
    # per CPU-second. `memory_ops` compares the two in the same rounds (`two_calls`).
    write_calls = 1
    follow = True  # False: events by the pump's poll only (one more Ray call per commit)

    def __init__(self, name: str, namespace: str, handle: Any = None) -> None:
        super().__init__(name, namespace, handle)
        # Per event loop: a coalescer's futures belong to the loop it runs on.
        self._writes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Writes] = (
            weakref.WeakKeyDictionary()
        )
        # The last loop asked for, weakly, and its writes: one loop asks for them on every
        # write and a weak dictionary's look-up is a call and a new weak reference each time.
        self._last: tuple[weakref.ref[asyncio.AbstractEventLoop], _Writes] | None = None

    def writes(self) -> _Writes:
        """This loop's coalescers (their `calls` and `requests` say how well they coalesce)."""
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0]() is loop:
            return last[1]
        found = self._writes.get(loop)
        if found is None:
            found = _Writes(
                Coalescer(self._remember_many, max_calls=self.write_calls),
                Coalescer(self._workspace_create_many, max_calls=self.write_calls),
                Follower(self._poll),
            )
            self._writes[loop] = found
        self._last = (weakref.ref(loop), found)
        return found

    def handed_events(self) -> int:
        """Events that came with write replies, over every event loop's follower (figures for
        tests and benchmarks: how much the pump's polls were spared)."""
        return sum(w.follow.handed for w in list(self._writes.values()))

    async def _remember_many(self, call: bytes) -> bytes:
        return await self._followed(call, "remember_many", "remember_many_followed")

    async def _workspace_create_many(self, call: bytes) -> bytes:
        return await self._followed(
            call, "workspace_create_memory_many", "workspace_create_memory_many_followed"
        )

    async def _packed(self, method: str, call: bytes) -> bytes:
        """One of the shard's `PACKED_WRITES` (a laned proxy sends it over the lane)."""
        return await remote(getattr(self._actor(), method), call)

    async def _followed(self, call: bytes, plain: str, followed: str) -> bytes:
        """A coalesced write call; where this loop follows the shard's events, the reply brings
        the ones published since (actors/runtime/follow.py). Every call in flight follows: two
        sent with the same `seen` bring some events twice, which the follower takes once, while
        a call that went plain would leave its commit's events to one more call, the pump's
        poll."""
        follow = self.writes().follow
        seen = follow.seen if self.follow else -1
        if seen < 0:
            return await self._packed(plain, call)
        follower = follow.id
        try:
            asked = _packer.encode(FollowingCall(follower=follower, seen=seen, call=Raw(call)))
            reply = FOLLOWED.decode(await self._packed(followed, asked))
        except BaseException:
            follow.lost()  # its reply may have carried events the shard thinks we have
            raise
        follow.take_reply(follower, seen, reply.events, reply.upto)
        return reply.replies  # type: ignore[return-value]  (Raw: bytes-like for the decoder)

    async def _poll(self, since: int, limit: int, wait: float, follower: str) -> EventBatch:
        return EVENT_BATCH.decode(
            await remote(self._actor().events_packed, since, limit, wait, follower)
        )

    # --- the calls that do more than hand on (every other call: the port's, over the actor) ---

    async def events_after(
        self, seq: int, limit: int = 1000, wait: float = 0.0
    ) -> tuple[ShardHead, list[Event]]:
        # Over Ray the poll comes back as one msgpack `EventBatch` (actors/shard/packed.py):
        # Ray would pickle the list of Events on both sides of every poll. A long poll goes
        # through this loop's follower, which write replies feed too (actors/runtime/follow.py).
        if wait > 0 and self.follow:
            got = await self.writes().follow.after(seq, limit, wait)
            if got is not None:
                return got
        batch = EVENT_BATCH.decode(await remote(self._actor().events_packed, seq, limit, wait))
        return batch.head, batch.events

    async def remember_packed(self, call: bytes) -> bytes:
        if self.coalesce:
            return await self.writes().remember.call(call)
        return await remote(self._actor().remember_packed, call)

    async def workspace_create_memory(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> WorkspaceEntryView:
        return WORKSPACE_ENTRY_VIEW.decode(await self.workspace_create_memory_json(access, body))

    async def workspace_create_memory_json(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> bytes:
        # One bytes each way (actors/shard/packed.py): Ray would pickle both Structs and the reply.
        call = _packer.encode(WorkspaceCreateCall(access=access, body=body))
        if self.coalesce:
            return await self.writes().workspace_create.call(call)
        return await remote(self._actor().workspace_create_memory_packed, call)
