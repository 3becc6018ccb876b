"""Workspace memory in three scopes (SC-1..SC-4, FS-2): records, extraction, forgetting.

A record (`WorkspaceEntry`) lives in one pool: `bot:<botId>` (the bot itself), `user:<accountId>`
(every bot of the account) or `project:<projectId>` (the project's members). Shared pools hold one
record per contributing bot, and the rules below keep contributions from overwriting each other:

- the memory bot changes only its own bot's contributions, and never a record a person wrote or
  edited (`protected`);
- a contribution on a topic another bot already contributed to is kept beside it, and both are
  flagged `review`, never merged or overwritten;
- a user-scope fact quotes the user's own words from a cited item;
- forgetting and manual revision leave a `ForgetBarrier` (the old content's fingerprint and old
  evidence markers). A later extraction is refused when its fingerprint matches a barrier, or when
  it cites an item a barrier cites: a fingerprint alone misses a reworded fact, the evidence does
  not, so an old extraction job cannot bring a forgotten fact back (SC-3).

Content is stored encrypted elsewhere, so records carry only a fingerprint of it; functions that
need the text take it (or a dict id → text) as an argument. Everything here is pure: the caller
passes the time and new ids, and stores what comes back.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Container, Iterable, Mapping, Sequence

import msgspec

from engine import tags as tagmod
from engine.errors import Conflict, InvalidInput
from engine.fingerprints import content_fingerprint
from engine.memory_entries import Scope, Tier
from engine.numbers import RevisionNumber
from engine.prompt_budget import ScopedEntry

MAX_CONTENT_CHARS = 2_000  # one fact, as for learned facts
MAX_TOPICS = 16
MIN_QUOTE_CHARS = 4  # shorter quotes ("I", "ok") would let any content pass as the user's words


class WorkspaceStatus(enum.StrEnum):
    ACTIVE = "active"
    FORGOTTEN = "forgotten"


class Origin(enum.StrEnum):
    """FS-2's `explicit/` (a person wrote it) and `synthesized/` (extracted) markers."""

    EXPLICIT = "explicit"
    SYNTHESIZED = "synthesized"


class WorkspaceEntry(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One memory record without its content. New fields get defaults (stored rows stay readable).

    `evidence` holds `"<chat>/<item>"` markers of the items it was extracted from. `revision`
    counts changes of content, tier, topics and status (what `expectedRevision` guards); the
    `review` flag is server bookkeeping and does not move it, so a client's open draft stays valid.
    """

    id: str
    scope: Scope
    pool: str
    contributor: str  # the bot the record is stored under (FS-1 `agents/<contributorBotId>`)
    tier: Tier
    content_fp: str
    created_at: int
    updated_at: int
    topics: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    protected: bool = False
    review: bool = False
    status: WorkspaceStatus = WorkspaceStatus.ACTIVE
    origin: Origin = Origin.SYNTHESIZED
    revision: int = 1
    # System tags of a bot-scope record (`from:`, `for:bot`, `org:`): who may read it as part of
    # the bot's one memory (engine/memory_union.py). Empty for user and project scope.
    tags: tuple[str, ...] = ()
    # The conversation the record is a turn of and its place there ("": none): its keyword
    # context comes from the thread's neighbours in that order (engine/write_context.py).
    thread: str = ""
    position: int = 0


class ForgetBarrier(msgspec.Struct, frozen=True, kw_only=True):
    """What a forgotten or revised record looked like, so extraction cannot restore it (SC-3)."""

    pool: str
    fingerprint: str
    evidence: tuple[str, ...]
    at: int
    entry: str = ""
    reason: str = "forgotten"  # forgotten | revised


class Revision(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `GET /memories/:id/revisions` (FS-2 `revisions/`): content before and after.

    `before`/`after` are plaintext here and stored encrypted by the caller; None means there was
    no content on that side (creation, forgetting).
    """

    entry: str
    revision: int
    operator: str  # a user id for people, a bot id for extraction
    at: int
    change: str  # created | extracted | updated | edited | forgotten
    before: str | None = None
    after: str | None = None


class SourceItem(msgspec.Struct, frozen=True, kw_only=True):
    """One item of the turn's evidence, as the caller read it from the chat."""

    chat: str
    item: str
    kind: str  # person | bot | notification | tool_result | delivery
    author: str
    text: str

    @property
    def marker(self) -> str:
        return marker(self.chat, self.item)


class Extraction(msgspec.Struct, frozen=True, kw_only=True):
    """One fact the memory bot proposes for `pool`, on behalf of bot `contributor`.

    `replaces` names one of the contributor's own records to update instead of adding one.
    `quote` (user scope) is the user's words; without it the whole content must be their words.
    """

    pool: str
    contributor: str
    content: str
    evidence: tuple[str, ...]
    tier: Tier = Tier.LOG
    topics: tuple[str, ...] = ()
    quote: str | None = None
    replaces: str | None = None


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """What one extraction does. `outcome`:

    - `created`: insert `entry` with `content`;
    - `updated`: store `entry` (one of the contributor's records) with its new `content`;
    - `duplicate`: nothing to store, the pool already says this;
    - `refused`: nothing to store; `code` and `reason` say why.

    `flagged` are other records newly marked `review` (metadata only: content, revision and update
    time stay), to be stored as well.
    """

    outcome: str
    code: str = ""
    reason: str = ""
    entry: WorkspaceEntry | None = None
    content: str | None = None
    flagged: tuple[WorkspaceEntry, ...] = ()
    revision: Revision | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome in ("created", "updated")


class Edit(msgspec.Struct, frozen=True, kw_only=True):
    """A person's change or forgetting: the record's new state, and what to keep about the old."""

    entry: WorkspaceEntry
    revision: Revision | None = None
    barrier: ForgetBarrier | None = None


# --- pools and markers ----------------------------------------------------------------------------


def marker(chat: str, item: str) -> str:
    return f"{chat}/{item}"


def pool_of(scope: Scope | str, *, bot: str, account: str, project: str | None = None) -> str:
    """The pool a scope means for a bot of `account` (in `project`, for project scope)."""
    scope = scope if type(scope) is Scope else Scope(scope)  # (an enum call costs a write more)
    if scope == Scope.BOT:
        return f"bot:{bot}"
    if scope == Scope.USER:
        return f"user:{account}"
    if not project:
        raise InvalidInput("project scope needs a project", code="project_required")
    return f"project:{project}"


_SCOPE_OF = {"bot": Scope.BOT, "user": Scope.USER, "project": Scope.PROJECT}


@functools.lru_cache(maxsize=8192)  # many times a write, for a few pools (errors: not cached)
def scope_of(pool: str) -> Scope:
    kind, sep, rest = pool.partition(":")
    scope = _SCOPE_OF.get(kind)  # a dict, not `Scope(kind)`: this runs many times a write
    if not sep or not rest or scope is None:
        raise InvalidInput(f"{pool!r} is not a workspace pool", code="invalid_pool")
    return scope


@functools.lru_cache(maxsize=8192)
def pool_owner(pool: str) -> str:
    """The bot, account or project id a pool belongs to."""
    scope_of(pool)
    return pool.partition(":")[2]


def may_access(pool: str, *, account: str, bots: Container[str], projects: Container[str]) -> bool:
    """Whether the signed-in `account` reads/writes `pool`: a bot it uses, its own user pool, a
    project it is a member of. For `merge_hits`' `allowed` and the memory routes."""
    scope, owner = scope_of(pool), pool_owner(pool)
    if scope == Scope.BOT:
        return owner in bots
    if scope == Scope.USER:
        return owner == account
    return owner in projects


# --- content --------------------------------------------------------------------------------------

_WS = re.compile(r"\s+")


def _squash(text: str) -> str:
    return _WS.sub(" ", text).strip()


def quote_ok(content_quote: str, source_text: str) -> bool:
    """The quote appears word for word in the source item (runs of whitespace count as one)."""
    quote = _squash(content_quote)
    return bool(quote) and quote in _squash(source_text)


def validate_content(content: object) -> str:
    if not isinstance(content, str) or not content.strip():
        raise InvalidInput("content must be a non-empty string", code="invalid_content")
    if len(content) > MAX_CONTENT_CHARS:
        raise InvalidInput(
            f"content is over {MAX_CONTENT_CHARS} characters", code="content_too_long"
        )
    return content


MAX_THREAD = 200
_POSITION_MAX = 2**62


def validate_thread(thread: str | None) -> str:
    if thread is None:
        return ""
    if not thread.strip() or len(thread) > MAX_THREAD:
        raise InvalidInput(f"a thread is 1-{MAX_THREAD} characters", code="invalid_thread")
    return thread


def validate_position(position: int) -> int:
    if not -_POSITION_MAX <= position <= _POSITION_MAX:
        raise InvalidInput("position out of range", code="invalid_position")
    return position


def validate_topics(topics: Iterable[str]) -> tuple[str, ...]:
    clean = tagmod.validate_topics(topics)
    if len(clean) > MAX_TOPICS:
        raise InvalidInput(f"at most {MAX_TOPICS} topics", code="too_many_tags")
    return clean


# --- extraction (the memory bot) ------------------------------------------------------------------


class _Refuse(Exception):
    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def blocked_by(
    pool: str, fingerprint: str, evidence: Iterable[str], barriers: Iterable[ForgetBarrier]
) -> ForgetBarrier | None:
    """The first barrier of `pool` that the fingerprint or any evidence marker hits."""
    cited = set(evidence)
    for barrier in barriers:
        if barrier.pool != pool:
            continue
        if barrier.fingerprint == fingerprint or cited.intersection(barrier.evidence):
            return barrier
    return None


def _check_quote(proposal: Extraction, sources: Mapping[str, SourceItem]) -> None:
    account = pool_owner(proposal.pool)
    quote = _squash(proposal.quote if proposal.quote is not None else proposal.content)
    said = [
        sources[m].text
        for m in proposal.evidence
        if sources[m].kind == "person" and sources[m].author == account
    ]
    if not said:
        raise _Refuse("not_users_words", "user memory needs an item the user said")
    if not any(quote_ok(quote, text) for text in said):
        raise _Refuse("not_users_words", "the quote is not the user's own words")
    if len(quote.replace(" ", "")) < MIN_QUOTE_CHARS and quote not in map(_squash, said):
        raise _Refuse(
            "not_users_words",
            f"a quote needs {MIN_QUOTE_CHARS} characters or the user's whole message",
        )
    if quote not in _squash(proposal.content):
        raise _Refuse("not_users_words", "user memory must quote the user's words in its content")


def propose_extraction(
    entries: Mapping[str, WorkspaceEntry],
    proposal: Extraction,
    barriers: Iterable[ForgetBarrier],
    now: int,
    new_id: Callable[[], str],
    *,
    sources: Mapping[str, SourceItem],
    contents: Mapping[str, str] | None = None,
    key: bytes = b"",
) -> Decision:
    """Whether one proposed fact is stored, and how. Never raises for a bad proposal: a background
    job records the refusal and goes on with the next one.

    `entries` are the pool's records (others are ignored), `sources` the turn's evidence by marker,
    `contents` the current text of records (only for the `before` of an update's revision).
    Refused (`code`) when the proposal is malformed (`invalid`); cites items not in the evidence
    or no person's words at all (`no_evidence`, LRN-9: bot words alone never become memory); puts
    bot memory in another bot's pool (`not_own_pool`); lacks the user's own words in user scope
    (`not_users_words`); hits a forget barrier (`forgotten`); or `replaces` a record that is
    missing (`not_found`), another bot's (`not_yours`), protected (`protected`) or forgotten
    (`not_active`). An active record with the same fingerprint makes it a `duplicate`.

    A record sharing a topic with it that is another bot's contribution, or a person's (protected),
    is kept as it is, and both are flagged `review` (SC-2).
    """
    try:
        return _propose(entries, proposal, barriers, now, new_id, sources, contents or {}, key)
    except _Refuse as e:
        return Decision(outcome="refused", code=e.code, reason=e.reason)


def _propose(entries, proposal, barriers, now, new_id, sources, contents, key) -> Decision:
    try:
        scope = scope_of(proposal.pool)
        content = validate_content(proposal.content)
        topics = validate_topics(proposal.topics)
        tier = Tier(proposal.tier)
    except (InvalidInput, ValueError) as e:
        raise _Refuse("invalid", f"invalid proposal: {e}") from e
    evidence = tuple(dict.fromkeys(proposal.evidence))
    unknown = [m for m in evidence if m not in sources]
    if unknown:
        raise _Refuse("no_evidence", f"evidence not in this turn: {', '.join(unknown)}")
    if not any(sources[m].kind == "person" for m in evidence):
        raise _Refuse("no_evidence", "a fact needs at least one item a person said")
    if scope == Scope.BOT and pool_owner(proposal.pool) != proposal.contributor:
        raise _Refuse("not_own_pool", "a bot keeps bot memory only in its own pool")
    if scope == Scope.USER:
        _check_quote(proposal, sources)
    fp = content_fingerprint(content, key)
    barrier = blocked_by(proposal.pool, fp, evidence, barriers)
    if barrier is not None:
        raise _Refuse("forgotten", f"matches what was {barrier.reason} from {barrier.entry}")
    pool_entries = [e for e in entries.values() if e.pool == proposal.pool]
    dup = next(
        (e for e in pool_entries if e.status == WorkspaceStatus.ACTIVE and e.content_fp == fp), None
    )
    if dup is not None:
        return Decision(outcome="duplicate", code="duplicate", reason=f"same as {dup.id}")

    if proposal.replaces is not None:
        old = entries.get(proposal.replaces)
        if old is None or old.pool != proposal.pool:
            raise _Refuse("not_found", f"no record {proposal.replaces} in this pool")
        if old.contributor != proposal.contributor:
            raise _Refuse("not_yours", "a bot can only change its own contributions")
        if old.protected:
            raise _Refuse("protected", "a person wrote or edited this record")
        if old.status != WorkspaceStatus.ACTIVE:
            raise _Refuse("not_active", "a forgotten record is not brought back")
        record = msgspec.structs.replace(
            old,
            tier=tier,
            topics=topics,
            content_fp=fp,
            evidence=tuple(dict.fromkeys((*old.evidence, *evidence))),
            revision=old.revision + 1,
            updated_at=now,
        )
        outcome, change = "updated", "updated"
    else:
        fresh = new_id()
        if fresh in entries:
            # Storing it would silently replace someone's record: the caller's ids are broken.
            raise Conflict(f"new id {fresh!r} is already taken", code="id_taken")
        record = WorkspaceEntry(
            id=fresh,
            scope=scope,
            pool=proposal.pool,
            contributor=proposal.contributor,
            tier=tier,
            topics=topics,
            content_fp=fp,
            evidence=evidence,
            created_at=now,
            updated_at=now,
        )
        outcome, change = "created", "extracted"

    rivals = [e for e in pool_entries if _rivals(e, record)]
    if rivals:
        record = msgspec.structs.replace(record, review=True)
    rev = Revision(
        entry=record.id,
        revision=record.revision,
        operator=proposal.contributor,
        at=now,
        change=change,
        before=contents.get(record.id) if outcome == "updated" else None,
        after=content,
    )
    return Decision(
        outcome=outcome,
        entry=record,
        content=content,
        flagged=tuple(msgspec.structs.replace(e, review=True) for e in rivals if not e.review),
        revision=rev,
    )


def propose_all(
    entries: Mapping[str, WorkspaceEntry],
    proposals: Iterable[Extraction],
    barriers: Sequence[ForgetBarrier],
    now: int,
    new_id: Callable[[], str],
    *,
    sources: Mapping[str, SourceItem],
    contents: Mapping[str, str] | None = None,
    key: bytes = b"",
) -> tuple[list[Decision], dict[str, WorkspaceEntry], dict[str, str]]:
    """Each proposal checked against the state the earlier ones left (one job's calls in order).

    Returns the decisions, and the records and contents to store (new or changed), by id.
    """
    state = dict(entries)
    text = dict(contents or {})
    records: dict[str, WorkspaceEntry] = {}
    changed_text: dict[str, str] = {}
    decisions = []
    for proposal in proposals:
        d = propose_extraction(
            state, proposal, barriers, now, new_id, sources=sources, contents=text, key=key
        )
        decisions.append(d)
        for e in d.flagged:
            state[e.id] = records[e.id] = e
        if d.entry is not None and d.content is not None:
            state[d.entry.id] = records[d.entry.id] = d.entry
            text[d.entry.id] = changed_text[d.entry.id] = d.content
    return decisions, records, changed_text


# --- people's changes -----------------------------------------------------------------------------


class WorkspaceMemoryCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /api/app/workspace/memories` without `id` (docs/design.md §9)."""

    requestId: str
    scope: Scope
    bot: str
    content: str
    project: str | None = None
    tier: Tier = Tier.PROFILE
    topics: list[str] = []
    # The conversation this is a turn of and its place in it (any increasing number: a
    # message's sequence number or time); without `position`, the write's time.
    thread: str | None = None
    position: int | None = None


class WorkspaceMemoryChange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /api/app/workspace/memories` with `id` and `expectedRevision`; absent fields stay."""

    requestId: str
    id: str
    expectedRevision: RevisionNumber
    content: str | None = None
    tier: Tier | None = None
    topics: list[str] | None = None


class WorkspaceForget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /api/app/workspace/memories/forget`."""

    requestId: str
    id: str
    expectedRevision: RevisionNumber


class WorkspaceEntryView(msgspec.Struct, frozen=True, kw_only=True):
    """The public record format: source (contributor, evidence), update time, revision (SC-2)."""

    id: str
    scope: Scope
    pool: str
    contributor: str
    tier: Tier
    topics: tuple[str, ...]
    content: str
    evidence: tuple[str, ...]
    origin: Origin
    protected: bool
    review: bool
    status: WorkspaceStatus
    revision: int
    createdAt: int
    updatedAt: int
    # In the bot's one memory (engine/memory_union.py): its entry layer and its tags.
    layer: str | None = None
    tags: tuple[str, ...] = ()


def view(entry: WorkspaceEntry, content: str) -> WorkspaceEntryView:
    return WorkspaceEntryView(
        id=entry.id,
        scope=entry.scope,
        pool=entry.pool,
        contributor=entry.contributor,
        tier=entry.tier,
        topics=entry.topics,
        content=content,
        evidence=entry.evidence,
        origin=entry.origin,
        protected=entry.protected,
        review=entry.review,
        status=entry.status,
        revision=entry.revision,
        createdAt=entry.created_at,
        updatedAt=entry.updated_at,
        layer="pinned" if entry.scope == Scope.BOT else None,
        tags=(*entry.tags, *entry.topics) if entry.scope == Scope.BOT else (),
    )


def _expect(entry: WorkspaceEntry, expected_revision: int) -> None:
    if expected_revision != entry.revision:
        raise Conflict(
            f"the record is at revision {entry.revision}, not {expected_revision}",
            code="stale_revision",
            details={"currentRevision": entry.revision},
        )


def user_create(
    *,
    entry_id: str,
    pool: str,
    contributor: str,
    content: str,
    operator: str,
    now: int,
    tier: Tier | str = Tier.PROFILE,
    topics: Iterable[str] = (),
    key: bytes = b"",
    tags: tuple[str, ...] = (),
    thread: str | None = None,
    position: int | None = None,
) -> Edit:
    """A record a person writes: explicit, and protected from the memory bot from the start.

    It is stored under `contributor`, the bot the person wrote it through (FS-1). Barriers do not
    apply: a person may say again what they once had forgotten.
    """
    record = WorkspaceEntry(
        id=entry_id,
        scope=scope_of(pool),
        pool=pool,
        contributor=contributor,
        tier=tier if type(tier) is Tier else Tier(tier),
        topics=validate_topics(topics),
        content_fp=content_fingerprint(validate_content(content), key),
        protected=True,
        origin=Origin.EXPLICIT,
        created_at=now,
        updated_at=now,
        tags=tags,
        thread=validate_thread(thread),
        position=now if position is None else validate_position(position),
    )
    rev = Revision(
        entry=entry_id, revision=1, operator=operator, at=now, change="created", after=content
    )
    return Edit(entry=record, revision=rev)


def user_edit(
    entry: WorkspaceEntry,
    new_content: str | None,
    expected_revision: int,
    *,
    operator: str,
    old_content: str,
    now: int,
    tier: Tier | str | None = None,
    topics: Iterable[str] | None = None,
    key: bytes = b"",
) -> Edit:
    """A person's revision: the record becomes protected and reviewed, revision + 1 (SC-2, SC-3).

    When the content changes, the old content's fingerprint and the old evidence become a barrier,
    so the extraction that produced the old wording cannot put it back. A stale
    `expected_revision` raises Conflict and changes nothing; so does editing a forgotten record.
    A change that changes nothing returns the record as it is.
    """
    _expect(entry, expected_revision)
    if entry.status != WorkspaceStatus.ACTIVE:
        raise Conflict("a forgotten record cannot be edited", code="forgotten")
    content = old_content if new_content is None else validate_content(new_content)
    new_tier = entry.tier if tier is None else Tier(tier)
    new_topics = entry.topics if topics is None else validate_topics(topics)
    fp = content_fingerprint(content, key)
    if content == old_content and (new_tier, new_topics) == (entry.tier, entry.topics):
        return Edit(entry=entry)
    record = msgspec.structs.replace(
        entry,
        tier=new_tier,
        topics=new_topics,
        content_fp=fp,
        protected=True,
        review=False,  # the person has looked at it; see `settled_reviews` for the rival
        revision=entry.revision + 1,
        updated_at=now,
    )
    barrier = None
    if fp != entry.content_fp:  # a new spelling of the same words leaves nothing to keep out
        barrier = ForgetBarrier(
            pool=entry.pool,
            fingerprint=entry.content_fp,
            evidence=entry.evidence,
            at=now,
            entry=entry.id,
            reason="revised",
        )
    rev = Revision(
        entry=entry.id,
        revision=record.revision,
        operator=operator,
        at=now,
        change="edited",
        before=old_content,
        after=content,
    )
    return Edit(entry=record, revision=rev, barrier=barrier)


def forget(
    entry: WorkspaceEntry,
    expected_revision: int,
    *,
    operator: str,
    old_content: str,
    now: int,
) -> Edit:
    """Forget a record: status `forgotten`, revision + 1, and a barrier from its fingerprint and
    evidence. The chat it came from is untouched (SC-3). Forgetting it again changes nothing."""
    _expect(entry, expected_revision)
    if entry.status == WorkspaceStatus.FORGOTTEN:
        return Edit(entry=entry)
    record = msgspec.structs.replace(
        entry,
        status=WorkspaceStatus.FORGOTTEN,
        review=False,  # nothing left to review on it; its rival may settle (`settled_reviews`)
        revision=entry.revision + 1,
        updated_at=now,
    )
    barrier = ForgetBarrier(
        pool=entry.pool,
        fingerprint=entry.content_fp,
        evidence=entry.evidence,
        at=now,
        entry=entry.id,
        reason="forgotten",
    )
    rev = Revision(
        entry=entry.id,
        revision=record.revision,
        operator=operator,
        at=now,
        change="forgotten",
        before=old_content,
    )
    return Edit(entry=record, revision=rev, barrier=barrier)


def _rivals(a: WorkspaceEntry, b: WorkspaceEntry) -> bool:
    # A person's record counts as another contribution even under the same bot: the memory bot
    # must not quietly contradict what someone wrote by hand.
    return (
        a.id != b.id
        and a.pool == b.pool
        and a.status == b.status == WorkspaceStatus.ACTIVE
        and (a.contributor != b.contributor or a.protected or b.protected)
        and bool(set(a.topics).intersection(b.topics))
    )


def settled_reviews(entries: Mapping[str, WorkspaceEntry]) -> list[WorkspaceEntry]:
    """Records flagged `review` that no longer have an active rival (the other one was forgotten,
    edited onto another topic, or changed hands), with the flag cleared, to store after a change.
    """
    active = [e for e in entries.values() if e.status == WorkspaceStatus.ACTIVE]
    return [
        msgspec.structs.replace(e, review=False)
        for e in active
        if e.review and not any(_rivals(e, other) for other in active)
    ]


def source_marker(entry: WorkspaceEntry) -> str:
    """The source shown with a record in a prompt (SC-5): the pool, and the contributing bot when
    the pool is shared."""
    if entry.pool == f"bot:{entry.contributor}":
        return entry.pool
    return f"{entry.pool} · {entry.contributor}"


def to_scoped(entry: WorkspaceEntry, content: str) -> ScopedEntry:
    """The record as SC-5's prompt packing takes it."""
    return ScopedEntry(
        id=entry.id,
        scope=entry.scope.value,
        tier=entry.tier.value,
        content=content,
        updated_at=entry.updated_at,
        source=source_marker(entry),
    )
