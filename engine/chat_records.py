"""What a shard returns about a chat: its items, turns, confessions, enrichments and learning
jobs. Plain values (the shard's chat store seals and stores them; the gateway serialises them),
so that the storage layer and the actors' contracts share them without either importing the
other.
"""

from __future__ import annotations

import msgspec


class Communication(msgspec.Struct, frozen=True, kw_only=True):
    """UI-1: how a real delivery between bots is shown (never derived from wording)."""

    direction: str  # received | sent
    peer: str  # the other bot's id
    body: str
    name: str | None = None  # the peer's name and avatar, filled in by the gateway
    avatar: str | None = None


class ItemView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: str
    author: str
    text: str
    at: int
    turn: str | None = None
    communication: Communication | None = None


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    chat: str
    operator: str  # the person the turn acts for (LRN-6): never parsed from an author field
    status: str  # running | done | failed
    at: int
    rounds: int = 1
    error: str | None = None
    # Delivery-goal turns (WS-6): delivering → delivered → accepted | rejected.
    goal: str | None = None
    verdict_by: str | None = None
    verdict_note: str | None = None


class Confession(msgspec.Struct, frozen=True, kw_only=True):
    turn: str
    text: str
    answer: str
    calm: bool
    at: int


class Enrichment(msgspec.Struct, frozen=True, kw_only=True):
    turn: str
    text: str
    original: str
    entries: list[str]
    at: int


class AttemptRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What a listing shows of one recorded model attempt (its sealed request and answer stay
    in the call log)."""

    step: int
    attempt: int
    at: int
    outcome: str  # answered | failed
    error: str | None = None
    costMicros: int | None = None


class LearningJob(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    pool: str
    chat: str
    turn: str
    upto: int  # learn from items with seq <= upto
    org: str
    grant: str  # the audience of the turn: for:person:<operator> | for:channel:<c>
    channel: str | None = None
    model: str | None = None
    status: str = "pending"  # pending | running | done | failed | waiting | deferred
    attempts: int = 0
    error: str | None = None
    created_at: int = 0
    updated_at: int = 0
    # Why each refused proposal was refused ("learn_fact: item … is not in the evidence").
    rejections: tuple[str, ...] = ()
    wake_at: int | None = None  # a job waiting for budget runs again at this time (MB-3)
    # Filled in for listings from the call log (LRN-4); never stored with the job.
    attemptRecords: list[AttemptRecord] = []
