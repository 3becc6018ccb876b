"""The event pump's poll with one bytes reply (issue 13).

Ray serialises each reply on its own, pickling anything that is not a plain value: a poll's list
of Events is pickled by the shard and unpickled by the gateway on every poll, one per group
commit under load. Here it is one msgpack `EventBatch` (actors/contracts.py), which the gateway
decodes for next to nothing. (A Remember's packed call is `SeedMemory.remember_packed`.)
"""

from __future__ import annotations

import msgspec

from actors.contracts import EventBatch
from actors.shard.kernel import ShardKernel

_msgpack = msgspec.msgpack.Encoder()


class PackedEvents:
    """Mixed into the shard as Ray hosts it (actors/runtime/hosting.py): a `ShardService`, which
    builds `kernel`."""

    kernel: ShardKernel

    async def events_packed(self, seq: int, limit: int = 1000, wait: float = 0.0) -> bytes:
        """`events_after` as one msgpack `EventBatch`: what the gateways' event pumps poll."""
        self.kernel.ensure_started()  # as events_after: a poll starts recovery after a restart
        events = await self.kernel.events.after(seq, limit=limit, wait=wait)
        return _msgpack.encode(EventBatch(head=self.kernel.events.head(), events=events))
