"""Memory entries without their content (docs/design.md §4).

An `EntryMeta` is everything the server needs to decide who sees an entry: tags, sources, access
proofs, status and the people who forgot it. The content is kept apart, encrypted, and is only
decrypted for entries a check has already let through (ACL-8).
"""

from __future__ import annotations

import enum

import msgspec


class Layer(enum.StrEnum):
    FACT = "fact"
    OBSERVATION = "observation"
    PINNED = "pinned"


class Status(enum.StrEnum):
    ACTIVE = "active"
    INVALIDATED = "invalidated"
    RETRACTED = "retracted"


class Scope(enum.StrEnum):
    BOT = "bot"
    USER = "user"
    PROJECT = "project"


class Tier(enum.StrEnum):
    PROFILE = "profile"
    LOG = "log"
    NOTE = "note"


class Source(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A chat item (`chat`, `item`) for facts, or another entry (`entry`) for observations."""

    chat: str | None = None
    item: str | None = None
    entry: str | None = None

    @property
    def is_item(self) -> bool:
        return self.chat is not None and self.item is not None and self.entry is None

    @property
    def is_entry(self) -> bool:
        return self.entry is not None and self.chat is None and self.item is None


class AccessProof(msgspec.Struct, frozen=True, kw_only=True):
    """The access rule of one source item, stored when a fact is learned from it (ACL-5).

    `audience` holds grant tags (`for:person:<u>`, `for:channel:<c>`, `for:bot`) of the people
    who could read the item where it was said, in `org`.
    """

    chat: str
    item: str
    org: str
    audience: tuple[str, ...]


class EntryMeta(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    pool: str
    layer: Layer
    tags: tuple[str, ...]
    created_at: int
    updated_at: int
    sources: tuple[Source, ...] = ()
    proofs: tuple[AccessProof, ...] = ()
    status: Status = Status.ACTIVE
    confidence: float | None = None
    invalidated_at: int | None = None
    scope: Scope = Scope.BOT
    tier: Tier = Tier.LOG
    contributor: str | None = None
    revision: int = 1
    forgotten_by: frozenset[str] = frozenset()
    protected: bool = False


class Reader(msgspec.Struct, frozen=True, kw_only=True):
    """Who is reading, in which org, as members of which channels.

    `uses_bot` is true when the reader uses the pool's bot (a grant or ownership), which is what a
    `for:bot` tag asks for.
    """

    user: str
    org: str
    channels: frozenset[str] = frozenset()
    uses_bot: bool = False


class Who(enum.StrEnum):
    PERSON = "person"
    MEMORY_BOT = "memory_bot"
    PROMOTION = "promotion"  # legacy rows only (API-3)


class Change(enum.StrEnum):
    CREATED = "created"
    RETRACTED = "retracted"
    FORGOTTEN = "forgotten"  # one person dropped out; the entry stays for the others
    INVALIDATED = "invalidated"
    UPDATED = "updated"


class LogRow(msgspec.Struct, frozen=True, kw_only=True):
    """One row of a pool's change log (API-3): which version changed which entry, and who did it."""

    version: int
    at: int
    who: Who
    entry: str
    change: Change


class EntryView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The public entry format (API-1); times in epoch milliseconds."""

    id: str
    layer: Layer
    content: str
    tags: tuple[str, ...]
    sources: tuple[Source, ...]
    status: Status
    createdAt: int
    updatedAt: int
    confidence: float | None = None
    invalidatedAt: int | None = None


def view(entry: EntryMeta, content: str) -> EntryView:
    return EntryView(
        id=entry.id,
        layer=entry.layer,
        content=content,
        tags=entry.tags,
        sources=entry.sources,
        status=entry.status,
        createdAt=entry.created_at,
        updatedAt=entry.updated_at,
        confidence=entry.confidence,
        invalidatedAt=entry.invalidated_at,
    )


class MemoryPage(msgspec.Struct, frozen=True, kw_only=True):
    entries: tuple[EntryView, ...]
    version: int


class SearchHitView(EntryView, frozen=True, kw_only=True):
    """An entry found by `GET /v1/bots/{bot}/memory?q=`: its fused score and the retrievers
    that found it."""

    score: float
    foundBy: tuple[str, ...]


class SearchPage(msgspec.Struct, frozen=True, kw_only=True):
    entries: tuple[SearchHitView, ...]
    version: int


class LogPage(msgspec.Struct, frozen=True, kw_only=True):
    changes: tuple[LogRow, ...]
    version: int


class Context(msgspec.Struct, frozen=True, kw_only=True):
    """What `context(reader, limit)` gives a model (ENR-5, ENR-7)."""

    text: str
    entries: tuple[str, ...]
    hasEntries: bool
