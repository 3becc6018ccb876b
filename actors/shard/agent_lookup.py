"""Finding a delivery's `agent` chat on the shard that made it, and whether its send is
stored (issue 13).

Mixed into `ShardService` (actors/shard/service.py, which is full). The chain's home shard makes
each delivery's agent chat itself and registers it with the directory in the background, once
for the chats of a few hundred milliseconds (actors/chats/agent_chats.py): a hop asks the
directory nothing. A reader that comes for such a chat before the directory has it (a client
fetching an item its `chat.item.created` announced) is served by the gateway from here
(gateway/auth.py `context`). A delivery's step on another shard asks here, before a tool of
it writes, whether the send it answers is durable (actors/chats/sent_gate.py).
"""

from __future__ import annotations

from actors.chats.chains import ChainRunner
from actors.contracts import SentRef
from engine.directory import Chat


class AgentChatLookup:
    chains: ChainRunner  # built by ShardService

    async def find_agent_chat(self, chat_id: str) -> Chat | None:
        return await self.chains.records.agent_chat(chat_id)

    async def send_stored(self, ref: SentRef) -> bool:
        """Whether the send of `ref` is durable (waits while it commits)."""
        return await self.chains.records.gate.stored(ref)
