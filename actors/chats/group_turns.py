"""A person's message in a group chat: rounds of bot steps on the chat's home shard (WS-5).

Every round each participant speaks once, in an order that rotates every round, and sees what
was said before it. Each bot's step runs on the shard of its memory (its enrichment reads only
the channel's and `for:bot` entries, ENR-2); that shard also keeps the person's item so a
confided step can learn from it with `for:channel:` grants. A member whose step fails is
recorded for that round as a notification and the others go on.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from actors.chats.chains import ChainRunner
from actors.chats.chat_logs import ChatLogs
from actors.chats.turn_rules import learns
from actors.contracts import Mirrored, StepInput, StepOutcome, TurnStart
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from engine.chat_records import Turn
from engine.discussion import Plan, leader_brief
from engine.errors import OpenBotError
from engine.models import Message
from storage.chat_store import Item

logger = logging.getLogger("openbot.group")


class GroupTurns:
    def __init__(self, *, logs: ChatLogs, chains: ChainRunner, peers: Peers) -> None:
        self.logs = logs
        self.chains = chains
        self.peers = peers

    async def run(self, start: TurnStart, turn: Turn, person: Item, plan: Plan) -> None:
        conv, chat, org = self.logs, start.chat, start.org
        members = {b.id: b for b in start.members}
        log = await conv.log(chat.id)
        mirror = (
            Mirrored(
                seq=person.seq,
                turn=turn.id,
                kind="person",
                author=person.author,
                at=person.at,
                text=start.text,
            ),
        )
        spoke = failed = 0
        effects = []
        confided: set[str] = set()
        said: list[tuple[str, str]] = []  # this turn's replies so far: (bot, text)
        pending: list = []  # item commits still on their way to disk
        async with conv.lock(chat.id):
            try:
                prior = conv.prior(log, person.seq)
                for r in range(plan.rounds):
                    for bot_id in plan.order(r):
                        bot = members[bot_id]
                        earlier = tuple(
                            Message(role="assistant", content=text)
                            if author == bot.id
                            else Message(role="user", content=f"{author}: {text}")
                            for author, text in said
                        )
                        step = StepInput(
                            chat=chat,
                            bot=bot,
                            org=org,
                            operator=turn.operator,
                            turn=turn.id,
                            text=start.text,
                            wake="person" if r == 0 else "round",
                            history=conv.as_messages(prior, me=bot.id),
                            after=self._after(start, turn, plan, r, bot, earlier),
                            channel=chat.channel,
                        )
                        outcome = await self._step(bot, step, mirror, person.seq)
                        batch = Batch()
                        conv.tool_items(log, chat, turn.id, outcome, batch)
                        if outcome.status == "done" and outcome.reply is not None:
                            spoke += 1
                            item = conv.item(log, turn.id, "bot", bot.id)
                            conv.append(log, chat, [(item, outcome.reply)], batch)
                            said.append((bot.id, outcome.reply))
                        else:
                            failed += 1
                            note = conv.item(log, turn.id, "notification", bot.id)
                            why = outcome.error or "no answer"
                            text = f"{bot.name} failed in round {r + 1}: {why}"
                            conv.append(log, chat, [(note, text)], batch)
                        # Each item goes out as soon as it is on disk: clients watch the rounds.
                        # The next speaker does not wait for that commit (group commit merges).
                        pending.append(conv.commit_soon(chat.id, log, batch))
                        effects.extend((bot, e) for e in outcome.effects)
                        if outcome.confided:
                            confided.add(bot.id)
                await asyncio.gather(*[f for f in pending if f is not None])
                status = "done" if spoke else "failed"
                error = f"{failed} step(s) failed" if failed else None
            except Exception as e:  # the turn must always end
                logger.exception("group turn %s failed", turn.id)
                status, error = "failed", f"internal error: {type(e).__name__}"
            if status == "failed":
                logger.warning("group turn %s in chat %s failed: %s", turn.id, chat.id, error)
            done = msgspec.structs.replace(turn, status=status, error=error)
            await conv.commit(chat.id, Batch(writes=[conv.store.put_turn(log, done)]))
        waiting = await self._schedule_learning(start, turn, person, plan, confided, effects)
        for bot, effect in effects:
            await self.chains.on_effects(
                chat, org, turn.id, bot, (effect,), parent=None, chain=None, learn=waiting
            )
            waiting = []

    async def _schedule_learning(self, start, turn, person, plan, confided, effects) -> list:
        """After the turn, each bot that confided (or every bot with autoRecord) learns once
        from it, on its own shard; with a collaboration under way, once that is back (CO-2)."""
        peers = self.peers
        chat, org = start.chat, start.org
        members = {b.id: b for b in start.members}
        sends = any(e.kind == "send" for _, e in effects)
        waiting = []
        for bot_id in plan.participants:
            bot = members[bot_id]
            if not learns(org, chat, bot_id in confided, bot):
                continue
            index = peers.index_of(bot.owner)
            try:
                job = await peers.shard(index).schedule_learning(
                    bot, chat, turn.id, person.seq, f"for:channel:{chat.channel}", org, sends
                )
            except OpenBotError as e:
                logger.warning(
                    "learning for %s in %s not scheduled: %s", bot_id, turn.id, e.message
                )
                continue
            if job is not None and sends:
                waiting.append((index, job))
        return waiting

    @staticmethod
    def _after(start: TurnStart, turn: Turn, plan: Plan, r: int, bot, said) -> tuple:
        """What a speaker sees after the person's words: earlier speakers of this turn, which
        round it is, and for a delivery group's leader, its brief (WS-6)."""
        out = list(said)
        if turn.goal is not None:
            team = {b.id: b.name for b in start.members}
            out.append(Message(role="system", content=leader_brief(team, bot.id)))
        if plan.rounds > 1 or said:
            out.append(Message(role="user", content=f"(round {r + 1} of {plan.rounds}: your turn)"))
        return tuple(out)

    async def _step(self, bot, step: StepInput, mirror, upto: int) -> StepOutcome:
        peers = self.peers
        try:
            return await peers.shard(peers.index_of(bot.owner)).run_step(step, mirror, upto)
        except OpenBotError as e:  # the bot's shard is down: this member fails this round
            logger.warning("step of bot %s in chat %s failed: %s", bot.id, step.chat.id, e.message)
            return StepOutcome(status="failed", error=e.message)
        except Exception as e:
            logger.exception("step of %s failed", bot.id)
            return StepOutcome(status="failed", error=f"internal error: {type(e).__name__}")
