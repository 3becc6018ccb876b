"""What Remember, Forget and purge do to a pool (API-2, API-4), and what they write to its log
(API-3). Each function returns the new entry states and log rows; the caller stores them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import msgspec

from engine import tags as tagmod
from engine.errors import Conflict, InvalidInput, TooLarge
from engine.memory_entries import Change, EntryMeta, Layer, LogRow, Reader, Status, Who
from engine.visibility import Visibility

MAX_CONTENT_CHARS = 8_000
MAX_TOPICS = 16


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    """Entries to store (new state), entries to delete, and the log rows of one pool version."""

    version: int
    upserts: tuple[EntryMeta, ...] = ()
    deletes: tuple[str, ...] = ()
    log: tuple[LogRow, ...] = ()


def validate_content(content: object) -> str:
    if not isinstance(content, str) or not content.strip():
        raise InvalidInput("content must be a non-empty string", code="invalid_content")
    if len(content) > MAX_CONTENT_CHARS:
        raise TooLarge(f"content is over {MAX_CONTENT_CHARS} characters", code="content_too_long")
    return content


def remember(
    *,
    pool: str,
    entry_id: str,
    reader: Reader,
    topics: Iterable[str],
    now: int,
    version: int,
) -> Outcome:
    """A pinned entry only the caller sees: `for:person:<caller>`, `from:<caller>`, `org:<org>`
    plus the topics the caller gave. `version` is the pool's current version."""
    clean = tagmod.validate_topics(topics)
    if len(clean) > MAX_TOPICS:
        raise InvalidInput(f"at most {MAX_TOPICS} topics", code="too_many_tags")
    entry = EntryMeta(
        id=entry_id,
        pool=pool,
        layer=Layer.PINNED,
        tags=(
            tagmod.author(reader.user),
            tagmod.person(reader.user),
            tagmod.org(reader.org),
            *clean,
        ),
        created_at=now,
        updated_at=now,
    )
    new_version = version + 1
    row = LogRow(version=new_version, at=now, who=Who.PERSON, entry=entry_id, change=Change.CREATED)
    return Outcome(version=new_version, upserts=(entry,), log=(row,))


def _audience_is_only(entry: EntryMeta, user: str) -> bool:
    return set(tagmod.grants_of(entry.tags)) == {tagmod.person(user)}


def forget(
    *,
    entries: Mapping[str, EntryMeta],
    entry_id: str,
    reader: Reader,
    now: int,
    version: int,
) -> Outcome:
    """Take back the caller's part of an entry.

    Only an entry the caller may see is theirs to forget; anything else (including ids that do not
    exist, so that existence is not revealed) is a conflict. If the caller is its only person it
    becomes `retracted` and stays listed to them as history; otherwise the caller stops being one
    of its people and it stays for the others. Forgetting an already retracted entry changes
    nothing. Tags and status change; content is never touched.
    """
    entry = entries.get(entry_id)
    if entry is None or not Visibility(reader, entries).visible(entry_id):
        raise Conflict("this entry is not yours to forget", code="not_yours")
    if entry.status == Status.RETRACTED:
        return Outcome(version=version)
    new_version = version + 1
    if _audience_is_only(entry, reader.user):
        changed = msgspec.structs.replace(
            entry, status=Status.RETRACTED, updated_at=now, revision=entry.revision + 1
        )
        change = Change.RETRACTED
    else:
        changed = msgspec.structs.replace(
            entry,
            tags=tuple(t for t in entry.tags if t != tagmod.person(reader.user)),
            forgotten_by=entry.forgotten_by | {reader.user},
            updated_at=now,
            revision=entry.revision + 1,
        )
        change = Change.FORGOTTEN
    row = LogRow(version=new_version, at=now, who=Who.PERSON, entry=entry_id, change=change)
    return Outcome(version=new_version, upserts=(changed,), log=(row,))


def purge_selection(entries: Mapping[str, EntryMeta], tag: str) -> set[str]:
    """Entries carrying `tag`, plus every observation derived from them, transitively.

    Works on tags and source links only: nothing is decrypted (API-4).
    """
    tagmod.validate_purge_tag(tag)
    selected = {i for i, e in entries.items() if tag in e.tags}
    dependents: dict[str, list[str]] = {}
    for e in entries.values():
        for s in e.sources:
            if s.entry is not None:
                dependents.setdefault(s.entry, []).append(e.id)
    frontier = list(selected)
    while frontier:
        for dep in dependents.get(frontier.pop(), ()):
            if dep not in selected:
                selected.add(dep)
                frontier.append(dep)
    return selected


def purge(*, entries: Mapping[str, EntryMeta], tag: str, version: int) -> Outcome:
    """Delete the selection. The log rows of deleted entries go with them; an empty selection
    changes nothing and keeps the version."""
    selected = purge_selection(entries, tag)
    if not selected:
        return Outcome(version=version)
    return Outcome(version=version + 1, deletes=tuple(sorted(selected)))


def visible_log(
    rows: Iterable[LogRow], entries: Mapping[str, EntryMeta], reader: Reader
) -> list[LogRow]:
    """Log rows about entries the reader can see now (ACL-7), oldest first."""
    vis = Visibility(reader, entries)
    return [r for r in rows if r.entry in entries and vis.visible(r.entry)]
