"""A memory pool held by a shard actor: its stored state, its lock and an audience index.

The index maps each `for:` tag to the entries carrying it, so a read checks only the entries
that could possibly admit the reader instead of the whole pool (a side table, in memory).
"""

from __future__ import annotations

import asyncio
import operator
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, TypeVar

from actors.shard.rwlock import RWLock
from engine import tags as tagmod
from engine.commands import Outcome
from engine.memory_entries import EntryMeta, Reader
from engine.order import order_key
from engine.visibility import Visibility
from storage.memory_store import StoredPool, log_without
from storage.search_index import TermIndex

T = TypeVar("T")
VIEWS = 8  # readers whose views a pool keeps (`Pool.kept`)
TEXTS = 4096  # opened contents a pool keeps (`Pool.open`); past it, it starts afresh
DERIVED = ("prompt", "learning", "record")  # the kinds `Pool.derive` keeps
KNOWN = 16_384  # visibility checks kept per reader (`Pool.known`); past it, afresh
EDITS = 64  # changes a pool remembers to bring a kept view up to date (`Pool.kept`)


@dataclass(eq=False)
class KeptView:
    """The entries one reader may see (or use), in memory order, at pool state `changes`, with
    lists made from them position by position (`made`: kind -> (maker, values)); `joined`: the
    length of the "text" kind's contents joined by newlines."""

    changes: int
    metas: list[EntryMeta]
    made: dict[str, tuple[Callable[[EntryMeta], Any], list]] = field(default_factory=dict)
    joined: int = -1
    _ends: list[int] | None = None
    _keys: list[tuple] | None = None  # each entry's `order_key`, once made
    _positions: dict[str, int] | None = None  # id -> position, made once per state

    def where(self, meta: EntryMeta) -> int:
        """Where `meta` belongs in the view (memory order)."""
        if self._keys is None:
            self._keys = list(map(order_key, self.metas))
        return bisect_left(self._keys, order_key(meta))

    def at(self, meta: EntryMeta) -> int | None:
        """Where `meta` (this very entry object) is in the view, if it is."""
        at = self.where(meta)
        return at if at < len(self.metas) and self.metas[at] is meta else None

    def position(self, meta: EntryMeta) -> int | None:
        """`at`, by a map of the view's ids made once per state: a context looks up each of
        its ranked hits, and bisecting for each costs its `order_key`."""
        at = self.positions().get(meta.id)
        return at if at is not None and self.metas[at] is meta else None

    def positions(self) -> dict[str, int]:
        """Each entry's position by its id, made once per state (read it, do not change it):
        an id is in the view exactly when the reader may see (or use) that entry now."""
        if self._positions is None:
            self._positions = {m.id: k for k, m in enumerate(self.metas)}
        return self._positions

    def ends(self) -> list[int]:
        """For each position, the length of the "text" kind's contents up to it, each with a
        newline: made once per state, for walks that stop where a limit is reached."""
        if self._ends is None:
            lengths = map(len, map(operator.itemgetter(1), self.made["text"][1]))
            self._ends = list(map(operator.add, accumulate(lengths), range(1, len(self.metas) + 1)))
        return self._ends

    def make(self, kind: str, maker: Callable[[EntryMeta], T]) -> list[T]:
        """The `kind` list, made with `maker` for each entry on first use and then kept."""
        hit = self.made.get(kind)
        if hit is None:
            hit = self.made[kind] = (maker, [maker(m) for m in self.metas])
            if kind == "text":
                self.joined = sum(len(t) for _, t in hit[1]) + len(hit[1]) - 1
        return hit[1]

    def catch_up(
        self,
        olds: dict[str, EntryMeta | None],
        entries: dict[str, EntryMeta],
        admits: Callable[[str], bool],
    ) -> None:
        """Move the changed entries (`olds`: as they were in this view's state) to where they
        are now (`entries`), each admitted again (`admits`), the rest staying as they are."""
        for old in olds.values():
            at = None if old is None else self.at(old)
            if at is not None:
                self._remove(at)
        for entry_id in olds:
            meta = entries.get(entry_id)
            if meta is not None and admits(entry_id):
                self._insert(self.where(meta), meta)

    def forget_made(self) -> None:
        """Drop the lists made from the entries (their contents among them)."""
        self.made.clear()
        self.joined, self._ends = -1, None

    def _remove(self, at: int) -> None:
        self._ends = self._positions = None
        del self.metas[at]
        if self._keys is not None:
            del self._keys[at]
        for kind, (_, values) in self.made.items():
            gone = values.pop(at)
            if kind == "text":
                self.joined -= len(gone[1]) + 1

    def _insert(self, at: int, meta: EntryMeta) -> None:
        self._ends = self._positions = None
        self.metas.insert(at, meta)
        if self._keys is not None:
            self._keys.insert(at, order_key(meta))
        for kind, (maker, values) in self.made.items():
            value = maker(meta)
            values.insert(at, value)
            if kind == "text":
                self.joined += len(value[1]) + 1


class Pool:
    def __init__(self, stored: StoredPool) -> None:
        self.stored = stored
        self.lock = RWLock()
        self.pending: asyncio.Future[None] | None = None
        self.poisoned = False  # a queued change failed: this state is ahead of the disk
        # Receipts written since load (the table has older ones): requestId key → (print, answer).
        self.receipts: dict[str, tuple[str, bytes]] = {}
        self.stored_receipts: set[str] | None = None  # keys on disk when loaded (None: not read)
        # The learning context (LRN-7) of one pool version: recomputing it walks every entry.
        self.learning_view: tuple | None = None  # (version, reader, entries, topic counts)
        # The provenance checks that depend on one entry alone (engine/learning.py `provable`),
        # kept while the entry object is the same: the learning context asks them every turn.
        self._proven: dict[str, tuple[EntryMeta, bool]] = {}
        # The entries recent readers may see (or use), in memory order, at one state of the
        # pool: a turn's reads (enrichment, prompt, confession, learning) ask the same again.
        # A change that no entry's visibility rests on but the changed ones' own (no
        # observation cites them) is applied to them in place (`kept`): a turn's write
        # does not make the next turn's reads walk the whole pool again.
        self._views: dict[tuple[Reader, bool], KeptView] = {}
        # The last changes, each as (`_changes` after it, the entries as they were before it,
        # by id; None when an observation cites one of them: kept views are built afresh).
        self._edits: list[tuple[int, dict[str, EntryMeta | None] | None]] = []
        self._cited: dict[str, int] = {}  # entry id -> entries naming it as a source
        self._changes = 0  # bumped by every `apply`: the state the views were built on
        # Per recent reader, each entry's own visibility checks (engine/visibility.py `known`).
        self._known: dict[Reader, dict[str, tuple[EntryMeta, bool | None]]] = {}
        # Content opened for a read, by entry, while its sealed bytes stay the same: a turn
        # reads the same entries several times, and the next turn most of them again. Only
        # what a visibility check let through is ever opened (ACL-8); purges drop it.
        self._texts: dict[str, tuple[bytes, str]] = {}
        # What reads make of an entry and its content (its prompt and learning forms), by
        # kind and entry, while the entry object and its sealed content are the same.
        self._derived: dict[tuple[str, str], tuple[EntryMeta, bytes, object]] = {}
        self._by_grant: dict[str, set[str]] = {}
        for meta in stored.entries.values():
            self._index(meta)
        # Keyword search: filled by the shard from stored term keys at load and
        # kept current by it on every change (in memory only).
        self.terms = TermIndex()

    @property
    def id(self) -> str:
        return self.stored.pool

    @property
    def entries(self) -> dict[str, EntryMeta]:
        return self.stored.entries

    @property
    def version(self) -> int:
        return self.stored.version

    def _index(self, meta: EntryMeta) -> None:
        for grant in tagmod.grants_of(meta.tags):
            self._by_grant.setdefault(grant, set()).add(meta.id)
        for source in meta.sources:
            if source.entry is not None:
                self._cited[source.entry] = self._cited.get(source.entry, 0) + 1

    def _unindex(self, meta: EntryMeta) -> None:
        for grant in tagmod.grants_of(meta.tags):
            ids = self._by_grant.get(grant)
            if ids is not None:
                ids.discard(meta.id)
                if not ids:
                    del self._by_grant[grant]
        for source in meta.sources:
            if source.entry is not None:
                left = self._cited[source.entry] - 1
                if left:
                    self._cited[source.entry] = left
                else:
                    del self._cited[source.entry]

    @staticmethod
    def _grant_keys(reader: Reader) -> list[str]:
        keys = [tagmod.person(reader.user)]
        keys += [tagmod.channel_grant(c) for c in reader.channels]
        if reader.uses_bot:
            keys.append(tagmod.FOR_BOT)
        return keys

    def candidates(self, reader: Reader) -> set[str]:
        """Entries whose audience could admit the reader; visibility still decides."""
        out: set[str] = set()
        for key in self._grant_keys(reader):
            out |= self._by_grant.get(key, set())
        return out

    def candidate(self, reader: Reader, entry_id: str) -> bool:
        """Whether one entry is among `candidates(reader)`, without building them."""
        return any(entry_id in self._by_grant.get(k, ()) for k in self._grant_keys(reader))

    def kept(
        self,
        reader: Reader,
        active: bool,
        build: Callable[[], list[EntryMeta]],
        admits: Callable[[str], bool],
    ) -> KeptView:
        """`build()` (the entries `reader` may see, or use with `active`, in memory order) kept
        across reads and brought up to date: by the changes since it was made when no other
        entry's visibility rests on them (`admits(id)`: whether the reader may see, or use, an
        entry now), else by `build()` again. Call under the pool's lock, with nothing else in
        the union (workspace records change apart from the pool); callers read the view,
        never change it."""
        key = (reader, active)
        hit = self._views.pop(key, None)
        if hit is not None and hit.changes != self._changes:
            olds = self._changed_since(hit.changes)
            if olds is None:
                hit = None
            else:
                hit.catch_up(olds, self.entries, admits)
                hit.changes = self._changes
        if hit is None:
            hit = KeptView(self._changes, build())
        self._views[key] = hit  # the most recently used last
        if len(self._views) > VIEWS:
            del self._views[next(iter(self._views))]
        return hit

    def _changed_since(self, changes: int) -> dict[str, EntryMeta | None] | None:
        """Each entry changed after state `changes`, as it was then; None when a change is
        not local or no longer remembered."""
        olds: dict[str, EntryMeta | None] = {}
        edits = self._edits
        if not edits or edits[0][0] > changes + 1:
            return None
        for at, before in edits:
            if at <= changes:
                continue
            if before is None:
                return None
            for entry_id, old in before.items():
                olds.setdefault(entry_id, old)
        return olds

    def known(self, reader: Reader) -> dict[str, tuple[EntryMeta, bool | None]]:
        """The reader's kept visibility checks, for `Visibility(..., known=)`."""
        known = self._known.pop(reader, None)
        if known is None or len(known) > KNOWN:
            known = {}
        self._known[reader] = known  # the most recently used last
        if len(self._known) > VIEWS:
            del self._known[next(iter(self._known))]
        return known

    @property
    def proven(self) -> dict[str, tuple[EntryMeta, bool]]:
        """The kept provenance checks, for `provable(..., known=)`."""
        if len(self._proven) > KNOWN:
            self._proven = {}
        return self._proven

    @property
    def opened(self) -> frozenset[str]:
        """Entries whose content the pool holds opened (`open`, `derive`, lists kept with views)."""
        made = (v.metas for v in self._views.values() if set(v.made) - {"proven"})
        kept = (m.id for metas in made for m in metas)
        return frozenset([*self._texts, *(entry_id for _, entry_id in self._derived), *kept])

    def open(self, entry_id: str, opener: Callable[[StoredPool, str], str]) -> str:
        """An entry's content, opened by `opener` once per sealed version."""
        sealed = self.stored.sealed[entry_id]
        hit = self._texts.get(entry_id)
        if hit is not None and hit[0] is sealed:
            return hit[1]
        text = opener(self.stored, entry_id)
        if len(self._texts) >= TEXTS:
            self._texts.clear()
        self._texts[entry_id] = (sealed, text)
        return text

    def derive(
        self,
        kind: str,
        metas: Sequence[EntryMeta],
        build: Callable[[EntryMeta, str], T],
        open_: Callable[[str], str],
    ) -> list[T]:
        """`build(meta, content)` for each entry (`open_` opens content), kept per `kind` for
        the pool's own entries; what else the read holds (workspace records) is built anew."""
        derived, sealed_of = self._derived, self.stored.sealed
        out: list[T] = []
        for meta in metas:
            key = (kind, meta.id)
            hit = derived.get(key)
            sealed = sealed_of.get(meta.id)
            if hit is not None and hit[0] is meta and hit[1] is sealed:
                out.append(hit[2])  # type: ignore[arg-type]
                continue
            value = build(meta, open_(meta.id))
            if sealed is not None:
                if len(derived) >= 2 * TEXTS:
                    derived.clear()
                derived[key] = (meta, sealed, value)
            out.append(value)
        return out

    def _forget_opened(self, entry_id: str) -> None:
        self._texts.pop(entry_id, None)
        for kind in DERIVED:
            self._derived.pop((kind, entry_id), None)

    def apply(self, outcome: Outcome, sealed: dict[str, bytes] | None = None) -> None:
        """Make an outcome the pool's in-memory state (after its writes were queued)."""
        stored = self.stored
        self._changes += 1
        changed = [m.id for m in outcome.upserts] + list(outcome.deletes)
        local = not any(i in self._cited for i in changed)  # what rests on them: before
        before = {i: stored.entries.get(i) for i in changed} if local else None
        self._edits.append((self._changes, before))
        if len(self._edits) > EDITS:
            del self._edits[0]
        for meta in outcome.upserts:
            old = stored.entries.get(meta.id)
            if old is not None:
                self._unindex(old)
            stored.entries[meta.id] = meta
            self._index(meta)
            if sealed and meta.id in sealed:
                stored.sealed[meta.id] = sealed[meta.id]
                self._forget_opened(meta.id)
        if outcome.deletes:
            for view in self._views.values():  # what was made of a deleted entry goes with it
                view.forget_made()
            for entry_id in outcome.deletes:
                old = stored.entries.pop(entry_id, None)
                if old is not None:
                    self._unindex(old)
                stored.sealed.pop(entry_id, None)
                self._forget_opened(entry_id)
            stored.log = log_without(stored.log, outcome.deletes)
        # The same order as a reload gives (storage sorts by version, then entry id).
        stored.log.extend(sorted(outcome.log, key=lambda r: (r.version, r.entry)))
        stored.version = outcome.version

    def search(self, keys: Sequence[int], reader: Reader, limit: int) -> list[tuple[str, float]]:
        """The `limit` best keyword hits (`Analyzer.query` keys) among the entries the reader
        may see that are active (forgotten, invalidated: history, not hits), best first. The
        ranking is walked in order and every id checked, so what the reader may not see is
        never a hit and never takes a readable hit's place (call under the pool's lock)."""
        candidates = self.candidates(reader)
        vis = Visibility(reader, self.entries)
        return self.terms.search(keys, limit, lambda i: i in candidates and vis.usable(i))
