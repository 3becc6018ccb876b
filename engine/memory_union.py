"""One memory per bot (MEM-1, SC-1): one model of a bot's entries, and its two views.

Pool `bot:<id>` keeps its entries in two tables of the shard's file, because they are
written by two different machineries with different bookkeeping:

- `memory_entries`: what the memory bot learned (facts, observations) and what a person
  pinned with Remember, with tags, sources and access proofs (`EntryMeta`);
- `ws_entries` with pool `bot:<id>`: records a person wrote (or a file tree imported)
  through the workspace API, with revisions, forget barriers and review flags (`WorkspaceEntry`).

They are one memory: every reader of a bot's memory reads the union, under one rule. Every entry
of the union has an `EntryMeta`: a memory entry its own, a workspace record the one `as_meta`
derives from it: layer `pinned` (a person asked for it to be kept; pinned entries keep their own
access rule, ACL-11), its stored system tags plus its topics, status `active` (or `retracted`
once forgotten), tier, contributor and revision as stored. engine/visibility.py then decides over
the union, so a workspace record is seen exactly by whom its tags admit, and an observation may
rest on one.

The system tags of a workspace bot record (decided here, set by the server only):
`from:<writer>`, `for:bot`, `org:<the bot's home org>` (`record_tags`): users of the bot in the
bot's org read these records, never users of it in another org. Records stored without these
tags get them from migration 7, which stamps `from:` (the first revision's
operator) and `for:bot` on them, and the shard adds `org:` from the bot's directory record when it
loads the pool (the directory lives in another file); without a bot record they stay hidden.

The views, all built from the union and the reader's visibility:

- the bot memory API (`GET /v1/bots/:id/memory`, context and enrichment, `hasEntries`, references,
  search, learning context): a workspace record appears as a pinned entry (`as_entry_view`);
- the workspace API (`GET /api/app/workspace/memories?scope=bot`, its search, the Markdown export):
  a memory entry appears as a record (`as_record_view`) with its evidence markers, `origin`
  synthesized (explicit when pinned), status `forgotten` once invalidated or retracted, its `layer`
  and its tags; it is listed only to readers the entry rule admits;
- the prompt (SC-5): the union as bot-scope `ScopedEntry`s under the step's reader.

Writes stay with their machinery: the memory bot learns bot facts into `memory_entries` (so
`workspace_extract` keeps refusing bot scope), people write records through the workspace routes.
The memory bot never changes a workspace record (pinned: no `invalidate`; a topic rename leaves
them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine import tags as tagmod
from engine.memory_entries import EntryMeta, EntryView, Layer, Reader, Scope, Status, Tier
from engine.prompt_budget import ScopedEntry
from engine.scoped_memory import Origin, WorkspaceEntry, WorkspaceEntryView, WorkspaceStatus, marker
from engine.visibility import directly_visible


def record_tags(writer: str, org: str) -> tuple[str, ...]:
    """The system tags of a workspace bot record a person writes (see the module docstring)."""
    return (tagmod.author(writer), tagmod.FOR_BOT, tagmod.org(org))


def link_tags(tags: Iterable[str], org: str | None) -> tuple[str, ...]:
    """A stored record's tags with `org:` added when it has none (records from before migration
    7); without an org it stays without one, which hides it."""
    tags = tuple(tags)
    if org is None or any(t.startswith("org:") for t in tags):
        return tags
    return (*tags, tagmod.org(org))


def as_meta(record: WorkspaceEntry) -> EntryMeta:
    """A workspace record as an entry of the bot's memory (pinned: its own access rule)."""
    return EntryMeta(
        id=record.id,
        pool=record.pool,
        layer=Layer.PINNED,
        tags=(*record.tags, *record.topics),
        created_at=record.created_at,
        updated_at=record.updated_at,
        status=Status.ACTIVE if record.status == WorkspaceStatus.ACTIVE else Status.RETRACTED,
        scope=Scope.BOT,
        tier=record.tier,
        contributor=record.contributor,
        revision=record.revision,
        protected=True,
    )


def record_visible(reader: Reader, record: WorkspaceEntry) -> bool:
    """Whether `reader` may see a workspace record of a bot pool: the one check of a record in
    the union, for every reader of a bot's memory (its listing, search and context, the
    workspace's listing, search, changes and revisions). A record is pinned (`as_meta`): its own
    tags decide, rules 1 and 2 (engine/visibility.py `directly_visible`), nothing it rests on.
    No lock needed: a record's writes replace it in one step."""
    return directly_visible(reader, as_meta(record))


def record_check(reader: Reader) -> Callable[[WorkspaceEntry], bool]:
    """`record_visible` for many records of one reader: a pool's records share a few tag sets,
    so each set is checked once. The answer is kept by the record's system tags, all that can
    decide (its topics never hold `org:` or `for:`: engine/tags.py rejects a topic with ':')."""
    memo: dict[tuple[str, ...], bool] = {}

    def visible(record: WorkspaceEntry) -> bool:
        seen = memo.get(record.tags)
        if seen is None:
            seen = memo[record.tags] = record_visible(reader, record)
        return seen

    return visible


def as_entry_view(record: WorkspaceEntry, content: str) -> EntryView:
    meta = as_meta(record)
    return EntryView(
        id=meta.id,
        layer=meta.layer,
        content=content,
        tags=meta.tags,
        sources=(),
        status=meta.status,
        createdAt=meta.created_at,
        updatedAt=meta.updated_at,
    )


def as_record_view(meta: EntryMeta, content: str, bot: str) -> WorkspaceEntryView:
    """A memory entry of bot `bot` as a workspace record."""
    return WorkspaceEntryView(
        id=meta.id,
        scope=Scope.BOT,
        pool=meta.pool,
        contributor=meta.contributor or bot,
        tier=meta.tier,
        topics=tagmod.topics_of(meta.tags),
        content=content,
        evidence=tuple(marker(s.chat, s.item) for s in meta.sources if s.is_item),  # type: ignore[arg-type]
        origin=Origin.EXPLICIT if meta.layer == Layer.PINNED else Origin.SYNTHESIZED,
        protected=meta.layer == Layer.PINNED,
        review=False,
        status=WorkspaceStatus.ACTIVE
        if meta.status == Status.ACTIVE
        else WorkspaceStatus.FORGOTTEN,
        revision=meta.revision,
        createdAt=meta.created_at,
        updatedAt=meta.updated_at,
        layer=meta.layer.value,
        tags=meta.tags,
    )


def as_scoped(meta: EntryMeta, content: str) -> ScopedEntry:
    """An entry of the bot's memory for SC-5's packing (bot scope)."""
    return ScopedEntry(
        id=meta.id,
        scope=Scope.BOT.value,
        tier=Tier(meta.tier).value,
        content=content,
        updated_at=meta.updated_at,
        source=meta.pool,
    )
