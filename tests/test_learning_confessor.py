"""LRN-2 with memory: the confessor's answer may draw on the confiding bot's memory, but only
on the entries the person the confession came from may see (the checks of any answer, ENR-2),
and its call record names the entries it was given."""

from __future__ import annotations

import asyncio

from actors.contracts import TurnStart
from engine.memory_entries import Reader
from tests.openai_stub import completion
from tests.shard_kit import ANN, BOT, CHAT, ORG, POOL, shard_service

CONFIDE = ("confide", {"text": "I booked Ann a flight and I am not sure she wanted one"})
# The bot's owner: owning the bot does not let the owner's entries reach Ann's answers.
OWNER = Reader(user=BOT.owner, org="o1", uses_bot=True)


def test_lrn2_confessor_gets_only_the_memory_the_person_may_read(tmp_path, fresh):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    # The confessor's call is the one without tools (the rewrite and learning offer tools).
    mem.routes.append(
        lambda body: completion("I hear you.") if not body.get("tools") else completion("ok")
    )

    async def go():
        svc = shard_service(tmp_path, fresh)
        try:
            hers = await svc.remember(POOL, ANN, "Ann prefers trains to planes")
            theirs = await svc.remember(POOL, OWNER, "The owner's flight plan is a surprise")
            turn = await svc.start_turn(
                TurnStart(chat=CHAT, bot=BOT, org=ORG, operator="u_ann", text="Book my trip")
            )
            await svc.wait_turn(CHAT.id, turn.id)
            await svc.learning_idle()
            stored = (await svc.kernel.pool(POOL)).stored
            calls = [c for _, c in await svc.chats.model_calls(stored, turn.id)]
            confessions = await svc.confessions(CHAT.id)
            return hers, theirs, calls, confessions
        finally:
            await svc.close()

    hers, theirs, calls, confessions = asyncio.run(go())
    assert confessions[0].answer == "I hear you." and not confessions[0].calm
    (asked,) = [r for r in mem.requests if not r.get("tools")]
    prompt = "\n".join(m["content"] or "" for m in asked["messages"])
    assert "Ann prefers trains to planes" in prompt  # hers: she may read it
    assert "surprise" not in prompt and theirs.id not in prompt  # not hers: never there
    # The call log says which entries the confessor was given.
    (confessor,) = [c for c in calls if "confessor" in c.request]
    assert confessor.entries == (hers.id,)
