"""What a turn is made of: the messages that start, mirror and answer it, and who learns.

Kept apart from the turn runners (conversations.py, group_turns.py) so that both, and the
gateway, name them without importing each other.
"""

from __future__ import annotations

import logging

import msgspec

from actors.chats.bot_step import StepInput, StepOutcome
from engine.directory import Bot, Channel, Chat, Org
from engine.errors import Forbidden
from storage.chat_store import ItemView, Turn

log_failure = logging.getLogger("openbot.turns")


def step_failed(step: StepInput, outcome: StepOutcome) -> None:
    """One warning line per failed bot step (direct, group and agent chats alike)."""
    if outcome.status == "failed":
        log_failure.warning(
            "step of bot %s in chat %s (turn %s) failed: %s",
            step.bot.id,
            step.chat.id,
            step.turn,
            outcome.error,
        )


class TurnStart(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a turn needs from the directory, captured when it starts."""

    chat: Chat
    bot: Bot | None  # direct and review chats
    org: Org
    operator: str
    text: str
    request_id: str | None = None
    channel: Channel | None = None  # group chats, with their member bots
    members: tuple[Bot, ...] = ()
    rounds: int | None = None
    mentions: tuple[str, ...] | None = None


class Mirrored(msgspec.Struct, frozen=True, kw_only=True):
    """A chat item a bot's shard keeps so that its learning can read the evidence (LRN-3)."""

    seq: int
    turn: str | None
    kind: str
    author: str
    at: int
    text: str


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    turn: Turn
    items: list[ItemView]


def learns(org: Org, chat: Chat, confided: bool, bot: Bot | None = None) -> bool:
    """A turn is learned from when the bot confided, or after every person turn with the org's
    autoRecord unless the bot's owner paused it (WS-1) (DESIGN "Learning triggers"); never with
    botMemory off, never in review chats."""
    if not org.settings.botMemory or chat.kind in ("review", "agent"):
        return False
    return confided or (org.settings.autoRecord and not (bot is not None and bot.autoRecordPaused))


def require_chat_owner(chat: Chat, user: str) -> None:
    """Reading a chat (items, confessions, enrichments) is for its owner only (API-6)."""
    if chat.owner != user:
        raise Forbidden("only the chat's owner may read it", code="not_chat_owner")
