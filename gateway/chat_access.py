"""What a chat route found out about its chat before acting."""

from __future__ import annotations

from typing import NamedTuple

from actors.ports import ShardPort
from engine.directory import Bot, Channel, Chat, Org, Principal
from engine.errors import Forbidden


class ChatAccess(NamedTuple):
    principal: Principal
    chat: Chat
    bot: Bot | None  # direct, review and agent chats
    channel: Channel | None  # group chats
    home: ShardPort  # the shard that stores the chat
    org: Org | None = None  # the chat's org, read with the chat (one directory call)
    members: tuple[Bot, ...] = ()  # group chats: the channel's bots, read with the chat


def require_chat_owner(chat: Chat, user: str) -> None:
    """Reading a chat (items, confessions, enrichments) is for its owner only (API-6)."""
    if chat.owner != user:
        raise Forbidden("only the chat's owner may read it", code="not_chat_owner")
