"""Guards of the confessor and what shapes a bot's input: the encrypted call log (SEC-1), a
confessor that listens (LRN-2), review chats and `botMemory` off (LRN-10, ENR-4), a group's
reader (ENR-2)."""

from __future__ import annotations

import pytest

from actors.chats.step_policy import reader_for
from actors.contracts import StepInput
from engine.directory import Chat, Org, OrgSettings
from engine.turns import CALM_ANSWER, confessor_messages
from tests.guards.kit import (
    CONFIDE,
    LEARN,
    OFF,
    CipherSpy,
    learning_requests,
    learning_route,
    pinned_meta,
    route_rewrite,
    tool_names,
)
from tests.openai_stub import completion
from tests.shard_kit import ANN, BOT, ORG, POOL, run_turn

# --- SEC-1 and LRN-2: the confessor and the encrypted call log -----------------------------------


@pytest.mark.anyio
async def test_SEC_1_confide_and_enrichment_calls_go_to_the_encrypted_call_log(
    shards, fresh, monkeypatch
):
    """The memory bot's model requests and results for the input rewrite and for `confide` are
    stored, sealed with the pool's key, in the call log of the turn (SEC-1).

    Breaks tried (each fails): in `Conversations._own_rows`, dropping the `sink.writes.extend(
    self.store.model_call_row(...) for c in sink.calls)` line → `[None, None, None]`; in
    `MemoryBotRuntime.confessor_answer`, `log=log` → `log=None` → the confide call is missing."""
    spy = CipherSpy(monkeypatch)
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you. Tell Ann directly and put it right."))

    svc = shards(stubs=fresh)
    mine = await svc.remember(POOL, ANN, "Ann prefers trains")
    mem.routes.append(route_rewrite("Plan my trip to Oslo by train", [mine.id]))
    mem.routes.append(learning_route(completion("nothing to learn")))
    result = await run_turn(svc, "Plan my trip to Oslo")
    pool = await svc.kernel.pool(POOL)
    store = svc.conversations.store
    calls = [await store.model_call(pool.stored, result.turn.id, s) for s in (1, 2, 3)]
    await shards.close(svc)
    assert calls[0] is not None and calls[1] is not None, calls
    rewrite, confide = calls[0], calls[1]
    assert "Plan my trip to Oslo" in rewrite.request and "Oslo by train" in rewrite.response
    assert CONFIDE[1]["text"] in confide.request and "Tell Ann directly" in confide.response
    assert calls[2] is None
    sealed = {k for k in spy.sealed if k.startswith(f"{POOL}\x00call\x00{result.turn.id}\x00")}
    assert len(sealed) == 2, "call records not sealed with the pool's key"


@pytest.mark.anyio
async def test_LRN_2_the_confessor_listens_without_judging_and_gives_no_task(shards, fresh):
    """The confessor's instructions (and the fixed calm answer) say what LRN-2 asks, and are
    what the memory model actually receives on `confide`.

    Break tried: `confessor_messages`' system text → "You are a confessor." → fails on
    `'listen' in 'you are a confessor.'`."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you."))

    svc = shards(stubs=fresh)
    await run_turn(svc, "hi", org=OFF)  # botMemory off: answers still come (LRN-10)
    await shards.close(svc)
    (request,) = [b for b in mem.requests if not b.get("tools")]
    system = request["messages"][0]["content"]
    assert request["messages"][0]["role"] == "system"
    assert request["messages"][-1]["content"] == CONFIDE[1]["text"]
    assert system == confessor_messages(CONFIDE[1]["text"], "")[0].content
    said = system.lower()
    for phrase in (
        "listen",
        "do not judge",
        "mistakes are part of work",
        "tell the person directly",
        "put things right",
        "no new task",
    ):
        assert phrase in said, phrase
    calm = CALM_ANSWER.lower()
    for phrase in ("mistakes", "part of the work", "tell the person directly", "put it right"):
        assert phrase in calm, phrase


# --- LRN-10, ENR-4: review chats and `botMemory` off ----------------------------------------------


AUTO = Org(
    id="o1", name="o", settings=OrgSettings(botMemory=True, botMemoryModel="mem", autoRecord=True)
)
AUTO_OFF = Org(
    id="o1", name="o", settings=OrgSettings(botMemory=False, botMemoryModel="mem", autoRecord=True)
)


@pytest.mark.anyio
async def test_LRN_10_review_chats_have_no_confide_and_learn_nothing(shards, fresh):
    """A review chat offers no `confide`; a bot that calls it anyway gets no confessor, and the
    turn is never learned from, even with autoRecord on.

    Breaks tried (each fails): in `BotStepper._confide`, dropping `if step.chat.kind ==
    "review": return None` → a confession is recorded; in `conversations.learns`,
    `chat.kind in ("review", "agent")` → `chat.kind in ("agent",)` → a learning job exists."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Here is my review."))
    mem.routes.append(learning_route(completion(None, tool_calls=[("learn_fact", LEARN)])))
    review = Chat(id="chat_1", kind="review", owner="u_ann", org="o1", bot="b1")

    svc = shards(stubs=fresh)
    await run_turn(svc, "Please review this", chat=review, org=AUTO)
    confessions = await svc.confessions("chat_1")
    jobs = await svc.learning_jobs(POOL)
    page = await svc.read_memory(POOL, ANN)
    assert "confide" not in tool_names(bot.requests[0])
    assert confessions == [] and jobs == [] and page.entries == ()
    assert mem.requests == []


@pytest.mark.anyio
async def test_LRN_10_bot_memory_off_still_answers_confide_but_learns_nothing(shards, fresh):
    """With `botMemory` off the confessor still answers, and no learning execution is made.

    Break tried: in `conversations.learns`, dropping `not org.settings.botMemory or` → a job
    runs and the fact is stored (`jobs == []` fails)."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you."))
    mem.routes.append(learning_route(completion(None, tool_calls=[("learn_fact", LEARN)])))

    svc = shards(stubs=fresh)
    await run_turn(svc, "I moved to Oslo", org=AUTO_OFF)
    confessions = await svc.confessions("chat_1")
    jobs = await svc.learning_jobs(POOL)
    page = await svc.read_memory(POOL, ANN)
    assert [(c.answer, c.calm) for c in confessions] == [("I hear you.", False)]
    assert jobs == [] and page.entries == ()
    assert learning_requests(mem) == []


@pytest.mark.anyio
async def test_ENR_4_bot_memory_off_leaves_the_input_unchanged(shards, fresh):
    """With `botMemory` off the memory bot is not asked to rewrite and the bot's model gets the
    person's own words, with no enrichment record.

    Break tried: in `BotStepper._enrich`, `not (org.settings.botMemory and
    org.settings.botMemoryModel)` → `not org.settings.botMemoryModel` → the bot's model gets
    the rewrite."""
    bot, mem = fresh
    bot.answer(completion("Sure."))

    svc = shards(stubs=fresh)
    mine = await svc.remember(POOL, ANN, "Ann prefers trains")
    mem.routes.append(route_rewrite("Plan my trip to Oslo by train", [mine.id]))
    await run_turn(svc, "Plan my trip to Oslo", org=OFF)
    enrichments = await svc.enrichments("chat_1")
    assert bot.requests[0]["messages"][-1]["content"] == "Plan my trip to Oslo"
    assert enrichments == [] and mem.requests == []


# --- ENR-2: a group's reader ----------------------------------------------------------------------


@pytest.mark.anyio
async def test_ENR_2_in_a_channel_group_only_the_groups_and_bot_entries_shape_the_input(
    shards, fresh
):
    """The reader of a group turn's enrichment admits `for:channel:<group>` and `for:bot`
    entries only — not the person's own entries, not another channel's.

    Break tried: in `step_policy.reader_for`, the group reader's `user="\\x00"` →
    `user=step.operator` → the person's own entry is in the context."""
    group = Chat(id="chat_g", kind="group", owner="u_ann", org="o1", channel="c1")
    step = StepInput(
        chat=group, bot=BOT, org=ORG, operator="u_ann", turn="t1", text="hi", channel="c1"
    )
    reader = reader_for(step)
    assert reader is not None

    svc = shards(stubs=fresh)
    await svc.add_entries(
        POOL,
        [
            (
                pinned_meta("mem_p1", ("for:person:u_ann", "org:o1"), 1),
                "Ann's private note",
            ),
            (pinned_meta("mem_c1", ("for:channel:c1", "org:o1"), 2), "the group's plan"),
            (pinned_meta("mem_c2", ("for:channel:c2", "org:o1"), 3), "another group"),
            (pinned_meta("mem_bt", ("for:bot", "org:o1"), 4), "the bot's own habit"),
        ],
    )
    parts, has = await svc.context_parts(POOL, reader, 10_000)
    assert {i for i, _ in parts} == {"mem_c1", "mem_bt"} and has
