"""The one visibility-checked read of a bot's memory (MEM-1, ENR-5; design in
engine/memory_union.py).

A bot's memory is the union of its entry pool (`Pool`, the shard's) and its workspace bot-scope
records (`WorkspacePool`, the workspace's). Every reader goes through `MemoryReader`: context and
enrichment, the HTTP views, search, the prompt, the learning context. Callers never read a pool and
filter it themselves.

Locking (ACL-9): a read holds the entry pool's shared lock while it checks visibility and opens
content; the workspace records are read in the same synchronous stretch (their writes happen
under the workspace pool's lock without an await in between), so a read never mixes old
permissions with new content. Content is opened only for entries the check let through (ACL-8).
"""

from __future__ import annotations

import contextlib
from bisect import bisect_right
from collections import ChainMap
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, islice
from typing import TypeVar

import msgspec

from actors.shard.kernel import ShardKernel
from actors.shard.pool import KeptView, Pool
from actors.workspace.pools import WorkspacePool, WorkspacePools
from engine import memory_union as bm
from engine import tags as tagmod
from engine.errors import InvalidInput
from engine.learning import (
    CONTEXT_ENTRIES,
    ContextEntry,
    context_entry,
    context_selection,
    counted_topics,
    encoded_entry,
    provable_alone,
)
from engine.memory_entries import EntryMeta, Reader
from engine.order import in_memory_order
from engine.scoped_memory import WorkspaceEntry, WorkspaceStatus
from engine.visibility import Visibility

T = TypeVar("T")
CONTEXT_HITS = 32  # ranked hits an input's context takes first (`MemoryReader.context_for`)


class Records(Mapping[str, EntryMeta]):
    """A bot pool's workspace records as entries (`as_meta`), built on first use and kept on
    the pool per record state: reads never rebuild thousands of them."""

    def __init__(self, ws: WorkspacePool | None) -> None:
        self.ws = ws

    def __getitem__(self, entry_id: str) -> EntryMeta:
        if self.ws is None:
            raise KeyError(entry_id)
        record = self.ws.stored.entries[entry_id]
        cached = self.ws.metas.get(entry_id)
        if cached is None or cached[0] is not record:
            cached = (record, bm.as_meta(record))
            self.ws.metas[entry_id] = cached
        return cached[1]

    def __iter__(self):
        return iter(() if self.ws is None else self.ws.stored.entries)

    def __len__(self) -> int:
        return 0 if self.ws is None else len(self.ws.stored.entries)

    def __contains__(self, entry_id: object) -> bool:
        return self.ws is not None and entry_id in self.ws.stored.entries


@dataclass
class Snapshot:
    """The union of one bot pool as one reader may see it, valid while the read lock is held."""

    pool: Pool
    ws: WorkspacePool | None
    reader: Reader
    entries: Mapping[str, EntryMeta]  # memory entries and workspace records, by id
    records: Records
    visibility: Visibility
    open: Callable[[str], str]

    def visible_records(self, *, active: bool = False) -> list[WorkspaceEntry]:
        if self.ws is None:
            return []
        visible = bm.record_check(self.reader)  # the one record check (engine/memory_union.py)
        return [
            r
            for r in self.ws.stored.entries.values()
            if (not active or r.status == WorkspaceStatus.ACTIVE) and visible(r)
        ]

    def visible_entries(self, *, active: bool = False) -> list[EntryMeta]:
        vis, entries = self.visibility, self.pool.entries
        check = vis.usable if active else vis.visible
        return [entries[i] for i in self.pool.candidates(self.reader) if check(i)]

    def _in_order(self, active: bool) -> list[EntryMeta]:
        records = [self.records[r.id] for r in self.visible_records(active=active)]
        if records:
            return in_memory_order([*self.visible_entries(active=active), *records])
        if self.ws is not None and self.ws.stored.entries:
            # Hidden records may still decide an observation's visibility: not kept.
            return in_memory_order(self.visible_entries(active=active))
        return list(self._kept(active).metas)

    def _kept(self, active: bool) -> KeptView:
        """The pool's kept view for this reader (call only with no records in the union)."""
        pool, reader, vis = self.pool, self.reader, self.visibility
        check = vis.usable if active else vis.visible
        return pool.kept(
            reader,
            active,
            lambda: in_memory_order(self.visible_entries(active=active)),
            lambda entry_id: pool.candidate(reader, entry_id) and check(entry_id),
        )

    def usable_made(self, kind: str, build: Callable[[EntryMeta, str], T]) -> list[T]:
        """`build(entry, content)` for each of `usable()`, in its order: kept per entry state
        (`Pool.derive`), and over a bot's entry pool alone also as a list with its view."""
        pool, open_ = self.pool, self.open
        if self.ws is not None and self.ws.stored.entries:
            return pool.derive(kind, self.usable(), build, open_)
        return list(self._kept(True).make(kind, lambda m: pool.derive(kind, (m,), build, open_)[0]))

    def visible(self) -> list[EntryMeta]:
        """Entries the reader may see (history included), in memory order (MEM-5)."""
        return self._in_order(active=False)

    def usable(self) -> list[EntryMeta]:
        """Visible and active, in memory order: what context, prompts and search use."""
        return self._in_order(active=True)

    def usable_kept(self) -> KeptView | None:
        """The pool's kept view of `usable()`; None when the union holds records."""
        if self.ws is not None and self.ws.stored.entries:
            return None
        return self._kept(True)

    def usable_texts(self) -> KeptView | None:
        """The pool's kept view of `usable()` with its "text" kind made ((id, content) of each,
        and `joined`); None when the union holds records (they change apart from the pool)."""
        if self.ws is not None and self.ws.stored.entries:
            return None
        kept, open_ = self._kept(True), self.open
        kept.make("text", lambda m: (m.id, open_(m.id)))
        return kept

    def is_record(self, entry_id: str) -> bool:
        return self.ws is not None and entry_id in self.ws.stored.entries

    def usable_id(self, entry_id: str) -> bool:
        """Whether one entry or record is visible to the reader and active, checked alone (a
        ranking found it; nothing walks the pool)."""
        if self.ws is not None:
            record = self.ws.stored.entries.get(entry_id)
            if record is not None:
                active = record.status == WorkspaceStatus.ACTIVE
                return active and bm.record_check(self.reader)(record)
        if entry_id not in self.pool.entries:
            return False
        return self.pool.candidate(self.reader, entry_id) and self.visibility.usable(entry_id)


class MemoryReader:
    def __init__(self, kernel: ShardKernel, records: WorkspacePools) -> None:
        self.kernel = kernel
        self.records = records

    async def pools(self, pool_id: str) -> tuple[Pool, WorkspacePool | None]:
        pool = await self.kernel.pool(pool_id)
        ws = await self.records.pool(pool_id) if pool_id.startswith("bot:") else None
        return pool, ws

    @staticmethod
    def union(pool: Pool, ws: WorkspacePool | None) -> Mapping[str, EntryMeta]:
        """The pool's entries and its records as one mapping (memory entries win an id clash;
        ids are random 96-bit, so it does not happen)."""
        if ws is None or not ws.stored.entries:
            return pool.entries
        return ChainMap(pool.entries, Records(ws))  # type: ignore[arg-type]

    def snapshot(self, pool: Pool, ws: WorkspacePool | None, reader: Reader) -> Snapshot:
        """Call under `pool.lock.shared()` (or exclusive)."""
        entries = self.union(pool, ws)
        store = self.kernel.store
        records = self.records

        def open_(entry_id: str) -> str:
            if entry_id in pool.stored.sealed:
                return pool.open(entry_id, store.open_content)
            assert ws is not None
            return records.open(ws, entry_id)

        return Snapshot(
            pool=pool,
            ws=ws,
            reader=reader,
            entries=entries,
            records=Records(ws),
            visibility=Visibility(reader, entries, pool.known(reader)),
            open=open_,
        )

    @contextlib.asynccontextmanager
    async def read(self, pool_id: str, reader: Reader) -> Iterator[Snapshot]:  # type: ignore[misc]
        """A shared-locked snapshot; after the block, waits for the commit of what it saw."""
        pool, ws = await self.pools(pool_id)
        async with pool.lock.shared():
            snap = self.snapshot(pool, ws, reader)
            yield snap
            pending = pool.pending
        await self.kernel.settle(pool, pending)
        if ws is not None:
            await self.records.settle_read(ws)

    async def texts(self, pool_id: str, reader: Reader) -> list[tuple[str, str]]:
        """(id, text) of every usable entry the reader may see, in memory order: what a search
        index of the pool serves for this reader (the text supplier of ranked search)."""
        async with self.read(pool_id, reader) as snap:
            return [(m.id, snap.open(m.id)) for m in snap.usable()]

    async def context_for(
        self,
        pool_id: str,
        reader: Reader,
        limit: int,
        first: Sequence[str] = (),
        *,
        partial: bool = True,
        rank: Callable[[Snapshot, Callable[[str], bool] | None], Sequence[str]] | None = None,
    ) -> tuple[list[tuple[str, str]], bool, bool]:
        """The memory bot's context for one input (ENR-1, ENR-5): (id, text) of
        usable entries the reader may see, at most `limit` characters joined by newlines, in
        memory order, whether any usable entry exists (ENR-7), and whether all of them fit.

        When they do not all fit, `first` (what the input's ranked search found, best first:
        the caller ranks with the one memory search, actors/workspace/search.py, before this
        read, as a ranking may await the embedding model) is taken first, each checked again
        and whole where it fits; the room left is filled in memory order, stopping at the
        first that does not fit. Over a bot's entry pool alone, the usable entries' contents
        are opened once per pool state and reader and kept with its view (`usable_texts`):
        a turn's prompt opens them all anyway, and its contexts ask again; with records in
        the union, only the entries taken are decrypted.

        `rank(snapshot, usable)`, when given instead of `first`, ranks in this read's locked
        stretch, only when not all fit (a ranking that awaits nothing: keyword search alone);
        `usable` tells whether the reader may use an entry of the pool, by the kept view's ids
        (None with records in the union). What it finds goes first as `first` would; when it
        finds nothing, the memory-order fill is the context.

        Without `partial` (and without `first`), a context that does not all fit is not made:
        no parts, only whether any usable entry exists (the caller ranks and asks again)."""
        if limit < 0:
            raise InvalidInput("limit must be >= 0")
        async with self.read(pool_id, reader) as snap:
            kept = snap.usable_texts()
            if kept is not None:
                if rank is not None and kept.joined > limit:
                    first = rank(snap, kept.positions().__contains__)
                return self.context_of_kept(kept, limit, first, partial)
            usable = snap.usable()
            if not partial and not first:
                whole: list[tuple[str, str]] = []
                size = -1  # the newline before the first part is not there
                for meta in usable:
                    text = snap.open(meta.id)
                    size += len(text) + 1
                    if size > limit:
                        return [], True, False
                    whole.append((meta.id, text))
                return whole, bool(whole), True
            parts = self._filled(snap, usable, limit, first)
            if rank is not None and len(parts) < len(usable):
                found = rank(snap, None)
                if found:
                    parts = self._filled(snap, usable, limit, found)
        return parts, bool(usable), len(parts) == len(usable)

    @staticmethod
    def _filled(
        snap: Snapshot, usable: list[EntryMeta], limit: int, first: Sequence[str]
    ) -> list[tuple[str, str]]:
        """`context_for`'s parts over the union's `usable` entries (records among them)."""
        taken: dict[str, str] = {}
        size = 0

        def take(entry_id: str) -> bool:
            nonlocal size
            text = snap.open(entry_id)
            extra = len(text) + (1 if taken else 0)
            if size + extra > limit:
                return False
            taken[entry_id] = text
            size += extra
            return True

        for entry_id in first[:CONTEXT_HITS]:
            if entry_id not in taken and snap.usable_id(entry_id):
                take(entry_id)
        for meta in usable:
            if meta.id not in taken and not take(meta.id):
                break
        return [(m.id, taken[m.id]) for m in usable if m.id in taken]

    @staticmethod
    def context_of_kept(
        kept: KeptView, limit: int, first: Sequence[str], partial: bool
    ) -> tuple[list[tuple[str, str]], bool, bool]:
        """`context_for` over a kept view of the usable entries and their contents: positions
        and running lengths stand for the walk (the same parts, found by bisection)."""
        texts, joined = kept.made["text"][1], kept.joined
        if joined <= limit:
            return list(texts), bool(texts), True
        if not partial and not first:
            return [], True, False
        taken: dict[int, None] = {}  # positions, in the order taken
        size = 0
        positions = kept.positions()  # the view is of the pool's state: its ids are usable
        for entry_id in first[:CONTEXT_HITS]:
            at = positions.get(entry_id)
            if at is not None and at not in taken:
                extra = len(texts[at][1]) + (1 if taken else 0)
                if size + extra <= limit:
                    taken[at] = None
                    size += extra
        # The room left, in memory order until the first that does not fit: each entry costs
        # its length and a newline (the first part has none), `ends` are their running sums.
        ends, count = kept.ends(), len(texts)
        stop, start = count, 0
        if not taken:
            stop = bisect_right(ends, limit + 1)
        else:
            for at in [*sorted(taken), count]:
                base = ends[start - 1] if start else 0
                end = bisect_right(ends, limit - size + base, start, at)
                if end < at:
                    stop = end
                    break
                if at > start:
                    size += ends[at - 1] - base
                start = at + 1
        parts = texts[:stop] + [texts[at] for at in sorted(taken) if at >= stop]
        return parts, True, len(parts) == count

    async def learning_context(
        self, pool_id: str, reader: Reader, *, encoded: bool = False
    ) -> tuple[list[ContextEntry] | list[msgspec.Raw], dict[str, int]]:
        """LRN-7 over the bot's one memory as the turn's audience may see it: the first 300
        valid entries in memory order with their text, and topic counts over all valid ones.
        The selection is kept per pool state and reader (recomputing it walks every entry).
        With `encoded`, each entry comes as its JSON in a learning request (`encoded_entry`)."""
        pool, ws = await self.pools(pool_id)
        async with pool.lock.shared():
            snap = self.snapshot(pool, ws, reader)
            kept = snap.usable_kept()
            if kept is not None:
                # Each entry's provenance and learning form are kept with the reader's view,
                # so a change costs what it changed; unless an observation rests on others.
                known, open_ = pool.proven, snap.open
                proven = kept.make("proven", lambda m: provable_alone(m, known))
                if None not in proven:

                    def form(m: EntryMeta) -> ContextEntry:
                        return pool.derive("learning", (m,), context_entry, open_)[0]

                    if encoded:
                        made = kept.make("learning_json", lambda m: encoded_entry(form(m)))
                    else:
                        made = kept.make("learning", form)
                    chosen = list(islice(compress(made, proven), CONTEXT_ENTRIES))
                    topics = kept.make("topics", lambda m: tagmod.topics_of(m.tags))
                    return chosen, counted_topics(compress(topics, proven))
            records = (
                ()
                if ws is None
                else tuple((i, r.revision, r.status) for i, r in sorted(ws.stored.entries.items()))
            )
            key = (pool.version, records, reader)
            cached = pool.learning_view
            if cached is None or cached[0] != key:
                seen = {m.id: m for m in snap.usable()}
                selection = context_selection(seen, ordered=True, known=pool.proven)
                cached = (key, *selection, snap.open)
                pool.learning_view = cached
            _, chosen, topics, open_ = cached
            entries = pool.derive("learning", chosen, context_entry, open_)
        return ([encoded_entry(e) for e in entries] if encoded else entries), topics

    def learning_state(self, pool: Pool, ws: WorkspacePool | None) -> Mapping[str, EntryMeta]:
        """What the memory bot's proposals are checked against (under the exclusive lock): the
        whole union, so an observation may rest on a person's record; only memory entries are
        ever changed by it (see engine/memory_union.py)."""
        return self.union(pool, ws)
