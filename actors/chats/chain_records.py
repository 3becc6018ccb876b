"""A shard's collaboration chains as stored: each chain's record (structure as JSON; request and
result texts sealed with the root chat's key), read once from the shard's file, and the chat
records chains meet (chat records never change once made, so a result finds the chat it goes to
without asking the directory; bounded)."""

from __future__ import annotations

import logging
import secrets
from typing import Any

import msgspec

from actors.chats.sent_gate import SendGate
from actors.contracts import ChainView, Effect, LinkView, StepInput, StepOutcome
from actors.shard.batch import Batch
from actors.shard.single_flight import SingleFlight
from engine.collaboration import Chain, ChainStatus, Link, find_link, new_chain
from engine.directory import Bot, Chat, Org, agent_chat, agent_chat_id
from engine.errors import NotFound, OpenBotError
from engine.events import Audience, CollaborationChanged
from storage.chat_store import ChatLog, Item
from storage.crypto import aad
from storage.group_commit import Put
from storage.shard_schema import CHAINS

log = logging.getLogger("openbot.chains")
_enc = msgspec.json.Encoder()
_texts_dec = msgspec.json.Decoder(dict[str, dict[str, str]])
KNOWN_CHATS = 10_000


class _Chains(dict[str, Chain]):
    """The chains by id; a chain that is not here (its first commit failed and memory dropped
    it while a delivery of it was under way) is a clear error, not a KeyError."""

    def __missing__(self, chain_id: str) -> Chain:
        raise NotFound(f"collaboration {chain_id} was not stored", code="collaboration_not_found")


class ChainRecords:
    def __init__(self, *, kernel: Any, logs: Any, peers: Any) -> None:
        self.kernel = kernel
        self.conv = logs
        self.peers = peers
        self._loaded: dict[str, Chain] | None = None
        self._once: SingleFlight[dict[str, Chain]] = SingleFlight()
        kernel.before_close.append(self._once.close)  # (a load whose caller was cancelled)
        self._link_chain: dict[str, str] = {}  # link → its chain (every chain's links)
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
        self.gate = SendGate(kernel)  # what a delivery's writing tools wait for (sent_gate.py)

    async def all(self) -> dict[str, Chain]:
        if self._loaded is None:
            # Read once however many ask at once (recovery at start, find_agent_chat): a
            # second read would overwrite texts, learning and unregistered links changed since.
            self._loaded = await self._once.get("chains", self._load)
        return self._loaded

    async def _load(self) -> dict[str, Chain]:
        rows = await self.kernel.db.run(
            lambda con: con.execute("SELECT doc, texts FROM chains").fetchall()
        )
        chains = _Chains()
        for doc, texts in rows:
            await self._take(chains, doc, texts)
        return chains

    async def _take(self, chains: dict[str, Chain], doc: str, texts: bytes) -> None:
        record = msgspec.json.decode(doc)
        chain = msgspec.convert(record["chain"], Chain)
        chains[chain.id] = chain
        self._link_chain.update((link.id, chain.id) for link in chain.links)
        self.channel[chain.id] = record.get("channel")
        if record.get("learn"):
            self.learn[chain.topic] = [tuple(x) for x in record["learn"]]
        if record.get("unregistered"):
            self.unregistered[chain.id] = set(record["unregistered"])
        root = await self.conv.log(chain.root_chat)
        opened = root.cipher.open(texts, aad(f"chat:{chain.root_chat}", f"chain\x00{chain.id}"))
        self.texts[chain.id] = _texts_dec.decode(opened)

    async def adopt(self, rows: list[tuple[str, bytes]]) -> None:
        """Chains an import stored on this shard (new ids; rows (doc, texts)): known from
        now on. Before the first load there is nothing to do (the load reads them)."""
        chains = await self.all()
        for doc, texts in rows:
            await self._take(chains, doc, texts)

    def audience(self, chain: Chain) -> Audience:
        channel = self.channel.get(chain.id)
        return Audience(org=chain.org, users=(chain.owner,), channels=(channel,) if channel else ())

    async def stage(self, chain: Chain, sink: Any) -> None:
        """Make `chain` the current state and add its row and event to `sink`. Callers hold
        the runner's lock until the sink is submitted, so chain rows reach the disk in order."""
        chains = await self.all()
        before = chains.get(chain.id)
        ended = chain.status in (ChainStatus.STOPPED, ChainStatus.CAPPED)
        if ended and (before is None or before.status != chain.status):
            log.warning("collaboration %s %s: %s", chain.id, chain.status, chain.reason)
        chains[chain.id] = chain
        self._link_chain.update((link.id, chain.id) for link in chain.links)
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
        doc = _enc.encode(
            {
                "chain": chain,
                "channel": self.channel.get(chain.id),
                "learn": self.learn.get(chain.topic, []),
                "unregistered": sorted(self.unregistered.get(chain.id, ())),
            }
        ).decode()
        event = CollaborationChanged(
            collaboration=chain.id, status=chain.status, chat=chain.root_chat
        )
        sink.key(root.key).add(Put(CHAINS.name, (chain.id, chain.org, doc, sealed)))
        # One announcement per chain and transaction, of its latest state: a hop stages its
        # chain twice (its request, then its sends), and after a cap every answer going up
        # rides in one batch (clients read the chain again on each; the rows merge anyway).
        sink.events[:] = [
            (p, a)
            for p, a in sink.events
            if not (isinstance(p, CollaborationChanged) and p.collaboration == chain.id)
        ]
        sink.emit(event, self.audience(chain))

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
        if self._loaded is not None:
            self._loaded.pop(chain_id, None)
        for kept in (self.texts, self.channel, self.unregistered):
            kept.pop(chain_id, None)

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
        self.know(chat)
        return chain

    def know(self, chat: Chat) -> None:
        if len(self.chats) >= KNOWN_CHATS:
            self.chats.clear()
        self.chats[chat.id] = chat

    async def agent_chat(self, chat_id: str) -> Chat | None:
        """The `agent` chat of one of this shard's deliveries, made here (agent_chats.py),
        whether or not the directory has it yet; None if no chain here has it."""
        known = self.chats.get(chat_id)
        if known is not None:
            return known if known.kind == "agent" else None
        chains = await self.all()  # fills `_link_chain`
        # The chat is named after its link (agent_chat_id): one chain to look in, not all.
        chain = chains.get(self._link_chain.get(chat_id.removeprefix(agent_chat_id("")), ""))
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
        chains = [c for c in (await self.all()).values() if c.topic == topic]
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

    async def listing(self, user: str, channels: frozenset[str]) -> list[ChainView]:
        chains = await self.all()
        return [
            self.view(c)
            for c in sorted(chains.values(), key=lambda c: (c.created_at, c.id))
            if self.may_see(c, user, channels)
        ]

    def may_see(self, chain: Chain, user: str, channels: frozenset[str]) -> bool:
        return chain.owner == user or self.channel.get(chain.id) in channels

    def view(self, chain: Chain) -> ChainView:
        texts = self.texts.get(chain.id, {})
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
