"""What the in-process chain tests share (no Ray): a scripted model whose bot sends "start" on
to a bot named Peer, and a directory holding Ann's org, an Asker and a Peer bot, and her direct
chat with Asker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from actors.directory import DirectoryService
from actors.shard.service import ShardService
from engine.directory import Bot, Chat, Org, OrgSettings
from tests.shard_kit import Shards

PEER_SCRIPT = """
default = "Result received and merged into my work."
after_tool = "Handed on; the answer will follow."
[[rules]]
match = '^start$'
tool_calls = [{ name = "workspace_send_to_agent", arguments = { agent = "Peer", message = "x" } }]
"""


async def ann_org(directory: DirectoryService) -> Org:
    org = await directory.create_org("o", "o_1", OrgSettings(botMemory=False))
    await directory.create_user("Ann", [org.id], "u_ann")
    return org


async def asker_and_peer(directory: DirectoryService) -> tuple[Org, Bot, Chat]:
    """Ann's org, the Asker bot (Peer beside it, both on model "s") and her chat with Asker."""
    org = await ann_org(directory)
    asker = await directory.create_bot(name="Asker", org=org.id, owner="u_ann", model="s")
    await directory.create_bot(name="Peer", org=org.id, owner="u_ann", model="s")
    chat = await directory.create_chat("u_ann", None, bot=asker.id)
    return org, asker, chat


@contextlib.asynccontextmanager
async def reopened(shards: Shards, models) -> AsyncIterator[ShardService]:
    """Shard 0 of the folder opened again after a close (a restart), on the folder's directory,
    started; closed on leaving (by the `shards` fixture, should the block fail)."""
    svc = shards(models=models, directory=True)
    await svc.kernel.started()
    yield svc
    await shards.close(svc)
