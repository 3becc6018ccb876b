"""Chats on a shard: a turn end to end (DESIGN §5) for direct chats.

1. The person's item is stored with the turn, whose operator is the person (LRN-6).
2. Enrichment (ENR-1 … ENR-4): with `botMemory` on, a memory model, and visible entries, the
   memory bot rewrites the input within 15 s; the record is kept, the history keeps the original.
3. The bot's model runs with its tools (DESIGN §6). `confide` gets the confessor's answer (or the
   calm one); workspace tools answer that they are not available here yet.
4. The reply is stored; `chat.item.created` goes out for every item.
5. If the bot confided and `botMemory` is on, a durable learning execution is scheduled.

No pool lock is held across a model call (ACL-9): context is read under the shared lock and the
lock is released before the model runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from actors.memory_bot import MemoryBotRuntime
from actors.models import ModelError
from engine.directory import Bot, Chat, Org, bot_pool
from engine.errors import Forbidden, InvalidInput, NotFound
from engine.events import Audience, ChatItemCreated
from engine.memory import Reader
from engine.models import Message, ToolCall
from engine.turns import accept_rewrite, bot_system_prompt, bot_tools, enrichment_messages
from storage.chat_store import (
    ChatLog,
    ChatStore,
    Confession,
    Enrichment,
    Item,
    ItemView,
    LearningJob,
    Turn,
)
from storage.shard_schema import CONFESSIONS, ENRICHMENTS

if TYPE_CHECKING:
    from actors.learning_runs import LearningRunner
    from actors.shard import ShardService

MAX_TEXT = 32_000
HISTORY_ITEMS = 50
TOOL_ROUNDS = 4
ENRICH_CONTEXT = 8_000
TURN_WAIT = 180.0


class TurnStart(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a turn needs from the directory, captured when it starts."""

    chat: Chat
    bot: Bot
    org: Org
    operator: str
    text: str
    request_id: str | None = None


@dataclass
class _Sink:
    """Rows and events a turn collects until it commits them together."""

    writes: list = field(default_factory=list)
    events: list = field(default_factory=list)
    calls: list = field(default_factory=list)  # the memory bot's model calls (SEC-1 call log)


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    turn: Turn
    items: list[ItemView]


class Conversations:
    def __init__(
        self,
        shard: ShardService,
        store: ChatStore,
        runtime: MemoryBotRuntime,
        learning: LearningRunner,
    ) -> None:
        self.shard = shard
        self.store = store
        self.runtime = runtime
        self.learning = learning
        self._logs: dict[str, ChatLog] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def _forget_log(self, chat: str) -> None:
        """A write of this chat failed: drop what memory holds so the next read reloads it."""
        self._logs.pop(chat, None)

    async def log(self, chat: str) -> ChatLog:
        log = self._logs.get(chat)
        if log is None:
            log = await self.store.load(chat)
            self._logs.setdefault(chat, log)
        return self._logs[chat]

    def _audience(self, chat: Chat) -> Audience:
        return Audience(org=chat.org, users=(chat.owner,))

    def _append(self, log: ChatLog, chat: Chat, new: list[tuple[Item, str]], sink: _Sink) -> None:
        """Add items to the chat and their rows and events to `sink`: a turn's writes after the
        person's item go to disk in one transaction at its end."""
        sink.writes.extend(self.store.add_items(log, new))
        sink.events.extend(
            (
                ChatItemCreated(chat=chat.id, item=i.id, kind=i.kind, turn=i.turn),
                self._audience(chat),
            )
            for i, _ in new
        )

    def _item(
        self, log: ChatLog, turn: str | None, kind: str, author: str, offset: int = 0
    ) -> Item:
        return Item(
            chat=log.chat,
            seq=log.next_seq + offset,
            turn=turn,
            kind=kind,
            author=author,
            at=self.shard.clock(),
        )

    # --- turns ---

    async def start_turn(self, start: TurnStart) -> Turn:
        if start.chat.kind not in ("direct", "review"):
            raise InvalidInput("group chats are not served yet", code="unsupported_chat")
        text = start.text
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("text must be a non-empty string", code="invalid_text")
        if len(text) > MAX_TEXT:
            raise InvalidInput(f"text over {MAX_TEXT} characters", code="text_too_long")
        log = await self.log(start.chat.id)
        lock = self._locks.setdefault(start.chat.id, asyncio.Lock())
        async with lock:
            if start.request_id is not None:
                for t in log.turns.values():
                    if t.id == _turn_id(start.chat.id, start.request_id):
                        return t  # the same request again: the same turn, not a second one
            turn_id = (
                _turn_id(start.chat.id, start.request_id)
                if start.request_id
                else "turn_" + secrets.token_hex(8)
            )
            turn = Turn(
                id=turn_id,
                chat=start.chat.id,
                operator=start.operator,
                status="running",
                at=self.shard.clock(),
            )
            item = self._item(log, turn.id, "person", start.operator)
            # The person's item is durable before the turn is acknowledged.
            sink = _Sink(writes=[self.store.put_turn(log, turn)])
            self._append(log, start.chat, [(item, text)], sink)
            await self.shard._submit(
                None, sink.writes, sink.events, on_failure=lambda: self._forget_log(start.chat.id)
            )
            log.committed = item.seq
        task = asyncio.create_task(self._run(start, turn, item))
        self._tasks[turn.id] = task
        task.add_done_callback(lambda _t, k=turn.id: self._tasks.pop(k, None))
        return turn

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
        chat, org = start.chat, start.org
        log = await self.log(chat.id)
        lock = self._locks.setdefault(chat.id, asyncio.Lock())
        sink = _Sink()
        async with lock:
            try:
                status, error, confided = await self._steps(start, turn, person_item, log, sink)
            except Exception as e:  # a turn must always end, with a safe message
                status, error, confided = "failed", f"internal error: {type(e).__name__}", False
            done = msgspec.structs.replace(turn, status=status, error=error)
            sink.writes.append(self.store.put_turn(log, done))
            sink.writes.extend(self.runtime.spend_rows())
            if sink.calls:
                stored = (await self.shard._pool(bot_pool(start.bot.id))).stored
                sink.writes.extend(self.shard.store.key_rows(stored))
                sink.writes.extend(
                    self.store.model_call_row(stored, turn.id, c, self.shard.clock())
                    for c in sink.calls
                )
            job = None
            if confided and org.settings.botMemory:
                job = self._job(start, turn, log, person_item)
                sink.writes.append(self.store.job_row(job, new=True))
                sink.events.append(self.learning.event(job))
            # The turn's end, its items, confessions and the learning job: one transaction.
            await self.shard._submit(
                None, sink.writes, sink.events, on_failure=lambda: self._forget_log(chat.id)
            )
            if log.items:
                log.committed = log.items[-1].seq
        if job is not None:
            self.learning.start(job)

    def _job(self, start: TurnStart, turn: Turn, log: ChatLog, person_item: Item) -> LearningJob:
        chat, bot, org = start.chat, start.bot, start.org
        reply_seq = log.items[-1].seq if log.items else person_item.seq
        now = self.shard.clock()
        return LearningJob(
            id="job_" + secrets.token_hex(8),
            pool=bot_pool(bot.id),
            chat=chat.id,
            turn=turn.id,
            upto=reply_seq,
            org=chat.org,
            grant=f"for:person:{turn.operator}",
            model=org.settings.botMemoryModel,
            created_at=now,
            updated_at=now,
        )

    async def _steps(
        self, start: TurnStart, turn: Turn, person_item: Item, log: ChatLog, sink: _Sink
    ):
        chat, bot, org = start.chat, start.bot, start.org
        pool = bot_pool(bot.id)
        settings = await self.shard.memory_bot_settings(pool)
        text = start.text
        # Enrichment (ENR): a direct chat's reader is its person; the server decides the entries.
        if org.settings.botMemory and org.settings.botMemoryModel:
            reader = Reader(user=turn.operator, org=chat.org, uses_bot=True)
            parts, has = await self.shard.context_parts(pool, reader, ENRICH_CONTEXT)
            if has and parts:
                done = await self.runtime.rewrite(
                    pool,
                    settings,
                    org.settings.botMemoryModel,
                    enrichment_messages(text, parts, settings.instructions),
                    sink.calls,
                )
                call = next(
                    (c for c in (done.tool_calls if done else ()) if c.name == "rewrite"), None
                )
                rewrite = accept_rewrite(call.arguments, {i for i, _ in parts}) if call else None
                if rewrite is not None:
                    record = Enrichment(
                        turn=turn.id,
                        text=rewrite.text,
                        original=text,
                        entries=rewrite.entries,
                        at=self.shard.clock(),
                    )
                    sink.writes.append(self.store.enrichment_row(log, record))
                    text = rewrite.text
        model = self.runtime.model(bot.model)
        if model is None:
            note = self._item(log, turn.id, "notification", "system")
            self._append(log, chat, [(note, "This bot has no model configured.")], sink)
            return "failed", "the bot has no model", False
        messages = [Message(role="system", content=bot_system_prompt(bot))]
        history = [i for i in log.items if i.seq < person_item.seq][-HISTORY_ITEMS:]
        for item in history:
            role = {"person": "user", "bot": "assistant"}.get(item.kind)
            if role is not None:
                messages.append(Message(role=role, content=self.store.text(log, item.seq)))
        messages.append(Message(role="user", content=text))  # ENR-3: the model sees the rewrite
        tools = bot_tools(review=chat.kind == "review")
        confided = False
        confessions = 0
        for _ in range(TOOL_ROUNDS):
            try:
                done = await model.complete(messages, tools)
            except ModelError as e:
                note = self._item(log, turn.id, "notification", "system")
                self._append(log, chat, [(note, "The bot's model did not answer.")], sink)
                return "failed", e.message, confided
            if not done.tool_calls:
                reply = self._item(log, turn.id, "bot", bot.id)
                self._append(log, chat, [(reply, done.text or "")], sink)
                return "done", None, confided
            messages.append(
                Message(role="assistant", content=done.text, tool_calls=done.tool_calls)
            )
            for call in done.tool_calls:
                result = await self._tool(call, start, turn, log, settings, confessions, sink)
                if call.name == "confide" and result is not None:
                    confided = True
                    confessions += 1
                messages.append(
                    Message(role="tool", content=result or "not available", tool_call_id=call.id)
                )
        reply = self._item(log, turn.id, "bot", bot.id)
        self._append(log, chat, [(reply, done.text or "")], sink)
        return "done", None, confided

    async def _tool(
        self, call: ToolCall, start: TurnStart, turn: Turn, log, settings, n: int, sink: _Sink
    ):
        if call.name != "confide" or start.chat.kind == "review":
            return None  # workspace tools come with the workspace issues
        try:
            args = msgspec.json.decode(call.arguments.encode(), type=dict)
            text = str(args.get("text", "")).strip()
        except msgspec.DecodeError:
            text = ""
        if not text:
            return None
        pool = bot_pool(start.bot.id)
        answer, calm = await self.runtime.confessor_answer(
            pool, settings, start.org.settings.botMemoryModel, text, sink.calls
        )
        record = Confession(
            turn=turn.id, text=text, answer=answer, calm=calm, at=self.shard.clock()
        )
        sink.writes.append(self.store.confession_row(log, record, n))
        return answer

    # --- reading and deleting ---

    def _view(self, log: ChatLog, item: Item) -> ItemView:
        return ItemView(
            id=item.id,
            kind=item.kind,
            author=item.author,
            text=self.store.text(log, item.seq),
            at=item.at,
            turn=item.turn,
        )

    async def items(self, chat: str) -> list[ItemView]:
        """The chat's stored items (a running turn's items appear once they are on disk)."""
        log = await self.log(chat)
        return [self._view(log, i) for i in log.items if i.seq <= log.committed]

    async def delete_items(self, chat: str) -> int:
        log = await self.log(chat)
        lock = self._locks.setdefault(chat, asyncio.Lock())
        async with lock:
            count = len(log.items)
            await self.shard._submit(None, self.store.delete_items(log))
        return count

    async def confessions(self, chat: str) -> list[Confession]:
        return await self.store.records(CONFESSIONS.name, await self.log(chat))

    async def enrichments(self, chat: str) -> list[Enrichment]:
        return await self.store.records(ENRICHMENTS.name, await self.log(chat))


def _turn_id(chat: str, request_id: str) -> str:
    if len(request_id) > 128:
        raise InvalidInput("requestId must be at most 128 characters", code="invalid_id")
    return "turn_" + hashlib.sha256(f"{chat}\x00{request_id}".encode()).hexdigest()[:16]


def require_chat_owner(chat: Chat, user: str) -> None:
    """Reading a chat (items, confessions, enrichments) is for its owner only (API-6)."""
    if chat.owner != user:
        raise Forbidden("only the chat's owner may read it", code="not_chat_owner")
