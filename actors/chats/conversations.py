"""Chats on their home shard: a turn end to end (docs/design.md §5).

1. The person's item is stored with the turn, whose operator is the person (LRN-6).
2. Each speaking bot takes a step (actors/chats/bot_step.py) on the shard that holds its memory:
   enrichment, its model with its tools, `confide`. A direct chat has one step; a group turn
   has rounds of steps in rotating order (actors/chats/group_turns.py).
3. Replies become items; `chat.item.created` goes out for every item.
4. If the bot confided and `botMemory` is on, a durable learning execution is scheduled on the
   bot's shard; in a group, that shard keeps a copy of the person's items to learn from.
5. Sends to other bots become collaboration chains (actors/chats/chains.py).

No pool lock is held across a model call (ACL-9): context is read under the shared lock and the
lock is released before the model runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from functools import partial

import msgspec

from actors.chats.bot_step import BotStepper
from actors.chats.chains import ChainRunner
from actors.chats.chat_logs import ChatLogs
from actors.chats.group_turns import GroupTurns
from actors.chats.requests import Requests
from actors.chats.turn_rules import learns, log_failure, step_failed
from actors.contracts import Effect, Mirrored, StepInput, StepOutcome, TurnResult, TurnStart
from actors.learning.jobs import job_event
from actors.learning.memory_bot_runtime import MemoryBotRuntime
from actors.learning.runs import LearningRunner
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, durable
from engine.bot_policy import require_active, require_team
from engine.chat_records import LearningJob, Turn
from engine.directory import Bot, Channel, Chat, Org, bot_pool
from engine.discussion import Plan, plan_goal, plan_turn
from engine.errors import Conflict, InvalidInput, NotFound, Unavailable
from storage.chat_store import ChatLog, Item

MAX_TEXT = 32_000
TURN_WAIT = 180.0


class Conversations:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        logs: ChatLogs,
        runtime: MemoryBotRuntime,
        learning: LearningRunner,
        stepper: BotStepper,
        groups: GroupTurns,
        chains: ChainRunner,
        requests: Requests,
        peers: Peers,
    ) -> None:
        self.kernel = kernel
        self.logs = logs
        self.store = logs.store
        self.runtime = runtime
        self.learning = learning
        # A learning job may read an agent chat made here before the directory has it.
        learning.chat_of = chains.records.chat
        self.stepper = stepper
        self.groups = groups
        self.chains = chains
        self.requests = requests
        self.peers = peers
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._scheduled: set[str] = set()  # learning jobs being stored right now
        # The channel as each group chat's last mode switch here left it (switch_mode).
        self._switched: dict[str, Channel] = {}
        # Turn → the commit of its person's item, while it runs (`_start_turn`).
        self._storing: dict[str, asyncio.Future[None]] = {}

    @staticmethod
    def _plan(start: TurnStart) -> Plan | None:
        """A group turn's plan from its channel's mode (WS-5, WS-6); None for direct chats."""
        if start.chat.kind != "group":
            if start.chat.kind not in ("direct", "review") or start.bot is None:
                raise InvalidInput(
                    "people post to direct, review and group chats", code="invalid_chat"
                )
            if start.rounds not in (None, 1) or start.mentions:
                raise InvalidInput(
                    "rounds and mentions apply to group chats", code="unsupported_option"
                )
            return None
        if start.channel is None:
            raise InvalidInput("a group turn needs its channel", code="invalid_chat")
        if start.channel.mode == "delivery":
            leader = next((b for b in start.members if b.id == start.channel.leader), None)
            if leader is None:
                raise Conflict("the group's leader is archived", code="bot_archived")
            require_team(leader, start.org)  # WS-6: the policy may have changed since
            return plan_goal(
                members=[b.id for b in start.members],
                leader=start.channel.leader,
                rounds=start.rounds,
                mentions=start.mentions,
            )
        return plan_turn(
            members=[b.id for b in start.members],
            names={b.id: b.name for b in start.members},
            text=start.text,
            rounds=start.rounds,
            mentions=start.mentions,
        )

    async def start_turn(self, start: TurnStart, wait: bool = False) -> Turn | TurnResult:
        """Store the person's item and start the turn; with `wait`, answer once it ended."""
        turn = await self._start_turn(start, wait)
        return await self.wait_turn(start.chat.id, turn.id) if wait else turn

    async def _start_turn(self, start: TurnStart, wait: bool = False) -> Turn:
        text = start.text
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("text must be a non-empty string", code="invalid_text")
        if len(text) > MAX_TEXT:
            raise InvalidInput(f"text over {MAX_TEXT} characters", code="text_too_long")
        if start.bot is not None:
            require_active(start.bot)  # WS-3: an archived bot takes no turns
        if start.members:  # archived members sit the turn out (WS-3)
            start = msgspec.structs.replace(
                start, members=tuple(b for b in start.members if not b.archived)
            )
        plan = self._plan(start)  # bad input fails here, before anything is stored
        log = await self.logs.log(start.chat.id)
        if start.channel is not None and start.chat.id not in self._switched:
            # The group's first turn since this shard started: its mode as the directory has
            # it, read before taking the lock (no actor is awaited under it). Later switches
            # happen here (switch_mode), so later turns ask the directory nothing.
            current = await self._current(start.channel)
            self._switched.setdefault(start.chat.id, current)
        async with self.logs.lock(start.chat.id):
            if not self.logs.holds(log):  # a failed commit dropped it while this waited
                log = await self.logs.log(start.chat.id)
            turn_id = (
                request_turn_id(start.chat.id, start.request_id)
                if start.request_id
                else "turn_" + secrets.token_hex(8)
            )
            if turn_id in log.turns:
                # The same request again: the same turn, not a second, acknowledged as the first
                # is, once its person's item is durable.
                await durable(self._storing.get(turn_id))
                return log.turns[turn_id]
            if start.channel is not None:
                # Mode switches happen here, under this lock (switch_mode): the latest one is
                # the mode. A turn never runs in a mode the group has left.
                channel = self._switched.get(start.chat.id, start.channel)
                if (channel.mode, channel.leader) != (start.channel.mode, start.channel.leader):
                    start = msgspec.structs.replace(start, channel=channel)
                    plan = self._plan(start)
            turn = Turn(
                id=turn_id,
                chat=start.chat.id,
                operator=start.operator,
                status="running",
                at=self.kernel.clock(),
                rounds=plan.rounds if plan else 1,
                goal="delivering"
                if start.channel is not None and start.channel.mode == "delivery"
                else None,
            )
            item = self.logs.item(log, turn.id, "person", start.operator)
            # The person's item is durable before the turn is acknowledged.
            batch = Batch(writes=[self.store.put_turn(log, turn)])
            self.logs.append(log, start.chat, [(item, text)], batch)
            held: Batch | None = None
            if plan is not None:
                await self.logs.commit(start.chat.id, batch)
                stored = None
            elif wait:
                # The caller is answered at the turn's end: the person's item commits with
                # it, one transaction for the whole turn. `stored` settles with that commit.
                held, stored = batch, asyncio.get_running_loop().create_future()
                self._storing[turn_id] = stored
                stored.add_done_callback(partial(_drop, self._storing, turn_id))
            else:  # a direct turn's step starts while it commits (below)
                stored = self.logs.commit_soon(start.chat.id, log, batch)
                if stored is not None:
                    self._storing[turn_id] = stored
                    stored.add_done_callback(partial(_drop, self._storing, turn_id))
        if plan is not None:
            task = asyncio.create_task(self.groups.run(start, turn, item, plan))
        else:
            # The bot's step overlaps the person's commit: what the turn stores goes `after`
            # it (with it or later, never without it), and the turn is acknowledged only
            # once it is durable.
            task = asyncio.create_task(
                self._run(start, turn, item, stored)
                if held is None
                else self._run_held(start, turn, item, held, stored)
            )
        self._tasks[turn.id] = task
        # A retry of a failed turn stores its own task under the same id: only this one goes.
        task.add_done_callback(partial(_drop, self._tasks, turn.id))
        if stored is not None:
            # Nothing of the turn can be stored without the person's item; but a caller that
            # goes away (cancelled) leaves the turn to end as it would have.
            stored.add_done_callback(partial(_cancel_unless_stored, task))
        await durable(stored)
        return turn

    async def _current(self, channel: Channel) -> Channel:
        try:
            return await self.peers.directory().get_channel(channel.id)
        except Unavailable as e:
            if e.code != "no_peers":
                raise
            return channel  # a shard run without a directory (benchmarks): nothing switches

    async def busy(self, chat: str) -> bool:
        """Whether a turn of this chat runs (its rounds, or the learning and collaboration it
        hands on after its end) or a collaboration it started is under way."""
        if self.logs.lock(chat).locked():
            return True
        return await self._busy_unlocked(chat)

    async def _busy_unlocked(self, chat: str) -> bool:
        log = await self.logs.log(chat)
        if any(t.status == "running" or t.id in self._tasks for t in log.turns.values()):
            return True
        for turn in list(log.turns):
            if await self.chains.running_for(turn):
                return True
        return False

    async def switch_mode(self, chat: str, channel: str, mode: str, leader: str | None) -> Channel:
        """Switch a group between discussion and delivery only while it is idle (WS-6), as
        one step with respect to its turns: the check and the switch hold the chat's turn
        lock, which every turn takes to start, so no turn starts in between; a running turn
        (its task is alive until its hand-offs are done) makes the switch a 409."""
        lock = self.logs.lock(chat)
        if lock.locked():  # a turn is starting or running: do not queue behind it
            raise Conflict("the group is busy; switch when it is idle", code="group_busy")
        async with lock:
            if await self._busy_unlocked(chat):
                raise Conflict("the group is busy; switch when it is idle", code="group_busy")
            switched = await self.peers.directory().set_mode(channel, mode, leader)
            self._switched[chat] = switched
            return switched

    async def wait_turn(self, chat: str, turn_id: str, timeout: float = TURN_WAIT) -> TurnResult:
        task = self._tasks.get(turn_id)
        if task is not None:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        log = await self.logs.log(chat)
        turn = log.turns.get(turn_id)
        if turn is None:
            raise NotFound(f"no turn {turn_id}", code="turn_not_found")
        items = [self.logs.view(log, i) for i in log.items if i.turn == turn_id]
        return TurnResult(turn=turn, items=items)

    async def _run_held(
        self, start: TurnStart, turn: Turn, person_item: Item, held: Batch, stored: asyncio.Future
    ) -> None:
        """`_run` with the person's item still in `held`: `stored` settles as that commits
        (or fails with what ended the turn first, so its caller is never left waiting)."""
        try:
            await self._run(start, turn, person_item, held=held, stored=stored)
        except BaseException as e:
            if not stored.done():
                err = e if isinstance(e, Exception) else Unavailable("the turn was stopped")
                stored.set_exception(err)
            raise
        finally:
            if not stored.done():
                stored.set_exception(Unavailable("the turn ended without storing its items"))

    def _release(
        self, chat: str, log: ChatLog, held: Batch, stored: asyncio.Future | None
    ) -> asyncio.Future[None] | None:
        """Commit what a held turn batch holds so far (the person's item first); the batch
        goes on empty, `after` that commit, as an acknowledged turn's does."""
        part = Batch(
            writes=held.writes,
            events=held.events,
            keys=held.keys,
            on_failure=held.on_failure,
            on_commit=held.on_commit,
        )
        held.writes, held.events, held.keys = [], [], []
        held.on_failure, held.on_commit = [], []
        fut = self.logs.commit_soon(chat, log, part)
        if fut is not None and stored is not None:
            fut.add_done_callback(partial(_settle_from, stored))
        return fut

    async def _run(
        self,
        start: TurnStart,
        turn: Turn,
        person_item: Item,
        after: asyncio.Future[None] | None = None,
        *,
        held: Batch | None = None,
        stored: asyncio.Future[None] | None = None,
    ) -> None:
        """A direct (or review) turn: one step; its end, items, confessions and learning job
        commit in one transaction, `after` the person's item (`_start_turn`), or with it
        (`held`: its batch, and the future `stored` to settle once that commit is durable)."""
        chat, org, bot = start.chat, start.org, start.bot
        assert bot is not None
        log = await self.logs.log(chat.id)
        batch = Batch(after=after) if held is None else held
        if held is not None:
            held.release = partial(self._release, chat.id, log, held, stored)
        effects: tuple[Effect, ...] = ()
        job = None
        async with self.logs.lock(chat.id):
            under_review = (
                await self.requests.for_review_chat(chat.id) if chat.kind == "review" else None
            )
            step = StepInput(
                chat=chat,
                bot=bot,
                org=org,
                operator=turn.operator,
                turn=turn.id,
                text=start.text,
                history=self.logs.history(log, person_item.seq),
                review=under_review.proposal if under_review is not None else None,
            )
            try:
                outcome = await self.stepper.run(step, lambda: self.logs.log(chat.id), batch)
            except Exception as e:  # a turn must always end, with a safe message
                log_failure.exception("step of bot %s in chat %s crashed", bot.id, chat.id)
                outcome = StepOutcome(status="failed", error=f"internal error: {type(e).__name__}")
            step_failed(step, outcome)
            if outcome.status == "failed":
                log_failure.warning(
                    "turn %s in chat %s failed: %s", turn.id, chat.id, outcome.error
                )
            self._record_outcome(log, chat, turn, bot, outcome, batch)
            effects = outcome.effects
            done = msgspec.structs.replace(turn, status=outcome.status, error=outcome.error)
            batch.add(self.store.put_turn(log, done))
            await self._own_rows(bot, turn.id, batch)
            if learns(org, chat, outcome.confided, bot):
                sends = any(e.kind == "send" for e in effects)
                job = self.new_job(
                    bot,
                    chat,
                    turn,
                    log.items[-1].seq,
                    f"for:person:{turn.operator}",
                    org,
                    deferred=sends,
                )
                self._scheduled.add(job.id)
                batch.add(self.store.job_row(job, new=True))
                batch.emit(*job_event(job))
            waiting = (
                [(self.kernel.index, job.id)]
                if job is not None and job.status == "deferred"
                else []
            )
            started = None
            try:
                if any(e.kind == "send" for e in effects):
                    # The sends (the chain's row, the sent items) commit with the turn's end:
                    # one transaction; the deliveries start while it commits.
                    await self.chains.record_sends(
                        chat, log, turn.id, bot, effects, batch, waiting, org
                    )
                    started = []
                else:
                    await self.logs.commit(chat.id, batch)
                if stored is not None and not stored.done():
                    stored.set_result(None)
            finally:
                if job is not None:  # stored (or not at all): the jobs table answers from now
                    self._scheduled.discard(job.id)
        if job is not None and job.status == "pending":
            self.learning.start(job)
        if effects:
            await self.chains.on_effects(
                chat, org, turn.id, bot, effects, parent=None, chain=None, started=started
            )

    def _record_outcome(
        self, log: ChatLog, chat: Chat, turn: Turn, bot: Bot, outcome: StepOutcome, batch: Batch
    ) -> None:
        self.logs.tool_items(log, chat, turn.id, outcome, batch)
        if outcome.note is not None:
            note = self.logs.item(log, turn.id, "notification", bot.id)
            self.logs.append(log, chat, [(note, outcome.note)], batch)
        if outcome.reply is not None:
            reply = self.logs.item(log, turn.id, "bot", bot.id)
            self.logs.append(log, chat, [(reply, outcome.reply)], batch)

    async def _own_rows(self, bot: Bot, turn: str, batch: Batch) -> None:
        """Spend and the memory bot's call log, on the shard of the bot's memory (SEC-1)."""
        batch.extend(self.runtime.spend_rows())
        if batch.calls:
            stored = (await self.kernel.pool(bot_pool(bot.id))).stored
            batch.key(stored)
            batch.extend(
                self.store.model_call_row(stored, turn, c, self.kernel.clock()) for c in batch.calls
            )

    def new_job(
        self,
        bot: Bot,
        chat: Chat,
        turn: Turn | str,
        upto: int,
        grant: str,
        org: Org,
        *,
        deferred: bool = False,
    ) -> LearningJob:
        now = self.kernel.clock()
        turn_id = turn if isinstance(turn, str) else turn.id
        # De-duplicated per user turn and bot (CO-2): confide and autoRecord share one job.
        key = f"{bot.id}\x00{chat.id}\x00{turn_id}".encode()
        return LearningJob(
            id="job_" + hashlib.sha256(key).hexdigest()[:16],
            status="deferred" if deferred else "pending",
            pool=bot_pool(bot.id),
            chat=chat.id,
            turn=turn if isinstance(turn, str) else turn.id,
            upto=upto,
            org=chat.org,
            grant=grant,
            channel=chat.channel if grant.startswith("for:channel:") else None,
            model=org.settings.botMemoryModel,
            created_at=now,
            updated_at=now,
        )

    async def verdict(self, chat: str, turn_id: str, user: str, accepted: bool, note: str) -> Turn:
        """The person accepts or rejects what a delivery group's leader delivered (WS-6): once,
        after the turn and every collaboration it started have ended."""
        log = await self.logs.log(chat)
        async with self.logs.lock(chat):
            turn = log.turns.get(turn_id)
            if turn is None:
                raise NotFound(f"no turn {turn_id}", code="turn_not_found")
            if turn.goal is None:
                raise Conflict("this turn has no delivery goal", code="no_goal")
            if turn.goal != "delivering":
                raise Conflict(f"the result was already {turn.goal}", code="already_decided")
            if turn.status == "running" or await self.chains.running_for(turn.id):
                raise Conflict("the result is still being delivered", code="still_delivering")
            done = msgspec.structs.replace(
                turn,
                goal="accepted" if accepted else "rejected",
                verdict_by=user,
                verdict_note=note or None,
            )
            batch = Batch(writes=[self.store.put_turn(log, done)])
            chat_rec = await self.peers.directory().get_chat(chat)
            text = ("Accepted" if accepted else "Rejected") + (f": {note}" if note else "")
            note_item = self.logs.item(log, turn.id, "notification", user)
            self.logs.append(log, chat_rec, [(note_item, text)], batch)
            await self.logs.commit(chat, batch)
        return done

    async def run_step(
        self, step: StepInput, mirror: tuple[Mirrored, ...] = (), learn_upto: int = 0
    ) -> StepOutcome:
        """A bot's step for a chat whose home may be another shard (group and agent chats).
        This shard keeps the person's items it is given, so the bot's learning can read them."""
        batch = Batch()
        new: list[tuple[Item, str]] = []
        if mirror:  # read here only when needed (a delivery to a new agent chat reads nothing)
            log = await self.logs.log(step.chat.id)
            known = {i.seq for i in log.items}
            new = [(_mirrored(log.chat, m), m.text) for m in mirror if m.seq not in known]
            batch.extend(self.store.add_items(log, new))
        try:
            outcome = await self.stepper.run(step, lambda: self.logs.log(step.chat.id), batch)
        except Exception as e:  # one member failing never stops the others (WS-5)
            log_failure.exception("step of bot %s in chat %s crashed", step.bot.id, step.chat.id)
            outcome = StepOutcome(status="failed", error=f"internal error: {type(e).__name__}")
        step_failed(step, outcome)
        await self._own_rows(step.bot, step.turn, batch)
        await self.kernel.commit(batch.fail(lambda: self.logs.forget(step.chat.id)))
        if new:
            log.committed = max(log.committed, new[-1][0].seq)
        return outcome

    async def schedule_learning(
        self, bot: Bot, chat: Chat, turn: str, upto: int, grant: str, org: Org, deferred: bool
    ) -> str | None:
        """One learning execution per turn and bot (CO-2), on this shard (the bot's memory).
        A deferred one waits until the turn's collaboration is back (`release`)."""
        job = self.new_job(bot, chat, turn, upto, grant, org, deferred=deferred)
        if job.id in self._scheduled or any(
            j.id == job.id for j in await self.store.jobs(job.pool)
        ):
            return None
        self._scheduled.add(job.id)
        try:
            await self.learning.schedule(job)
        finally:
            self._scheduled.discard(job.id)  # stored (or not at all): the table answers now
        return job.id


def _drop(held: dict, key: str, fut: asyncio.Future) -> None:
    if held.get(key) is fut:
        del held[key]


def _settle_from(target: asyncio.Future, source: asyncio.Future) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        target.set_result(None)


def _cancel_unless_stored(task: asyncio.Task, stored: asyncio.Future) -> None:
    if stored.cancelled() or stored.exception() is not None:
        task.cancel()


def _mirrored(chat: str, m: Mirrored) -> Item:
    return Item(chat=chat, seq=m.seq, turn=m.turn, kind=m.kind, author=m.author, at=m.at)


def request_turn_id(chat: str, request_id: str) -> str:
    """The id of the turn a start with `request_id` makes in `chat`: a repeat of the request
    names the same turn."""
    if len(request_id) > 128:
        raise InvalidInput("requestId must be at most 128 characters", code="invalid_id")
    return "turn_" + hashlib.sha256(f"{chat}\x00{request_id}".encode()).hexdigest()[:16]
