"""Collaboration chains on the root chat's home shard (WS-4, CO-1, CO-2, UI-1).

A bot's `workspace_send_to_agent` got a receipt at once; here the send is checked against the
chain's rules (engine/collaboration.py: depth, deliveries, duplicates, bare acknowledgements,
stop) and delivered: the peer works in an `agent` chat that holds only what was sent to it (a
peer's private chat is never handed to another bot). When the peer has answered and every send
it made itself has come back, its reply returns as a `delivery` item to the chat it was asked
from and wakes the bot that asked, never as a person's words. After `stop`, results are
recorded and start nothing.

Chains are stored on this shard (structure as JSON, request and result texts sealed with the
root chat's key) and announced as `collaboration.changed`.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import msgspec

from actors.chats.chat_logs import ChatLogs
from actors.contracts import ChainView, Effect, LinkView, StepInput, StepOutcome
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel
from engine import collaboration as rules
from engine.collaboration import Chain, ChainStatus
from engine.directory import Bot, Chat, Org
from engine.errors import NotFound, OpenBotError
from engine.events import Audience, CollaborationChanged
from storage.crypto import aad
from storage.group_commit import Put
from storage.shard_schema import CHAINS

log = logging.getLogger("openbot.chains")
_enc = msgspec.json.Encoder()
_chain_dec = msgspec.json.Decoder(Chain)
_texts_dec = msgspec.json.Decoder(dict[str, dict[str, str]])


class ChainRunner:
    def __init__(self, kernel: ShardKernel, logs: ChatLogs, peers: Peers) -> None:
        self.kernel = kernel
        self.conv = logs  # the chats chains write to (root, agent and target chats)
        self.peers = peers
        self._chains: dict[str, Chain] | None = None
        self._texts: dict[str, dict[str, dict[str, str]]] = {}
        self._channel: dict[str, str | None] = {}
        self._tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()
        self._learn: dict[str, list[tuple[int, str]]] = {}  # turn → jobs waiting for it
        self._busy: dict[str, int] = {}  # turn → deliveries of it still being worked on

    async def _all(self) -> dict[str, Chain]:
        if self._chains is None:
            rows = await self.kernel.db.run(
                lambda con: con.execute("SELECT doc, texts FROM chains").fetchall()
            )
            chains: dict[str, Chain] = {}
            for doc, texts in rows:
                record = msgspec.json.decode(doc)
                chain = msgspec.convert(record["chain"], Chain)
                chains[chain.id] = chain
                self._channel[chain.id] = record.get("channel")
                if record.get("learn"):
                    self._learn[chain.topic] = [tuple(x) for x in record["learn"]]
                root = await self.conv.log(chain.root_chat)
                opened = root.cipher.open(
                    texts, aad(f"chat:{chain.root_chat}", f"chain\x00{chain.id}")
                )
                self._texts[chain.id] = _texts_dec.decode(opened)
            if self._chains is None:
                self._chains = chains
        return self._chains

    async def resume(self) -> None:
        """`recover` at start; a chain that cannot resume must not stop the shard serving."""
        try:
            await self.recover()
        except Exception:
            log.exception("resuming collaboration chains failed")

    async def recover(self) -> int:
        """Resume the deliveries that were under way when the shard stopped (nothing is lost;
        a delivery already answered is not asked again)."""
        resumed = 0
        for chain in list((await self._all()).values()):
            if chain.status != "running":
                continue
            open_ = [
                k for k in rules.open_links(chain) if not any(c.parent == k.id for c in chain.links)
            ]
            if not open_:
                continue
            try:
                org = await self.peers.directory().get_org(chain.org)
            except OpenBotError as e:  # one chain that cannot resume does not hold the others
                log.warning("chain %s not resumed: %s", chain.id, e.message)
                continue
            for link in open_:
                self._spawn(self._deliver(chain.id, link.id, org))
                resumed += 1
        log.info("resumed %d deliveries", resumed)
        return resumed

    def _audience(self, chain: Chain) -> Audience:
        channel = self._channel.get(chain.id)
        return Audience(org=chain.org, users=(chain.owner,), channels=(channel,) if channel else ())

    async def _save(self, chain: Chain) -> None:
        chains = await self._all()
        before = chains.get(chain.id)
        ended = chain.status in (ChainStatus.STOPPED, ChainStatus.CAPPED)
        if ended and (before is None or before.status != chain.status):
            log.warning("collaboration %s %s: %s", chain.id, chain.status, chain.reason)
        chains[chain.id] = chain
        root = await self.conv.log(chain.root_chat)
        sealed = root.cipher.seal(
            _enc.encode(self._texts.get(chain.id, {})),
            aad(f"chat:{chain.root_chat}", f"chain\x00{chain.id}"),
        )
        doc = _enc.encode(
            {
                "chain": chain,
                "channel": self._channel.get(chain.id),
                "learn": self._learn.get(chain.topic, []),
            }
        ).decode()
        event = CollaborationChanged(
            collaboration=chain.id, status=chain.status, chat=chain.root_chat
        )
        batch = Batch().key(root.key).add(Put(CHAINS.name, (chain.id, chain.org, doc, sealed)))
        await self.kernel.commit(batch.emit(event, self._audience(chain)))

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- what bots asked for ---

    async def on_effects(
        self,
        chat: Chat,
        org: Org,
        turn: str,
        bot: Bot,
        effects: tuple[Effect, ...],
        *,
        parent: str | None,
        chain: str | None,
        learn: list[tuple[int, str]] | tuple = (),
    ) -> None:
        """Carry out what a bot asked for. `learn`: learning jobs (shard, job id) of this turn
        that wait until its collaboration is back (CO-2)."""
        if learn:
            self._learn.setdefault(turn, []).extend(learn)
        await self._effects(chat, org, turn, bot, effects, parent=parent, chain=chain)
        await self._maybe_release(turn)

    async def _effects(
        self,
        chat: Chat,
        org: Org,
        turn: str,
        bot: Bot,
        effects: tuple[Effect, ...],
        *,
        parent: str | None,
        chain: str | None,
    ) -> None:
        for effect in effects:
            if effect.kind == "post":
                await self._post(effect, bot, org)
                continue
            async with self._lock:
                chains = await self._all()
                current = chains.get(chain) if chain else None
                if current is None:
                    root = chat if chat.kind != "agent" else None
                    if root is None:  # an agent chat's own sends belong to its chain
                        continue
                    current = rules.new_chain(
                        chain_id="col_" + secrets.token_hex(8),
                        org=chat.org,
                        owner=chat.owner,
                        root_chat=chat.id,
                        topic=turn,
                        project=chat.project,
                        root_bot=bot.id,
                        now=self.kernel.clock(),
                    )
                    self._channel[current.id] = chat.channel
                    chain = current.id
                updated, decision = rules.on_send(
                    current,
                    link_id=effect.link,
                    parent=parent,
                    from_bot=bot.id,
                    to_bot=effect.target,
                    message=effect.message,
                    now=self.kernel.clock(),
                )
                self._texts.setdefault(updated.id, {})[effect.link] = {"request": effect.message}
                await self._save(updated)
            if decision.action == "deliver":
                # UI-1: the asking bot's chat shows what it sent, to whom (a real delivery only).
                await self.conv.say_sent(chat, turn, bot.id, effect.target, effect.message)
                self._spawn(self._deliver(updated.id, effect.link, org))

    async def _post(self, effect: Effect, bot: Bot, org: Org) -> None:
        """`workspace_post_to_group`: the bot's message in its group's chat (the group's home
        may be another shard)."""
        peers = self.peers
        try:
            group = await peers.directory().group_chat(effect.target)
            await peers.shard(peers.index_of(group.home)).post_item(group, bot.id, effect.message)
        except OpenBotError as e:
            log.warning("post to group %s failed: %s", effect.target, e.message)

    # --- delivering ---

    async def _deliver(self, chain_id: str, link_id: str, org: Org) -> None:
        topic = (await self._all())[chain_id].topic
        self._busy[topic] = self._busy.get(topic, 0) + 1
        try:
            await self._deliver_once(chain_id, link_id, org)
        except Exception:
            log.exception("delivery %s of chain %s failed", link_id, chain_id)
        finally:
            self._busy[topic] -= 1
            if not self._busy[topic]:
                del self._busy[topic]
        await self._maybe_release(topic)

    async def _deliver_once(self, chain_id: str, link_id: str, org: Org) -> None:
        conv, peers = self.conv, self.peers
        chain = (await self._all())[chain_id]
        if chain.status != "running":
            return
        link = rules.find_link(chain, link_id)
        root = await peers.directory().get_chat(chain.root_chat)
        agent_chat = await peers.directory().agent_chat(root, link.to_bot, chain.id, link.id)
        async with self._lock:
            chain = rules.attach_agent_chat((await self._all())[chain_id], link.id, agent_chat.id)
            await self._save(chain)
        peer = await peers.directory().get_bot(link.to_bot)
        request = self._texts[chain_id][link_id]["request"]
        async with conv.lock(agent_chat.id):
            alog = await conv.log(agent_chat.id)
            # After a restart the delivery may be stored already, and even answered: resume
            # from what the agent chat holds instead of delivering or asking twice.
            asked = next((i for i in alog.items if i.kind == "delivery"), None)
            if asked is None:
                asked = await conv.say(agent_chat, chain.topic, "delivery", link.from_bot, request)
            answered = next(
                (i for i in alog.items if i.seq > asked.seq and i.kind in ("bot", "notification")),
                None,
            )
            effects: tuple = ()
            if answered is not None:
                reply = conv.store.text(alog, answered.seq)
            else:
                step = StepInput(
                    chat=agent_chat,
                    bot=peer,
                    org=org,
                    operator=chain.owner,
                    turn=chain.topic,
                    text=f"[delivery from {link.from_bot}, receipt {link.id}] {request}",
                    wake="delivery",
                    history=conv.history(alog, asked.seq, me=peer.id),
                )
                outcome = await self._step(peer, step)
                reply = await self._store_reply(agent_chat, chain.topic, peer, outcome)
                effects = outcome.effects
        await self.on_effects(
            agent_chat, org, chain.topic, peer, effects, parent=link.id, chain=chain_id
        )
        await self._maybe_answer(chain_id, link.id, reply, org)

    async def _step(self, bot: Bot, step: StepInput) -> StepOutcome:
        if bot.archived:  # archived after the chain began (WS-3): it is asked nothing more
            return StepOutcome(status="failed", error="the bot is archived")
        peers = self.peers
        try:
            return await peers.shard(peers.index_of(bot.owner)).run_step(step, (), 0)
        except OpenBotError as e:
            log.warning("step of bot %s in chat %s failed: %s", bot.id, step.chat.id, e.message)
            return StepOutcome(status="failed", error=e.message)

    async def _store_reply(self, chat: Chat, turn: str, bot: Bot, outcome: StepOutcome) -> str:
        if outcome.status == "done" and outcome.reply is not None:
            await self.conv.say(chat, turn, "bot", bot.id, outcome.reply)
            return outcome.reply
        text = f"{bot.name} could not answer: {outcome.error or 'no answer'}"
        await self.conv.say(chat, turn, "notification", bot.id, text)
        return text

    async def _maybe_answer(self, chain_id: str, link_id: str, reply: str, org: Org) -> None:
        """The peer's latest reply answers its link once none of its own sends is still open."""
        chain = (await self._all())[chain_id]
        if any(c.parent == link_id and c.status == "sent" for c in chain.links):
            self._texts[chain_id].setdefault(link_id, {})["pending"] = reply
            return
        await self._result(chain_id, link_id, reply, org)

    async def _result(self, chain_id: str, link_id: str, text: str, org: Org) -> None:
        conv, peers = self.conv, self.peers
        async with self._lock:
            chain = (await self._all())[chain_id]
            chain, decision = rules.on_result(
                chain, link_id=link_id, text=text, now=self.kernel.clock()
            )
            self._texts.setdefault(chain_id, {}).setdefault(link_id, {})["result"] = text
            await self._save(chain)
        link = rules.find_link(chain, link_id)
        if decision.action != "deliver":
            # Suppressed, or late after a stop or cap: recorded, starts nothing (CO-1). A peer
            # that answered while waiting for this one gets its answer recorded the same way.
            parent = rules.find_link(chain, link.parent) if link.parent else None
            pending = (
                self._texts.get(chain_id, {}).get(parent.id, {}).get("pending") if parent else None
            )
            if (
                parent is not None
                and parent.status == "sent"
                and pending is not None
                and not any(c.parent == parent.id and c.status == "sent" for c in chain.links)
            ):
                await self._result(chain_id, parent.id, pending, org)
            return
        parent = rules.find_link(chain, link.parent) if link.parent else None
        target_id = parent.agent_chat if parent else chain.root_chat
        waker = await peers.directory().get_bot(parent.to_bot if parent else chain.root_bot)
        target = await peers.directory().get_chat(target_id)
        async with conv.lock(target.id):
            tlog = await conv.log(target.id)
            delivered = await conv.say(target, chain.topic, "delivery", link.to_bot, text)
            step = StepInput(
                chat=target,
                bot=waker,
                org=org,
                operator=chain.owner,
                turn=chain.topic,
                text=f"[delivery from {link.to_bot}, receipt {link.id}] {text}",
                wake="delivery",
                history=conv.history(tlog, delivered.seq, me=waker.id),
                channel=target.channel,
            )
            outcome = await self._step(waker, step)
            reply = await self._store_reply(target, chain.topic, waker, outcome)
        await self.on_effects(
            target,
            org,
            chain.topic,
            waker,
            outcome.effects,
            parent=parent.id if parent else None,
            chain=chain_id,
        )
        if parent is not None:
            await self._maybe_answer(chain_id, parent.id, reply, org)

    # --- what people see and do ---

    async def stop_visible(
        self, chain_id: str, user: str, channels: frozenset[str]
    ) -> ChainView | None:
        """Stop a chain homed here that `user` may see; None when it is not here."""
        chain = await self.find(chain_id)
        if chain is None or not self.may_see(chain, user, channels):
            return None
        return await self.stop(chain_id, user)

    async def stop(self, chain_id: str, by: str) -> ChainView:
        async with self._lock:
            chain = (await self._all()).get(chain_id)
            if chain is None:
                raise NotFound(f"no collaboration {chain_id}", code="collaboration_not_found")
            chain = rules.stop(chain, by=by, now=self.kernel.clock())
            await self._save(chain)
        await self._maybe_release(chain.topic)
        return self.view(chain)

    async def _maybe_release(self, topic: str) -> None:
        """Once no collaboration of this turn is under way, its waiting learning jobs run, once,
        over everything that came back (CO-2)."""
        waiting = self._learn.get(topic)
        if not waiting or await self.running_for(topic) or self._busy.get(topic):
            return
        self._learn.pop(topic, None)
        peers = self.peers
        upto = 0
        chains = [c for c in (await self._all()).values() if c.topic == topic]
        if chains:
            root = await self.conv.log(chains[0].root_chat)
            upto = root.items[-1].seq if root.items else 0
        for index, job_id in waiting:
            try:
                await peers.shard(index).release_learning(job_id, upto)
            except OpenBotError as e:
                log.warning("releasing learning job %s failed: %s", job_id, e.message)
        for chain in chains:  # the stored record no longer lists them
            await self._save(chain)

    async def running_for(self, topic: str) -> bool:
        """Whether a chain started by this turn is still under way."""
        return any(
            c.topic == topic and c.status == "running" and rules.open_links(c)
            for c in (await self._all()).values()
        )

    async def find(self, chain_id: str) -> Chain | None:
        return (await self._all()).get(chain_id)

    async def listing(self, user: str, channels: frozenset[str]) -> list[ChainView]:
        chains = await self._all()
        return [
            self.view(c)
            for c in sorted(chains.values(), key=lambda c: (c.created_at, c.id))
            if c.owner == user or self._channel.get(c.id) in channels
        ]

    def may_see(self, chain: Chain, user: str, channels: frozenset[str]) -> bool:
        return chain.owner == user or self._channel.get(chain.id) in channels

    def view(self, chain: Chain) -> ChainView:
        texts = self._texts.get(chain.id, {})
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
