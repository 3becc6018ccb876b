"""What the memory bot learns from, and which of its proposals the server accepts
(docs/requirements.md §3).

The model sees evidence (the chat's items up to the source turn) and the pool's first 300 valid
entries; it proposes `learn_fact`, `learn_observation`, `invalidate` and `rename_topic` calls
(docs/design.md §6). Everything that decides visibility is set here by the server, never taken from
the model: system tags come from the turn's stored operator and the chat (LRN-6), access proofs from
the items' audience (ACL-5), an observation's audience from its sources (ACL-3). Each call is
checked on its own against the latest state; a bad call is rejected with a reason and the valid rest
still applies.
"""

from __future__ import annotations

import operator
from collections import ChainMap, Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import chain

import msgspec

from engine import tags as tagmod
from engine import widening
from engine.errors import Conflict
from engine.memory_entries import (
    AccessProof,
    EntryMeta,
    Layer,
    Scope,
    Source,
    Status,
    Tier,
)
from engine.order import in_memory_order

CONTEXT_ENTRIES = 300  # LRN-7
_TAGS = operator.attrgetter("tags")
REQUEST_LIMIT = 60_000  # SC-6: under the 65,000-character tool bridge
MAX_FACT_CHARS = 2_000

# --- what the model is shown ---------------------------------------------------------------------


class EvidenceItem(msgspec.Struct, frozen=True, kw_only=True):
    chat: str
    item: str
    kind: str  # person | bot | notification | tool_result | delivery
    author: str
    text: str


class ContextEntry(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    layer: str
    tier: str
    scope: str
    content: str
    topics: tuple[str, ...]
    status: str


class LearningRequest(msgspec.Struct, frozen=True, kw_only=True):
    evidence: list[EvidenceItem]
    # An entry may come encoded already (`msgspec.Raw` of its JSON): a reader keeps each
    # entry's form while it is unchanged, and the request is made every turn.
    entries: list[ContextEntry | msgspec.Raw]
    topics: dict[str, int]


def _fact_provable(entry: EntryMeta) -> bool:
    items = {(p.chat, p.item) for p in entry.proofs}
    return bool(entry.sources) and all(
        s.is_item and (s.chat, s.item) in items for s in entry.sources
    )


def provable(
    entries: Mapping[str, EntryMeta],
    known: dict[str, tuple[EntryMeta, bool]] | None = None,
    among: Iterable[str] | None = None,
) -> set[str]:
    """Active entries whose provenance holds for someone: facts with a proof for every item,
    observations whose sources are all provable (no cycles, nothing missing). What fails is
    left out of learning input together with what depends on it (ACL-11).

    `known`: a caller's memo of the checks that depend on the entry alone (pinned entries and
    facts), by id with the entry they were made on, kept across calls while it is the same.
    `among`: only these ids are asked about (what they rest on is still checked), not every
    entry of `entries`."""
    memo: dict[str, bool] = {}
    own = {} if known is None else known

    def check(entry_id: str, path: frozenset[str]) -> bool:
        if entry_id in memo:
            return memo[entry_id]
        entry = entries.get(entry_id)
        if entry is None or entry.status != Status.ACTIVE or entry_id in path:
            return False
        if entry.layer == Layer.PINNED:
            ok = True
        elif entry.layer == Layer.FACT:
            hit = own.get(entry_id)
            if hit is not None and hit[0] is entry:
                ok = hit[1]
            else:
                ok = _fact_provable(entry)
                own[entry_id] = (entry, ok)
        else:
            ok = bool(entry.sources) and all(
                s.is_entry and check(s.entry, path | {entry_id})  # type: ignore[arg-type]
                for s in entry.sources
            )
        memo[entry_id] = ok
        return ok

    # Observation chains are short in practice; the frozenset path keeps cycles finite.
    root = frozenset[str]()
    return {i for i in (entries if among is None else among) if check(i, root)}


def context_selection(
    entries: Mapping[str, EntryMeta],
    *,
    ordered: bool = False,
    known: dict[str, tuple[EntryMeta, bool]] | None = None,
) -> tuple[list[EntryMeta], dict[str, int]]:
    """The first 300 valid entries in memory order, and topic counts over all valid ones.
    `ordered`: `entries` iterate in memory order already (a read's usable entries); `known`:
    see `provable`."""
    ok = provable(entries, known)
    if ordered:
        valid = [m for i, m in entries.items() if i in ok]
        counts = topic_counts(valid)
        return valid[:CONTEXT_ENTRIES], counts
    valid = [entries[i] for i in ok]
    return in_memory_order(valid)[:CONTEXT_ENTRIES], topic_counts(valid)


def provable_alone(
    entry: EntryMeta, known: dict[str, tuple[EntryMeta, bool]] | None = None
) -> bool | None:
    """`provable` of one active entry when it depends on that entry alone (pinned entries,
    facts, observations that cite an item or nothing); None for an observation resting on
    other entries. `known`: as for `provable`."""
    if entry.status != Status.ACTIVE:
        return False
    if (
        entry.layer == Layer.OBSERVATION
        and entry.sources
        and all(s.is_entry for s in entry.sources)
    ):
        return None
    return bool(provable({entry.id: entry}, known, (entry.id,)))


def topic_counts(valid: Iterable[EntryMeta]) -> dict[str, int]:
    """Topic counts over valid entries (LRN-7)."""
    # Entries share a few tag sets: each set's topics are counted once, times its entries.
    counts: dict[str, int] = {}
    for tags, n in Counter(map(_TAGS, valid)).items():
        for topic in tagmod.topics_of(tags):
            counts[topic] = counts.get(topic, 0) + n
    return dict(sorted(counts.items()))


def counted_topics(topics: Iterable[tuple[str, ...]]) -> dict[str, int]:
    """`topic_counts` from each valid entry's topics (`tags.topics_of`), as a reader's kept
    view holds them: the topics are counted, not the entries' tag sets."""
    return dict(sorted(Counter(chain.from_iterable(topics)).items()))


def encoded_entry(entry: ContextEntry) -> msgspec.Raw:
    """An entry's JSON in a request (`LearningRequest.entries`), made once."""
    return msgspec.Raw(_enc.encode(entry))


def context_entry(entry: EntryMeta, content: str) -> ContextEntry:
    return ContextEntry(
        id=entry.id,
        layer=entry.layer,
        tier=entry.tier,
        scope=entry.scope,
        content=content,
        topics=tagmod.topics_of(entry.tags),
        status=entry.status,
    )


_enc = msgspec.json.Encoder()


def build_request(
    evidence: Sequence[EvidenceItem],
    entries: Sequence[ContextEntry | msgspec.Raw],
    topics: Mapping[str, int],
    *,
    limit: int = REQUEST_LIMIT,
    overhead: int = 0,
) -> tuple[str, list[EvidenceItem]]:
    """The request JSON, at most `limit - overhead` characters (SC-6), and the evidence it kept.

    Sizes are measured on the serialized JSON. Whole elements are left out, never cut: first the
    oldest entries beyond what fits, then items that are not a person's words, then the oldest
    person items. The JSON structure always stays whole.
    """
    budget = limit - overhead
    whole = _enc.encode(
        LearningRequest(evidence=list(evidence), entries=list(entries), topics=dict(topics))
    )
    # What the sizing below keeps when everything fits: all of it (each list's elements cost
    # their bytes and one comma each, one more than the commas between them).
    if len(whole) + bool(entries) + bool(evidence) <= budget:
        return whole.decode(), list(evidence)
    sizes_e = [len(_enc.encode(e)) + 1 for e in entries]
    sizes_i = [len(_enc.encode(i)) + 1 for i in evidence]
    base = len(_enc.encode(LearningRequest(evidence=[], entries=[], topics=dict(topics))))
    room = budget - base
    # Person items first, newest first; then the other items; then entries in memory order.
    order = sorted(range(len(evidence)), key=lambda k: (evidence[k].kind != "person", -k))
    keep_items: set[int] = set()
    for k in order:
        if sizes_i[k] <= room:
            keep_items.add(k)
            room -= sizes_i[k]
    keep_entries = 0
    for size in sizes_e:
        if size > room:
            break
        keep_entries += 1
        room -= size
    kept = [evidence[k] for k in sorted(keep_items)]
    request = LearningRequest(
        evidence=kept, entries=list(entries[:keep_entries]), topics=dict(topics)
    )
    text = _enc.encode(request).decode()
    if len(text) > budget:  # topics alone too large: drop them rather than exceed the bridge
        request = LearningRequest(evidence=kept, entries=list(entries[:keep_entries]), topics={})
        text = _enc.encode(request).decode()
    return text, kept


# --- what the model may propose ------------------------------------------------------------------


class ItemRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    chat: str
    item: str


class LearnFact(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    content: str
    items: list[ItemRef]
    topics: list[str] = []
    scope: str | None = None
    tier: str | None = None


class LearnObservation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    content: str
    entries: list[str]
    confidence: float
    topics: list[str] = []


class Invalidate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    entry: str


class Widen(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ask to show an entry to the turn's channel (`channel`) or everyone who uses the bot
    (`bot`); the server picks the grant tag and checks every source's rule (ACL-4)."""

    entry: str
    to: str
    reason: str = ""  # read by nobody: a reason never skips the check


class RenameTopic(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename={"from_": "from"}
):
    from_: str
    to: str


PROPOSALS: dict[str, type[msgspec.Struct]] = {
    "learn_fact": LearnFact,
    "learn_observation": LearnObservation,
    "invalidate": Invalidate,
    "rename_topic": RenameTopic,
    "widen": Widen,
}


class Audience(msgspec.Struct, frozen=True, kw_only=True):
    """Who was present at the source turn (LRN-6, ACL-2): from the operator stored with the turn
    (a direct chat) or the chat's channel (a group chat)."""

    chat: str
    org: str
    grant: str  # for:person:<operator> | for:channel:<channel>
    channel: str | None = None


class Rejected(msgspec.Struct, frozen=True, kw_only=True):
    tool: str
    reason: str


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """Accepted changes: new entries with their content, changed entries (tags or status only:
    their ciphertext is kept), and the rejected calls with reasons."""

    new: list[tuple[EntryMeta, str]] = []
    changed: list[EntryMeta] = []
    rejected: list[Rejected] = []


def decide(
    calls: Iterable[tuple[str, bytes]],
    *,
    pool: str,
    entries: Mapping[str, EntryMeta],
    evidence: Mapping[tuple[str, str], EvidenceItem],
    audience: Audience,
    now: int,
    new_ids: Iterator[str],
    contributor: str | None = None,
) -> Decision:
    """Check each proposed call (`name`, JSON arguments) against the latest state."""
    out = Decision(new=[], changed=[], rejected=[])
    # Grows with accepted entries, so later calls may build on them; an overlay, not a copy:
    # the pool may hold many thousands of entries and a call reads a few of them.
    state: ChainMap[str, EntryMeta] = ChainMap({}, entries)  # type: ignore[arg-type]
    for name, raw in calls:
        kind = PROPOSALS.get(name)
        if kind is None:
            out.rejected.append(Rejected(tool=name, reason="unknown tool"))
            continue
        try:
            call = msgspec.json.decode(raw, type=kind)
            result = _check(call, pool, state, evidence, audience, now, new_ids, contributor)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            out.rejected.append(Rejected(tool=name, reason=f"invalid arguments: {e}"))
            continue
        except _Reject as e:
            out.rejected.append(Rejected(tool=name, reason=str(e)))
            continue
        for meta, content in result[0]:
            state[meta.id] = meta
            out.new.append((meta, content))
        fresh = {m.id: k for k, (m, _) in enumerate(out.new)}
        for meta in result[1]:
            state[meta.id] = meta
            if meta.id in fresh:  # changed again before it was ever stored: store it changed
                k = fresh[meta.id]
                out.new[k] = (meta, out.new[k][1])
                continue
            out.changed[:] = [m for m in out.changed if m.id != meta.id]
            out.changed.append(meta)
    return out


class _Reject(Exception):
    pass


def _topics(raw: Sequence[str]) -> tuple[str, ...]:
    out = []
    for t in raw:
        if not isinstance(t, str) or tagmod.is_system(t) or not tagmod.is_topic(t):
            raise _Reject(f"topic {t!r} is not a topic (only [a-z0-9-], no system tags)")
        if t not in out:
            out.append(t)
    return tuple(out)


def _content(text: str) -> str:
    if not text.strip():
        raise _Reject("empty content")
    if len(text) > MAX_FACT_CHARS:
        raise _Reject(f"content over {MAX_FACT_CHARS} characters")
    return text


def _check(call, pool, state, evidence, audience, now, new_ids, contributor):
    if isinstance(call, LearnFact):
        content = _content(call.content)
        if not call.items:
            raise _Reject("a fact needs at least one item")
        authors: list[str] = []
        apps: list[str] = []
        for ref in call.items:
            item = evidence.get((ref.chat, ref.item))
            if item is None:
                raise _Reject(f"item {ref.chat}/{ref.item} is not in the evidence")
            if item.kind == "tool_result" and tagmod.system_kind(f"app:{item.author}") == "app":
                # MEM-3: an app tool's result may support what a person said (`app:<tool>`).
                if f"app:{item.author}" not in apps:
                    apps.append(f"app:{item.author}")
                continue
            if item.kind != "person":
                # LRN-9: bot words and notifications never become memory.
                raise _Reject(f"item {ref.item} is not something a person said")
            if item.author not in authors:
                authors.append(item.author)
        if not authors:
            # LRN-9: a tool result alone never becomes memory.
            raise _Reject("a fact needs at least one item a person said")
        scope = Scope(call.scope) if call.scope in ("bot", "user", "project") else Scope.BOT
        tier = Tier(call.tier) if call.tier in ("profile", "log", "note") else Tier.LOG
        system = [*(tagmod.author(a) for a in authors), audience.grant, tagmod.org(audience.org)]
        system.append(f"chat:{audience.chat}")
        if audience.channel:
            system.append(f"channel:{audience.channel}")
        system += apps
        unique = list(dict.fromkeys((r.chat, r.item) for r in call.items))
        meta = EntryMeta(
            id=next(new_ids),
            pool=pool,
            layer=Layer.FACT,
            tags=(*system, *_topics(call.topics)),
            sources=tuple(Source(chat=c, item=i) for c, i in unique),
            proofs=tuple(
                AccessProof(chat=c, item=i, org=audience.org, audience=(audience.grant,))
                for c, i in unique
            ),
            scope=scope,
            tier=tier,
            contributor=contributor,
            created_at=now,
            updated_at=now,
        )
        return [(meta, content)], []
    if isinstance(call, LearnObservation):
        content = _content(call.content)
        if not 0.0 <= call.confidence <= 1.0:
            raise _Reject("confidence must be in [0, 1]")
        if not call.entries:
            raise _Reject("an observation needs at least one source entry")
        valid = provable(state, among=call.entries)  # its sources, not the whole pool
        grants: list[str] = []
        orgs: set[str] = set()
        inherited: list[str] = []
        for source_id in dict.fromkeys(call.entries):
            source = state.get(source_id)
            if source is None or source_id not in valid:
                raise _Reject(f"source {source_id} is missing, inactive or unprovable")
            orgs |= tagmod.orgs_of(source.tags)
            for g in tagmod.grants_of(source.tags):
                if g not in grants:
                    grants.append(g)
            for t in source.tags:
                if t.split(":", 1)[0] in ("from", "chat", "channel", "app") and t not in inherited:
                    inherited.append(t)  # so that purging a source's tag takes this too (API-4)
        if len(orgs) != 1:
            raise _Reject("sources come from different orgs")
        meta = EntryMeta(
            id=next(new_ids),
            pool=pool,
            layer=Layer.OBSERVATION,
            tags=(*grants, tagmod.org(orgs.pop()), *inherited, *_topics(call.topics)),
            sources=tuple(Source(entry=e) for e in dict.fromkeys(call.entries)),
            confidence=call.confidence,
            contributor=contributor,
            created_at=now,
            updated_at=now,
        )
        return [(meta, content)], []
    if isinstance(call, Invalidate):
        entry = state.get(call.entry)
        if entry is None or entry.status != Status.ACTIVE or entry.layer == Layer.PINNED:
            # Pinned entries are a person's; only that person takes them back (API-2).
            raise _Reject(f"entry {call.entry} cannot be invalidated")
        changed = msgspec.structs.replace(
            entry,
            status=Status.INVALIDATED,
            invalidated_at=now,
            updated_at=now,
            revision=entry.revision + 1,
        )
        return [], [changed]
    if isinstance(call, Widen):
        if call.to == "channel" and audience.channel:
            grant = tagmod.channel_grant(audience.channel)
        elif call.to == "bot":
            grant = tagmod.FOR_BOT
        else:
            raise _Reject("to must be 'bot', or 'channel' in a group's turn")
        try:
            changed = widening.widen(state, call.entry, grant, requester=None, now=now)
        except Conflict as e:
            raise _Reject(e.message) from e
        return [], [] if changed is None else [changed]
    assert isinstance(call, RenameTopic)
    old, new = _topics([call.from_])[0], _topics([call.to])[0]
    changed = []
    for entry in state.values():
        if old in entry.tags:  # LRN-8: every matching entry, tags only
            tags = tuple(dict.fromkeys(new if t == old else t for t in entry.tags))
            changed.append(
                msgspec.structs.replace(
                    entry, tags=tags, updated_at=now, revision=entry.revision + 1
                )
            )
    return [], changed
