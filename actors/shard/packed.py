"""The shard's hot calls from gateways with one bytes argument and one bytes reply.

Ray serialises each argument and reply of a call on its own, pickling anything that is not a
plain value: a Remember's five arguments and its Struct reply cost the gateway ~0.3-0.4 ms of
CPU per call more than one bytes argument and a bytes reply (measured against a bare actor on
the 2-core machine), and the shard as much again; an event pump's poll pays for a pickled list
of Events. Here the call is a msgpack Struct (actors/contracts.py) and the reply is what the
caller needs next: the HTTP body for a Remember, a msgpack `EventBatch` for a poll.
"""

from __future__ import annotations

import msgspec

from actors.contracts import REMEMBER_CALL, EventBatch, pack
from actors.shard.kernel import ShardKernel
from actors.shard.seed_memory import SeedMemory
from engine.casing import to_wire

_json = msgspec.json.Encoder()


class PackedCalls:
    """Mixed into `ShardService` (which builds `kernel` and `memory`)."""

    kernel: ShardKernel
    memory: SeedMemory

    async def remember_json(self, call: bytes) -> bytes:
        """`remember` for `POST /v1/bots/{bot}/memory`: a msgpack `RememberCall` in, the new
        entry out as the HTTP body (camelCase JSON, exactly as the gateway's `json()` writes)."""
        c = REMEMBER_CALL.decode(call)
        entry = await self.memory.remember(c.pool, c.reader, c.content, c.tags, c.request_id)
        return _json.encode(to_wire(entry))

    async def events_packed(self, seq: int, limit: int = 1000, wait: float = 0.0) -> bytes:
        """`events_after` as one msgpack `EventBatch`: what the gateways' event pumps poll."""
        self.kernel.ensure_started()  # as events_after: a poll starts recovery after a restart
        events = await self.kernel.events.after(seq, limit=limit, wait=wait)
        return pack(EventBatch(head=self.kernel.events.head(), events=events))
