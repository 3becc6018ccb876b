"""Chat logs on their home shard: loading, items, locks, and the batches that store them.

A chat's log (its items, turns and sealed texts, keyed with the chat's own data key) is loaded
once and kept while used (residency budget, actors/shard/residency.py). Items are added to a
`Batch` with their `chat.item.created` events and listed once that batch is durable; a failed
commit drops the log so the next read reloads what the file holds. Turns (direct, group) and
collaboration chains all write chats through here.
"""

from __future__ import annotations

import asyncio

import msgspec

from actors.contracts import StepOutcome
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, ignore_failure
from actors.shard.residency import CHAT_WEIGHT, unused
from actors.shard.single_flight import SingleFlight
from engine.chat_records import Communication, Confession, Enrichment, ItemView
from engine.directory import Chat
from engine.events import Audience, ChatItemCreated, ChatItemsDeleted, ChatUpdated
from engine.models import Message
from storage.chat_store import ChatLog, ChatStore, Item
from storage.shard_schema import CONFESSIONS, ENRICHMENTS

HISTORY_ITEMS = 50
_tool_enc = msgspec.json.Encoder()


class ChatLogs:
    def __init__(self, kernel: ShardKernel, store: ChatStore) -> None:
        self.kernel = kernel
        self.store = store
        self._loader: SingleFlight[ChatLog] = SingleFlight(self._resident)
        kernel.before_close.append(self._loader.close)
        self._logs: dict[str, ChatLog] = self._loader.loaded
        self._locks: dict[str, asyncio.Lock] = {}

    def __len__(self) -> int:
        """Chats in memory now."""
        return len(self._logs)

    def is_loaded(self, chat: str) -> bool:
        return chat in self._logs

    def holds(self, log: ChatLog) -> bool:
        """Whether `log` is still the chat's log in memory (a failed commit drops it)."""
        return self._logs.get(log.chat) is log

    def forget(self, chat: str) -> None:
        """A write of this chat failed: drop what memory holds so the next read reloads it."""
        self._logs.pop(chat, None)
        self.kernel.residency.forget("chat:" + chat)

    def fresh(self, chat: str) -> ChatLog:
        """The log of a chat its caller knows has nothing stored yet (a delivery's new agent
        chat): no database read, which would also make the shard apply its journal first."""
        log = self._logs.get(chat)
        if log is None:
            log = self._logs[chat] = self.store.new(chat)
        self._resident(log)
        return log

    async def log(self, chat: str) -> ChatLog:
        # One load at a time per chat: two loads of a new chat would make two keys, and a load
        # that finished after its chat was evicted must not come back with an old state.
        log = await self._loader.get(chat, lambda: self._load(chat))
        self._resident(log)
        return log

    async def _load(self, chat: str) -> ChatLog:
        log = await self.store.load(chat)
        if log.plain_turns:  # written unsealed by an older version: seal them now
            rows = [self.store.put_turn(log, log.turns[t]) for t in log.plain_turns]
            log.plain_turns.clear()
            fut = self.kernel.stage(Batch(writes=rows).key(log.key))
            if fut is not None:
                ignore_failure(fut)
        return log

    def _resident(self, log: ChatLog) -> None:
        """Count the chat as used now, at its current size."""
        chat = log.chat
        if self._logs.get(chat) is log:
            self.kernel.residency.touch(
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
        self.kernel.keyring.forget(f"chat:{chat}")
        return True

    def lock(self, chat: str) -> asyncio.Lock:
        return self._locks.setdefault(chat, asyncio.Lock())

    @staticmethod
    def audience(chat: Chat) -> Audience:
        if chat.kind == "group" and chat.channel:
            return Audience(org=chat.org, channels=(chat.channel,))
        return Audience(org=chat.org, users=(chat.owner,))

    def append(self, log: ChatLog, chat: Chat, new: list[tuple[Item, str]], batch: Batch) -> None:
        """Add items to the chat and their rows and events to `batch`."""
        batch.extend(self.store.add_items(log, new))
        self._resident(log)
        batch.events.extend(
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
            at=self.kernel.clock(),
        )

    async def commit(self, chat: str, batch: Batch) -> None:
        """Write a batch's rows and events in one transaction; the chat's items are then
        listed. If it fails, the chat's log is reloaded from the file by the next read."""
        log = await self.log(chat)
        await self.kernel.commit(batch.fail(lambda: self.forget(chat)))
        if log.items:
            log.committed = max(log.committed, log.items[-1].seq)

    async def one_item(self, chat: str, seq: int) -> ItemView | None:
        """One stored item, as an event names it: one text read, not the whole chat's."""
        log = await self.log(chat)
        found = next((i for i in log.items if i.seq == seq and seq <= log.committed), None)
        return None if found is None else self.view(log, found)

    async def say(self, chat: Chat, turn: str | None, kind: str, author: str, text: str) -> Item:
        """Store one item now (a reply, a delivery, a notification) and announce it."""
        log = await self.log(chat.id)
        batch = Batch()
        item = self.item(log, turn, kind, author)
        self.append(log, chat, [(item, text)], batch)
        await self.commit(chat.id, batch)
        return item

    async def say_view(self, chat: Chat, kind: str, author: str, text: str) -> ItemView:
        """`say` outside any turn (a bot's post to a group, a notification), as listed."""
        item = await self.say(chat, None, kind, author, text)
        return self.view(await self.log(chat.id), item)

    async def say_sent(
        self, chat: Chat, turn: str | None, sender: str, peer: str, text: str
    ) -> Item:
        """UI-1: the sending side of a real delivery, in the chat the bot sent from: the actual
        body, marked `sent` to `peer` (the chain's own record of the request is not touched)."""
        log = await self.log(chat.id)
        batch = Batch()
        item = self.item(log, turn, "delivery", sender)
        self.append(log, chat, [(item, text)], batch)
        batch.add(self.store.communication_row(log, item.seq, "sent", peer))
        await self.commit(chat.id, batch)
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

    def commit_soon(
        self, chat: str, log: ChatLog, batch: Batch, riders: list[tuple[str, ChatLog]] | None = None
    ):
        """Queue a batch without waiting: the next step goes on while it commits (group commit
        keeps the order); its items are listed once durable. Returns the commit's future.
        `riders`: other chats (and their logs) whose new items are in `batch` too."""
        chats = [(chat, log), *(riders or ())]
        lasts = [(lg, lg.items[-1].seq if lg.items else 0) for _, lg in chats]

        def durable(f) -> None:
            if not f.cancelled() and f.exception() is None:
                for lg, last in lasts:
                    lg.committed = max(lg.committed, last)

        for c, _ in chats:
            batch.fail(lambda c=c: self.forget(c))
        fut = self.kernel.stage(batch)
        if fut is not None:
            fut.add_done_callback(durable)
        return fut

    # --- turns ---

    def tool_items(
        self, log: ChatLog, chat: Chat, turn: str, outcome: StepOutcome, batch: Batch
    ) -> None:
        """The bot's app tool calls and results as `tool_result` items (MEM-3), authored by the
        tool: sources learning may cite beside what a person said, never alone (LRN-9)."""
        for use in outcome.tools:
            item = self.item(log, turn, "tool_result", use.tool)
            text = _tool_enc.encode(
                {"tool": use.tool, "arguments": use.arguments, "result": use.result}
            ).decode()
            self.append(log, chat, [(item, text)], batch)

    # --- reading and deleting ---

    def view(self, log: ChatLog, item: Item) -> ItemView:
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
        return [self.view(log, i) for i in log.items if i.seq <= log.committed]

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
            batch = Batch(writes=self.store.delete_items(log), events=events)
            await self.kernel.commit(batch.fail(lambda: self.forget(chat)))
            self.store.clear_items(log)
        return count

    async def announce_update(self, chat: Chat, change: str) -> int:
        """Tell who may read `chat` (its record as the directory just stored it) that it
        changed: a `chat.updated` event in this, its home shard's, log. Returns its seq."""
        event = ChatUpdated(
            chat=chat.id, revision=chat.revision, change=change, project=chat.project
        )
        return await self.kernel.emit([(event, self.audience(chat))])

    async def confessions(self, chat: str) -> list[Confession]:
        return await self.store.records(CONFESSIONS.name, await self.log(chat))

    async def enrichments(self, chat: str) -> list[Enrichment]:
        return await self.store.records(ENRICHMENTS.name, await self.log(chat))
