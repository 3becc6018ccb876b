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

from actors.chats.agent_chats import Registrar
from actors.chats.chain_records import ChainRecords, bounded
from actors.chats.chat_logs import ChatLogs
from actors.contracts import ChainView, Effect, SentRef, StepInput
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, durable
from engine import collaboration as rules
from engine.collaboration import Chain
from engine.directory import Bot, Chat, Org, agent_chat
from engine.errors import NotFound, OpenBotError
from storage.chat_store import ChatLog
from storage.crypto import chain_fp_key

log = logging.getLogger("openbot.chains")


class ChainRunner:
    def __init__(self, *, kernel: ShardKernel, logs: ChatLogs, peers: Peers) -> None:
        self.kernel = kernel
        self.conv = logs  # the chats chains write to (root, agent and target chats)
        self.peers = peers
        self.records = ChainRecords(kernel=kernel, logs=logs, peers=peers)
        self._texts, self._learn = self.records.texts, self.records.learn  # (shorter names)
        self._tasks: set[asyncio.Task] = set()
        self._lock = asyncio.Lock()
        self._busy: dict[str, int] = {}  # turn → deliveries of it still being worked on
        # link → the bot that sent it: the answer wakes it (WS-4) as it was when it sent.
        self._askers: dict[str, Bot] = {}
        # link → (the peer as its send found it, the bot that sent it), until it is delivered.
        self._parties: dict[str, tuple[Bot, Bot]] = {}
        # Links whose delivery task runs now: recovery at start (`recover`)
        # may find a chain a first turn just began, its delivery already under way.
        self._delivering: set[str] = set()
        self.registrar = Registrar(
            records=self.records, peers=peers, spawn=self._spawn, lock=self._lock, kernel=kernel
        )

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- a delivery's agent chat, asked for before the directory has it ---
    # This shard makes each delivery's agent chat itself and registers it with the directory in
    # the background (agent_chats.py): a hop asks the directory nothing. A reader that comes
    # for such a chat before the directory has it (a client fetching an item its
    # `chat.item.created` announced) is served by the gateway from here (gateway/auth.py
    # `context`). A delivery's step on another shard asks here, before a tool of it writes,
    # whether the send it answers is durable (sent_gate.py).

    async def find_agent_chat(self, chat_id: str) -> Chat | None:
        return await self.records.agent_chat(chat_id)

    async def send_stored(self, ref: SentRef) -> bool:
        """Whether the send of `ref` is durable (waits while it commits)."""
        return await self.records.gate.stored(ref)

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
        started: list[tuple[str, str]] | None = None,
    ) -> None:
        """Carry out what a bot asked for. `learn`: learning jobs (shard, job id) of this turn
        waiting for its collaboration (CO-2). `started`: deliveries of sends already recorded
        (`record_sends`)."""
        if learn:
            self._learn.setdefault(turn, []).extend(learn)
        for effect in effects:
            if effect.kind == "post":
                await self.records.post(effect, bot, org)
        sends = tuple(e for e in effects if e.kind == "send")
        if started is not None:
            await self._started(None, started, org)
        elif sends:
            log_ = await self.conv.log(chat.id)
            async with self.conv.lock(chat.id):
                fut, started = await self._sends(
                    chat, log_, turn, bot, sends, parent, chain, Batch()
                )
            await self._started(fut, started, org)
        await self._maybe_release(turn)

    async def record_sends(
        self,
        chat: Chat,
        chat_log: ChatLog,
        turn: str,
        bot: Bot,
        effects: tuple[Effect, ...],
        sink: Batch,
        learn: list[tuple[int, str]],
        org: Org,
    ) -> None:
        """A person's turn's sends in `sink` (the turn's own batch, committed here: the turn's
        end and its chain in one transaction). Call holding the chat's lock; returns once it is
        durable. The deliveries begin at once, while it commits (as a hop's do: what they
        store goes `after` it, never without it)."""
        if learn:  # stored with the chain's row (CO-2 after a restart)
            self._learn.setdefault(turn, []).extend(learn)
        sends = tuple(e for e in effects if e.kind == "send")
        fut, started = await self._sends(chat, chat_log, turn, bot, sends, None, None, sink)
        await self._started(fut, started, org)

    async def _sends(
        self,
        chat: Chat,
        chat_log: ChatLog,
        turn: str,
        bot: Bot,
        sends: tuple[Effect, ...],
        parent: str | None,
        chain: str | None,
        sink: Batch,
        *,
        restage: str | None = None,
        hold: str | None = None,
    ):
        """Record a bot's sends in its chain and, for each real delivery, the sent item in
        `chat` (UI-1), adding them to `sink` and submitting it: one transaction. Call holding
        the chat's lock. `restage`: a chain changed in memory since its last row, whose row
        goes in `sink` now (under the lock, so rows reach the disk in order). `hold`: a link
        whose answer goes up with `sink` when no send of it is open: then `sink` is not
        submitted here (the commit is None). Returns the commit and the deliveries to start
        once it is durable."""
        started: list[tuple[str, str]] = []
        async with self._lock:
            if restage is not None and (again := await self.records.get(restage)):
                await self.records.stage(again, sink)  # (gone: its first commit failed)
            for effect in sends:
                current = await self.records.get(chain) if chain else None
                if current is None:
                    root = chat if chat.kind != "agent" else None
                    if root is None:  # an agent chat's own sends belong to its chain
                        continue
                    current = self.records.begin(chat, turn, bot.id)
                    chain = current.id
                updated, decision = rules.on_send(
                    current,
                    link_id=effect.link,
                    parent=parent,
                    from_bot=bot.id,
                    to_bot=effect.target,
                    message=effect.message,
                    now=self.kernel.clock(),
                    fp_key=chain_fp_key(self.kernel.master, current.org),
                )
                self._texts.setdefault(updated.id, {})[effect.link] = {"request": effect.message}
                await self.records.stage(updated, sink)
                if decision.action == "deliver":
                    if effect.peer is not None and effect.peer.id == effect.target:
                        bounded(self._parties)[effect.link] = (effect.peer, bot)
                    # UI-1: the asking bot's chat shows what it sent, to whom (a real delivery).
                    self.records.sent(
                        chat_log, chat, turn, bot.id, effect.target, effect.message, sink
                    )
                    started.append((updated.id, effect.link))
            if hold is not None and chain is not None:
                links = getattr(await self.records.get(chain), "links", ())
                if links and not any(c.parent == hold and c.status == "sent" for c in links):
                    return None, started
            fut = self.conv.commit_soon(chat.id, chat_log, sink)
        return fut, started

    async def _started(self, fut, started: list[tuple[str, str]], org: Org) -> None:
        """The sends' deliveries begin while their commit `fut` runs (the peers' steps overlap
        it; what they store waits for it), and this returns once it is durable."""
        for chain_id, link in started:
            self._spawn_delivery(chain_id, link, org, fut)
        await durable(fut)

    # --- delivering ---

    def _spawn_delivery(self, chain_id: str, link_id: str, org: Org, after=None) -> None:
        """One delivery task per link at a time (a second is not started, never run twice)."""
        if link_id in self._delivering:
            return
        self._delivering.add(link_id)

        async def one() -> None:
            try:
                await self._deliver(chain_id, link_id, org, after)
            finally:
                self._delivering.discard(link_id)

        self._spawn(one())

    async def _deliver(self, chain_id: str, link_id: str, org: Org, after=None) -> None:
        if (chain := await self.records.get(chain_id)) is None:
            return  # its first row failed to commit before this began (dropped)
        topic = chain.topic
        self._busy[topic] = self._busy.get(topic, 0) + 1
        try:
            await self._deliver_once(chain_id, link_id, org, after)
        except Exception:
            log.exception("delivery %s of chain %s failed", link_id, chain_id)
        finally:
            self._busy[topic] -= 1
            if not self._busy[topic]:
                del self._busy[topic]
        await self._maybe_release(topic)

    async def _deliver_once(self, chain_id: str, link_id: str, org: Org, after=None) -> None:
        """One delivery: the peer's step, then one transaction for the request (chain record,
        delivery item) with the peer's reply and what it sent on, or its answer, staged `after`
        the send that made the link (stored with it or later, never without it), announced
        as it commits. The agent chat is made here and registered with the directory later
        (agent_chats.py): the hop asks the directory nothing."""
        conv = self.conv
        chain = await self.records.get(chain_id)  # (None: its first commit failed)
        if chain is None or chain.status != "running":
            return
        link = rules.find_link(chain, link_id)
        first = link.agent_chat is None  # nothing of this delivery is stored yet
        parties = self._parties.pop(link.id, None) if first else None
        if made_here := parties is not None:
            peer, asker = parties
            root = await self.records.chat(chain.root_chat)
            achat = agent_chat(root, peer.id, chain.id, link.id, link.sent_at)
        else:  # after a restart: one directory call
            achat, peer, asker = await self.peers.directory().delivery_chat(
                chain.root_chat, link.to_bot, link.from_bot, chain.id, link.id
            )
        self.records.know(achat)
        bounded(self._askers)[link.id] = asker  # links whose answer never came are dropped
        texts = self._texts.get(chain_id, {}).get(link_id)
        if texts is None:  # the chain's first commit failed while the agent chat was found
            return
        request = texts["request"]
        started: list[tuple[str, str]] = []
        fut = None
        async with conv.lock(achat.id):
            # A new agent chat is made in memory: reading it would cost a database read.
            alog = conv.fresh(achat.id) if first else await conv.log(achat.id)
            # After a restart the delivery may be stored already, and even answered: resume
            # from what the agent chat holds instead of delivering or asking twice.
            asked = next((i for i in alog.items if i.kind == "delivery"), None)
            sink = Batch(after=after)
            restage = None
            held = False
            if asked is None:
                # The request (the link's agent chat and the delivery item) commits with the
                # peer's reply: one transaction, after the send's (`after`). Until it commits
                # the item is not listed, and a restart finds nothing of the delivery stored
                # and delivers it again (if the send is stored), so nothing is lost or
                # answered twice.
                async with self._lock:
                    current = await self.records.need(chain_id)
                    self.records.put(rules.attach_agent_chat(current, link.id, achat.id))
                    if made_here:  # listed in the chain's row until the directory has it
                        self.records.unregistered.setdefault(chain_id, set()).add(link.id)
                    asked = conv.item(alog, chain.topic, "delivery", link.from_bot)
                    conv.append(alog, achat, [(asked, request)], sink)
                restage = chain_id
            answered = next(
                (i for i in alog.items if i.seq > asked.seq and i.kind in ("bot", "notification")),
                None,
            )
            if answered is not None:
                reply = conv.store.text(alog, answered.seq)
            else:
                step = StepInput(
                    chat=achat,
                    bot=peer,
                    org=org,
                    operator=chain.owner,
                    turn=chain.topic,
                    text=f"[delivery from {link.from_bot}, receipt {link.id}] {request}",
                    wake="delivery",
                    history=conv.history(alog, asked.seq, me=peer.id),
                )
                try:
                    outcome = await self.records.step(peer, step, (chain_id, link.id, after))
                except BaseException:
                    if restage is not None:  # the request was never stored: memory drops it
                        conv.forget(achat.id)
                    raise
                reply = self.records.reply(alog, achat, chain.topic, peer, outcome, sink)
                sends = tuple(e for e in outcome.effects if e.kind == "send")
                # A peer that sent nothing on (and posts nothing) has answered: its reply
                # and its answer going up are held for one transaction (`_result`).
                hold = None if any(e.kind == "post" for e in outcome.effects) else link.id
                fut, started = await self._sends(
                    achat,
                    alog,
                    chain.topic,
                    peer,
                    sends,
                    link.id,
                    chain_id,
                    sink,
                    restage=restage,
                    hold=hold,
                )
                if any(e.kind == "post" for e in outcome.effects):  # its own commit elsewhere:
                    await durable(after)  # never for a send or turn whose transaction failed
                for effect in outcome.effects:
                    if effect.kind == "post":
                        await self.records.post(effect, peer, org)
                held = fut is None and not started and hold is not None and bool(sink.writes)
        if held:
            try:
                await self._result(chain_id, link.id, reply, org, sink, [(achat.id, alog)])
            except Exception:
                await self._submit_held(chain_id, achat.id, alog, sink, None)
                raise
            if made_here:  # durable now
                self.registrar.add(chain_id, link.id, achat)
            await self._maybe_release(chain.topic)
            return
        await self._started(fut, started, org)
        if made_here:  # durable now (`_started` waited for its commit)
            self.registrar.add(chain_id, link.id, achat)
        await self._maybe_release(chain.topic)
        await self._maybe_answer(chain_id, link.id, reply, org)

    async def _submit_held(
        self, chain_id: str, chat: str, log_: ChatLog, sink: Batch, riders
    ) -> None:
        """A held batch whose answer failed to go up is still written (unless submitted)."""
        if sink.staged:
            return
        async with self._lock:
            await self.records.stage(await self.records.need(chain_id), sink)
            saved = self.conv.commit_soon(chat, log_, sink, riders)
        if saved is not None:
            await saved

    async def _maybe_answer(self, chain_id: str, link_id: str, reply: str, org: Org) -> None:
        """The peer's latest reply answers its link once none of its own sends is still open."""
        chain = await self.records.need(chain_id)
        if any(c.parent == link_id and c.status == "sent" for c in chain.links):
            self._texts[chain_id].setdefault(link_id, {})["pending"] = reply
            self.records.put(chain)  # (kept in memory until a row stores it)
            return
        await self._result(chain_id, link_id, reply, org)

    async def _result(
        self,
        chain_id: str,
        link_id: str,
        text: str,
        org: Org,
        carried: Batch | None = None,
        riders: list[tuple[str, ChatLog]] | None = None,
    ) -> None:
        """A link's answer: recorded in the chain and, unless suppressed, delivered to the chat
        it was asked from in the same transaction; then it wakes the bot that asked, whose
        reply (and what it sent on) is a second transaction. A suppressed answer that lets its
        parent's waiting answer go up is not committed alone: its row is `carried` up into the
        parent's transaction (after a cap, a linear chain's answers go up in one)."""
        conv = self.conv
        chain = await self.records.need(chain_id)
        link = rules.find_link(chain, link_id)
        parent = rules.find_link(chain, link.parent) if link.parent else None
        target = await self.records.chat(
            parent.agent_chat if parent and parent.agent_chat else chain.root_chat
        )
        waker = self._askers.pop(link_id, None)
        if waker is None:  # after a restart: read it now
            waker = await self.peers.directory().get_bot(link.from_bot)
        fut = None
        started: list[tuple[str, str]] = []
        async with conv.lock(target.id):
            tlog = await conv.log(target.id)
            sink = carried or Batch()
            async with self._lock:
                chain = await self.records.need(chain_id)
                chain, decision = rules.on_result(
                    chain,
                    link_id=link_id,
                    text=text,
                    now=self.kernel.clock(),
                    fp_key=chain_fp_key(self.kernel.master, chain.org),
                )
                self._texts.setdefault(chain_id, {}).setdefault(link_id, {})["result"] = text
                # The last row of this chain in `sink` wins (rows of one key merge in order),
                # and it is staged here under the lock, so a carried row is never stale.
                await self.records.stage(chain, sink)
                delivered = None
                if decision.action == "deliver":
                    delivered = conv.item(tlog, chain.topic, "delivery", link.to_bot)
                    conv.append(tlog, target, [(delivered, text)], sink)
                up = None if delivered is not None else self.records.waiting_parent(chain, link)
                recorded = (
                    None if up is not None else conv.commit_soon(target.id, tlog, sink, riders)
                )
            if recorded is not None:
                await recorded
            if delivered is not None:
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
                outcome = await self.records.step(waker, step)
                sink = Batch()
                reply = self.records.reply(tlog, target, chain.topic, waker, outcome, sink)
                sends = tuple(e for e in outcome.effects if e.kind == "send")
                fut, started = await self._sends(
                    target,
                    tlog,
                    chain.topic,
                    waker,
                    sends,
                    parent.id if parent else None,
                    chain_id,
                    sink,
                )
                for effect in outcome.effects:
                    if effect.kind == "post":
                        await self.records.post(effect, waker, org)
        if delivered is None:
            # Suppressed, or late after a stop or cap: recorded, starts nothing (CO-1). A peer
            # that answered while waiting for this one gets its answer recorded the same way,
            # in the same transaction.
            if up is not None:
                try:
                    await self._result(chain_id, up[0], up[1], org, sink, riders)
                except Exception:
                    await self._submit_held(chain_id, target.id, tlog, sink, riders)
                    raise
            return
        await self._started(fut, started, org)
        await self._maybe_release(chain.topic)
        if parent is not None:
            await self._maybe_answer(chain_id, parent.id, reply, org)

    # --- a chain's life outside its hops: resuming after a restart, stopping, listing, and
    # releasing a turn's waiting learning jobs once its chains are done (WS-4, CO-1, CO-2) ---

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
        await self.registrar.recover(self._lock, self.kernel)
        await self.records.start()
        for chain in self.records.running():
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
                self._spawn_delivery(chain.id, link.id, org)  # (not if one runs already)
                resumed += 1
        log.info("resumed %d deliveries", resumed)
        return resumed

    async def _save(self, chain: Chain) -> None:
        batch = Batch()
        await self.records.stage(chain, batch)
        await self.kernel.commit(batch)

    # --- what people see and do ---

    async def stop_visible(
        self, chain_id: str, user: str, channels: frozenset[str]
    ) -> ChainView | None:
        """Stop a chain homed here that `user` may see; None when it is not here."""
        chain = await self.records.get(chain_id)
        if chain is None or not self.records.may_see(chain, user, channels):
            return None
        return await self.stop(chain_id, user)

    async def stop(self, chain_id: str, by: str) -> ChainView:
        async with self._lock:
            chain = await self.records.get(chain_id)
            if chain is None:
                raise NotFound(f"no collaboration {chain_id}", code="collaboration_not_found")
            chain = rules.stop(chain, by=by, now=self.kernel.clock())
            await self._save(chain)
        await self._maybe_release(chain.topic)
        return self.records.view(chain)

    async def _maybe_release(self, topic: str) -> None:
        """Once no collaboration of this turn is under way, its waiting learning jobs run, once,
        over everything that came back (CO-2)."""
        waiting = self._learn.get(topic)
        if not waiting or await self.running_for(topic) or self._busy.get(topic):
            return
        self._learn.pop(topic, None)
        for chain in await self.records.release_learning(topic, waiting):
            await self._save(chain)  # the stored record no longer lists them

    async def running_for(self, topic: str) -> bool:
        """Whether a chain started by this turn is still under way (an index by turn: this
        runs on every turn of a chat, whatever the number of chains)."""
        await self.records.start()
        return self.records.under_way(topic)

    async def listing(
        self, user: str, channels: frozenset[str], after: str | None = None, limit: int = 200
    ) -> list[ChainView]:
        return await self.records.listing(user, channels, after, limit)
