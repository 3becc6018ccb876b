"""The gateway's lookup of a delivery's agent chat the directory does not have yet (gateway/auth.py
`_context_at`): an id no shard knows is answered 404 as before, but is not asked of every shard
again for AGENT_MISS_TTL seconds; the directory is still asked first each time, so a chat it
registered meanwhile is found at once. Typed ports faked in process (no Ray)."""

from __future__ import annotations

import asyncio

import pytest

from engine.directory import Chat, ChatContext, Org
from engine.errors import NotFound
from gateway.auth import AGENT_MISS_TTL, Auth

ORG = Org(id="o_1", name="o")


class FakeDirectory:
    def __init__(self) -> None:
        self.chats: dict[str, Chat] = {}
        self.asked = 0

    async def watch_access(self, watcher: str, seen: int, wait: float) -> tuple[int, tuple]:
        await asyncio.sleep(wait)
        return seen, ()

    async def chat_context_at(self, chat_id: str) -> tuple[int, ChatContext]:
        self.asked += 1
        chat = self.chats.get(chat_id)
        if chat is None:
            raise NotFound(f"no chat {chat_id}", code="chat_not_found")
        return 0, ChatContext(chat=chat, org=ORG)


class FakeShard:
    def __init__(self) -> None:
        self.asked = 0

    async def find_agent_chat(self, chat_id: str) -> Chat | None:
        self.asked += 1
        return None


class FakeEngine:
    def __init__(self, shards: int) -> None:
        self.directory_port = FakeDirectory()
        self.shard_ports = [FakeShard() for _ in range(shards)]


@pytest.mark.anyio
async def test_an_unknown_agent_chat_is_asked_of_the_shards_once_while_it_is_a_miss():
    chat_id = "chat_agent_dlv_nobody"

    engine = FakeEngine(3)
    now = [0.0]
    auth = Auth(engine, "admin-token", clock=lambda: now[0])  # type: ignore[arg-type]
    errors = []
    for _ in range(24):
        with pytest.raises(NotFound) as caught:
            await auth.context(chat_id)
        errors.append((caught.value.code, caught.value.message))
    shard_calls = [s.asked for s in engine.shard_ports]
    directory_calls = engine.directory_port.asked
    # Registered in the directory meanwhile: found at once, miss or not.
    engine.directory_port.chats[chat_id] = Chat(
        id=chat_id, kind="agent", owner="u_ann", org=ORG.id, bot="b_1"
    )
    found = await auth.context(chat_id)
    del engine.directory_port.chats[chat_id]
    auth.drop(None)  # nothing cached: the chat is looked up again
    now[0] = AGENT_MISS_TTL * 0.99  # still a miss: the shards are not asked
    with pytest.raises(NotFound):
        await auth.context(chat_id)
    still = [s.asked for s in engine.shard_ports]
    now[0] = AGENT_MISS_TTL * 1.01  # the miss is forgotten: the shards are asked again
    with pytest.raises(NotFound):
        await auth.context(chat_id)
    again = [s.asked for s in engine.shard_ports]
    assert set(errors) == {("chat_not_found", f"no chat {chat_id}")}
    assert shard_calls == [1, 1, 1]
    assert directory_calls == 24
    assert found.chat.id == chat_id
    assert still == [1, 1, 1] and again == [2, 2, 2]
