"""Requests to widen an entry's visibility (ACL-4): they pass every source's rule or fail.

A request names an entry and one grant tag to add (`for:person:<u>`, `for:channel:<c>`,
`for:bot`). It is accepted only when every reader the new grant admits is admitted by the rule of
every source of the entry, so the entry can never reach someone who cannot see where it came
from. No reason, model instruction or bot ownership enters the check: it reads tags, sources and
access proofs only (ACL-8), never the content and never who owns the bot.

A grant is within another only when they are equal: `for:person:<u>` is not within
`for:channel:<c>` even when u is a member (u reads the bot outside the channel too, where the
channel's rule does not admit them), and nothing but `for:bot` is within `for:bot` (a person
named by a grant need not use the bot). The source rules:

- a `fact`: every source item needs a stored access proof (ACL-5), and the grant must be in the
  audience of every proof of every item; a missing proof refuses (ACL-11: never widened);
- an `observation`: every source entry, recursively, must pass for the grant, and be active
  (ACL-10); a missing source or a cycle refuses (ACL-6);
- a `pinned` entry has no sources: its rule is its own. It is a person's: only that person
  (`from:<u>`) may share it, and a memory bot never can.

The entry must be active; its `org:` stays. With access proofs stored per source, a fact or an
observation is in any case never shown to a reader its sources do not admit (engine/visibility.py);
the check keeps a widened entry's tags from claiming an audience its sources do not have, and is
the only gate for pinned entries.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from engine import tags as tagmod
from engine.errors import Conflict, InvalidInput
from engine.memory_entries import EntryMeta, Layer, Status

GRANT_KINDS = ("for:person", "for:channel", "for:bot")


def check_grant(grant: object) -> str:
    """A grant tag a request may add; anything else is bad input."""
    kind = tagmod.system_kind(grant) if isinstance(grant, str) else None
    if kind not in GRANT_KINDS:
        raise InvalidInput(
            "to must be one grant tag: for:person:<id>, for:channel:<id> or for:bot",
            code="invalid_grant",
        )
    assert isinstance(grant, str)
    return grant


def refused(reason: str) -> Conflict:
    return Conflict(f"the entry's visibility cannot be widened: {reason}", code="widen_refused")


def passes(
    entries: Mapping[str, EntryMeta],
    entry_id: str,
    grant: str,
    *,
    requester: str | None,
) -> str | None:
    """None when adding `grant` to the entry passes every source's rule, else why not.

    `requester` is the person asking (None for the memory bot): it matters only for pinned
    entries, whose source is the person who pinned them."""
    on_path: set[str] = set()
    memo: dict[str, str | None] = {}

    def check(eid: str, top: bool) -> str | None:
        if eid in memo:
            return memo[eid]
        if eid in on_path:
            return "a cycle in the sources"
        entry = entries.get(eid)
        if entry is None:
            return f"source {eid} is missing"
        if entry.status != Status.ACTIVE:
            return f"{'the entry' if top else f'source {eid}'} is not active"
        if entry.layer == Layer.PINNED:
            authors = {t[5:] for t in entry.tags if t.startswith("from:")}
            if grant in tagmod.grants_of(entry.tags):
                why = None
            elif top and requester is not None and entry.sources == () and authors == {requester}:
                why = None  # the person who pinned it shares it
            else:
                why = f"{eid} is a person's pinned entry"
        elif entry.layer == Layer.FACT:
            why = _fact(entry, grant)
        else:
            if not entry.sources or not all(s.is_entry for s in entry.sources):
                why = f"{eid} has no entry sources"
            else:
                on_path.add(eid)
                why = next(
                    (w for s in entry.sources if (w := check(s.entry, False)) is not None),  # type: ignore[arg-type]
                    None,
                )
                on_path.discard(eid)
                if why is None and any(
                    entries[s.entry].pool != entry.pool  # type: ignore[index]
                    for s in entry.sources
                ):
                    why = f"{eid} rests on another pool"
        memo[eid] = why
        return why

    return check(entry_id, True)


def _fact(entry: EntryMeta, grant: str) -> str | None:
    if not entry.sources:
        return f"{entry.id} has no sources"
    for source in entry.sources:
        if not source.is_item:
            return f"{entry.id} has a source that is not an item"
        proofs = [p for p in entry.proofs if (p.chat, p.item) == (source.chat, source.item)]
        if not proofs:
            return f"item {source.chat}/{source.item} has no access proof"
        for proof in proofs:
            if grant not in proof.audience:
                return f"item {source.chat}/{source.item} is not for {grant}"
    return None


def widen(
    entries: Mapping[str, EntryMeta],
    entry_id: str,
    grant: str,
    *,
    requester: str | None,
    now: int,
) -> EntryMeta | None:
    """The entry with `grant` added (tags only: content untouched, LRN-8), None when it already
    has it; raises Conflict (`widen_refused`) when a source's rule refuses."""
    grant = check_grant(grant)
    why = passes(entries, entry_id, grant, requester=requester)
    if why is not None:
        raise refused(why)
    entry = entries[entry_id]
    if grant in entry.tags:
        return None
    return msgspec.structs.replace(
        entry, tags=(*entry.tags, grant), updated_at=now, revision=entry.revision + 1
    )
