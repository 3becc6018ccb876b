"""Who may see a memory entry: a pure function of tags, sources and access proofs
(docs/requirements.md §2).

The rules, in the order they are applied:

1. Org scoping: an entry is seen only from the org its `org:` tags name; no `org:` tag, or
   several different ones, hides it.
2. Audience: some `for:` tag must admit the reader — `for:person:<reader>`, `for:channel:<c>` for
   a channel the reader is a member of, or `for:bot` when the reader uses the bot. An entry with no
   `for:` tag is visible to nobody (ACL-1). A person who forgot the entry is no longer admitted.
3. Provenance (ACL-3, ACL-5, ACL-6, ACL-10, ACL-11):
   - `pinned` entries keep their own rule: steps 1-2 are all.
   - a `fact` needs at least one source, every source a chat item, and for every item a stored
     access proof that admits the reader in the reader's org (if several proofs were stored for
     one item, all of them). A missing proof hides the fact.
   - an `observation` needs at least one source, every source an entry of the same pool that is
     itself visible to the reader *and* still active, checked recursively. A missing source, a
     source that is an item, or a cycle anywhere below hides the observation.

Invalidated and retracted entries stay visible as history to those the rules admit; they only
stop supporting conclusions built on them. Content is never needed and never passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine import tags as tagmod
from engine.memory_entries import AccessProof, EntryMeta, Layer, Reader, Status


def grant_admits(reader: Reader, grant: str) -> bool:
    if grant == tagmod.FOR_BOT:
        return reader.uses_bot
    if grant.startswith("for:person:"):
        return grant[len("for:person:") :] == reader.user
    if grant.startswith("for:channel:"):
        return grant[len("for:channel:") :] in reader.channels
    return False


def directly_visible(reader: Reader, entry: EntryMeta) -> bool:
    """Rules 1 and 2: org scoping and audience, ignoring provenance."""
    # One pass over the tags: this runs for every candidate entry of every read.
    org_ok = False
    admitted = False
    for tag in entry.tags:
        if tag.startswith("org:"):
            if tag[4:] != reader.org:
                return False
            org_ok = True
        elif not admitted and tag.startswith("for:"):
            admitted = grant_admits(reader, tag)
    return org_ok and admitted and reader.user not in entry.forgotten_by


def _fact_proven(reader: Reader, entry: EntryMeta) -> bool:
    if not entry.sources:
        return False
    proofs: dict[tuple[str | None, str | None], list[AccessProof]] = {}
    for p in entry.proofs:
        proofs.setdefault((p.chat, p.item), []).append(p)
    for source in entry.sources:
        if not source.is_item:
            return False
        # Every proof stored for the item must admit the reader: conflicting proofs fail closed.
        found = proofs.get((source.chat, source.item))
        if not found:
            return False
        for proof in found:
            if proof.org != reader.org or not any(grant_admits(reader, g) for g in proof.audience):
                return False
    return True


class Visibility:
    """Memoized visibility of the entries of one pool for one reader.

    Build one per read (the memo is only valid for the pool state it was built on).
    """

    def __init__(
        self,
        reader: Reader,
        entries: Mapping[str, EntryMeta],
        known: dict[str, tuple[EntryMeta, bool | None]] | None = None,
    ) -> None:
        self.reader = reader
        self.entries = entries
        self._memo: dict[str, bool] = {}
        # Each entry's own checks (`_local`) by id, with the entry they were made on: they
        # depend on that entry and the reader alone, so a caller may keep them across reads
        # (for this reader) and they hold while the entry object is the same.
        self._known = known

    def visible(self, entry_id: str) -> bool:
        """Whether the reader may see this entry (including as history)."""
        memo = self._memo.get(entry_id)
        if memo is None:
            entry = self.entries.get(entry_id)
            local = None if entry is None else self._local_of(entry)
            # Pinned entries and facts need no recursion; only observations walk their sources.
            memo = self._resolve(entry_id) if local is None else local
            self._memo[entry_id] = memo
        return memo

    def usable(self, entry_id: str) -> bool:
        """Visible and active: what a conclusion may rest on (ACL-10)."""
        entry = self.entries.get(entry_id)
        return entry is not None and entry.status == Status.ACTIVE and self.visible(entry_id)

    def _local_of(self, entry: EntryMeta) -> bool | None:
        known = self._known
        if known is None:
            return self._local(entry)
        hit = known.get(entry.id)
        if hit is not None and hit[0] is entry:
            return hit[1]
        local = self._local(entry)
        known[entry.id] = (entry, local)
        return local

    def _local(self, entry: EntryMeta) -> bool | None:
        """Everything but the recursion: False if hidden, True if visible, None if it depends on
        source entries."""
        if not directly_visible(self.reader, entry):
            return False
        if entry.layer == Layer.PINNED:
            return True
        if entry.layer == Layer.FACT:
            return _fact_proven(self.reader, entry)
        if not entry.sources or not all(s.is_entry for s in entry.sources):
            return False
        return None

    def _resolve(self, root: str) -> bool:
        # Iterative depth-first search: pools may hold long observation chains, and recursion
        # would run into Python's stack limit. A node met again while still on the path is a
        # cycle, and everything on a cycle is hidden.
        on_path: set[str] = set()
        stack: list[tuple[str, int]] = [(root, 0)]
        memo = self._memo
        while stack:
            entry_id, next_source = stack[-1]
            if next_source == 0 and entry_id not in on_path:
                entry = self.entries.get(entry_id)
                local = None if entry is None else self._local_of(entry)
                if entry is None or local is not None:
                    memo[entry_id] = bool(local)
                    stack.pop()
                    continue
                on_path.add(entry_id)
            entry = self.entries[entry_id]
            if next_source > 0:
                # The source just resolved decides whether we go on.
                prev = entry.sources[next_source - 1].entry
                assert prev is not None
                if not self._source_ok(prev, entry.pool):
                    memo[entry_id] = False
                    on_path.discard(entry_id)
                    stack.pop()
                    continue
            if next_source == len(entry.sources):
                memo[entry_id] = True
                on_path.discard(entry_id)
                stack.pop()
                continue
            stack[-1] = (entry_id, next_source + 1)
            source_id = entry.sources[next_source].entry
            assert source_id is not None
            if source_id in on_path:
                memo[source_id] = False  # a cycle: the source resolves as hidden
                continue
            if source_id not in memo:
                stack.append((source_id, 0))
        return memo[root]

    def _source_ok(self, source_id: str, pool: str) -> bool:
        source = self.entries.get(source_id)
        return (
            source is not None
            and source.pool == pool
            and self._memo.get(source_id, False)
            and source.status == Status.ACTIVE
        )


def visible_ids(
    reader: Reader, entries: Mapping[str, EntryMeta], candidates: Iterable[str] | None = None
) -> set[str]:
    """Ids among `candidates` (default: all entries) that `reader` may see."""
    vis = Visibility(reader, entries)
    ids = entries.keys() if candidates is None else candidates
    return {i for i in ids if vis.visible(i)}
