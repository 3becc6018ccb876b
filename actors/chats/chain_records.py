"""A shard's collaboration chains as stored: each chain's record (structure as JSON; request and
result texts sealed with the root chat's key), and the chat records chains meet (chat records
never change once made, so a result finds the chat it goes to without asking the directory;
bounded).

Memory holds the chains that have work: those under way (a send not answered yet), those with
rows not committed yet or changes not stored yet, and those listing agent chats the directory
may not have; besides them, a few recently read (`RECENT`). Any other chain is read from the
shard's file when asked for (chain_rows.py), so a restart reads only the live rows and memory
does not grow with the chains a shard has ever run."""

from __future__ import annotations

import logging
import secrets
from collections import OrderedDict
from typing import Any

import msgspec

from actors.chats import chain_rows
from actors.chats.sent_gate import SendGate
from actors.contracts import ChainView, Effect, LinkView, StepInput, StepOutcome
from actors.shard.batch import Batch
from actors.shard.single_flight import SingleFlight
from engine.collaboration import Chain, ChainStatus, Link, find_link, new_chain
from engine.directory import Bot, Chat, Org, agent_chat, agent_chat_id
from engine.errors import NotFound, OpenBotError, StorageError
from engine.events import Audience, CollaborationChanged
from storage.chat_store import ChatLog, Item
from storage.crypto import aad

log = logging.getLogger("openbot.chains")
_enc = msgspec.json.Encoder()
KNOWN_CHATS = 10_000
RECENT = 64  # chains with no work kept after a read or a write (a stop, a late answer)


class ChainRecords:
    def __init__(self, *, kernel: Any, logs: Any, peers: Any) -> None:
        self.kernel = kernel
        self.conv = logs
        self.peers = peers
        self._chains: dict[str, Chain] = {}  # the chains in memory (see the module's doc)
        self._once: SingleFlight[bool] = SingleFlight()
        self._reads: SingleFlight[Chain | None] = SingleFlight()
        kernel.before_close.append(self._once.close)  # (a load whose caller was cancelled)
        kernel.before_close.append(self._reads.close)
        self._started = False
        # Chains read from the file at start, as an earlier run left them: only these can have
        # a delivery that no task of this run carries on (a chain begun in this run has one).
        self.from_before: set[str] = set()
        self._link_chain: dict[str, str] = {}  # link → its chain (the chains in memory)
        self.texts: dict[str, dict[str, dict[str, str]]] = {}
        self.channel: dict[str, str | None] = {}
        self.learn: dict[str, list[tuple[int, str]]] = {}  # turn → jobs waiting for it
        self.chats: dict[str, Chat] = {}
        # chain → links whose agent chat this shard made and the directory may not have yet:
        # stored with the chain's row, so a restart registers them again (agent_chats.py).
        self.unregistered: dict[str, set[str]] = {}
        # Chains made here with no row on disk yet → their rows staged and not failed: a chain
        # whose every row failed (its first with the turn's end) is dropped from memory too.
        self._unstored: dict[str, int] = {}
        # Chains dropped so: a delivery still holding one stores nothing more of it.
        self._dropped: set[str] = set()
        self._staged: dict[str, int] = {}  # chain → its rows staged, not committed or failed
        self._changed: set[str] = set()  # chains changed in memory since their last row
        self._new: set[str] = set()  # chains `begin` made, not staged yet
        self._under_way: dict[str, set[str]] = {}  # turn → its chains under way
        self._recent: OrderedDict[str, None] = OrderedDict()  # chains with no work, oldest first
        self.gate = SendGate(kernel)  # what a delivery's writing tools wait for (sent_gate.py)

    # --- memory ---

    async def start(self) -> None:
        """Read the live rows, once however many ask at once (recovery at start,
        find_agent_chat): a second read would overwrite what changed since."""
        if not self._started:
            await self._once.get("live", self._load_live)
            self._started = True

    async def _load_live(self) -> bool:
        for row in await chain_rows.live(self.kernel.db):
            if row.learn:
                self.learn[row.chain.topic] = list(row.learn)
            if row.unregistered:
                self.unregistered[row.chain.id] = set(row.unregistered)
            if await self._keep(row) is row.chain:
                self.from_before.add(row.chain.id)
        return True

    async def _texts_of(self, row: chain_rows.Row) -> dict[str, dict[str, str]]:
        chain = row.chain
        root = await self.conv.log(chain.root_chat)
        opened = root.cipher.open(
            row.sealed, aad(f"chat:{chain.root_chat}", f"chain\x00{chain.id}")
        )
        return chain_rows.open_texts(opened)

    async def _keep(self, row: chain_rows.Row) -> Chain:
        chain = row.chain
        texts = await self._texts_of(row)
        known = self._chains.get(chain.id)
        if known is not None:  # staged while this was read: memory is ahead of the row
            return known
        self.texts[chain.id] = texts
        self.channel[chain.id] = row.channel
        self._set(chain)
        return chain

    async def get(self, chain_id: str) -> Chain | None:
        """The chain, from memory or else from the file; None when none is stored."""
        await self.start()
        chain = self._chains.get(chain_id)
        if chain is not None:
            if chain_id in self._recent:
                self._recent.move_to_end(chain_id)
            return chain
        try:
            return await self._reads.get(chain_id, lambda: self._read(chain_id))
        finally:
            self._reads.loaded.pop(chain_id, None)

    async def _read(self, chain_id: str) -> Chain | None:
        row = await chain_rows.one(self.kernel.db, chain_id)
        return None if row is None else await self._keep(row)

    async def need(self, chain_id: str) -> Chain:
        """`get` for a chain that must exist: gone (its first commit failed and memory dropped
        it while a delivery of it was under way) is a clear error."""
        chain = await self.get(chain_id)
        if chain is None:
            raise NotFound(
                f"collaboration {chain_id} was not stored", code="collaboration_not_found"
            )
        return chain

    def put(self, chain: Chain) -> None:
        """A change in memory that a later `stage` stores (kept in memory until then)."""
        self._changed.add(chain.id)
        self._set(chain)

    def _set(self, chain: Chain) -> None:
        self._chains[chain.id] = chain
        self._link_chain.update((link.id, chain.id) for link in chain.links)
        running = self._under_way.setdefault(chain.topic, set())
        if chain_rows.under_way(chain):
            running.add(chain.id)
        else:
            running.discard(chain.id)
        if not running:
            del self._under_way[chain.topic]
        self.settle(chain.id)

    def _has_work(self, chain_id: str) -> bool:
        chain = self._chains.get(chain_id)
        return (
            (chain is not None and chain_rows.under_way(chain))
            or chain_id in self._staged
            or chain_id in self._changed
            or chain_id in self.unregistered
        )

    def settle(self, chain_id: str) -> None:
        """Keep a chain with work; one without joins the recent ones, the oldest of which
        leave memory (the file has them as memory had them)."""
        if chain_id not in self._chains:
            return
        if self._has_work(chain_id):
            self._recent.pop(chain_id, None)
        else:
            self._recent[chain_id] = None
            self._recent.move_to_end(chain_id)
        while len(self._recent) > RECENT:
            oldest, _ = self._recent.popitem(last=False)
            if not self._has_work(oldest):
                self._forget(oldest)

    def _forget(self, chain_id: str) -> None:
        chain = self._chains.pop(chain_id, None)
        for link in chain.links if chain is not None else ():
            if self._link_chain.get(link.id) == chain_id:
                del self._link_chain[link.id]
        if chain is not None and (running := self._under_way.get(chain.topic)):
            running.discard(chain_id)
            if not running:
                del self._under_way[chain.topic]
        self._recent.pop(chain_id, None)
        for kept in (self.texts, self.channel):
            kept.pop(chain_id, None)

    def stats(self) -> dict[str, int]:
        """How many chains memory holds (shard stats)."""
        return {"chains_in_memory": len(self._chains)}

    def running(self) -> list[Chain]:
        """The chains under way (every one is in memory)."""
        return [self._chains[c] for ids in self._under_way.values() for c in ids]

    def under_way(self, topic: str) -> bool:
        """Whether a chain started by this turn is still under way."""
        return bool(self._under_way.get(topic))

    async def of_topic(self, topic: str) -> list[Chain]:
        """Every chain started by this turn, in memory or not."""
        await self.start()
        ids = {c.id for c in self._chains.values() if c.topic == topic}
        ids.update(await chain_rows.of_topic(self.kernel.db, topic))
        found = [await self.get(c) for c in sorted(ids)]
        return [c for c in found if c is not None]

    async def adopt(self, chain_ids: list[str]) -> None:
        """Chains an import stored on this shard (new ids): those with work join memory as a
        start would take them; the others are read from the file when asked for. Before the
        start there is nothing to do (it reads the live rows, these among them)."""
        if not self._started:
            return
        for chain_id in chain_ids:
            row = await chain_rows.one(self.kernel.db, chain_id)
            if row is None or not (
                chain_rows.under_way(row.chain) or row.learn or row.unregistered
            ):
                continue
            if row.learn:
                self.learn[row.chain.topic] = list(row.learn)
            if row.unregistered:
                self.unregistered[chain_id] = set(row.unregistered)
            await self._keep(row)

    def audience(self, chain: Chain) -> Audience:
        channel = self.channel.get(chain.id)
        return Audience(org=chain.org, users=(chain.owner,), channels=(channel,) if channel else ())

    async def stage(self, chain: Chain, sink: Any, announce: bool = True) -> None:
        """Make `chain` the current state and add its row and event (unless not `announce`:
        a row's own bookkeeping) to `sink`. Callers hold the runner's lock until the sink is
        submitted, so chain rows reach the disk in order."""
        await self.start()  # (the live rows first: a row read later never replaces this)
        if chain.id in self._dropped:
            raise StorageError("the chain's first write could not be stored")
        before = self._chains.get(chain.id)
        if before is None and chain.id not in self._new:  # (a chain `begin` made is not read)
            before = await self.get(chain.id)
        self._new.discard(chain.id)
        ended = chain.status in (ChainStatus.STOPPED, ChainStatus.CAPPED)
        if ended and (before is None or before.status != chain.status):
            log.warning("collaboration %s %s: %s", chain.id, chain.status, chain.reason)
        # Counted before the first `await`: a chain with a row on its way stays in memory.
        self._staged[chain.id] = self._staged.get(chain.id, 0) + 1
        self._changed.discard(chain.id)
        self._set(chain)
        sink.done(lambda: self._row_settled(chain.id))
        sink.fail(lambda: self._row_settled(chain.id))
        if before is None:
            self._unstored[chain.id] = 0
        if chain.id in self._unstored:
            self._unstored[chain.id] += 1
            sink.done(lambda: self._unstored.pop(chain.id, None))
            sink.fail(lambda: self._row_failed(chain.id))
        root = await self.conv.log(chain.root_chat)
        sealed = root.cipher.seal(
            _enc.encode(self.texts.get(chain.id, {})),
            aad(f"chat:{chain.root_chat}", f"chain\x00{chain.id}"),
        )
        event = CollaborationChanged(
            collaboration=chain.id, status=chain.status, chat=chain.root_chat
        )
        stored = chain_rows.row(
            chain,
            self.channel.get(chain.id),
            self.learn.get(chain.topic, []),
            sorted(self.unregistered.get(chain.id, ())),
            sealed,
        )
        sink.key(root.key).add(stored)
        if not announce:
            return
        # One announcement per chain and transaction, of its latest state: a hop stages its
        # chain twice (its request, then its sends), and after a cap every answer going up
        # rides in one batch (clients read the chain again on each; the rows merge anyway).
        sink.events[:] = [
            (p, a)
            for p, a in sink.events
            if not (isinstance(p, CollaborationChanged) and p.collaboration == chain.id)
        ]
        sink.emit(event, self.audience(chain))

    def _row_settled(self, chain_id: str) -> None:
        left = self._staged.get(chain_id, 0) - 1
        if left > 0:
            self._staged[chain_id] = left
        else:
            self._staged.pop(chain_id, None)
            self.settle(chain_id)

    def _row_failed(self, chain_id: str) -> None:
        """A row of a chain with none on disk failed: once every row staged for it has
        failed, memory drops the chain as the disk never had it (a delivery under way finds
        it gone and stores nothing: its rows went after the failed one)."""
        left = self._unstored.get(chain_id)
        if left is None:  # a row of it committed: the chain exists
            return
        if left > 1:
            self._unstored[chain_id] = left - 1
            return
        del self._unstored[chain_id]
        self._dropped.add(chain_id)
        self._changed.discard(chain_id)
        self.unregistered.pop(chain_id, None)
        self._forget(chain_id)

    def begin(self, chat: Chat, turn: str, bot: str) -> Chain:
        """A new chain rooted in `chat` (not stored yet: its first send stages it)."""
        chain = new_chain(
            chain_id="col_" + secrets.token_hex(8),
            org=chat.org,
            owner=chat.owner,
            root_chat=chat.id,
            topic=turn,
            project=chat.project,
            root_bot=bot,
            now=self.kernel.clock(),
        )
        self.channel[chain.id] = chat.channel
        if len(self._new) >= KNOWN_CHATS:  # (begun, and their first send refused as invalid)
            self._new.clear()
        self._new.add(chain.id)
        self.know(chat)
        return chain

    def know(self, chat: Chat) -> None:
        if len(self.chats) >= KNOWN_CHATS:
            self.chats.clear()
        self.chats[chat.id] = chat

    async def agent_chat(self, chat_id: str) -> Chat | None:
        """The `agent` chat of one of this shard's deliveries, made here (agent_chats.py),
        whether or not the directory has it yet; None if no chain in memory has it (a chain
        whose agent chats the directory may lack is kept in memory until it has them)."""
        known = self.chats.get(chat_id)
        if known is not None:
            return known if known.kind == "agent" else None
        await self.start()
        # The chat is named after its link (agent_chat_id): one chain to look in, not all.
        chain = self._chains.get(self._link_chain.get(chat_id.removeprefix(agent_chat_id("")), ""))
        for link in chain.links if chain is not None else ():
            if link.agent_chat == chat_id:
                root = await self.chat(chain.root_chat)
                made = agent_chat(root, link.to_bot, chain.id, link.id, link.sent_at)
                self.know(made)
                return made
        return None

    async def chat(self, chat_id: str) -> Chat:
        chat = self.chats.get(chat_id)
        if chat is None:
            try:
                chat = await self.peers.directory().get_chat(chat_id)
            except NotFound:
                # An agent chat made here reaches the directory a moment after its delivery.
                chat = await self.agent_chat(chat_id)
                if chat is None:
                    raise
            self.know(chat)
        return chat

    def sent(
        self,
        log_: ChatLog,
        chat: Chat,
        turn: str | None,
        sender: str,
        peer: str,
        text: str,
        sink: Any,
    ) -> Item:
        """UI-1: the sending side of a real delivery, in the chat the bot sent from: the actual
        body, marked `sent` to `peer` (the chain's own record of the request is not touched),
        added to `sink`."""
        conv = self.conv
        item = conv.item(log_, turn, "delivery", sender)
        conv.append(log_, chat, [(item, text)], sink)
        sink.writes.append(conv.store.communication_row(log_, item.seq, "sent", peer))
        return item

    def waiting_parent(self, chain: Chain, link: Link) -> tuple[str, str] | None:
        """The parent link and its peer's waiting answer, when `link` was the last of its
        sends still open."""
        parent = find_link(chain, link.parent) if link.parent else None
        if parent is None or parent.status != "sent":
            return None
        pending = self.texts.get(chain.id, {}).get(parent.id, {}).get("pending")
        if pending is None or any(
            c.parent == parent.id and c.status == "sent" for c in chain.links
        ):
            return None
        return parent.id, pending

    def reply(
        self, chat_log: ChatLog, chat: Chat, turn: str, bot: Bot, outcome: StepOutcome, sink: Batch
    ) -> str:
        """The step's answer as an item of `chat`, added to `sink`; returns its text."""
        if outcome.status == "done" and outcome.reply is not None:
            kind, text = "bot", outcome.reply
        else:
            kind, text = (
                "notification",
                f"{bot.name} could not answer: {outcome.error or 'no answer'}",
            )
        item = self.conv.item(chat_log, turn, kind, bot.id)
        self.conv.append(chat_log, chat, [(item, text)], sink)
        return text

    async def step(
        self, bot: Bot, step: StepInput, sent: tuple[str, str, Any] | None = None
    ) -> StepOutcome:
        """`sent`: (chain, link, its send's commit) for a delivery: until that commit is
        durable, the step's writing tools wait for it (sent_gate.py)."""
        if bot.archived:  # archived after the chain began (WS-3): it is asked nothing more
            return StepOutcome(status="failed", error="the bot is archived")
        peers = self.peers
        ref = self.gate.open(*sent) if sent is not None else None
        if ref is not None:  # (the peer's writing tools ask whether it is stored: sent_gate.py)
            step = msgspec.structs.replace(step, sent=ref)
        try:
            return await peers.shard(peers.index_of(bot.owner)).run_step(step, (), 0)
        except OpenBotError as e:
            log.warning("step of bot %s in chat %s failed: %s", bot.id, step.chat.id, e.message)
            return StepOutcome(status="failed", error=e.message)
        finally:
            if ref is not None and sent is not None:
                self.gate.close(ref.link, sent[2])

    async def release_learning(self, topic: str, waiting: list[tuple[int, str]]) -> list[Chain]:
        """Let the learning jobs (shard, job id) that waited for this turn's collaboration run,
        over the root chat as it is now (CO-2); returns the turn's chains (to store again)."""
        peers = self.peers
        upto = 0
        chains = await self.of_topic(topic)
        if chains:
            root = await self.conv.log(chains[0].root_chat)
            upto = root.items[-1].seq if root.items else 0
        for index, job_id in waiting:
            try:
                await peers.shard(index).release_learning(job_id, upto)
            except OpenBotError as e:
                log.warning("releasing learning job %s failed: %s", job_id, e.message)
        return chains

    async def post(self, effect: Effect, bot: Bot, org: Org) -> None:
        """`workspace_post_to_group`: the bot's message in its group's chat (the group's home
        may be another shard)."""
        peers = self.peers
        try:
            group = await peers.directory().group_chat(effect.target)
            await peers.shard(peers.index_of(group.home)).post_item(group, bot.id, effect.message)
        except OpenBotError as e:
            log.warning("post to group %s failed: %s", effect.target, e.message)

    async def listing(
        self, user: str, channels: frozenset[str], after: str | None, limit: int
    ) -> list[ChainView]:
        """The first `limit` chains `user` may see whose sort key (chain_rows.sort_key) is
        below `after`, newest first: one page read from the file, with memory's newer state
        (and chains whose first row is not committed yet) in their place."""
        await self.start()
        rows = await chain_rows.page(self.kernel.db, user, channels, after, limit)
        found: dict[str, ChainView] = {}
        for row in rows:  # (read for this answer only: memory keeps none of them)
            if row.chain.id not in self._chains:
                found[row.chain.id] = self.view(row.chain, await self._texts_of(row))
        for chain in list(self._chains.values()):
            key = chain_rows.sort_key(chain.created_at, chain.id)
            if (after is None or key < after) and self.may_see(chain, user, channels):
                found[chain.id] = self.view(chain)
        newest = sorted(found.values(), key=lambda c: (c.createdAt, c.id), reverse=True)
        return newest[:limit]

    def may_see(self, chain: Chain, user: str, channels: frozenset[str]) -> bool:
        return chain.owner == user or self.channel.get(chain.id) in channels

    def view(self, chain: Chain, texts: dict[str, dict[str, str]] | None = None) -> ChainView:
        texts = self.texts.get(chain.id, {}) if texts is None else texts
        return ChainView(
            id=chain.id,
            status=chain.status,
            reason=chain.reason,
            rootChat=chain.root_chat,
            topic=chain.topic,
            project=chain.project,
            rootBot=chain.root_bot,
            deliveries=chain.deliveries,
            revision=chain.revision,
            createdAt=chain.created_at,
            updatedAt=chain.updated_at,
            links=[
                LinkView(
                    id=k.id,
                    parent=k.parent,
                    fromBot=k.from_bot,
                    toBot=k.to_bot,
                    depth=k.depth,
                    status=k.status,
                    reason=k.reason,
                    request=texts.get(k.id, {}).get("request"),
                    result=texts.get(k.id, {}).get("result"),
                    agentChat=k.agent_chat,
                )
                for k in chain.links
            ],
        )


def bounded(links: dict) -> dict:
    """A map by link, emptied when it grows past what running chains can need (entries of
    links a stop or a failure left undone are never taken out)."""
    if len(links) >= 10_000:
        links.clear()
    return links
