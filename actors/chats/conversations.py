"""Chats on their home shard: a turn end to end (DESIGN §5).

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
import logging
import secrets
from typing import TYPE_CHECKING

import msgspec

from actors.chats.bot_step import BotStepper, Sink
from actors.contracts import Effect, Mirrored, StepInput, StepOutcome, TurnResult, TurnStart
from actors.learning.memory_bot import MemoryBotRuntime
from actors.shard.residency import CHAT_WEIGHT, unused
from actors.shard.single_flight import SingleFlight
from engine.bot_policy import require_active, require_team
from engine.chat_records import Communication, Confession, Enrichment, ItemView, LearningJob, Turn
from engine.directory import Bot, Channel, Chat, Org, bot_pool
from engine.discussion import Plan, plan_goal, plan_turn
from engine.errors import Conflict, InvalidInput, NotFound, Unavailable
from engine.events import Audience, ChatItemCreated, ChatItemsDeleted
from engine.models import Message
from storage.chat_store import ChatLog, ChatStore, Item
from storage.shard_schema import CONFESSIONS, ENRICHMENTS

if TYPE_CHECKING:
    from actors.learning.runs import LearningRunner
    from actors.shard.service import ShardService

MAX_TEXT = 32_000
HISTORY_ITEMS = 50
TURN_WAIT = 180.0
_tool_enc = msgspec.json.Encoder()


log_failure = logging.getLogger("openbot.turns")


def step_failed(step: StepInput, outcome: StepOutcome) -> None:
    """One warning line per failed bot step (direct, group and agent chats alike)."""
    if outcome.status == "failed":
        log_failure.warning(
            "step of bot %s in chat %s (turn %s) failed: %s",
            step.bot.id,
            step.chat.id,
            step.turn,
            outcome.error,
        )


class Conversations:
    def __init__(
        self,
        shard: ShardService,
        store: ChatStore,
        runtime: MemoryBotRuntime,
        learning: LearningRunner,
    ) -> None:
        from actors.chats.chains import ChainRunner
        from actors.chats.group_turns import GroupTurns

        self.shard = shard
        self.store = store
        self.runtime = runtime
        self.learning = learning
        self.stepper = BotStepper(shard)
        self.groups = GroupTurns(self)
        self.chains = ChainRunner(self)
        self._loader: SingleFlight[ChatLog] = SingleFlight()
        self._logs: dict[str, ChatLog] = self._loader.loaded
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._scheduled: set[str] = set()  # learning jobs being stored right now
        # Each group chat's channel as the directory had it at its first turn here, then as
        # each mode switch here left it (switch_mode).
        self._switched: dict[str, Channel] = {}

    def _forget_log(self, chat: str) -> None:
        """A write of this chat failed: drop what memory holds so the next read reloads it."""
        self._logs.pop(chat, None)
        self.shard.residency.forget("chat:" + chat)

    async def log(self, chat: str) -> ChatLog:
        # One load at a time per chat: two loads of a new chat would make two keys, and a load
        # that finished after its chat was evicted must not come back with an old state.
        log = await self._loader.get(chat, lambda: self._load(chat))
        self._resident(log)
        return log

    def fresh(self, chat: str) -> ChatLog:
        """The log of a chat its caller knows has nothing stored yet (a delivery's new agent
        chat): no database read, which would also make the shard apply its journal first."""
        log = self._logs.get(chat)
        if log is None:
            log = self._logs[chat] = self.store.new(chat)
        self._resident(log)
        return log

    async def _load(self, chat: str) -> ChatLog:
        log = await self.store.load(chat)
        if log.plain_turns:  # written unsealed by an older version: seal them now
            rows = [self.store.put_turn(log, log.turns[t]) for t in log.plain_turns]
            log.plain_turns.clear()
            fut = self.shard._submit(None, [*self.shard.store.key_rows(log.key), *rows])
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        return log

    def _resident(self, log: ChatLog) -> None:
        """Count the chat as used now, at its current size."""
        chat = log.chat
        if self._logs.get(chat) is log:
            self.shard.residency.touch(
                "chat:" + chat,
                CHAT_WEIGHT + len(log.items) + len(log.turns),
                lambda: self._evict(chat),
            )

    def _evict(self, chat: str) -> bool:
        """Drop a chat's log (and its lock) from memory unless a turn, a read or a write is
        using it; everything in it is on disk."""
        log = self._logs.get(chat)
        if log is None:
            return True
        lock = self._locks.get(chat)
        if lock is not None and (lock.locked() or not unused(lock, 1)):
            return False
        if any(t.status == "running" for t in log.turns.values()):
            return False
        key = log.key
        if not unused(log, 1) or not unused(key, 1):  # _logs, and the log's attribute
            return False
        del self._logs[chat]
        self._locks.pop(chat, None)
        self.shard.store.keyring.forget(f"chat:{chat}")
        return True

    def lock(self, chat: str) -> asyncio.Lock:
        return self._locks.setdefault(chat, asyncio.Lock())

    @staticmethod
    def audience(chat: Chat) -> Audience:
        if chat.kind == "group" and chat.channel:
            return Audience(org=chat.org, channels=(chat.channel,))
        return Audience(org=chat.org, users=(chat.owner,))

    def append(self, log: ChatLog, chat: Chat, new: list[tuple[Item, str]], sink: Sink) -> None:
        """Add items to the chat and their rows and events to `sink`."""
        sink.writes.extend(self.store.add_items(log, new))
        self._resident(log)
        sink.events.extend(
            (
                ChatItemCreated(chat=chat.id, item=i.id, kind=i.kind, turn=i.turn),
                self.audience(chat),
            )
            for i, _ in new
        )

    def item(self, log: ChatLog, turn: str | None, kind: str, author: str) -> Item:
        return Item(
            chat=log.chat,
            seq=log.next_seq,
            turn=turn,
            kind=kind,
            author=author,
            at=self.shard.clock(),
        )

    async def commit(self, chat: str, sink: Sink) -> None:
        """Write a sink's rows and events in one transaction; the chat's items are then listed."""
        log = await self.log(chat)
        fut = self.shard._submit(
            None, sink.writes, sink.events, on_failure=lambda: self._forget_log(chat)
        )
        if fut is not None:
            await fut
        if log.items:
            log.committed = max(log.committed, log.items[-1].seq)

    async def one_item(self, chat: str, seq: int) -> ItemView | None:
        """One stored item, as an event names it: one text read, not the whole chat's."""
        log = await self.log(chat)
        found = next((i for i in log.items if i.seq == seq and seq <= log.committed), None)
        return None if found is None else self._view(log, found)

    async def say(self, chat: Chat, turn: str | None, kind: str, author: str, text: str) -> Item:
        """Store one item now (a reply, a delivery, a notification) and announce it."""
        log = await self.log(chat.id)
        sink = Sink()
        item = self.item(log, turn, kind, author)
        self.append(log, chat, [(item, text)], sink)
        await self.commit(chat.id, sink)
        return item

    def prior(self, log: ChatLog, before: int) -> list[tuple[str, str, str]]:
        """(kind, author, text) of the conversation before item `before`, decrypted once. A
        bot's own sent records are left out: its words to the peer are not the chat's."""
        return [
            (i.kind, i.author, self.store.text(log, i.seq))
            for i in [i for i in log.items if i.seq < before][-HISTORY_ITEMS:]
            if i.kind in ("person", "bot", "delivery") and i.seq not in log.comms
        ]

    @staticmethod
    def as_messages(
        prior: list[tuple[str, str, str]], me: str | None = None
    ) -> tuple[Message, ...]:
        """What a bot sees of the chat: its own words as the assistant's, everyone else's as
        user messages (named in a group, so speakers stay apart)."""
        out = []
        for kind, author, text in prior:
            if (kind == "bot" and author == me) or (me is None and kind == "bot"):
                out.append(Message(role="assistant", content=text))
            elif me is None and kind == "person":
                out.append(Message(role="user", content=text))
            elif kind == "delivery":
                out.append(Message(role="user", content=f"[delivery from {author}] {text}"))
            else:
                out.append(Message(role="user", content=f"{author}: {text}"))
        return tuple(out)

    def history(self, log: ChatLog, before: int, me: str | None = None) -> tuple[Message, ...]:
        return self.as_messages(self.prior(log, before), me)

    def commit_soon(self, chat: str, log: ChatLog, sink: Sink):
        """Queue a sink without waiting: the next step goes on while it commits (group commit
        keeps the order); its items are listed once durable. Returns the commit's future."""
        last = log.items[-1].seq if log.items else 0

        def durable(f) -> None:
            if not f.cancelled() and f.exception() is None:
                log.committed = max(log.committed, last)

        fut = self.shard._submit(
            None, sink.writes, sink.events, on_failure=lambda: self._forget_log(chat)
        )
        if fut is not None:
            fut.add_done_callback(durable)
        return fut

    # --- turns ---

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
        turn = await self._start_turn(start)
        return await self.wait_turn(start.chat.id, turn.id) if wait else turn

    async def _start_turn(self, start: TurnStart) -> Turn:
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
        log = await self.log(start.chat.id)
        if start.channel is not None and start.chat.id not in self._switched:
            # The group's first turn since this shard started: its mode as the directory has
            # it, read before taking the lock (no actor is awaited under it). Later switches
            # happen here (switch_mode), so later turns ask the directory nothing.
            current = await self._current(start.channel)
            self._switched.setdefault(start.chat.id, current)
        async with self.lock(start.chat.id):
            turn_id = (
                _turn_id(start.chat.id, start.request_id)
                if start.request_id
                else "turn_" + secrets.token_hex(8)
            )
            if turn_id in log.turns:
                return log.turns[turn_id]  # the same request again: the same turn, not a second
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
                at=self.shard.clock(),
                rounds=plan.rounds if plan else 1,
                goal="delivering"
                if start.channel is not None and start.channel.mode == "delivery"
                else None,
            )
            item = self.item(log, turn.id, "person", start.operator)
            # The person's item is durable before the turn is acknowledged.
            sink = Sink(writes=[self.store.put_turn(log, turn)])
            self.append(log, start.chat, [(item, text)], sink)
            await self.commit(start.chat.id, sink)
        if plan is not None:
            task = asyncio.create_task(self.groups.run(start, turn, item, plan))
        else:
            task = asyncio.create_task(self._run(start, turn, item))
        self._tasks[turn.id] = task
        task.add_done_callback(lambda _t, k=turn.id: self._tasks.pop(k, None))
        return turn

    async def _current(self, channel: Channel) -> Channel:
        try:
            return await self.shard.peers.directory().get_channel(channel.id)
        except Unavailable as e:
            if e.code != "no_peers":
                raise
            return channel  # a shard run without a directory (benchmarks): nothing switches

    async def busy(self, chat: str) -> bool:
        """Whether a turn of this chat runs (its rounds, or the learning and collaboration it
        hands on after its end) or a collaboration it started is under way."""
        if self.lock(chat).locked():
            return True
        return await self._busy_unlocked(chat)

    async def _busy_unlocked(self, chat: str) -> bool:
        log = await self.log(chat)
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
        lock = self.lock(chat)
        if lock.locked():  # a turn is starting or running: do not queue behind it
            raise Conflict("the group is busy; switch when it is idle", code="group_busy")
        async with lock:
            if await self._busy_unlocked(chat):
                raise Conflict("the group is busy; switch when it is idle", code="group_busy")
            switched = await self.shard.peers.directory().set_mode(channel, mode, leader)
            self._switched[chat] = switched
            return switched

    async def wait_turn(self, chat: str, turn_id: str, timeout: float = TURN_WAIT) -> TurnResult:
        task = self._tasks.get(turn_id)
        if task is not None:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        log = await self.log(chat)
        turn = log.turns.get(turn_id)
        if turn is None:
            raise NotFound(f"no turn {turn_id}", code="turn_not_found")
        items = [self._view(log, i) for i in log.items if i.turn == turn_id]
        return TurnResult(turn=turn, items=items)

    async def _run(self, start: TurnStart, turn: Turn, person_item: Item) -> None:
        """A direct (or review) turn: one step; its end, items, confessions and learning job
        commit in one transaction."""
        chat, org, bot = start.chat, start.org, start.bot
        assert bot is not None
        log = await self.log(chat.id)
        sink = Sink()
        effects: tuple[Effect, ...] = ()
        job = None
        async with self.lock(chat.id):
            under_review = (
                await self.shard.requests.for_review_chat(chat.id)
                if chat.kind == "review"
                else None
            )
            step = StepInput(
                chat=chat,
                bot=bot,
                org=org,
                operator=turn.operator,
                turn=turn.id,
                text=start.text,
                history=self.history(log, person_item.seq),
                review=under_review.proposal if under_review is not None else None,
            )
            try:
                outcome = await self.stepper.run(step, lambda: self.log(chat.id), sink)
            except Exception as e:  # a turn must always end, with a safe message
                log_failure.exception("step of bot %s in chat %s crashed", bot.id, chat.id)
                outcome = StepOutcome(status="failed", error=f"internal error: {type(e).__name__}")
            step_failed(step, outcome)
            if outcome.status == "failed":
                log_failure.warning(
                    "turn %s in chat %s failed: %s", turn.id, chat.id, outcome.error
                )
            self._record_outcome(log, chat, turn, bot, outcome, sink)
            effects = outcome.effects
            done = msgspec.structs.replace(turn, status=outcome.status, error=outcome.error)
            sink.writes.append(self.store.put_turn(log, done))
            await self._own_rows(bot, turn.id, sink)
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
                sink.writes.append(self.store.job_row(job, new=True))
                sink.events.append(self.learning.event(job))
            try:
                await self.commit(chat.id, sink)
            finally:
                if job is not None:  # stored (or not at all): the jobs table answers from now
                    self._scheduled.discard(job.id)
        if job is not None and job.status == "pending":
            self.learning.start(job)
        if effects:
            waiting = (
                [(self.shard.index, job.id)] if job is not None and job.status == "deferred" else []
            )
            await self.chains.on_effects(
                chat, org, turn.id, bot, effects, parent=None, chain=None, learn=waiting
            )

    def tool_items(
        self, log: ChatLog, chat: Chat, turn: str, outcome: StepOutcome, sink: Sink
    ) -> None:
        """The bot's app tool calls and results as `tool_result` items (MEM-3), authored by the
        tool: sources learning may cite beside what a person said, never alone (LRN-9)."""
        for use in outcome.tools:
            item = self.item(log, turn, "tool_result", use.tool)
            text = _tool_enc.encode(
                {"tool": use.tool, "arguments": use.arguments, "result": use.result}
            ).decode()
            self.append(log, chat, [(item, text)], sink)

    def _record_outcome(
        self, log: ChatLog, chat: Chat, turn: Turn, bot: Bot, outcome: StepOutcome, sink: Sink
    ) -> None:
        self.tool_items(log, chat, turn.id, outcome, sink)
        if outcome.note is not None:
            note = self.item(log, turn.id, "notification", bot.id)
            self.append(log, chat, [(note, outcome.note)], sink)
        if outcome.reply is not None:
            reply = self.item(log, turn.id, "bot", bot.id)
            self.append(log, chat, [(reply, outcome.reply)], sink)

    async def _own_rows(self, bot: Bot, turn: str, sink: Sink) -> None:
        """Spend and the memory bot's call log, on the shard of the bot's memory (SEC-1)."""
        sink.writes.extend(self.runtime.spend_rows())
        if sink.calls:
            stored = (await self.shard._pool(bot_pool(bot.id))).stored
            sink.writes.extend(self.shard.store.key_rows(stored))
            sink.writes.extend(
                self.store.model_call_row(stored, turn, c, self.shard.clock()) for c in sink.calls
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
        now = self.shard.clock()
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
        log = await self.log(chat)
        async with self.lock(chat):
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
            sink = Sink(writes=[self.store.put_turn(log, done)])
            chat_rec = await self.shard.peers.directory().get_chat(chat)
            text = ("Accepted" if accepted else "Rejected") + (f": {note}" if note else "")
            note_item = self.item(log, turn.id, "notification", user)
            self.append(log, chat_rec, [(note_item, text)], sink)
            await self.commit(chat, sink)
        return done

    async def run_step(
        self, step: StepInput, mirror: tuple[Mirrored, ...] = (), learn_upto: int = 0
    ) -> StepOutcome:
        """A bot's step for a chat whose home may be another shard (group and agent chats).
        This shard keeps the person's items it is given, so the bot's learning can read them."""
        sink = Sink()
        new: list[tuple[Item, str]] = []
        if mirror:  # read here only when needed (a delivery to a new agent chat reads nothing)
            log = await self.log(step.chat.id)
            known = {i.seq for i in log.items}
            new = [(_mirrored(log.chat, m), m.text) for m in mirror if m.seq not in known]
            sink.writes.extend(self.store.add_items(log, new))
        try:
            outcome = await self.stepper.run(step, lambda: self.log(step.chat.id), sink)
        except Exception as e:  # one member failing never stops the others (WS-5)
            log_failure.exception("step of bot %s in chat %s crashed", step.bot.id, step.chat.id)
            outcome = StepOutcome(status="failed", error=f"internal error: {type(e).__name__}")
        step_failed(step, outcome)
        await self._own_rows(step.bot, step.turn, sink)
        fut = self.shard._submit(
            None, sink.writes, sink.events, on_failure=lambda: self._forget_log(step.chat.id)
        )
        if fut is not None:
            await fut
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

    # --- reading and deleting ---

    def _view(self, log: ChatLog, item: Item) -> ItemView:
        text = self.store.text(log, item.seq)
        # Only a delivery the chain runner stored is shown as bot communication (UI-1): a sent
        # one has its record; any other delivery item was received from its author.
        communication = None
        if item.seq in log.comms:
            direction, peer = log.comms[item.seq]
            communication = Communication(direction=direction, peer=peer, body=text)
        elif item.kind == "delivery":
            communication = Communication(direction="received", peer=item.author, body=text)
        return ItemView(
            id=item.id,
            kind=item.kind,
            author=item.author,
            text=text,
            at=item.at,
            turn=item.turn,
            communication=communication,
        )

    async def items(self, chat: str) -> list[ItemView]:
        """The chat's stored items (a running turn's items appear once they are on disk)."""
        log = await self.log(chat)
        return [self._view(log, i) for i in log.items if i.seq <= log.committed]

    async def delete_items(self, chat: str, record: Chat | None = None) -> int:
        """Delete the chat's history: the rows commit first, then the log in memory is cleared
        (a failed commit raises and changes nothing). With the chat's `record` (its home
        shard) a `chat.items.deleted` event goes out with the commit; the copies other shards
        keep for learning are deleted without one."""
        async with self.lock(chat):
            log = await self.log(chat)
            count = len(log.items)
            events = []
            if record is not None:
                events.append((ChatItemsDeleted(chat=chat, count=count), self.audience(record)))
            fut = self.shard._submit(
                None,
                self.store.delete_items(log),
                events,
                on_failure=lambda: self._forget_log(chat),
            )
            if fut is not None:
                await fut
            self.store.clear_items(log)
        return count

    async def confessions(self, chat: str) -> list[Confession]:
        return await self.store.records(CONFESSIONS.name, await self.log(chat))

    async def enrichments(self, chat: str) -> list[Enrichment]:
        return await self.store.records(ENRICHMENTS.name, await self.log(chat))


def _mirrored(chat: str, m: Mirrored) -> Item:
    return Item(chat=chat, seq=m.seq, turn=m.turn, kind=m.kind, author=m.author, at=m.at)


def _turn_id(chat: str, request_id: str) -> str:
    if len(request_id) > 128:
        raise InvalidInput("requestId must be at most 128 characters", code="invalid_id")
    return "turn_" + hashlib.sha256(f"{chat}\x00{request_id}".encode()).hexdigest()[:16]


def learns(org: Org, chat: Chat, confided: bool, bot: Bot | None = None) -> bool:
    """A turn is learned from when the bot confided, or after every person turn with the org's
    autoRecord unless the bot's owner paused it (WS-1) (DESIGN "Learning triggers"); never with
    botMemory off, never in review chats."""
    if not org.settings.botMemory or chat.kind in ("review", "agent"):
        return False
    return confided or (org.settings.autoRecord and not (bot is not None and bot.autoRecordPaused))
