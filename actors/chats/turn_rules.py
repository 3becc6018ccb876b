"""Rules both turn runners (conversations.py, group_turns.py) follow: who learns from a turn,
and the one log line of a failed step. Apart, so neither runner imports the other."""

from __future__ import annotations

import logging

from actors.contracts import StepInput, StepOutcome
from engine.directory import Bot, Chat, Org

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


def learns(org: Org, chat: Chat, confided: bool, bot: Bot | None = None) -> bool:
    """A turn is learned from when the bot confided, or after every person turn with the org's
    autoRecord unless the bot's owner paused it (WS-1) (docs/design.md §6); never with
    botMemory off, never in review chats."""
    if not org.settings.botMemory or chat.kind in ("review", "agent"):
        return False
    return confided or (org.settings.autoRecord and not (bot is not None and bot.autoRecordPaused))
