"""Directory records (docs/design.md §4) and the access policy over them (docs/design.md §9,
"Who may do what").

These are the stored shapes as well as the wire shapes of the admin routes; new fields get
defaults so stored rows stay readable.
"""

from __future__ import annotations

import enum
import re

import msgspec

from engine.errors import Forbidden, InvalidInput, NotFound

ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


class Permission(enum.StrEnum):
    READ = "read"
    WRITE = "write"


class OrgSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    botMemory: bool = True
    botMemoryModel: str | None = None
    autoRecord: bool = False
    # WS-1: bots' team and collaboration are server policy (on unless the admin turns it off);
    # no per-bot toggle of a client overrides it.
    collaboration: bool = True


class Org(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    settings: OrgSettings = OrgSettings()


class User(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    orgs: tuple[str, ...]


class BotRules(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str = ""
    description: str = ""
    prompt: str = ""
    duties: str = ""
    boundaries: str = ""
    tone: str = ""
    preferences: str = ""


class Bot(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    org: str
    owner: str
    kind: str = "persistent"
    linked: bool = False
    model: str | None = None
    rules: BotRules = BotRules()
    revision: int = 1
    grants: dict[str, Permission] = {}
    creator: str | None = None  # the bot that created this one (WS-3: it may not edit its rules)
    avatar: str | None = None  # an image URL clients show next to the bot (UI-1)
    archived: bool = False  # WS-3: takes no turns and is no collaboration target
    autoRecordPaused: bool = False  # WS-1: "auto-record long-term facts" paused for this bot
    # Other orgs an admin shared the bot with (MB-1): it works in each of them too, its memory
    # written there tagged with that org and seen only by work there.
    sharedOrgs: tuple[str, ...] = ()


class Channel(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    org: str
    name: str = ""
    people: tuple[str, ...] = ()
    bots: tuple[str, ...] = ()
    mode: str = "discussion"
    leader: str | None = None


class Chat(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: str  # direct | group | review | agent
    owner: str
    org: str
    bot: str | None = None
    channel: str | None = None
    project: str | None = None
    created_at: int = 0
    # The key whose shard stores the chat: the bot's owner (direct, review), the channel
    # (group), the root chat's home (agent). Empty in rows written before it existed.
    home: str = ""
    chain: str | None = None  # agent chats: the collaboration chain they serve
    # Moves with every change to the record after it was made (its project, WS-7), so a
    # client that hears of changes out of order keeps the newest.
    revision: int = 1


class ChatContext(msgspec.Struct, frozen=True, kw_only=True):
    """A chat with what a turn needs from the directory, read at one moment (one call): its
    org, its bot (direct, review, agent chats) or its channel and the channel's bots."""

    chat: Chat
    org: Org
    bot: Bot | None = None
    channel: Channel | None = None
    members: tuple[Bot, ...] = ()


def chat_home(chat: Chat, bot_owner: str | None = None) -> str:
    if chat.home:
        return chat.home
    if bot_owner is None:
        raise InvalidInput(f"chat {chat.id} has no home", code="invalid_chat")
    return bot_owner


def agent_chat_id(link: str) -> str:
    """The `agent` chat of a collaboration delivery is named after its link (the receipt id):
    the chain's home shard and the directory make the same record without asking each other."""
    return f"chat_agent_{link}"


def agent_chat(root: Chat, peer: str, chain: str, link: str, at: int) -> Chat:
    """The `agent` chat in which `peer` works on one delivery of a chain rooted in `root`: it
    lives with the root chat (same home) and belongs to the root chat's person. `at` is the
    link's send time, so every maker of the record makes the same one."""
    return Chat(
        id=agent_chat_id(link),
        kind="agent",
        owner=root.owner,
        org=root.org,
        bot=peer,
        project=root.project,
        created_at=at,
        home=root.home,
        chain=chain,
    )


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """Who a request acts for: the admin, or a user with their orgs and channel memberships."""

    admin: bool = False
    user: User | None = None
    channels: frozenset[str] = frozenset()
    bots: frozenset[str] = frozenset()  # bots the user may use (owner, read or write grant)
    # `bot\x00org` for each of those bots and each org of the user's it does not work in (a
    # shared bot, or one no longer shared): its memory of that org is no news for them.
    unshared: frozenset[str] = frozenset()


MAX_CHANNEL_BOTS = 8


def check_id(value: str, what: str) -> str:
    if not isinstance(value, str) or not ID_RE.match(value):
        raise InvalidInput(f"{what} must be 1-128 characters of [A-Za-z0-9_.-]", code="invalid_id")
    return value


def permission(bot: Bot, user_id: str) -> Permission | None:
    if bot.owner == user_id:
        return Permission.WRITE
    return bot.grants.get(user_id)


def bot_orgs(bot: Bot) -> tuple[str, ...]:
    """The orgs a bot works in: its home org, then the orgs it is shared with."""
    return (bot.org, *(o for o in bot.sharedOrgs if o != bot.org))


def works_in(bot: Bot, org: str) -> bool:
    return org == bot.org or org in bot.sharedOrgs


def _require_same_org(bot: Bot, user: User) -> None:
    """A bot works in its own org and the orgs it is shared with: a person of none of them
    cannot use it, whatever grant an older directory may hold. To them it is as unknown as a
    free id."""
    if not any(works_in(bot, o) for o in user.orgs):
        raise NotFound(f"no bot {bot.id!r}", code="bot_not_found")


def require_use(bot: Bot, user: User, org: str | None = None) -> None:
    """Using a bot (turns, Remember, Forget, reading one's own memory) needs read or write, and
    the user must be a person of an org the bot works in. With `org` (a chat's), the bot must
    still work in that org: a chat of an org the bot is no longer shared with takes no turn."""
    _require_same_org(bot, user)
    if permission(bot, user.id) is None:
        raise Forbidden("you have no access to this bot", code="no_access")
    if org is not None and not (works_in(bot, org) and org in user.orgs):
        raise Forbidden(f"this bot does not work in org {org!r}", code="org_not_shared")


def require_write(bot: Bot, user: User) -> None:
    """Purge and memory-bot settings need write on a bot that is not a linked bot. They act on
    the bot's memory in every org, so only a person of its home org may: sharing a bot never
    lets another org purge or re-budget it."""
    _require_same_org(bot, user)
    if bot.linked:
        raise Forbidden("a linked bot's memory is managed where it is linked from", code="linked")
    if permission(bot, user.id) != Permission.WRITE:
        raise Forbidden("you need write on this bot", code="no_write")
    if bot.org not in user.orgs:
        raise Forbidden("only people of the bot's home org manage it", code="home_org_only")


def may_use(bot: Bot, user: User) -> bool:
    return any(works_in(bot, o) for o in user.orgs) and permission(bot, user.id) is not None


def bot_org(bot: Bot, user: User, requested: str | None) -> str:
    """The org a user works in with a bot: `requested` (the `OpenBot-Org` header) when given,
    which must be one of the user's orgs and one the bot works in; else the bot's home org when
    the user is a person of it, else the first of the user's orgs the bot is shared with.
    Memory written through the bot is tagged `org:<that org>`, never with an org the bot does
    not work in."""
    if requested:
        resolve_org(user, requested)
    _require_same_org(bot, user)
    if requested:
        if not works_in(bot, requested):
            raise Forbidden(
                f"this bot works in org {bot.org!r}, not {requested!r}", code="wrong_org"
            )
        return requested
    if bot.org in user.orgs:
        return bot.org
    return next(o for o in user.orgs if works_in(bot, o))


def work_org(bot: Bot, user: User, requested: str | None) -> str | None:
    """`bot_org`, or None where the user does not work with the bot in the requested org."""
    try:
        return bot_org(bot, user, requested)
    except (Forbidden, NotFound):
        return None


def resolve_org(user: User, requested: str | None) -> str:
    """The org a user acts in: the requested one if it is theirs, else their first."""
    if requested:
        if requested not in user.orgs:
            raise Forbidden(f"you are not a member of org {requested!r}", code="not_in_org")
        return requested
    if not user.orgs:
        raise Forbidden("you belong to no org", code="not_in_org")
    return user.orgs[0]


def bot_pool(bot_id: str) -> str:
    return f"bot:{bot_id}"
