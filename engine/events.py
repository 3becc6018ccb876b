"""Events (docs/design.md §8, contract): what changed, never the content, and who may hear of it.

An event is stored with an `Audience` computed when it is written, from the same rules that
decide visibility; the gateway checks each client against it, on live delivery and again on
replay. Cursors are opaque to clients: one position per shard plus each shard's epoch.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec

from engine import tags as tagmod
from engine.errors import InvalidInput
from engine.memory_entries import EntryMeta, Layer, Reader
from engine.visibility import Visibility, directly_visible

# --- payloads (the `data` of a frame); new fields get defaults, types never change ---------------


class MemoryChanged(msgspec.Struct, frozen=True, kw_only=True, tag="memory.changed"):
    pool: str
    entry: str
    version: int
    change: str
    bot: str | None = None


class MemoryJobChanged(msgspec.Struct, frozen=True, kw_only=True, tag="memory.job.changed"):
    bot: str
    job: str
    status: str
    attempts: int = 0


class ProjectChanged(msgspec.Struct, frozen=True, kw_only=True, tag="project.changed"):
    project: str
    revision: int
    change: str


class CollaborationChanged(msgspec.Struct, frozen=True, kw_only=True, tag="collaboration.changed"):
    collaboration: str
    status: str
    chat: str | None = None


class ChatItemCreated(msgspec.Struct, frozen=True, kw_only=True, tag="chat.item.created"):
    chat: str
    item: str
    kind: str
    turn: str | None = None


class ChatItemsDeleted(msgspec.Struct, frozen=True, kw_only=True, tag="chat.items.deleted"):
    """A chat's history was deleted (`DELETE /v1/chats/:id/items`): clients drop its items."""

    chat: str
    count: int


class ChatUpdated(msgspec.Struct, frozen=True, kw_only=True, tag="chat.updated"):
    """A chat's record changed (`PATCH /v1/chats/:id`): `change` names what (`project`), and
    `project` is the chat's project now (an id, or null when cleared). Clients keep the highest
    `revision` they heard of."""

    chat: str
    revision: int
    change: str
    project: str | None = None


class RequestChanged(msgspec.Struct, frozen=True, kw_only=True, tag="request.changed"):
    """A request (approval) was made, decided or got a review chat (ENR-3)."""

    request: str
    status: str
    revision: int
    bot: str
    chat: str | None = None


Payload = (
    MemoryChanged
    | MemoryJobChanged
    | ProjectChanged
    | CollaborationChanged
    | ChatItemCreated
    | ChatItemsDeleted
    | ChatUpdated
    | RequestChanged
)
EVENT_TYPES = tuple(t.__struct_config__.tag for t in Payload.__args__)  # type: ignore[attr-defined]


class Audience(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Who may receive an event: any listed user, any member of a listed channel, or anyone who
    uses `bot` — always within `org` when one is set."""

    org: str | None = None
    users: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    bot: str | None = None


NOBODY = Audience(org="\x00none")  # no org is named like this: admits no one


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """An event as stored in a shard's log."""

    seq: int
    at: int
    data: Payload
    audience: Audience


class Listener(msgspec.Struct, frozen=True, kw_only=True):
    """A connected client as the audience check sees it."""

    user: str
    orgs: frozenset[str]
    channels: frozenset[str] = frozenset()
    bots: frozenset[str] = frozenset()  # bots the user may use (read or write)
    # `bot\x00org`: an org of the user's that one of those bots does not work in (Principal)
    unshared: frozenset[str] = frozenset()


def admits(audience: Audience, listener: Listener) -> bool:
    if audience.org is not None and audience.org not in listener.orgs:
        return False
    if listener.user in audience.users:
        return True
    # Using a shared bot in one org is no way into its memory of another org of theirs.
    if (
        audience.bot is not None
        and audience.bot in listener.bots
        and f"{audience.bot}\x00{audience.org}" not in listener.unshared
    ):
        return True
    return any(c in listener.channels for c in audience.channels)


def entry_audience(bot_id: str | None, entry_id: str, entries: Mapping[str, EntryMeta]) -> Audience:
    """Everyone the visibility rules let see entry `entry_id` in the pool state `entries`.

    Each grant is checked on its own with a reader holding only that grant, so someone who could
    see the entry only by combining grants is not told about it (fails closed: they still see it
    when they read).
    """
    entry = entries.get(entry_id)
    if entry is None:
        return NOBODY
    if entry.layer == Layer.PINNED:
        tags, gone = entry.tags, entry.forgotten_by
        if type(tags) is tuple and type(gone) is frozenset:  # (hashable: as decoded)
            return _pinned_audience(bot_id, tags, gone)
        return _audience(bot_id, entry, lambda r: directly_visible(r, entry))
    return _audience(bot_id, entry, lambda r: Visibility(r, entries).visible(entry_id))


@functools.lru_cache(maxsize=4096)
def _pinned_audience(
    bot_id: str | None, tags: tuple[str, ...], forgotten_by: frozenset[str]
) -> Audience:
    """A pinned entry's audience: its visibility is rules 1 and 2 alone (engine/visibility.py),
    which read only its tags and who forgot it, so entries alike in those (a person's notes
    on one topic) share one answer (this runs for every entry a write changes)."""
    entry = EntryMeta(
        id="", pool="", layer=Layer.PINNED, tags=tags, created_at=0, updated_at=0,
        forgotten_by=forgotten_by,
    )  # fmt: skip
    return _audience(bot_id, entry, lambda r: directly_visible(r, entry))


def _audience(bot_id: str | None, entry: EntryMeta, sees: Callable[[Reader], bool]) -> Audience:
    orgs = tagmod.orgs_of(entry.tags)
    if len(orgs) != 1:
        return NOBODY
    (org,) = orgs
    users: list[str] = []
    channels: list[str] = []
    bot = None
    for grant in tagmod.grants_of(entry.tags):
        if grant.startswith("for:person:"):
            user = grant[len("for:person:") :]
            if sees(Reader(user=user, org=org)):
                users.append(user)
        elif grant.startswith("for:channel:"):
            channel = grant[len("for:channel:") :]
            if sees(Reader(user="\x00", org=org, channels=frozenset({channel}))):
                channels.append(channel)
        elif (
            grant == tagmod.FOR_BOT
            and bot_id is not None
            and sees(Reader(user="\x00", org=org, uses_bot=True))
        ):
            bot = bot_id
    return Audience(org=org, users=tuple(users), channels=tuple(channels), bot=bot)


def union(audiences: Iterable[Audience]) -> Audience:
    """Those admitted by any of `audiences` (all must share one org, or the result is empty)."""
    items = [a for a in audiences if a != NOBODY]
    if len(items) == 1:
        return items[0]
    orgs = {a.org for a in items}
    if len(orgs) != 1:
        return NOBODY
    return Audience(
        org=orgs.pop(),
        users=tuple(dict.fromkeys(u for a in items for u in a.users)),
        channels=tuple(dict.fromkeys(c for a in items for c in a.channels)),
        bot=next((a.bot for a in items if a.bot is not None), None),
    )


# --- cursors ---


class Position(msgspec.Struct, frozen=True, array_like=True):
    epoch: str
    seq: int


# base64's URL-safe alphabet, applied as `base64.urlsafe_b64encode` does, without its two
# Python-level calls: a cursor is encoded for every event a hub hands out.
_URL_SAFE = bytes.maketrans(b"+/", b"-_")


def encode_cursor(positions: Sequence[Position]) -> str:
    raw = msgspec.json.encode(list(positions))
    return binascii.b2a_base64(raw, newline=False).translate(_URL_SAFE).rstrip(b"=").decode()


def decode_cursor(cursor: str) -> list[Position]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        positions = msgspec.json.decode(raw, type=list[Position])
    except (binascii.Error, ValueError, msgspec.DecodeError, RecursionError) as e:
        raise InvalidInput("malformed cursor", code="bad_cursor") from e
    return positions


class ShardHead(msgspec.Struct, frozen=True, kw_only=True):
    """Where a shard's event log stands: its epoch, the first seq it still keeps, the last seq
    it published."""

    epoch: str
    oldest: int
    head: int


def needs_reset(positions: Sequence[Position], heads: Sequence[ShardHead]) -> bool:
    """A cursor from another epoch or shard layout, older than what a shard still keeps, or
    ahead of what it published (a restored copy) cannot be resumed without a gap."""
    if len(positions) != len(heads):
        return True
    for pos, h in zip(positions, heads, strict=True):
        if pos.epoch != h.epoch or pos.seq < h.oldest - 1 or pos.seq > h.head:
            return True
    return False
