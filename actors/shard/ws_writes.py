"""A shard's workspace memory creation, as a typed view or as its HTTP body (issue 11), and
the deletion of what a bot learned from a purged chat.

Mixed into `ShardService` (actors/shard/service.py, which is full): the gateway sends a
creation's JSON body on as the shard made it, as it does a Remember's, instead of decoding a
view and encoding it again.
"""

from __future__ import annotations

import msgspec

from actors.contracts import WsAccess
from actors.workspace.service import Workspace
from engine.scoped_memory import WsEntryView, WsMemoryCreate

_json = msgspec.json.Encoder()


class WsWrites:
    workspace: Workspace  # built by ShardService

    async def ws_create_memory(self, access: WsAccess, body: WsMemoryCreate) -> WsEntryView:
        return await self.workspace.create_memory(access, body)

    async def ws_create_memory_json(self, access: WsAccess, body: WsMemoryCreate) -> bytes:
        return _json.encode(await self.workspace.create_memory(access, body))

    async def ws_purge_learned(self, bot: str, chat: str) -> int:
        """Delete the user and project facts of the pools here that bot `bot` learned from
        chat `chat` (a purge of `chat:<id>`, API-5); their count."""
        return await self.workspace.records.purge_learned(bot, chat)
