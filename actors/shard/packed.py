"""The event pump's poll and workspace memory writes with one bytes each way (issue 13).

Ray serialises each reply on its own, pickling anything that is not a plain value: a poll's list
of Events is pickled by the shard and unpickled by the gateway on every poll, one per group
commit under load. Here it is one msgpack `EventBatch` (actors/contracts.py), which the gateway
decodes for next to nothing. (A Remember's packed call is `SeedMemory.remember_packed`.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from actors.contracts import WS_CREATE_CALL, EventBatch, WsAccess
from actors.shard.kernel import ShardKernel
from engine.errors import InvalidInput
from engine.scoped_memory import WsEntryView, WsMemoryCreate

_msgpack = msgspec.msgpack.Encoder()


class PackedEvents:
    """Mixed into the shard as Ray hosts it (actors/runtime/hosting.py): a `ShardService`, which
    builds `kernel`."""

    kernel: ShardKernel

    if TYPE_CHECKING:  # ShardService's (declared only: a definition here would shadow it)

        async def ws_create_memory(self, access: WsAccess, body: WsMemoryCreate) -> WsEntryView: ...

    async def events_packed(self, seq: int, limit: int = 1000, wait: float = 0.0) -> bytes:
        """`events_after` as one msgpack `EventBatch`: what the gateways' event pumps poll."""
        self.kernel.ensure_started()  # as events_after: a poll starts recovery after a restart
        events = await self.kernel.events.after(seq, limit=limit, wait=wait)
        return _msgpack.encode(EventBatch(head=self.kernel.events.head(), events=events))

    async def ws_create_memory_packed(self, call: bytes) -> bytes:
        """`ws_create_memory` from one msgpack `WsCreateCall`, answered as msgpack (RayShard
        packs and unpacks both, so the port's signature stays typed)."""
        try:
            c = WS_CREATE_CALL.decode(call)
        except msgspec.DecodeError as e:
            raise InvalidInput(f"bad workspace write: {e}", code="invalid_body") from e
        return _msgpack.encode(await self.ws_create_memory(c.access, c.body))
