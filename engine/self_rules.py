"""A bot's own rules: reading and changing them (WS-2) and setting a new member's (WS-3).

Who may change a bot's rules: the bot itself (unless it is a temporary assistant) and people with
write on it. The bot that created a member sets its first rules and then loses that right, so a
member's character is its own and its owner's, not its creator's; it keeps the right to rename
and to archive the member (WS-3). Rules never reach the base
profile: model, kind, org, owner and grants are not rule fields and no path here changes them.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from engine.directory import Bot, BotRules, Permission, check_id, permission
from engine.errors import Conflict, Forbidden, InvalidInput
from engine.numbers import RevisionNumber, bound_error

RULE_FIELDS = ("name", "description", "prompt", "duties", "boundaries", "tone", "preferences")
MAX_FIELD = 8000
EDITOR_KINDS = ("self", "bot", "user")


class RulesUpdate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The arguments of `workspace_update_self_rules` and the body of a client's edit.

    A field left out (None) keeps its value; "" clears it (except `name`, which may not be blank).
    """

    expectedRevision: RevisionNumber
    name: str | None = None
    description: str | None = None
    prompt: str | None = None
    duties: str | None = None
    boundaries: str | None = None
    tone: str | None = None
    preferences: str | None = None


class Editor(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "self" (the bot through its tool) | "bot" (another bot's tool) | "user" (HTTP)
    id: str


def parse_update(args: object) -> RulesUpdate:
    """A RulesUpdate from decoded JSON (tool-call arguments or a request body)."""
    try:
        return msgspec.convert(args, RulesUpdate)
    except msgspec.ValidationError as e:
        bounds = bound_error(e)
        if bounds is not None:
            raise bounds from e
        raise InvalidInput(f"invalid rules update: {e}", code="invalid_update") from e


def rules_view(bot: Bot) -> dict:
    """What `workspace_get_self_rules` returns."""
    rules = msgspec.structs.asdict(bot.rules)
    # Rows written before the rules carried a name fall back to the bot's name, as the prompt does.
    rules["name"] = bot.rules.name or bot.name
    return {
        "id": bot.id,
        "name": bot.name,
        "kind": bot.kind,
        "rules": {f: rules[f] for f in RULE_FIELDS},
        "revision": bot.revision,
    }


def _check_field(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"rule {field!r} must be a string", code="invalid_rule")
    if len(value) > MAX_FIELD:
        raise InvalidInput(
            f"rule {field!r} is over {MAX_FIELD} characters",
            code="field_too_long",
            details={"field": field},
        )
    return value


def _check_name(value: object) -> str:
    name = _check_field("name", value)
    if not name.strip():
        raise InvalidInput("a bot's name may not be blank", code="invalid_name")
    return name.strip()


def _check_editor(bot: Bot, editor: Editor, fields: frozenset[str] = frozenset()) -> None:
    """May `editor` change `fields` of `bot`'s rules (none: may it edit at all)?"""
    kind = editor.kind
    if kind == "bot" and editor.id == bot.id:
        # A bot reaching itself through a bot-to-bot tool is still editing itself.
        kind = "self"
    if kind == "self":
        if editor.id != bot.id:
            raise Forbidden("a bot may only change its own rules this way", code="not_self")
        if bot.kind == "temporary":
            raise Forbidden(
                "a temporary assistant cannot change its own rules", code="temporary_bot"
            )
    elif kind == "bot":
        if editor.id == bot.creator and fields and fields <= {"name"}:
            return  # WS-3: the creator keeps its right to rename
        if editor.id == bot.creator:
            raise Forbidden(
                "the rules you set when creating this bot are now its own to change",
                code="creator_locked",
            )
        raise Forbidden("a bot may not change another bot's rules", code="not_your_bot")
    elif kind == "user":
        if permission(bot, editor.id) != Permission.WRITE:
            raise Forbidden("you need write on this bot", code="no_write")
    else:
        raise InvalidInput(
            f"editor kind must be one of {', '.join(EDITOR_KINDS)}", code="invalid_editor"
        )


def update_rules(bot: Bot, update: RulesUpdate, editor: Editor) -> Bot:
    """The bot with its rules changed and its revision one higher.

    An update that names no field changes nothing and keeps the revision (so it cannot make other
    editors' drafts stale), but is still checked for permission and revision: it answers "may I,
    and is my copy current?".
    """
    named = frozenset(f for f in RULE_FIELDS if getattr(update, f) is not None)
    _check_editor(bot, editor, named)
    expected = update.expectedRevision
    if isinstance(expected, bool) or not isinstance(expected, int):
        raise InvalidInput("expectedRevision must be an integer", code="invalid_revision")
    if expected != bot.revision:
        raise Conflict(
            f"the rules are at revision {bot.revision}, not {expected}",
            code="stale_revision",
            details={"currentRevision": bot.revision},
        )
    changes = {f: getattr(update, f) for f in RULE_FIELDS if getattr(update, f) is not None}
    if not changes:
        return bot
    for field, value in changes.items():
        changes[field] = _check_name(value) if field == "name" else _check_field(field, value)
    rules = msgspec.structs.replace(bot.rules, **changes)
    renamed = {"name": changes["name"]} if "name" in changes else {}
    return msgspec.structs.replace(bot, rules=rules, revision=bot.revision + 1, **renamed)


def new_member(
    creator: Bot, *, bot_id: str, name: str, prompt: str | None, rules: Mapping | None
) -> Bot:
    """The bot `creator` makes with `workspace_create_agent`, with its first rules.

    It belongs to the creator's owner and org. The model is the creator's, so that the member can
    answer at once; grants are not copied, because the creator's readers were never given this bot.
    """
    if creator.kind == "temporary":
        raise Forbidden("a temporary assistant cannot create members", code="temporary_bot")
    check_id(bot_id, "bot id")
    fields: dict[str, str] = {}
    if rules is not None:
        if not isinstance(rules, Mapping):
            raise InvalidInput("rules must be an object", code="invalid_rule")
        for key, value in rules.items():
            if key not in RULE_FIELDS:
                raise InvalidInput(
                    f"unknown rule {key!r}; rules are {', '.join(RULE_FIELDS)}",
                    code="unknown_rule",
                    details={"field": key},
                )
            fields[key] = _check_field(key, value)
    if prompt is not None:
        fields["prompt"] = _check_field("prompt", prompt)
    # The member's name is one thing; `name` wins over a rules name that disagrees.
    fields["name"] = _check_name(name)
    extra = {"creator": creator.id} if "creator" in Bot.__struct_fields__ else {}
    return Bot(
        id=bot_id,
        name=fields["name"],
        org=creator.org,
        owner=creator.owner,
        kind="persistent",
        model=creator.model,
        rules=BotRules(**fields),
        revision=1,
        **extra,
    )


def set_archived(bot: Bot, archived: bool, editor: Editor) -> Bot:
    """Archive (or restore) a bot: its creator bot or a person with write may (WS-3). An
    archived bot keeps its memory and chats; it takes no turns and is no collaboration target."""
    if editor.kind == "bot":
        if editor.id != bot.creator:
            raise Forbidden("only the bot that created this one may archive it", code="not_creator")
    elif editor.kind == "user":
        if permission(bot, editor.id) != Permission.WRITE:
            raise Forbidden("you need write on this bot", code="no_write")
    else:
        raise Forbidden("a bot may not archive itself", code="not_creator")
    if bot.archived == archived:
        return bot
    return msgspec.structs.replace(bot, archived=archived)
