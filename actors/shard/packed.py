"""The event pump's poll and workspace memory writes with one bytes each way.

Ray serialises each reply on its own, pickling anything that is not a plain value: a poll's list
of Events is pickled by the shard and unpickled by the gateway on every poll, one per group
commit under load. Here it is one msgpack `EventBatch` (actors/contracts.py), which the gateway
decodes for next to nothing. (A Remember's packed call is `MemoryOps.remember_packed`.)

And the coalesced calls: a gateway sends the Remembers, and the workspace memory
creations, that its clients make of one shard while its previous such call is in flight as ONE
call (actors/runtime/coalesce.py), each request packed as it would be sent alone; each gets its
own answer or its own error back (`CallError`, actors/contracts.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from actors.contracts import (
    COALESCED,
    FOLLOWING_CALL,
    HANDED_LIMIT,
    WORKSPACE_CREATE_CALL,
    CallError,
    EventBatch,
    Followed,
    FollowingCall,
    WorkspaceAccess,
)
from actors.shard.kernel import ShardKernel
from actors.shard.memory_ops import MemoryOps
from actors.shard.remember_batch import Answer, remember_all
from actors.workspace.create_batch import create_all
from actors.workspace.service import Workspace
from engine.errors import InvalidInput
from engine.scoped_memory import WorkspaceMemoryCreate

_msgpack = msgspec.msgpack.Encoder()
_json = msgspec.json.Encoder()


class PackedCalls:
    """The shard's calls that carry one bytes each way, built by `ShardService` over its kernel,
    its memory API and its workspace."""

    def __init__(self, *, kernel: ShardKernel, memory: MemoryOps, workspace: Workspace) -> None:
        self.kernel = kernel
        self.memory = memory
        self.workspace = workspace

    async def workspace_create_memory_json(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> bytes:
        """A workspace memory creation answered with its HTTP body: the gateway sends on the
        JSON the shard made, as it does a Remember's, instead of decoding a view and encoding
        it again."""
        return _json.encode(await self.workspace.create_memory(access, body))

    async def events_packed(
        self, seq: int, limit: int = 1000, wait: float = 0.0, follower: str = ""
    ) -> bytes:
        """`events_after` as one msgpack `EventBatch`: what the gateways' event pumps poll. A
        `follower`'s poll (actors/runtime/follow.py) is not answered for events it was handed
        with its writes' replies (`remember_many_followed`; storage/event_log.py `follow_page`:
        its batch then says the `since` it answers from)."""
        self.kernel.ensure_started()  # as events_after: a poll starts recovery after a restart
        log = self.kernel.events
        if not follower:
            events, head = await log.page(seq, limit=limit, wait=wait)
            return _msgpack.encode(EventBatch(head=head, events=events))
        since, events, head = await log.follow_page(seq, follower, limit=limit, wait=wait)
        return _msgpack.encode(
            EventBatch(head=head, events=events, since=since if since != seq else None)
        )

    async def _hand_over(self, replies: bytes, follower: str, seen: int) -> bytes:
        """`replies` with the published events after `seen`, handed to `follower`."""
        log = self.kernel.events
        events, head = await log.page(seen, limit=HANDED_LIMIT)
        upto = events[-1].seq if len(events) >= HANDED_LIMIT else head.head
        log.handed(follower, upto)
        return _msgpack.encode(
            Followed(
                replies=msgspec.Raw(replies), events=EventBatch(head=head, events=events), upto=upto
            )
        )

    async def workspace_create_memory_packed(self, call: bytes) -> bytes:
        """`workspace_create_memory` from one msgpack `WorkspaceCreateCall`, answered with the
        record as JSON: the HTTP body as it is (as `remember_packed`; RayShard decodes it for a
        typed caller)."""
        try:
            c = WORKSPACE_CREATE_CALL.decode(call)
        except msgspec.DecodeError as e:
            raise InvalidInput(f"bad workspace write: {e}", code="invalid_body") from e
        return await self.workspace_create_memory_json(c.access, c.body)

    async def remember_many(self, call: bytes) -> bytes:
        """Coalesced Remembers: each request a packed `RememberCall`, answered as `remember_packed`
        would answer it alone; a pool's share is one commit (actors/shard/remember_batch.py)."""
        return _replies(await remember_all(self.memory, _requests(call)))

    async def remember_many_followed(self, call: bytes) -> bytes:
        """`remember_many` from a `FollowingCall`, its reply `Followed` by the events after its
        `seen` for its `follower`."""
        c = _following(call)
        replies = _replies(await remember_all(self.memory, _requests(c.call)))
        return await self._hand_over(replies, c.follower, c.seen)

    async def workspace_create_memory_many(self, call: bytes) -> bytes:
        """Coalesced workspace memory creations: each request a packed `WorkspaceCreateCall`,
        answered as `workspace_create_memory_packed` would answer it alone; a pool's share is one
        commit (actors/workspace/create_batch.py)."""
        return _replies(await create_all(self.workspace, _requests(call)))

    async def workspace_create_memory_many_followed(self, call: bytes) -> bytes:
        """`workspace_create_memory_many` from a `FollowingCall`, its reply `Followed` by the events
        after its `seen`."""
        c = _following(call)
        replies = _replies(await create_all(self.workspace, _requests(c.call)))
        return await self._hand_over(replies, c.follower, c.seen)


def _following(call: bytes) -> FollowingCall:
    try:
        return FOLLOWING_CALL.decode(call)
    except msgspec.DecodeError as e:
        raise InvalidInput(f"not a followed call: {e}", code="invalid_body") from e


def _requests(call: bytes | msgspec.Raw) -> list[bytes]:
    try:
        return COALESCED.decode(call)
    except msgspec.DecodeError as e:
        raise InvalidInput(f"not a coalesced call: {e}", code="invalid_body") from e


def _replies(answers: Sequence[Answer]) -> bytes:
    return _msgpack.encode([a if isinstance(a, bytes) else CallError.of(a) for a in answers])
