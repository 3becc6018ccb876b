"""A decided request wakes its bot in the chat it came from (ENR-3), on the chat's home shard.

Like a collaboration delivery, the wake-up is not a person's turn: the chat shows the decision
as a notification, and the bot takes one step with the decision as its input (no enrichment:
nobody's words are rewritten), whose answer becomes the chat's next item. The wake-up has a
turn named after the request (engine/requests.py `decision_turn`):

1. the turn and its notice commit first;
2. the bot's step runs on the shard of its memory; its answer and the turn's end commit in one
   transaction.

The request's shard asks again until it hears that the step is stored (after a restart too), so
a wake-up whose answer is stored is never stepped again, one whose answer is not is stepped
(again), and the notice is stored once.
"""

from __future__ import annotations

import msgspec

from actors.chats.chains import ChainRunner
from actors.chats.chat_logs import ChatLogs
from actors.chats.turn_rules import step_failed
from actors.contracts import DecisionWake, StepInput
from actors.shard.batch import Batch
from engine.chat_records import Turn


class DecisionWakes:
    def __init__(self, *, logs: ChatLogs, chains: ChainRunner) -> None:
        self.logs = logs
        self.chains = chains

    async def wake(self, wake: DecisionWake) -> bool:
        """Store the decision's notice and the bot's answer to it, once; False when they were
        stored already (nothing runs)."""
        logs, chat = self.logs, wake.chat
        log = await logs.log(chat.id)
        async with logs.lock(chat.id):
            if not logs.holds(log):  # a failed commit dropped it while this waited
                log = await logs.log(chat.id)
            mine = [i for i in log.items if i.turn == wake.turn]
            if len(mine) > 1:  # the notice and the answer: the step is stored
                return False
            if mine:  # the notice only: the step never stored its answer (a restart)
                notice = mine[0]
                turn = log.turns.get(wake.turn) or _turn(wake, notice.at)
            else:
                turn = _turn(wake, logs.kernel.clock())
                notice = logs.item(log, wake.turn, "notification", wake.operator)
                batch = Batch(writes=[logs.store.put_turn(log, turn)])
                logs.append(log, chat, [(notice, wake.notice)], batch)
                await logs.commit(chat.id, batch)
            step = StepInput(
                chat=chat,
                bot=wake.bot,
                org=wake.org,
                operator=wake.operator,
                turn=wake.turn,
                text=wake.text,
                wake="decision",
                history=logs.history(log, notice.seq, me=wake.bot.id if chat.channel else None),
                channel=chat.channel,
            )
            records = self.chains.records
            outcome = await records.step(wake.bot, step)
            step_failed(step, outcome)
            batch = Batch()
            records.reply(log, chat, wake.turn, wake.bot, outcome, batch)
            done = msgspec.structs.replace(turn, status=outcome.status, error=outcome.error)
            batch.add(logs.store.put_turn(log, done))
            await logs.commit(chat.id, batch)
        if outcome.effects:  # what it asked for, as any step's (WS-4)
            await self.chains.on_effects(
                chat, wake.org, wake.turn, wake.bot, outcome.effects, parent=None, chain=None
            )
        return True


def _turn(w: DecisionWake, at: int) -> Turn:
    return Turn(id=w.turn, chat=w.chat.id, operator=w.operator, status="running", at=at)
