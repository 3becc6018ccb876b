"""The bot memory API of a shard (API-1, API-2, MEM-1 … MEM-5, ACL-4, MB-2): remember,
forget, purge, widen, the reads, the memory bot's settings and the entries it writes.

Built on the kernel (pools, locks, the commit pipeline) and on `MemoryReader`, the one
visibility-checked read of a bot's memory. Every change holds the pool's lock exclusively only
while deciding and staging; every reply waits for the commit it depends on (`kernel.settle`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import msgspec

from actors.contracts import RememberCall
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel
from actors.shard.memory_reader import MemoryReader, Snapshot
from actors.shard.pool import Pool
from engine import commands, widening
from engine.commands import Outcome
from engine.errors import Conflict, InvalidInput, NotFound
from engine.memory_bot_settings import MemoryBotSettings, SettingsPatch, apply_patch
from engine.memory_entries import (
    Change,
    Context,
    EntryMeta,
    EntryView,
    LogPage,
    LogRow,
    MemoryPage,
    Reader,
    Status,
    Who,
    view,
)
from engine.memory_union import as_entry_view
from storage.group_commit import DeleteWhere, Write
from storage.receipts import Receipts, fingerprint, receipt_key
from storage.shard_schema import RECEIPTS

_view_dec = msgspec.json.Decoder(EntryView)
_remember_dec = msgspec.msgpack.Decoder(RememberCall)
_json = msgspec.json.Encoder()


def _entry_view(snap: Snapshot, meta: EntryMeta) -> EntryView:
    """An entry of a bot's one memory in the memory API's format (API-1)."""
    if (
        snap.ws is not None
        and meta.id in snap.ws.stored.entries
        and meta.id not in snap.pool.entries
    ):
        return as_entry_view(snap.ws.stored.entries[meta.id], snap.open(meta.id))
    return view(meta, snap.open(meta.id))


class BotRecordRoutes(Protocol):
    """The bot memory routes' reach into a bot's workspace records (actors/workspace/)."""

    async def forget(
        self, pool_id: str, reader: Reader, entry_id: str, request_id: str | None
    ) -> EntryView: ...
    async def purge(self, pool_id: str, tag: str, *, learned: bool = False) -> int: ...
    async def log(self, pool_id: str, reader: Reader) -> list[LogRow]: ...


class MemoryOps:
    def __init__(self, kernel: ShardKernel, memory_reader: MemoryReader) -> None:
        self.kernel = kernel
        self.memory_reader = memory_reader
        # Set by the workspace that keeps the records (one memory per bot, MEM-1).
        self.records: BotRecordRoutes | None = None

    async def read_memory(
        self, pool_id: str, reader: Reader, tags: Sequence[str] = ()
    ) -> MemoryPage:
        """Every entry the reader may see (history included), in memory order (API-1)."""
        return (await self.page(pool_id, reader, tags))[0]

    async def page(
        self, pool_id: str, reader: Reader, tags: Sequence[str]
    ) -> tuple[MemoryPage, int]:
        """The page, and the last event seq its state reflects (for the gateway's cache). A
        bot's workspace records are part of it (one memory per bot, engine/memory_union.py)."""
        want = set(tags)
        async with self.memory_reader.read(pool_id, reader) as snap:
            views = tuple(_entry_view(snap, m) for m in snap.visible() if want.issubset(m.tags))
            version = snap.pool.version
            staged = self.kernel.events.staged
        return MemoryPage(entries=views, version=version), staged

    async def receipt(self, pool: Pool, key: str | None, print_: str) -> EntryView | None:
        """The answer already given to this request, if any (call under the exclusive lock)."""
        if key is None:
            return None
        answer = pool.receipts.get(key)
        if answer is not None:
            if answer[0] != print_:
                raise Conflict(
                    "this requestId was already used for a different request",
                    code="request_id_reused",
                )
            return _view_dec.decode(answer[1])
        if pool.stored_receipts is None:
            pool.stored_receipts = await self.kernel.receipts.keys(pool.id)
        if key not in pool.stored_receipts:
            return None  # a new request id: nothing to read
        raw = await self.kernel.receipts.find(key, print_, pool.stored.cipher, pool.id)
        return None if raw is None else _view_dec.decode(raw)

    def receipt_rows(
        self, pool: Pool, key: str | None, print_: str, answer: EntryView, raw: bytes | None = None
    ):
        """The receipt's row (none without a requestId); `raw`: the answer as JSON, if the
        caller has it encoded already (for its reply)."""
        if key is None:
            return ()
        if raw is None:
            raw = msgspec.json.encode(answer)
        pool.receipts[key] = (print_, raw)
        return (Receipts.row(key, print_, raw, pool.stored.cipher, pool.id, self.kernel.clock()),)

    async def read_memory_json(
        self, pool_id: str, reader: Reader, tags: Sequence[str] = ()
    ) -> tuple[str, int, bytes]:
        """`read_memory` encoded as the HTTP body: one bytes object crosses Ray instead of a
        hundred pickled Structs that the gateway would encode again (measured: half the cost).
        With the shard's epoch and the last event seq the page reflects, so the gateway can keep
        it until a later `memory.changed` for this pool reaches it."""
        page, staged = await self.page(pool_id, reader, tags)
        return self.kernel.events.epoch, staged, _json.encode(page)

    async def memory_log_json(self, pool_id: str, reader: Reader) -> bytes:
        return _json.encode(await self.memory_log(pool_id, reader))

    async def remember(
        self,
        pool_id: str,
        reader: Reader,
        content: str,
        topics: Sequence[str] = (),
        request_id: str | None = None,
    ) -> EntryView:
        """Add a pinned entry (API-2). With a `request_id` a retry returns the first answer."""
        commands.validate_content(content)
        key = None if request_id is None else receipt_key(pool_id, reader.user, request_id)
        # Only a request with an id is ever compared with another (a receipt).
        print_ = (
            "" if key is None else fingerprint(("remember", reader.org, content, tuple(topics)))
        )
        pool = await self.kernel.pool(pool_id)
        entry_id = self.kernel.new_id()
        async with pool.lock.exclusive():
            done = await self.receipt(pool, key, print_)
            if done is not None:
                pending = pool.pending
            else:
                outcome = commands.remember(
                    pool=pool_id,
                    entry_id=entry_id,
                    reader=reader,
                    topics=topics,
                    now=self.kernel.clock(),
                    version=pool.version,
                )
                sealed = {entry_id: self.kernel.store.seal_content(pool.stored, entry_id, content)}
                done = view(outcome.upserts[0], content)
                extra = self.receipt_rows(pool, key, print_, done)
                pending = self.kernel.stage_outcome(
                    pool, outcome, sealed, extra, texts={entry_id: content}
                )
        await self.kernel.settle(pool, pending, reads_state=False)
        return done

    async def remember_packed(self, call: bytes) -> bytes:
        """`remember` from one msgpack `RememberCall`, answered as the entry's JSON (the HTTP
        body of API-2)."""
        try:
            c = _remember_dec.decode(call)
        except msgspec.DecodeError as e:
            raise InvalidInput(f"not a packed Remember: {e}") from e
        entry = await self.remember(c.pool, c.reader, c.content, c.topics, c.request_id)
        return _json.encode(entry)

    async def forget(
        self,
        pool_id: str,
        reader: Reader,
        entry_id: str,
        request_id: str | None = None,
        expected_revision: int | None = None,
    ) -> EntryView:
        key = None if request_id is None else receipt_key(pool_id, reader.user, request_id)
        print_ = fingerprint(("forget", reader.org, entry_id))
        pool, ws = await self.memory_reader.pools(pool_id)
        if self.records is not None and ws is not None and entry_id in ws.stored.entries:
            # A record a person wrote for the bot: forgotten as the workspace forgets it.
            return await self.records.forget(pool_id, reader, entry_id, request_id)
        async with pool.lock.exclusive():
            done = await self.receipt(pool, key, print_)
            if done is not None:
                pending = pool.pending
            else:
                if entry_id not in pool.entries:
                    raise Conflict("this entry is not yours to forget", code="not_yours")
                outcome = commands.forget(
                    # Visibility over the bot's one memory (an observation may rest on a record).
                    entries=self.memory_reader.learning_state(pool, ws),
                    entry_id=entry_id,
                    reader=reader,
                    now=self.kernel.clock(),
                    version=pool.version,
                )  # raises for an entry the reader may not see
                current = pool.entries[entry_id].revision
                if expected_revision is not None and current != expected_revision:
                    # Under the lock: a concurrent change makes this request stale.
                    raise Conflict(
                        f"the entry is at revision {current}, not {expected_revision}",
                        code="stale_revision",
                        details={"currentRevision": current},
                    )
                content = self.kernel.store.open_content(pool.stored, entry_id)
                meta = outcome.upserts[0] if outcome.upserts else pool.entries[entry_id]
                done = view(meta, content)
                extra = self.receipt_rows(pool, key, print_, done)
                pending = self.kernel.stage_outcome(pool, outcome, None, extra)
        await self.kernel.settle(pool, pending, reads_state=False)
        return done

    async def purge(self, pool_id: str, tag: str) -> int:
        pool = await self.kernel.pool(pool_id)
        async with pool.lock.exclusive():
            outcome = commands.purge(entries=pool.entries, tag=tag, version=pool.version)
            extra: list[Write] = []
            if outcome.deletes:
                # Stored answers may quote what was just deleted: a purge ends their replay.
                extra.append(DeleteWhere(RECEIPTS.name, "scope", (pool_id,)))
                pool.receipts.clear()
                pool.stored_receipts = set()
            pending = self.kernel.stage_outcome(pool, outcome, None, extra)
        await self.kernel.settle(pool, pending, reads_state=False)
        count = len(outcome.deletes)
        if self.records is not None and pool_id.startswith("bot:"):
            count += await self.records.purge(pool_id, tag, learned=count > 0)  # its records
        return count

    async def memory_log(self, pool_id: str, reader: Reader) -> LogPage:
        pool = await self.kernel.pool(pool_id)
        async with pool.lock.shared():
            rows = commands.visible_log(pool.stored.log, pool.entries, reader)
            version, pending = pool.version, pool.pending
        await self.kernel.settle(pool, pending)
        if self.records is not None and pool_id.startswith("bot:"):
            # The bot's records' revisions among them, by time (a stable sort keeps the order
            # of changes made at one instant).
            rows = sorted([*rows, *await self.records.log(pool_id, reader)], key=lambda r: r.at)
        return LogPage(changes=tuple(rows), version=version)

    async def context(self, pool_id: str, reader: Reader, limit: int) -> Context:
        """Visible valid entries in memory order until the first that does not fit (ENR-5)."""
        parts, has = await self.context_parts(pool_id, reader, limit)
        return Context(
            text="\n".join(t for _, t in parts), entries=tuple(i for i, _ in parts), hasEntries=has
        )

    async def context_parts(
        self, pool_id: str, reader: Reader, limit: int
    ) -> tuple[list[tuple[str, str]], bool]:
        """(id, text) of the entries `context` uses, and `hasEntries` (ENR-7). Stops at the first
        entry that does not fit, without decrypting any later one (ENR-5)."""
        if limit < 0:
            raise InvalidInput("limit must be >= 0")
        async with self.memory_reader.read(pool_id, reader) as snap:
            usable = snap.usable()
            parts: list[tuple[str, str]] = []
            size = 0
            for meta in usable:
                text = snap.open(meta.id)
                extra = len(text) + (1 if parts else 0)
                if size + extra > limit:
                    break
                parts.append((meta.id, text))
                size += extra
        return parts, bool(usable)

    async def has_entries(self, pool_id: str, reader: Reader) -> bool:
        """Whether the reader has visible valid entries, fitting a limit or not (ENR-7)."""
        pool, ws = await self.memory_reader.pools(pool_id)
        async with pool.lock.shared():
            snap = self.memory_reader.snapshot(pool, ws, reader)
            return bool(snap.visible_entries(active=True) or snap.visible_records(active=True))

    async def validate_references(
        self, pool_id: str, reader: Reader, entry_ids: Sequence[str]
    ) -> bool:
        """Whether a stored answer's entry references are all still allowed for the reader,
        from tags and sources only (ENR-8): entries pushed out of a text limit still count,
        lost access does not."""
        pool, ws = await self.memory_reader.pools(pool_id)
        async with pool.lock.shared():
            vis = self.memory_reader.snapshot(pool, ws, reader).visibility
            return all(vis.usable(i) for i in entry_ids)

    async def memory_texts(self, pool_id: str, reader: Reader) -> list[tuple[str, str]]:
        """(id, text) of every usable entry of the pool the reader may see, in memory order:
        the one visibility-checked enumeration a search index serves a reader from (ENR-5)."""
        return await self.memory_reader.texts(pool_id, reader)

    async def widen(
        self, pool_id: str, entry_id: str, grant: str, requester: str
    ) -> dict[str, object]:
        """A person's request to widen an entry (ACL-4): passes every source's rule or raises
        Conflict `widen_refused`, the same for an id that is not in the pool (so a refusal does
        not tell whether an entry exists). Tags only: the ciphertext is kept (LRN-8)."""
        widening.check_grant(grant)
        pool, ws = await self.memory_reader.pools(pool_id)
        async with pool.lock.exclusive():
            if entry_id not in pool.entries:
                raise widening.refused("no such entry in this memory")
            state = self.memory_reader.learning_state(pool, ws)
            now = self.kernel.clock()
            changed = widening.widen(state, entry_id, grant, requester=requester, now=now)
            pending = None
            version = pool.version
            if changed is not None:
                version += 1
                row = LogRow(
                    version=version, at=now, who=Who.PERSON, entry=entry_id, change=Change.UPDATED
                )
                pending = self.kernel.stage_outcome(
                    pool, Outcome(version=version, upserts=(changed,), log=(row,))
                )
        await self.kernel.settle(pool, pending, reads_state=False)
        return {"id": entry_id, "to": grant, "widened": changed is not None, "version": version}

    # --- memory-bot settings (MB-2) ------------------------------------------------------------

    async def memory_bot_settings(self, pool_id: str) -> MemoryBotSettings:
        pool = await self.kernel.pool(pool_id)
        async with pool.lock.shared():
            settings, pending = pool.stored.settings, pool.pending
        await self.kernel.settle(pool, pending)
        return settings

    async def patch_memory_bot_settings(
        self, pool_id: str, patch: SettingsPatch
    ) -> MemoryBotSettings:
        pool = await self.kernel.pool(pool_id)
        async with pool.lock.exclusive():
            settings = apply_patch(pool.stored.settings, patch)
            pool.stored.settings = settings
            row = self.kernel.store.pool_row(pool.stored, pool.version, settings)
            pending = self.kernel.stage(Batch(writes=[row]), pool)
        await self.kernel.settle(pool, pending, reads_state=False)
        return settings

    # --- entries written by the memory bot (facts, observations) ---------------------------------

    async def add_entries(
        self, pool_id: str, entries: Iterable[tuple[EntryMeta, str]], who: Who = Who.MEMORY_BOT
    ) -> int:
        """Store entries the memory bot learned (validated by its caller); returns the version."""
        pool = await self.kernel.pool(pool_id)
        async with pool.lock.exclusive():
            now = self.kernel.clock()
            version = pool.version + 1
            metas: list[EntryMeta] = []
            sealed: dict[str, bytes] = {}
            texts: dict[str, str] = {}
            for meta, content in entries:
                if meta.pool != pool_id or meta.id in pool.entries or meta.id in sealed:
                    raise InvalidInput(f"entry {meta.id} does not fit pool {pool_id}")
                metas.append(meta)
                sealed[meta.id] = self.kernel.store.seal_content(pool.stored, meta.id, content)
                texts[meta.id] = content
            log = tuple(
                LogRow(version=version, at=now, who=who, entry=m.id, change=Change.CREATED)
                for m in metas
            )
            outcome = Outcome(version=version, upserts=tuple(metas), log=log)
            pending = self.kernel.stage_outcome(pool, outcome, sealed, texts=texts)
        await self.kernel.settle(pool, pending, reads_state=False)
        return version

    async def set_status(self, pool_id: str, entry_id: str, status: Status) -> int:
        """Invalidate (or otherwise re-status) an entry as the memory bot: tags and ciphertext are
        untouched (LRN-8)."""
        pool = await self.kernel.pool(pool_id)
        async with pool.lock.exclusive():
            meta = pool.entries.get(entry_id)
            if meta is None:
                raise NotFound(f"no entry {entry_id}")
            now = self.kernel.clock()
            changed = msgspec.structs.replace(
                meta,
                status=status,
                updated_at=now,
                invalidated_at=now if status == Status.INVALIDATED else meta.invalidated_at,
                revision=meta.revision + 1,
            )
            version = pool.version + 1
            change = Change.INVALIDATED if status == Status.INVALIDATED else Change.UPDATED
            row = LogRow(version=version, at=now, who=Who.MEMORY_BOT, entry=entry_id, change=change)
            pending = self.kernel.stage_outcome(
                pool, Outcome(version=version, upserts=(changed,), log=(row,))
            )
        await self.kernel.settle(pool, pending, reads_state=False)
        return version
