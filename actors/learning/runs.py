"""Durable learning executions (LRN-3 … LRN-10, MB-5, CO-3).

A job is stored before it runs and is driven from the database: at start every open job runs
again. Its one model step is recorded (request, result, cost) in the encrypted call log *before*
anything is applied, so a restart reuses the recorded result instead of calling the model again.
The memory changes, the chat's read position and the end of the job commit in one transaction
(LRN-5); the user and project facts it decided for other pools are staged in that same commit
and sent to their pools after it, idempotently, again at every start until stored
(actors/learning/outbox.py). Jobs of one pool and chat run one at a time, from reading the read
position to committing the new one (`_run`'s lock; nothing else moves a position), so the same
evidence is never applied twice. No pool lock is held across the model call or the calls to the
directory and other shards (user and project facts). A step over two minutes ends the job with a
safe error and leaves the read position where it was.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Coroutine
from typing import Any, Protocol

import msgspec

from actors.learning import outbox
from actors.learning.jobs import job_event
from actors.learning.memory_bot_runtime import BudgetSpent, MemoryBotRuntime
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, ignore_failure
from actors.shard.memory_reader import MemoryReader
from actors.shard.residency import unused
from engine import scoped_memory as sm
from engine import tags as tagmod
from engine.chat_records import LearningJob
from engine.commands import Outcome
from engine.errors import Conflict, OpenBotError
from engine.learning import (
    Audience,
    EvidenceItem,
    build_request,
    decide,
)
from engine.memory_bot_settings import next_period_start
from engine.memory_entries import Change, LogRow, Reader, Scope, Who
from engine.models import Completion, Message
from engine.turns import LEARNING_STEP_LIMIT, LEARNING_TOOLS, learning_system
from storage.chat_store import ChatLog, ChatStore, ModelCall

log = logging.getLogger("openbot.learning")
AUTO_RETRIES = 3  # CO-3
WAKE_MARGIN = 0.05  # seconds past a period boundary, so the new period has surely begun
# Seconds before the first retry, doubled each time (the tests shorten it).
RETRY_DELAY = float(os.environ.get("OPENBOT_LEARNING_RETRY_DELAY", "2.0"))
_completion_enc = msgspec.json.Encoder()
_completion_dec = msgspec.json.Decoder(Completion)


class EvidenceLogs(Protocol):
    """Where a job reads its evidence: the chat items kept on this shard (actors/chats/)."""

    async def log(self, chat: str) -> ChatLog: ...


class LearningRunner:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        store: ChatStore,
        runtime: MemoryBotRuntime,
        memory: MemoryReader,
        logs: EvidenceLogs,
        peers: Peers,
    ) -> None:
        self.kernel = kernel
        self.store = store
        self.runtime = runtime
        self.memory = memory
        self.logs = logs  # the evidence: chat items kept on this shard
        self.peers = peers
        self.chat_of = lambda chat: peers.directory().get_chat(chat)  # + this shard's agent chats
        kernel.on_evict_memory.append(self.forget_pool)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._chains: dict[tuple[str, str], asyncio.Lock] = {}
        self._positions: dict[str, dict[str, int]] = {}  # pool → chat → read position
        self.model_steps = 0  # model calls actually made (tests and benchmarks read it)
        self.step_limit = LEARNING_STEP_LIMIT
        self.retry_delay = RETRY_DELAY
        self._waiting: dict[str, list[LearningJob]] = {}
        self._recovered: set[str] = set()  # jobs found open at start: their step may be recorded

    async def schedule(self, job: LearningJob) -> None:
        """Store a job and run it (callers that commit the job row themselves use `start`)."""
        await self._save(job)
        self.start(job)

    def start(self, job: LearningJob) -> None:
        """Run a job whose row is stored."""
        self._spawn(job)
        # Jobs of this pool that waited for budget get another chance now (MB-3).
        self.wake(job.pool)

    async def recover(self) -> int:
        """Run every job that was open when the shard stopped, and send the facts staged by
        steps that committed but whose pools had not stored them yet (LRN-5)."""
        for job_id, pool_id, sealed in await self.store.outbox():
            self._spawn_task(f"outbox:{job_id}", self._resend(job_id, pool_id, sealed))
        jobs = await self.store.open_jobs()
        for job in jobs:
            self._recovered.add(job.id)
            self._spawn(job)
        return len(jobs)

    async def wait(self, job_id: str) -> None:
        task = self._tasks.get(job_id)
        if task is not None:
            await asyncio.shield(task)

    async def idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    def abandon(self) -> None:
        """Cancel every running job where it stands, as a process that stops does: what a
        job committed stays, and `recover` (at the next start) resumes it from there."""
        for task in list(self._tasks.values()):
            task.cancel()

    def _spawn(self, job: LearningJob) -> None:
        self._spawn_task(job.id, self._run(job))

    def _spawn_task(self, key: str, work: Coroutine[Any, Any, None]) -> None:
        if key in self._tasks:
            work.close()
            return
        task = asyncio.create_task(work)
        self._tasks[key] = task
        task.add_done_callback(lambda _t, k=key: self._tasks.pop(k, None))

    def _queue_save(self, job: LearningJob):
        """Queue the job's row and event; group commit keeps them in order with what follows."""
        fut = self.kernel.stage(Batch(writes=[self.store.job_row(job)], events=[job_event(job)]))
        assert fut is not None  # the job row is always there
        ignore_failure(fut)
        return fut

    async def _save(self, job: LearningJob) -> None:
        await self._queue_save(job)

    async def _position(self, pool: str, chat: str) -> int:
        known = self._positions.get(pool, {}).get(chat)
        if known is None:
            known = await self.store.position(pool, chat)
            self._positions.setdefault(pool, {})[chat] = known
        return known

    def forget_pool(self, pool: str) -> None:
        """The pool left memory: its cached read positions go too (they are on disk)."""
        self._positions.pop(pool, None)

    async def _run(self, job: LearningJob) -> None:
        key = (job.pool, job.chat)
        lock = self._chains.setdefault(key, asyncio.Lock())
        try:
            await self._run_locked(job, lock)
        finally:
            # The last job of this pool and chat takes its lock along (memory stays bounded).
            if not lock.locked() and self._chains.get(key) is lock and unused(lock, 1):
                del self._chains[key]

    async def _run_locked(self, job: LearningJob, lock: asyncio.Lock) -> None:
        retry: LearningJob | None = None
        async with lock:
            # "running" and the attempt count go to disk with the recorded model step.
            job = msgspec.structs.replace(
                job, status="running", attempts=job.attempts + 1, updated_at=self.kernel.clock()
            )
            try:
                # MB-5: the model step is bounded by `step_limit` (its call's timeout); applying
                # is not, so a late apply never commits under a job already ended as failed.
                await self._execute(job)
            except BudgetSpent:
                await self._end(job, "waiting", "the memory bot's budget is spent for now")
            except OpenBotError as e:
                log.warning("learning job %s failed: %s", job.id, e.message)
                if e.code == "model_timeout":
                    await self._end(job, "failed", "the learning step took longer than 2 minutes")
                elif job.attempts <= AUTO_RETRIES:
                    # CO-3: a failed step is tried again, at most 3 times, off the chat's path.
                    retry = await self._end(job, "pending", f"the learning step failed: {e.code}")
                else:
                    await self._end(job, "failed", f"the learning step failed: {e.code}")
            except Exception as e:  # never leave a job running
                log.exception("learning job %s crashed", job.id)
                await self._end(job, "failed", f"internal error: {type(e).__name__}")
        if retry is not None:
            await asyncio.sleep(self.retry_delay * 2 ** (retry.attempts - 1))
            await self._run(retry)

    async def retry(self, job: LearningJob) -> LearningJob:
        """A person asks to try a failed job again (`/memory-jobs/:id/retry`)."""
        if job.status != "failed":
            raise Conflict(
                f"only failed jobs are retried; this one is {job.status}", code="not_failed"
            )
        job = msgspec.structs.replace(
            job, status="pending", error=None, updated_at=self.kernel.clock()
        )
        await self._save(job)
        self.start(job)
        return job

    async def release(self, job_id: str, upto: int) -> bool:
        """Start a job that waited for its turn's collaboration to come back (CO-2), reading up
        to `upto` so the results in the original topic count."""
        job = next((j for j in await self.store.open_jobs(deferred=True) if j.id == job_id), None)
        if job is None or job.status != "deferred":
            return False
        job = msgspec.structs.replace(
            job, status="pending", upto=max(job.upto, upto), updated_at=self.kernel.clock()
        )
        await self._save(job)
        self.start(job)
        return True

    async def _end(self, job: LearningJob, status: str, error: str | None) -> LearningJob:
        if status == "failed":
            log.warning(
                "learning job %s (%s, chat %s) failed: %s", job.id, job.pool, job.chat, error
            )
        wake_at = await self._next_period(job.pool) if status == "waiting" else None
        job = msgspec.structs.replace(
            job, status=status, error=error, updated_at=self.kernel.clock(), wake_at=wake_at
        )
        await self._save(job)
        if status == "waiting":
            self._waiting.setdefault(job.pool, []).append(job)
            if wake_at is not None:
                self._wake_at(job.pool, wake_at)
        return job

    async def _next_period(self, pool_id: str) -> int | None:
        """When the budget that stopped this pool's learning starts its next period (MB-3)."""
        budget = (await self.kernel.pool(pool_id)).stored.settings.budget
        return None if budget is None else next_period_start(budget.period, self.kernel.clock())

    def _wake_at(self, pool_id: str, at: int) -> None:
        """A timer for the period boundary, read on the shard's clock: the waiting jobs run
        again then, whether or not another job starts meanwhile (MB-3)."""
        delay = max(0.0, (at - self.kernel.clock()) / 1000) + WAKE_MARGIN
        asyncio.get_running_loop().call_later(delay, self.wake, pool_id)

    def wake(self, pool_id: str) -> None:
        """Run the jobs of this pool that wait for budget (a new period, or new settings)."""
        for waiting in self._waiting.pop(pool_id, []):
            self._spawn(waiting)

    async def _execute(self, job: LearningJob) -> None:
        start = await self._position(job.pool, job.chat)
        if start >= job.upto:
            await self._end(job, "done", None)  # another execution learned from this already
            return
        log = await self.logs.log(job.chat)
        evidence = [
            EvidenceItem(
                chat=job.chat,
                item=i.id,
                kind=i.kind,
                author=i.author,
                text=self.store.text(log, i.seq),
            )
            for i in log.items
            if start < i.seq <= job.upto
        ]
        model = self.runtime.model(job.model)
        isolation = getattr(model, "isolation", None)
        if isolation is not None and not (await isolation())[1]:
            # ND-2: tool-less extraction only on a node that reports memory_extraction.
            await self._end(job, "failed", "the memory model's node cannot run extraction")
            return
        if model is None or not any(e.kind == "person" for e in evidence):
            # MB-1: no memory model learns nothing; nothing a person said: nothing to learn.
            await self._end(job, "done", None if model else "no memory model is set")
            return
        pool = await self.kernel.pool(job.pool)
        settings = pool.stored.settings
        # A step is recorded only by an attempt that reached the model; a job's first attempt in
        # the process that created it has none to find (saves a read per turn).
        fresh = job.attempts == 1 and job.id not in self._recovered
        recorded = None if fresh else await self.store.model_call(pool.stored, job.id, 1)
        if recorded is not None and recorded.response is not None:
            completion = _completion_dec.decode(recorded.response)  # LRN-4: reuse, never re-call
        else:
            # The model sees only what the turn's audience may see: whatever it writes is shown
            # to that audience, so it must not be able to restate anyone else's entries.
            reader = Reader(
                user=job.grant.removeprefix("for:person:") if job.channel is None else "\x00",
                org=job.org,
                channels=frozenset({job.channel}) if job.channel else frozenset(),
                uses_bot=True,
            )
            # ENR-5: the pool's one visibility-checked read (the bot's whole memory).
            entries, topics = await self.memory.learning_context(job.pool, reader, encoded=True)
            system = learning_system(settings.instructions)  # MB-2
            request, _ = build_request(evidence, entries, topics, overhead=len(system))
            messages = [
                Message(role="system", content=system),
                Message(role="user", content=request),
            ]
            self.model_steps += 1
            try:
                completion = await self.runtime.call(
                    job.pool,
                    settings,
                    model,
                    messages,
                    LEARNING_TOOLS,
                    timeout=self.step_limit,
                    org=job.org,
                )
            except BudgetSpent:
                raise  # the model was not asked: nothing to record
            except OpenBotError as e:
                # LRN-4: a failed attempt keeps its own sealed record; the next one adds another.
                failed = ModelCall(
                    step=1, attempt=job.attempts, request=request, error=f"{e.code}: {e.message}"
                )
                self._record_call(pool.stored, job, failed)
                raise
            call = ModelCall(
                step=1,
                attempt=job.attempts,
                request=request,
                response=_completion_enc.encode(completion).decode(),
            )
            self._record_call(pool.stored, job, call)
        await self.apply_step(job, pool, completion, {(e.chat, e.item): e for e in evidence})

    def _record_call(self, stored, job: LearningJob, call: ModelCall) -> None:
        """Queue an attempt's call record with the job row. Queued, not awaited: it commits
        before what follows (group commit keeps order), and if the process dies first the
        attempt was simply not recorded."""
        batch = Batch().key(stored).emit(*job_event(job))
        batch.add(
            self.store.model_call_row(stored, job.id, call, self.kernel.clock()),
            self.store.job_row(job),
            *self.runtime.spend_rows(),
        )
        recorded_fut = self.kernel.stage(batch)
        assert recorded_fut is not None
        ignore_failure(recorded_fut)

    async def apply_step(self, job: LearningJob, pool, completion: Completion, evidence) -> None:
        """Apply a model step's tool calls to the bot's pool, and stage the user and project
        facts it decided for their pools (`evidence`: the step's chat items by (chat, item))."""
        calls = [(c.name, c.arguments.encode()) for c in completion.tool_calls]
        audience = Audience(chat=job.chat, org=job.org, grant=job.grant, channel=job.channel)
        now = self.kernel.clock()

        def new_ids():
            return (f"mem_{secrets.token_hex(12)}" for _ in iter(int, 1))

        # User and project facts go to the workspace pools (SC-1..SC-3), maybe on other shards:
        # they are decided from the pool's state under its shared lock, staged in the commit
        # that moves the read position (LRN-5) and sent once it is stored, outside any pool
        # lock (ACL-9); each pool's receipt makes a repeat store nothing twice.
        _, ws = await self.memory.pools(job.pool)
        async with pool.lock.shared():
            first = decide(
                calls,
                pool=job.pool,
                entries=self.memory.learning_state(pool, ws),
                evidence=evidence,
                audience=audience,
                now=now,
                new_ids=new_ids(),
            )
        # The read position `_execute` started from is still the chat's: nothing but this job
        # moves it while `_run` holds the chat's lock.
        staged, workspace_rejected = await self._stage_scoped(job, first.new, evidence, now)
        async with pool.lock.exclusive():
            decision = decide(
                calls,
                pool=job.pool,
                # The latest state, under the write lock (LRN-8): the bot's one memory.
                entries=self.memory.learning_state(pool, ws),
                evidence=evidence,
                audience=audience,
                now=now,
                new_ids=new_ids(),
            )
            rejections = tuple(
                [f"{r.tool}: {r.reason}" for r in decision.rejected] + workspace_rejected
            )
            decision = msgspec.structs.replace(
                decision,
                new=[(m, t) for m, t in decision.new if m.scope == Scope.BOT],
                # A person's workspace records are never changed by the memory bot.
                changed=[m for m in decision.changed if m.id in pool.entries],
            )
            version = pool.version + 1
            log_rows = [
                LogRow(
                    version=version,
                    at=now,
                    who=Who.MEMORY_BOT,
                    entry=m.id,
                    change=Change.CREATED,
                )
                for m, _ in decision.new
            ] + [
                LogRow(
                    version=version,
                    at=now,
                    who=Who.MEMORY_BOT,
                    entry=m.id,
                    change=Change.INVALIDATED if m.status == "invalidated" else Change.UPDATED,
                )
                for m in decision.changed
            ]
            sealed = {
                m.id: self.kernel.store.seal_content(pool.stored, m.id, text)
                for m, text in decision.new
            }
            outcome = Outcome(
                version=version if log_rows else pool.version,
                upserts=tuple([m for m, _ in decision.new] + decision.changed),
                log=tuple(log_rows),
            )
            rejected = len(rejections)
            done = msgspec.structs.replace(
                job,
                status="done",
                error=f"{rejected} proposed change(s) rejected" if rejected else None,
                rejections=rejections,
                updated_at=now,
            )
            self._positions.setdefault(job.pool, {})[job.chat] = job.upto
            extra = [
                self.store.position_row(job.pool, job.chat, job.upto),
                self.store.job_row(done),
                *self.runtime.spend_rows(),
            ]
            if staged is not None:
                # LRN-5: the facts for other pools commit with the read position they
                # were learned up to; they reach their pools after this commit.
                payload = outbox.encode(staged)
                extra.append(self.store.outbox_row(pool.stored, job.id, payload, now))
            pending = self.kernel.stage_outcome(
                pool,
                outcome,
                sealed,
                extra,
                [job_event(done)],
                texts={m.id: text for m, text in decision.new},
            )
        try:
            await self.kernel.settle(pool, pending, reads_state=False)
        except BaseException:
            # Reload what was really stored.
            self._positions.get(job.pool, {}).pop(job.chat, None)
            raise
        if staged is not None and not await self._send_staged(pool.stored, staged, done):
            # Off the chat's path: its next job need not wait for a shard to come back.
            self._spawn_task(f"outbox:{job.id}", self._send_later(pool.stored, staged, done))

    async def _stage_scoped(
        self, job: LearningJob, new, evidence, now: int
    ) -> tuple[outbox.StagedFacts | None, list[str]]:
        """The user- and project-scope facts among `new`, grouped by the workspace pool that
        keeps them, to stage with the step (nothing is sent yet); why each one refused here was
        refused. User scope needs the turn's one person (a direct chat); project scope needs
        the chat's project."""
        scoped = [(m, t) for m, t in new if m.scope != Scope.BOT]
        if not scoped:
            return None, []
        contributor = job.pool.removeprefix("bot:")
        user = (
            job.grant.removeprefix("for:person:") if job.grant.startswith("for:person:") else None
        )
        project: str | None = None
        if any(m.scope == Scope.PROJECT for m, _ in scoped):
            project = (await self.chat_of(job.chat)).project
        by_pool: dict[str, list[sm.Extraction]] = {}
        refused: list[str] = []
        for meta, text in scoped:
            if meta.scope == Scope.USER and user is None:
                # A group's turn has no single user to keep it for.
                refused.append("learn_fact: user scope needs a direct chat with one person")
                continue
            if meta.scope == Scope.PROJECT and not project:
                refused.append("learn_fact: project scope needs a chat with a project")
                continue
            pool_id = sm.pool_of(meta.scope, bot=contributor, account=user or "", project=project)
            by_pool.setdefault(pool_id, []).append(
                sm.Extraction(
                    pool=pool_id,
                    contributor=contributor,
                    content=text,
                    evidence=tuple(sm.marker(s.chat, s.item) for s in meta.sources if s.is_item),
                    tier=meta.tier,
                    topics=tagmod.topics_of(meta.tags),
                )
            )
        if not by_pool:
            return None, refused
        sources = tuple(
            sm.SourceItem(chat=e.chat, item=e.item, kind=e.kind, author=e.author, text=e.text)
            for e in evidence.values()
        )
        groups = tuple(
            outbox.StagedGroup(pool=pool_id, proposals=tuple(proposals), sources=sources)
            for pool_id, proposals in by_pool.items()
        )
        return outbox.StagedFacts(job=job.id, upto=job.upto, at=now, groups=groups), refused

    async def _send_staged(self, stored, staged: outbox.StagedFacts, job: LearningJob) -> bool:
        """Send each staged group to the shard holding its pool, under its own receipt, then
        delete the set with the job's refusals added, in one batch. A set that cannot be sent
        now stays staged for the next start (whether it was stored there is unknown; the
        receipts make sending it again harmless). True once the set is gone."""
        contributor = stored.pool.removeprefix("bot:")
        refused: list[str] = []
        try:
            for index, group in enumerate(staged.groups):
                owner = sm.pool_owner(group.pool)
                if group.pool.startswith("project:"):
                    owner = await self.peers.directory().project_owner(owner)
                    if owner is None:
                        refused += [f"learn_fact: no project {group.pool}"] * len(group.proposals)
                        continue
                shard = self.peers.shard(self.peers.index_of(owner))
                decisions = await shard.workspace_extract(
                    group.pool,
                    contributor,
                    list(group.proposals),
                    list(group.sources),
                    staged.request_id(index),
                    staged.at,
                )
                refused += [f"learn_fact: {d.reason}" for d in decisions if d.outcome == "refused"]
        except Exception as e:  # a shard away or failing: sent again at the next start
            log.warning("learned facts of job %s stay staged: %r", staged.job, e)
            return False
        batch = Batch(writes=[self.store.outbox_done(staged.job)])
        if refused:
            rejections = (*job.rejections, *refused)
            job = msgspec.structs.replace(
                job,
                rejections=rejections,
                error=f"{len(rejections)} proposed change(s) rejected",
                updated_at=self.kernel.clock(),
            )
            batch.writes.append(self.store.job_row(job))
            batch.events.append(job_event(job))
        fut = self.kernel.stage(batch)
        assert fut is not None
        await fut
        return True

    async def _send_later(self, stored, staged: outbox.StagedFacts, job: LearningJob) -> None:
        """Try a set that could not be sent again, a few times (CO-3's pace); past that it
        waits for the next start."""
        for attempt in range(AUTO_RETRIES):
            await asyncio.sleep(self.retry_delay * 2**attempt)
            if await self._send_staged(stored, staged, job):
                return

    async def _resend(self, job_id: str, pool_id: str, sealed: bytes) -> None:
        """At start: send a set a stopped shard left staged (its step had committed)."""
        try:
            stored = (await self.kernel.pool(pool_id)).stored
            staged = outbox.decode(self.store.open_outbox(stored, job_id, sealed))
            job = next(j for j in await self.store.jobs(pool_id) if j.id == job_id)
            await self._send_staged(stored, staged, job)
        except Exception:
            log.exception("staged facts of learning job %s could not be sent", job_id)
