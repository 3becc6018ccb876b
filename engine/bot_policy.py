"""What a bot may do with other bots, decided by the server (WS-1, WS-3, WS-6).

Team and collaboration are server policy: the org's `collaboration` setting (on by default)
and the bot's own state (archived, temporary). A client's old per-bot switches are not part of
it and never override it; the bot profile shows the result as a status. "Auto-record long-term
facts" is the one switch a bot's owner keeps: it pauses learning after every turn and deletes
nothing.
"""

from __future__ import annotations

import msgspec

from engine.directory import Bot, Org
from engine.errors import Conflict, Forbidden, InvalidInput, Unprocessable

# Legacy per-bot toggles older clients still send; accepted and ignored (WS-1).
LEGACY_TOGGLES = ("team", "collaboration")


class BotPermissions(msgspec.Struct, frozen=True, kw_only=True):
    """The status a bot profile shows; `source` says who decides it."""

    team: bool  # may lead a delivery goal and create member bots
    collaboration: bool  # may send to other bots, post to groups, and be sent to
    autoRecord: bool  # learns after every person turn
    source: str = "server"
    reason: str | None = None


def permissions(bot: Bot, org: Org) -> BotPermissions:
    if bot.archived:
        return BotPermissions(team=False, collaboration=False, autoRecord=False, reason="archived")
    collaboration = org.settings.collaboration
    reason = None if collaboration else "turned off for this organization"
    return BotPermissions(
        team=collaboration and bot.kind == "persistent",
        collaboration=collaboration,
        autoRecord=org.settings.botMemory and org.settings.autoRecord and not bot.autoRecordPaused,
        reason=reason,
    )


def require_active(bot: Bot) -> None:
    """An archived bot takes no turns (WS-3)."""
    if bot.archived:
        raise Conflict(f"bot {bot.id} is archived", code="bot_archived")


def require_collaboration(bot: Bot, org: Org, *, role: str = "sender") -> None:
    """`role` is "sender" (the bot asking) or "target" (the bot asked)."""
    if bot.archived:
        raise Forbidden(f"{bot.name} is archived", code="bot_archived")
    if not permissions(bot, org).collaboration:
        what = "collaborate" if role == "sender" else "be asked"
        raise Forbidden(
            f"{bot.name} may not {what}: collaboration is off", code="collaboration_off"
        )


def require_team(bot: Bot, org: Org) -> None:
    """Leading a delivery goal or creating members needs team permission (WS-6)."""
    if not permissions(bot, org).team:
        raise Unprocessable(f"{bot.name} has no team permission", code="no_team_permission")


class BotProfile(msgspec.Struct, frozen=True, kw_only=True):
    """What clients show of a bot: who it is and what the server lets it do (WS-1)."""

    id: str
    name: str
    kind: str
    org: str
    owner: str
    avatar: str | None
    creator: str | None
    archived: bool
    permissions: BotPermissions
    ignored: list[str] = []  # legacy toggles this request sent, which do not override policy


def profile(bot: Bot, org: Org, ignored: list[str] | None = None) -> BotProfile:
    return BotProfile(
        id=bot.id,
        name=bot.name,
        kind=bot.kind,
        org=bot.org,
        owner=bot.owner,
        avatar=bot.avatar,
        creator=bot.creator,
        archived=bot.archived,
        permissions=permissions(bot, org),
        ignored=ignored or [],
    )


def parse_profile_patch(body: object) -> tuple[bool | None, list[str]]:
    """A profile PATCH: `autoRecord` (the one switch a bot's owner has) and the legacy toggles,
    which are accepted and ignored. Returns (autoRecord or None, the ignored toggles)."""
    if not isinstance(body, dict):
        raise InvalidInput("the body must be a JSON object", code="invalid_body")
    unknown = sorted(set(body) - {"autoRecord", *LEGACY_TOGGLES})
    if unknown:
        raise InvalidInput(f"unknown fields: {', '.join(unknown)}", code="invalid_body")
    for key, value in body.items():
        if not isinstance(value, bool):
            raise InvalidInput(f"{key} must be true or false", code="invalid_body")
    return body.get("autoRecord"), [k for k in LEGACY_TOGGLES if k in body]
