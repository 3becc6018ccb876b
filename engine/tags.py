"""The tag grammar of memory entries (MEM-3, docs/design.md §4).

A tag with a `:` is a *system tag*: only the server sets it, never a model and never a caller of
the public API, because system tags decide who sees an entry. Every other tag is a *topic*:
lowercase letters, digits and dashes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable

from engine.errors import InvalidInput

TOPIC_RE = re.compile(r"^[a-z0-9-]{1,64}$")
# An id inside a system tag: the ids this engine makes plus what admins may choose.
_ID = r"[A-Za-z0-9_.\-]{1,128}"
_SYSTEM_PATTERNS = {
    "from": re.compile(rf"^from:{_ID}$"),
    "for:person": re.compile(rf"^for:person:{_ID}$"),
    "for:channel": re.compile(rf"^for:channel:{_ID}$"),
    "for:project": re.compile(rf"^for:project:{_ID}$"),
    "for:bot": re.compile(r"^for:bot$"),
    "org": re.compile(rf"^org:{_ID}$"),
    "chat": re.compile(rf"^chat:{_ID}$"),
    "channel": re.compile(rf"^channel:{_ID}$"),
    "project": re.compile(rf"^project:{_ID}$"),
    "app": re.compile(rf"^app:{_ID}$"),
}
# System tag kinds by which `purge` may select entries (API-4).
PURGE_KINDS = ("from", "chat", "org", "channel")
FOR_BOT = "for:bot"


def is_system(tag: str) -> bool:
    return ":" in tag


def is_topic(tag: str) -> bool:
    return bool(TOPIC_RE.match(tag))


def system_kind(tag: str) -> str | None:
    """The kind of a well-formed system tag (`for:person`, `org`, …), or None if malformed."""
    for kind, pattern in _SYSTEM_PATTERNS.items():
        if pattern.match(tag):
            return kind
    return None


def validate_topics(tags: Iterable[str]) -> tuple[str, ...]:
    """Topics a caller or model gave, deduplicated in order; system tags and bad topics raise."""
    out: list[str] = []
    for tag in tags:
        if not isinstance(tag, str):
            raise InvalidInput("tags must be strings", code="invalid_tag")
        if is_system(tag):
            raise InvalidInput(
                f"{tag!r} is a system tag; only the server sets tags containing ':'",
                code="system_tag_not_allowed",
            )
        if not is_topic(tag):
            raise InvalidInput(
                f"topic {tag!r} must be 1-64 characters of [a-z0-9-]", code="invalid_tag"
            )
        if tag not in out:
            out.append(tag)
    return tuple(out)


def validate_purge_tag(tag: str) -> str:
    kind = system_kind(tag) if isinstance(tag, str) else None
    if kind not in PURGE_KINDS:
        raise InvalidInput(
            "purge takes one system tag of the form from:<id>, chat:<id>, org:<id> or channel:<id>",
            code="invalid_tag",
        )
    return tag


def person(user_id: str) -> str:
    return f"for:person:{user_id}"


def channel_grant(channel_id: str) -> str:
    return f"for:channel:{channel_id}"


def org(org_id: str) -> str:
    return f"org:{org_id}"


def author(user_id: str) -> str:
    return f"from:{user_id}"


def orgs_of(tags: Iterable[str]) -> set[str]:
    return {t[4:] for t in tags if t.startswith("org:")}


def grants_of(tags: Iterable[str]) -> tuple[str, ...]:
    """The audience tags (`for:…`) among `tags`."""
    return tuple(t for t in tags if t.startswith("for:"))


def topics_of(tags: Iterable[str]) -> tuple[str, ...]:
    if isinstance(tags, tuple):
        return _topics_of(tags)
    return tuple(t for t in tags if not is_system(t))


@functools.lru_cache(maxsize=4096)
def _topics_of(tags: tuple[str, ...]) -> tuple[str, ...]:
    # A pool's entries share a few tag sets, and a turn reads their topics several times
    # (learning's topic counts walk every valid entry).
    return tuple(t for t in tags if not is_system(t))
