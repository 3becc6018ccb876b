"""Cursor pagination for the listing routes (`GET /v1/chats`, `/v1/bots`, `/v1/channels`,
`/v1/admin/orgs|users|bots|channels`), and the shapes a person is shown of chats and bots.

Every listing answers `{"items": [...], "nextCursor": str | null}` in one stable order (ascending
by the record's sort key, its id unless said otherwise). A cursor is opaque to clients: it names
the last record of the page, so records added or removed between pages neither repeat nor shift
what comes next. `nextCursor` is null on the last page.
"""

from __future__ import annotations

import base64
import binascii
import heapq
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import msgspec

from engine.directory import Bot, Channel, Chat, Permission, User
from engine.errors import InvalidInput
from engine.numbers import query_number

T = TypeVar("T")
DEFAULT_LIMIT = 50
MAX_LIMIT = 200
_MAX_CURSOR = 512


class Page(msgspec.Struct, Generic[T], frozen=True, kw_only=True):
    items: list[T]
    nextCursor: str | None = None


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> str | None:
    """The sort key a cursor names; None for the first page. A cursor this module did not make
    is refused rather than read as some other position."""
    if cursor is None or cursor == "":
        return None
    if len(cursor) > _MAX_CURSOR:
        raise InvalidInput("cursor too long", code="invalid_cursor")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        key = raw.decode()
    except (binascii.Error, ValueError) as e:
        raise InvalidInput("not a cursor this server made", code="invalid_cursor") from e
    if not key or encode_cursor(key) != cursor:
        raise InvalidInput("not a cursor this server made", code="invalid_cursor")
    return key


def parse_limit(raw: str | None) -> int:
    return query_number(raw, field="limit", low=1, high=MAX_LIMIT, default=DEFAULT_LIMIT)


def page(records: Iterable[T], key: Callable[[T], str], cursor: str | None, limit: int) -> Page[T]:
    """The `limit` records after `cursor` in `key` order (keys must be unique)."""
    after = decode_cursor(cursor)
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be 1-{MAX_LIMIT}", code="invalid_limit")
    candidates = records if after is None else (r for r in records if key(r) > after)
    # One more than asked tells whether another page exists, without a count of the rest.
    chosen = heapq.nsmallest(limit + 1, candidates, key=key)
    more = len(chosen) > limit
    chosen = chosen[:limit]
    return Page(items=chosen, nextCursor=encode_cursor(key(chosen[-1])) if more else None)


def chain_key(created_at: int, chain_id: str) -> str:
    """A collaboration chain's place in its listing, which runs newest first (an activity
    list: what just happened is on the first page): the gateway names it in a cursor and each
    shard reads its chains below it."""
    return f"{created_at:015d}/{chain_id}"


# --- what a person is shown ---


class Member(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    name: str
    avatar: str | None = None


class Me(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/me`: who a user token is."""

    id: str
    name: str
    orgs: list[str]


class ChatEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A chat in the caller's list: the record plus the names a client shows for it."""

    id: str
    kind: str
    org: str
    owner: str
    title: str
    bot: str | None = None
    channel: str | None = None
    project: str | None = None
    chain: str | None = None
    createdAt: int = 0
    revision: int = 1  # moves with each change to the chat (its project, WS-7)
    bots: list[Member] = []
    people: list[Member] = []


class BotEntry(msgspec.Struct, frozen=True, kw_only=True):
    """A bot the caller may use, without other people's grants."""

    id: str
    name: str
    org: str
    owner: str
    kind: str
    linked: bool
    model: str | None
    avatar: str | None
    revision: int
    permission: Permission


class ChannelEntry(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    org: str
    name: str
    mode: str
    leader: str | None
    bots: list[Member]
    people: list[Member]


def chat_sees(chat: Chat, user: str, channels: frozenset[str]) -> bool:
    """A person's chats: those they own, and the group chats of their channels."""
    if chat.kind == "group":
        return chat.channel in channels
    return chat.owner == user


def _bot_member(bots: dict[str, Bot], bot_id: str) -> Member:
    b = bots.get(bot_id)
    return (
        Member(id=bot_id, name=bot_id)
        if b is None
        else Member(id=b.id, name=b.name, avatar=b.avatar)
    )


def _person(users: dict[str, User], user_id: str) -> Member:
    u = users.get(user_id)
    return Member(id=user_id, name=user_id if u is None else u.name)


def chat_entry(
    chat: Chat, bots: dict[str, Bot], channels: dict[str, Channel], users: dict[str, User]
) -> ChatEntry:
    members: list[Member] = []
    people: list[Member] = [_person(users, chat.owner)]
    title = chat.id
    ch = channels.get(chat.channel) if chat.channel else None
    if ch is not None:
        members = [_bot_member(bots, b) for b in ch.bots]
        people = [_person(users, u) for u in ch.people]
        title = ch.name or ", ".join(m.name for m in members) or ch.id
    elif chat.bot is not None:
        members = [_bot_member(bots, chat.bot)]
        title = members[0].name
    return ChatEntry(
        id=chat.id,
        kind=chat.kind,
        org=chat.org,
        owner=chat.owner,
        title=title,
        bot=chat.bot,
        channel=chat.channel,
        project=chat.project,
        chain=chat.chain,
        createdAt=chat.created_at,
        revision=chat.revision,
        bots=members,
        people=people,
    )


def bot_entry(bot: Bot, permission: Permission) -> BotEntry:
    return BotEntry(
        id=bot.id,
        name=bot.name,
        org=bot.org,
        owner=bot.owner,
        kind=bot.kind,
        linked=bot.linked,
        model=bot.model,
        avatar=bot.avatar,
        revision=bot.revision,
        permission=permission,
    )


def channel_entry(ch: Channel, bots: dict[str, Bot], users: dict[str, User]) -> ChannelEntry:
    return ChannelEntry(
        id=ch.id,
        org=ch.org,
        name=ch.name,
        mode=ch.mode,
        leader=ch.leader,
        bots=[_bot_member(bots, b) for b in ch.bots],
        people=[_person(users, u) for u in ch.people],
    )
