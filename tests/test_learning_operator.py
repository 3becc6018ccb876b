"""LRN-6: what a learning step learns is for the turn's operator (the identity stored with the
turn), never for whoever an item's author field names. Bob speaks in a chat first; Ann's turn
then confides, and its learning reads Bob's words too: a fact from them is kept for Ann (who
operated the turn that learned it) with Bob only as its provenance, and user memory takes only
the operator's own words, into the operator's pool."""

from __future__ import annotations

import asyncio

from actors.contracts import TurnStart, WorkspaceAccess, WorkspaceQuery
from engine.memory_entries import Reader
from tests.openai_stub import completion
from tests.shard_kit import ANN, BOT, CHAT, ORG, POOL, shard_service

BOB = Reader(user="u_bob", org="o1", uses_bot=True)
BOB_SAID = "I am vegan"
ANN_SAID = "I drink green tea every morning"


async def _user_facts(svc, account: str) -> list[str]:
    access = WorkspaceAccess(account=account, bots=frozenset({BOT.id}))
    listing = await svc.workspace_entries(access, WorkspaceQuery(pools=(f"user:{account}",)))
    return [e.content for e in listing.entries]


def test_lrn6_learning_is_for_the_turns_operator_not_an_items_author(tmp_path, fresh):
    bot, mem = fresh
    confide = ("confide", {"text": "I am not sure I got their food right"})
    bot.answer(
        completion("Hello."),  # Bob's turn: no confession, nothing learned
        completion(None, tool_calls=[confide]),
        completion("Noted."),
    )
    bobs, anns = {"chat": CHAT.id, "item": "i-1"}, {"chat": CHAT.id, "item": "i-3"}
    calls = [
        ("learn_fact", {"content": "Bob eats no meat", "items": [bobs]}),
        # User memory from Bob's words for the turn's operator: refused (not her words).
        ("learn_fact", {"content": BOB_SAID, "items": [bobs], "scope": "user"}),
        ("learn_fact", {"content": ANN_SAID, "items": [anns], "scope": "user"}),
    ]
    mem.routes.append(
        lambda body: (
            completion(None, tool_calls=calls) if body.get("tools") else completion("I hear you.")
        )
    )

    async def go():
        svc = shard_service(tmp_path, fresh)
        try:
            for operator, text in (("u_bob", BOB_SAID), ("u_ann", ANN_SAID)):
                start = TurnStart(chat=CHAT, bot=BOT, org=ORG, operator=operator, text=text)
                turn = await svc.start_turn(start)
                await svc.wait_turn(CHAT.id, turn.id)
                await svc.learning_idle()
            items = await svc.chat_items(CHAT.id)
            return (
                [(i.kind, i.author) for i in items],
                (await svc.read_memory(POOL, ANN)).entries,
                (await svc.read_memory(POOL, BOB)).entries,
                await _user_facts(svc, "u_ann"),
                await _user_facts(svc, "u_bob"),
                await svc.learning_jobs(POOL),
            )
        finally:
            await svc.close()

    items, for_ann, for_bob, ann_facts, bob_facts, jobs = asyncio.run(go())
    # The learning step read an item Bob wrote in a turn Ann operated.
    assert items[0] == ("person", "u_bob") and items[2] == ("person", "u_ann")
    (fact,) = for_ann
    assert fact.content == "Bob eats no meat"
    assert "for:person:u_ann" in fact.tags and "from:u_bob" in fact.tags  # audience vs author
    assert not any(t == "for:person:u_bob" for t in fact.tags)
    assert for_bob == ()  # the author is not its audience
    assert ann_facts == [ANN_SAID] and bob_facts == []
    (job,) = jobs
    assert job.grant == "for:person:u_ann"
    assert job.rejections == ("learn_fact: user memory needs an item the user said",)
