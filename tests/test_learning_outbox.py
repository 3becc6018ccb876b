"""LRN-5 across pools: the user facts a learning step decides live in another pool than the
bot's (possibly on another shard), yet they and the chat's read position move together. The
process dies between the step's commit and the user pool's; after a restart the read position
has moved and the fact is stored exactly once, never one without the other."""

from __future__ import annotations

import asyncio

import pytest

from actors.contracts import TurnStart, WorkspaceAccess, WorkspaceQuery
from tests.openai_stub import completion
from tests.shard_kit import BOT, CHAT, ORG, POOL, shard_service

SAID = "I drink green tea every morning"
CONFIDE = ("confide", {"text": "Ann told me about her mornings"})
USER_POOL = "user:u_ann"


async def _user_facts(svc) -> list[str]:
    access = WorkspaceAccess(account="u_ann", bots=frozenset({BOT.id}))
    listing = await svc.workspace_entries(access, WorkspaceQuery(pools=(USER_POOL,)))
    return [e.content for e in listing.entries]


async def _die_between_commits(tmp_path, stubs, *, user_pool_stored: bool):
    """Run a turn whose learning step decides a user fact; the process dies when the fact is
    on its way to the user pool: before that pool stored it, or after (before the outbox row
    was deleted). Returns what was on disk then: read position and staged sets."""
    svc = shard_service(tmp_path, stubs)
    dying = asyncio.Event()
    extract = svc.workspace_extract

    async def crash_at_the_user_pool(*args, **kwargs):
        if user_pool_stored:
            await extract(*args, **kwargs)
        dying.set()
        await asyncio.Event().wait()  # the process dies here

    svc.workspace_extract = crash_at_the_user_pool
    turn = await svc.start_turn(TurnStart(chat=CHAT, bot=BOT, org=ORG, operator="u_ann", text=SAID))
    await svc.wait_turn(CHAT.id, turn.id)
    await asyncio.wait_for(dying.wait(), 30)
    svc.learning.abandon()
    await svc.committer.drain()
    on_disk = (await svc.chats.position(POOL, CHAT.id), await svc.chats.outbox())
    stored_before = await _user_facts(svc) if user_pool_stored else []
    svc.db.close()
    return on_disk, stored_before


async def _restart(tmp_path, stubs):
    svc = shard_service(tmp_path, stubs)
    try:
        await svc.ping()  # the first call resumes open jobs and staged facts
        steps = await svc.learning_idle()
        return (
            steps,
            await svc.chats.position(POOL, CHAT.id),
            await _user_facts(svc),
            await svc.chats.outbox(),
            await svc.learning_jobs(POOL),
        )
    finally:
        await svc.close()


@pytest.mark.parametrize("user_pool_stored", [False, True])
def test_lrn5_user_fact_and_read_position_move_together_across_a_crash(
    tmp_path, fresh, user_pool_stored
):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    learn = {
        "content": SAID,
        "items": [{"chat": CHAT.id, "item": "i-1"}],
        "scope": "user",
        "tier": "profile",
    }
    mem.answer(completion("I hear you."), completion(None, tool_calls=[("learn_fact", learn)]))

    (position, staged), stored_before = asyncio.run(
        _die_between_commits(tmp_path, fresh, user_pool_stored=user_pool_stored)
    )
    # The step's commit holds the moved read position and the staged fact together.
    assert position == 2 and [job for job, _, _ in staged] != []
    assert stored_before == ([SAID] if user_pool_stored else [])
    calls = len(mem.requests)

    steps, position, facts, staged, jobs = asyncio.run(_restart(tmp_path, fresh))
    assert facts == [SAID]  # exactly once, whether or not the first send had stored it
    assert position == 2 and staged == []
    assert steps == 0 and len(mem.requests) == calls  # nothing learned again (LRN-4)
    assert [(j.status, j.rejections) for j in jobs] == [("done", ())]


def test_lrn5_staged_facts_a_pool_refused_for_now_are_sent_again(tmp_path, fresh):
    """The user pool's shard fails the first send (away for a moment): the staged fact is sent
    again while the shard runs, without waiting for a restart."""
    from engine.errors import Unavailable

    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    learn = {"content": SAID, "items": [{"chat": CHAT.id, "item": "i-1"}], "scope": "user"}
    mem.answer(completion("I hear you."), completion(None, tool_calls=[("learn_fact", learn)]))

    async def go():
        svc = shard_service(tmp_path, fresh)
        svc.learning.retry_delay = 0.0
        extract, failed = svc.workspace_extract, []

        async def away_once(*args, **kwargs):
            if not failed:
                failed.append(True)
                raise Unavailable("the shard is restarting")
            return await extract(*args, **kwargs)

        svc.workspace_extract = away_once
        try:
            turn = await svc.start_turn(
                TurnStart(chat=CHAT, bot=BOT, org=ORG, operator="u_ann", text=SAID)
            )
            await svc.wait_turn(CHAT.id, turn.id)
            await svc.learning_idle()
            return failed, await _user_facts(svc), await svc.chats.outbox()
        finally:
            await svc.close()

    failed, facts, staged = asyncio.run(go())
    assert failed == [True] and facts == [SAID] and staged == []
