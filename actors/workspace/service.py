"""Workspace scoped memory on a shard (SC-1..SC-3, WA-1, WA-2).

The records of the pools hosted here — `bot:<id>` (the bot's owner's shard), `user:<accountId>`
(the account's shard) and `project:<id>` (the project owner's shard) — are kept by `WorkspacePools`
(actors/workspace/pools.py), loaded per pool on first use, content sealed with the pool's data
key; projects by `Projects` (actors/workspace/projects.py).

Every write takes a `requestId` (actors/workspace/receipts.py). Edits carry `expectedRevision`
(engine/scoped_memory.py decides); nothing is written when they refuse. `memory.changed` events
go into the same batch and are published after commit, with audiences that admit only who may
read: a project's members, the account itself for user memory, whoever uses the bot for bot
memory.

Access: the gateway passes the caller's account and the bots they use (`WorkspaceAccess`); project
membership is checked here, where the project is. A pool the caller may not read is "not found".
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

import msgspec

from actors.contracts import RevisionView, WorkspaceAccess
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, durable
from actors.shard.memory_ops import MemoryOps
from actors.workspace.access import WorkspaceRules
from actors.workspace.bot_records import BotRecords
from actors.workspace.pools import WorkspacePool, WorkspacePools
from actors.workspace.projects import Projects
from actors.workspace.receipts import RECEIPT_SCOPE, WorkspaceReceipts
from actors.workspace.semantic import SemanticSearch
from engine import memory_union as bm
from engine import projects as projmod
from engine import scoped_memory as sm
from engine.errors import Conflict, Forbidden, InvalidInput, NotFound
from engine.events import NOBODY, Audience, MemoryChanged, Payload
from engine.fingerprints import content_fingerprint
from engine.memory_entries import Scope
from engine.scoped_memory import (
    ForgetBarrier,
    WorkspaceEntry,
    WorkspaceEntryView,
    WorkspaceForget,
    WorkspaceMemoryChange,
    WorkspaceMemoryCreate,
)
from storage.crypto import random_bytes
from storage.group_commit import Write
from storage.receipts import fingerprint, receipt_key

_entry_view_dec = msgspec.json.Decoder(WorkspaceEntryView)
_decisions_dec = msgspec.json.Decoder(list[sm.Decision])


# A person writes many records with the same tags: kept for up to this many (account, org).
_record_tags = functools.lru_cache(maxsize=4_096)(bm.record_tags)


def new_memory_id() -> str:
    return "mem_" + random_bytes(12).hex()


class Workspace:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        pools: WorkspacePools,
        projects: Projects,
        receipts: WorkspaceReceipts,
        memory: MemoryOps,
        rules: WorkspaceRules,
        semantic: SemanticSearch | None = None,
        new_id: Callable[[], str] = new_memory_id,
    ) -> None:
        self.kernel = kernel
        self.pools = pools
        self.projects = projects
        self.receipts = receipts
        self.memory = memory  # a bot's one memory: its learned entries (MEM-1)
        self.rules = rules
        self.semantic = semantic  # when configured (SC-7)
        self.store = pools.store
        self.new_id: Callable[[], str] = new_id
        self.records = memory.records = BotRecords(self)  # the bot memory routes reach records

    async def purge_learned(self, bot: str, chat: str) -> int:
        """Delete the user and project facts of the pools here that bot `bot` learned from
        chat `chat` (a purge of `chat:<id>`, API-5); their count."""
        return await self.records.purge_learned(bot, chat)

    async def _locate(self, entry_id: str) -> str | None:
        for pool in self.pools.loaded():
            if entry_id in pool.stored.entries:
                return pool.id
        for seed in self.kernel.loaded():  # a bot's learned entries, maybe queued
            if seed.id.startswith("bot:") and entry_id in seed.entries:
                return seed.id
        return await self.store.entry_pool(entry_id)

    async def has_entry(self, entry_id: str) -> bool:
        """Whether a workspace record with this id is kept on this shard (for routing only)."""
        return await self._locate(entry_id) is not None

    # --- memory ---------------------------------------------------------------------------------

    async def create_memory(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> WorkspaceEntryView:
        pool_id, key, print_ = await self.create_check(access, body)
        pool = await self.pools.pool(pool_id)
        async with self.receipts.request(key), pool.lock:
            raw = await self.receipts.replay(key, print_, pool.keyed)
            if raw is not None:
                return _entry_view_dec.decode(raw)
            edit, answer = self.create_edit(pool, access, body)
            fut = self._apply(pool, edit, body.content, "created", (key, print_, answer), new=True)
        await durable(fut)
        return answer

    async def create_check(
        self, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> tuple[str, str, str]:
        """A creation's checks before its pool is locked: its pool, receipt key, fingerprint."""
        key, print_ = self.create_receipt(access, body)
        return await self.create_pool(access, body), key, print_

    @staticmethod
    def create_receipt(access: WorkspaceAccess, body: WorkspaceMemoryCreate) -> tuple[str, str]:
        """A creation's receipt key and fingerprint, its requestId checked."""
        projmod.check_request_id(body.requestId)
        key = receipt_key(RECEIPT_SCOPE, access.account, body.requestId)
        return key, fingerprint(("memory.create", body))

    async def create_pool(self, access: WorkspaceAccess, body: WorkspaceMemoryCreate) -> str:
        """The pool a creation writes to, if the caller may write there (`create_check`'s
        checks of who asks, not of the request itself)."""
        if body.bot not in access.bots:
            raise Forbidden("you have no access to this bot", code="no_access")
        pool_id = sm.pool_of(body.scope, bot=body.bot, account=access.account, project=body.project)
        await self.projects.load()
        self.rules.require(pool_id, access)
        return pool_id

    def create_edit(
        self, pool: WorkspacePool, access: WorkspaceAccess, body: WorkspaceMemoryCreate
    ) -> tuple[sm.Edit, WorkspaceEntryView]:
        """A new record and its answer (under the pool's lock, after the receipt check); refuses
        before anything changes."""
        if pool.id.startswith("project:"):  # membership may have changed while waiting
            self.rules.require(pool.id, access)  # (who may use a bot or a user pool may not)
        entry_id = self.new_id()
        if entry_id in pool.stored.entries:
            raise Conflict(f"new id {entry_id!r} is already taken", code="id_taken")
        tags: tuple[str, ...] = ()
        if body.scope == Scope.BOT:
            # Tagged with the org the person works in with the bot (a shared bot's other org).
            org = self.rules.bot_org(pool, access)
            if pool.bot_org is None or org == NOBODY.org:
                raise NotFound("no such bot", code="bot_not_found")
            tags = _record_tags(access.account, org)
        edit = sm.user_create(
            entry_id=entry_id,
            pool=pool.id,
            contributor=body.bot,
            content=body.content,
            operator=access.account,
            now=self.kernel.clock(),
            tier=body.tier,
            topics=body.topics,
            key=pool.fp_key,
            tags=tags,
            thread=body.thread,
            position=body.position,
        )
        return edit, sm.view(edit.entry, body.content)

    async def change_memory(
        self, access: WorkspaceAccess, body: WorkspaceMemoryChange | WorkspaceForget
    ) -> WorkspaceEntryView:
        """A person's edit (content, tier, topics) or forgetting, by `expectedRevision`."""
        projmod.check_request_id(body.requestId)
        pool_id = await self._locate(body.id)
        await self.projects.load()
        if pool_id is None or not self.rules.readable(pool_id, access):
            raise NotFound("no such memory", code="memory_not_found")
        forgetting = isinstance(body, WorkspaceForget)
        key = receipt_key(RECEIPT_SCOPE, access.account, body.requestId)
        print_ = fingerprint(("memory.forget" if forgetting else "memory.change", body))
        pool = await self.pools.pool(pool_id)
        if body.id not in pool.stored.entries and pool_id.startswith("bot:"):
            return await self._change_learned(pool, access, body)
        async with self.receipts.request(key), pool.lock:
            raw = await self.receipts.replay(key, print_, pool.keyed)
            if raw is not None:
                return _entry_view_dec.decode(raw)
            self.rules.require(pool_id, access)
            entry = pool.stored.entries.get(body.id)
            if entry is None or not self.rules.sees(pool, access, entry):
                # Reloaded without it (a failed commit), or a bot record outside the caller's org.
                raise NotFound("no such memory", code="memory_not_found")
            old = self.pools.open(pool, entry.id)
            now = self.kernel.clock()
            if isinstance(body, WorkspaceForget):
                edit = sm.forget(
                    entry, body.expectedRevision, operator=access.account, old_content=old, now=now
                )
                content, change = old, "forgotten"
            else:
                edit = sm.user_edit(
                    entry,
                    body.content,
                    body.expectedRevision,
                    operator=access.account,
                    old_content=old,
                    now=now,
                    tier=body.tier,
                    topics=body.topics,
                    key=pool.fp_key,
                )
                content = old if body.content is None else body.content
                change = "edited"
            answer = sm.view(edit.entry, content)
            fut = self._apply(pool, edit, content, change, (key, print_, answer), new=False)
        await durable(fut)
        return answer

    async def _change_learned(
        self,
        pool: WorkspacePool,
        access: WorkspaceAccess,
        body: WorkspaceMemoryChange | WorkspaceForget,
    ) -> WorkspaceEntryView:
        """A learned entry of the bot's one memory, through the workspace routes: forgetting it
        is the memory API's Forget (the caller's part: retracted when it is only theirs, API-2) by
        `expectedRevision`; its words are the memory bot's to change, not an edit's."""
        reader = self.rules.bot_reader(pool, access)
        if isinstance(body, WorkspaceMemoryChange):
            seed = await self.kernel.pool(pool.id)
            if body.id in seed.entries and self.memory.memory_reader.snapshot(
                seed, pool, reader
            ).visibility.visible(body.id):
                raise Conflict(
                    "a learned entry is kept by the memory bot; forget it instead",
                    code="learned_entry",
                )
            raise NotFound("no such memory", code="memory_not_found")
        try:
            await self.memory.forget(
                pool.id,
                reader,
                body.id,
                request_id=f"ws\x00{body.requestId}",
                expected_revision=body.expectedRevision,
            )
        except Conflict as e:
            if e.code == "not_yours":  # not visible to the caller: not found, as elsewhere
                raise NotFound("no such memory", code="memory_not_found") from e
            raise
        seed = await self.kernel.pool(pool.id)
        meta = seed.entries[body.id]
        content = self.kernel.store.open_content(seed.stored, body.id)
        return bm.as_record_view(meta, content, sm.pool_owner(pool.id))

    def _apply(
        self,
        pool: WorkspacePool,
        edit: sm.Edit,
        content: str,
        change: str,
        receipt: tuple[str, str, WorkspaceEntryView],
        *,
        new: bool,
    ) -> asyncio.Future[None]:
        """Queue one person's change (under the pool's lock) and make it the pool's state."""
        batch = self.change_batch(pool, edit, content, change, new=new)
        changed = bool(batch.writes)
        key, print_, answer = receipt
        fut = self.receipts.stage(batch, (key, print_, msgspec.json.encode(answer), pool.keyed))
        if changed:
            pool.pending = fut
            self.pools.resident(pool)  # its size changed
        return fut

    def change_batch(
        self,
        pool: WorkspacePool,
        edit: sm.Edit,
        content: str,
        change: str,
        *,
        new: bool,
        into: Batch | None = None,
    ) -> Batch:
        """Make one person's change the pool's state (under the pool's lock): the batch that
        stores it (rows and events; the pool is dropped if it fails), its receipt not yet in.
        With `into`, its rows and events join that batch (a coalesced call's; its caller sees
        to the failure hook) and it is returned."""
        stored, keyed = pool.stored, pool.keyed
        entry = edit.entry
        writes: list[Write] = []
        events: list[tuple[Payload, Audience]] = []
        audience = self.rules.audience(pool.id, entry)
        if edit.revision is not None:  # something changed
            sealed = (
                self.store.seal(keyed.cipher, pool.id, entry.id, content)
                if new or edit.revision.after is not None
                else stored.sealed[entry.id]
            )
            writes.append(self.store.entry_row(entry, sealed, new=new))
            if new or edit.revision.after is not None:
                writes.extend(self.pools.indexed(pool, entry, content, new=new))
            writes.append(self.store.revision_row(pool.id, edit.revision, keyed.cipher))
            if edit.barrier is not None:
                writes.append(self.store.barrier_row(edit.barrier, entry.revision))
            events.append(
                (
                    MemoryChanged(
                        pool=pool.id,
                        entry=entry.id,
                        version=entry.revision,
                        change=change,
                        bot=entry.contributor,
                    ),
                    audience,
                )
            )
            stored.entries[entry.id] = entry
            stored.sealed[entry.id] = sealed
            if self.semantic is not None:
                self.semantic.written(pool.id, entry.id)
            if edit.barrier is not None:
                stored.barriers.append(edit.barrier)
            # Records flagged for review whose rival is gone settle (metadata only). A new
            # record takes no rival away: only edits and forgetting need the walk of the pool.
            for settled in () if new else sm.settled_reviews(stored.entries):
                writes.append(self.store.entry_row(settled, stored.sealed[settled.id], new=False))
                stored.entries[settled.id] = settled
                events.append(
                    (
                        MemoryChanged(
                            pool=pool.id,
                            entry=settled.id,
                            version=settled.revision,
                            change="reviewed",
                            bot=settled.contributor,
                        ),
                        self.rules.audience(pool.id, settled),
                    )
                )
        if into is not None:
            into.writes.extend(writes)
            into.events.extend(events)
            return into
        return Batch(writes=writes, events=events).fail(lambda: self.pools.drop(pool))

    async def extract(
        self,
        pool_id: str,
        contributor: str,
        proposals: Sequence[sm.Extraction],
        sources: Sequence[sm.SourceItem],
        request_id: str,
        now: int | None = None,
    ) -> list[sm.Decision]:
        """Store what the memory bot of bot `contributor` learned for a user or project pool
        hosted here (SC-1..SC-3): each proposal goes through `propose_extraction` against the
        pool's latest records and forget barriers, in order, under the pool's lock. Created,
        updated and review-flagged records are stored as people's writes are (records,
        revisions, `memory.changed` events to who may read). `request_id` (the learning job's)
        makes a repeat return the first decisions and store nothing again."""
        scope = sm.scope_of(pool_id)
        if scope == Scope.BOT:
            raise InvalidInput("bot memory is kept in the bot's pool", code="invalid_pool")
        projects = await self.projects.load()
        if scope == Scope.PROJECT and sm.pool_owner(pool_id) not in projects:
            return [
                sm.Decision(outcome="refused", code="not_found", reason="no such project here")
                for _ in proposals
            ]
        if (
            scope == Scope.USER
            and self.rules.peers.index_of(sm.pool_owner(pool_id)) != self.kernel.index
        ):
            raise InvalidInput("a user pool is kept on the account's shard", code="wrong_shard")
        proposals = list(proposals)
        for p in proposals:
            if p.pool != pool_id or p.contributor != contributor:
                raise InvalidInput("every proposal must be for this pool and bot", code="invalid")
        by_marker = {s.marker: s for s in sources}
        # One learning job extracts into several pools (the user's, the project's), maybe
        # all on this shard, under one request id: each pool's answer is a receipt of its own.
        key = receipt_key(RECEIPT_SCOPE, f"bot:{contributor}", f"{request_id}\x00{pool_id}")
        print_ = fingerprint(("memory.extract", pool_id, contributor, proposals, sources))
        pool = await self.pools.pool(pool_id)
        async with self.receipts.request(key), pool.lock:
            raw = await self.receipts.replay(key, print_, pool.keyed)
            if raw is not None:
                return _decisions_dec.decode(raw)
            stored = pool.stored
            at = self.kernel.clock() if now is None else now
            contents = {
                e.id: self.pools.open(pool, e.id)
                for p in proposals
                if p.replaces is not None and (e := stored.entries.get(p.replaces)) is not None
            }

            def new_id() -> str:
                while (fresh := self.new_id()) in stored.entries:
                    pass
                return fresh

            decisions, records, texts = sm.propose_all(
                stored.entries,
                proposals,
                list(stored.barriers),
                at,
                new_id,
                sources=by_marker,
                contents=contents,
                key=pool.fp_key,
            )
            fut = self._apply_extraction(pool, decisions, records, texts, (key, print_, decisions))
        await durable(fut)
        return decisions

    def _apply_extraction(
        self,
        pool: WorkspacePool,
        decisions: Sequence[sm.Decision],
        records: dict[str, WorkspaceEntry],
        texts: dict[str, str],
        receipt: tuple[str, str, Sequence[sm.Decision]],
    ) -> asyncio.Future[None]:
        """Queue what an extraction created, updated or flagged (under the pool's lock)."""
        stored, keyed = pool.stored, pool.keyed
        writes: list[Write] = []
        events: list[tuple[Payload, Audience]] = []
        for entry_id, entry in records.items():
            audience = self.rules.audience(pool.id, entry)
            new = entry_id not in stored.entries
            if entry_id in texts:
                sealed = self.store.seal(keyed.cipher, pool.id, entry_id, texts[entry_id])
                writes.extend(self.pools.indexed(pool, entry, texts[entry_id], new=new))
            else:  # flagged for review only: the content stays as it is
                sealed = stored.sealed[entry_id]
            writes.append(self.store.entry_row(entry, sealed, new=new))
            change = "reviewed" if entry_id not in texts else ("extracted" if new else "updated")
            events.append(
                (
                    MemoryChanged(
                        pool=pool.id,
                        entry=entry_id,
                        version=entry.revision,
                        change=change,
                        bot=entry.contributor,
                    ),
                    audience,
                )
            )
            stored.entries[entry_id] = entry
            stored.sealed[entry_id] = sealed
            if entry_id in texts and self.semantic is not None:
                self.semantic.written(pool.id, entry_id)
        for d in decisions:
            if d.accepted and d.revision is not None:
                writes.append(self.store.revision_row(pool.id, d.revision, keyed.cipher))
        key, print_, answer = receipt
        raw = msgspec.json.encode(list(answer))
        batch = Batch(writes=list(writes), events=events).fail(lambda: self.pools.drop(pool))
        fut = self.receipts.stage(batch, (key, print_, raw, keyed))
        if writes:
            pool.pending = fut
            self.pools.resident(pool)  # its size changed
        return fut

    async def revisions(self, access: WorkspaceAccess, entry_id: str) -> list[RevisionView]:
        pool_id = await self._locate(entry_id)
        await self.projects.load()
        if pool_id is None or not self.rules.readable(pool_id, access):
            raise NotFound("no such memory", code="memory_not_found")
        pool = await self.pools.pool(pool_id)
        await self.pools.settle_read(pool)
        rows = await self.store.revisions(pool_id, entry_id, pool.keyed.cipher)
        return [RevisionView(**msgspec.structs.asdict(r)) for r in rows]

    # --- forget barriers (SC-3): what extraction will check ----------------------------------

    async def barriers(self, pool_id: str) -> list[ForgetBarrier]:
        pool = await self.pools.pool(pool_id)
        await self.pools.settle_read(pool)
        return list(pool.stored.barriers)

    async def blocked(
        self, pool_id: str, content: str, evidence: Sequence[str] = ()
    ) -> ForgetBarrier | None:
        """The barrier that keeps `content` (or anything citing `evidence`) out of the pool."""
        pool = await self.pools.pool(pool_id)
        fp = content_fingerprint(content, pool.fp_key)
        return sm.blocked_by(pool_id, fp, evidence, pool.stored.barriers)
