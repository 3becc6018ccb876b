"""A shard's workspace memory creation, as a typed view or as its HTTP body (issue 11).

Mixed into `ShardService` (actors/shard/service.py, which is full): the gateway sends a
creation's JSON body on as the shard made it, as it does a Remember's, instead of decoding a
view and encoding it again.
"""

from __future__ import annotations

import msgspec

from actors.contracts import WorkspaceAccess
from actors.workspace.service import Workspace
from engine.scoped_memory import WorkspaceEntryView, WorkspaceMemoryCreate

_json = msgspec.json.Encoder()


class WorkspaceWrites:
    workspace: Workspace  # built by ShardService

    async def workspace_create_memory(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> WorkspaceEntryView:
        return await self.workspace.create_memory(access, body)

    async def workspace_create_memory_json(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> bytes:
        return _json.encode(await self.workspace.create_memory(access, body))
