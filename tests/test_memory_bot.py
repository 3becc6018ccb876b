"""The memory bot end to end on a shard (no Ray), with real HTTP to a loopback OpenAI-compatible
server: confide, learning, enrichment, calm answers, budgets, recovery, purge."""

from __future__ import annotations

import asyncio
import json
import threading

import msgspec
import pytest

from actors.contracts import TurnStart
from actors.models.registry import OpenAIModel
from engine.directory import Org, OrgSettings
from engine.memory_bot_settings import Budget, SettingsPatch, period_key
from engine.memory_entries import Reader
from engine.models import Price
from engine.turns import CALM_ANSWER
from tests.openai_stub import OpenAIStub, completion
from tests.shard_kit import ANN, BOT, CHAT, ORG, POOL, run_turn, shard_service
from tests.waiting import TIMEOUT, until

CONFIDE = ("confide", {"text": "Ann told me she moved to Oslo; I hope I got it right"})


@pytest.mark.anyio
async def test_confide_then_learn_a_fact_from_the_persons_item(shards, tmp_path, fresh):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted, Ann."))
    learn = {
        "content": "Ann lives in Oslo",
        "items": [{"chat": "chat_1", "item": "i-1"}],
        "topics": ["home"],
    }
    bad = {"content": "the bot said so", "items": [{"chat": "chat_1", "item": "i-2"}]}
    mem.answer(
        completion("Thank you for saying it. Tell Ann directly if unsure."),
        completion(
            None, tool_calls=[("learn_fact", learn), ("learn_fact", bad), ("learn_fact", "{broken")]
        ),
    )

    svc = shards(stubs=fresh)
    result = await run_turn(svc, "I moved to Oslo last week")
    assert [(i.kind, i.text) for i in result.items] == [
        ("person", "I moved to Oslo last week"),
        ("bot", "Noted, Ann."),
    ]
    page = await svc.read_memory(POOL, ANN)
    confessions = await svc.confessions("chat_1")
    jobs = await svc.learning_jobs(POOL)
    other = await svc.read_memory(POOL, Reader(user="u_bob", org="o1", uses_bot=True))
    await shards.close(svc)
    # SEC-1: items, confessions, learned content and the model call log are all sealed.
    for path in tmp_path.rglob("*"):
        if path.is_file():
            raw = path.read_bytes()
            for secret in (b"moved to Oslo", b"lives in Oslo", b"hope I got it right"):
                assert secret not in raw, (path, secret)
    (fact,) = page.entries
    assert fact.layer == "fact" and fact.content == "Ann lives in Oslo"
    assert [s.chat for s in fact.sources] == ["chat_1"] and fact.sources[0].item == "i-1"
    assert set(fact.tags) == {"from:u_ann", "for:person:u_ann", "org:o1", "chat:chat_1", "home"}
    assert other.entries == ()
    assert confessions[0].text == CONFIDE[1]["text"] and not confessions[0].calm
    assert jobs[0].status == "done" and jobs[0].error == "2 proposed change(s) rejected"
    # Each refused proposal says why (the memory-jobs route shows them).
    assert jobs[0].rejections == (
        "learn_fact: item i-2 is not something a person said",
        "learn_fact: invalid arguments: JSON is malformed: object keys must be strings (byte 1)",
    ), jobs[0].rejections
    # The bot was offered confide, described without a word about memory (LRN-1).
    confide = next(t for t in bot.requests[0]["tools"] if t["function"]["name"] == "confide")
    assert "memor" not in confide["function"]["description"].lower()
    # The learning request is the contract shape, and the bot's words are only evidence.
    request = json.loads(mem.requests[1]["messages"][-1]["content"])
    assert set(request) == {"evidence", "entries", "topics"}
    assert [e["kind"] for e in request["evidence"]] == ["person", "bot"]


@pytest.mark.anyio
async def test_a_bot_that_never_confides_learns_nothing(shards, fresh):
    bot, mem = fresh
    bot.answer(completion("Hello!"))

    svc = shards(stubs=fresh)
    await run_turn(svc, "I moved to Oslo")
    steps = await svc.learning_idle()
    page = await svc.read_memory(POOL, ANN)
    await shards.close(svc)
    assert steps == 0 and page.entries == () and mem.requests == []


@pytest.mark.anyio
@pytest.mark.parametrize("case", ["no_model", "budget", "hang"])
async def test_calm_answer_without_model_budget_or_in_time(shards, fresh, case):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("OK."))
    org = ORG
    if case == "no_model":
        org = Org(id="o1", name="o", settings=OrgSettings(botMemory=True, botMemoryModel=None))
    if case == "hang":
        mem.answer(OpenAIStub.HANG)

    svc = shards(stubs=fresh, answer_wait=1.0)
    if case == "budget":
        patch = SettingsPatch(expected=0, budget=Budget(period="day", limitMicros=0))
        await svc.patch_memory_bot_settings(POOL, patch)
    # A hung memory model is not waited for past `answer_wait`: the turn ends well inside the
    # bound (without the answer wait it never would).
    async with asyncio.timeout(TIMEOUT):
        await run_turn(svc, "hi", org=org)
    confessions = await svc.confessions("chat_1")
    await shards.close(svc)
    assert confessions[0].answer == CALM_ANSWER and confessions[0].calm
    if case != "hang":
        assert mem.requests == []


@pytest.mark.anyio
async def test_enrichment_uses_only_the_readers_entries_and_history_keeps_the_original(
    shards, fresh
):
    bot, mem = fresh
    bot.answer(completion("Sure."))

    svc = shards(stubs=fresh)
    mine = await svc.remember(POOL, ANN, "Ann prefers trains to planes")
    rewrite = {
        "text": "Plan my trip to Oslo (I prefer trains)",
        "entries": [mine.id, "mem_not_hers"],
    }
    mem.answer(completion(None, tool_calls=[("rewrite", rewrite)]))
    result = await run_turn(svc, "Plan my trip to Oslo")
    enrichments = await svc.enrichments("chat_1")
    await shards.close(svc)
    assert result.items[0].text == "Plan my trip to Oslo"  # history keeps the original (ENR-3)
    assert bot.requests[0]["messages"][-1]["content"] == "Plan my trip to Oslo (I prefer trains)"
    (record,) = enrichments
    assert record.original == "Plan my trip to Oslo" and record.entries == [mine.id]
    sent = json.loads(mem.requests[0]["messages"][-1]["content"])
    assert sent["input"] == "Plan my trip to Oslo" and [e["id"] for e in sent["entries"]] == [
        mine.id
    ]


@pytest.mark.anyio
async def test_restart_mid_execution_reuses_the_recorded_step_and_stores_once(
    shards, tmp_path, fresh
):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    learn = {"content": "Ann lives in Oslo", "items": [{"chat": "chat_1", "item": "i-1"}]}
    mem.answer(completion("I hear you."), completion(None, tool_calls=[("learn_fact", learn)]))

    # Built by hand: it dies below (its files left as a crash leaves them), never closed.
    svc = shard_service(tmp_path, fresh)
    stuck = asyncio.Event()

    async def never_apply(*args, **kwargs):
        stuck.set()
        await asyncio.Event().wait()  # the process dies here, before anything is applied

    svc.learning.apply_step = never_apply  # type: ignore[method-assign]
    turn = await svc.start_turn(
        TurnStart(chat=CHAT, bot=BOT, org=ORG, operator="u_ann", text="I moved to Oslo")
    )
    await svc.wait_turn("chat_1", turn.id)
    await stuck.wait()
    svc.learning.abandon()  # the process dies
    await svc.committer.drain()
    svc.db.close()

    calls_before = len(mem.requests)
    svc = shards(stubs=fresh)
    await svc.ping()  # the first call resumes open jobs
    steps = await svc.learning_idle()
    page = await svc.read_memory(POOL, ANN)
    jobs = await svc.learning_jobs(POOL)
    assert len(mem.requests) == calls_before and steps == 0, jobs  # not called again (LRN-4)
    assert [e.content for e in page.entries] == ["Ann lives in Oslo"], jobs
    assert jobs[0].status == "done" and jobs[0].attempts == 2


@pytest.mark.anyio
async def test_purging_the_chat_removes_what_was_learned_deleting_history_does_not(shards, fresh):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    learn = {"content": "Ann lives in Oslo", "items": [{"chat": "chat_1", "item": "i-1"}]}
    mem.answer(completion("I hear you."), completion(None, tool_calls=[("learn_fact", learn)]))

    svc = shards(stubs=fresh)
    await run_turn(svc, "I moved to Oslo")
    assert await svc.delete_chat_items("chat_1") == 2
    after_delete = await svc.read_memory(POOL, ANN)
    items = await svc.chat_items("chat_1")
    purged = await svc.purge(POOL, "chat:chat_1")
    after_purge = await svc.read_memory(POOL, ANN)
    await shards.close(svc)
    assert len(after_delete.entries) == 1 and items == []
    assert purged == 1 and after_purge.entries == ()


@pytest.mark.anyio
async def test_garbage_from_the_memory_model_is_a_recorded_safe_error(shards, fresh, caplog):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    mem.answer(completion("I hear you."), *[OpenAIStub.GARBAGE] * 4)

    svc = shards(stubs=fresh)
    svc.learning.retry_delay = 0.0
    await run_turn(svc, "I moved to Oslo")
    page = await svc.read_memory(POOL, ANN)
    jobs = await svc.learning_jobs(POOL)
    await shards.close(svc)
    assert page.entries == ()
    # CO-3: tried again three times, then ended with the safe error.
    assert jobs[0].status == "failed" and jobs[0].attempts == 4
    assert jobs[0].error == "the learning step failed: model_garbage"
    assert len(mem.requests) == 5  # the confessor's answer and four learning attempts
    # Each failed attempt is logged, and the job's end once.
    lines = [r.message for r in caplog.records if r.name == "openbot.learning"]
    final = (
        f"learning job {jobs[0].id} (bot:b1, chat chat_1) failed: "
        "the learning step failed: model_garbage"
    )
    assert lines.count(final) == 1, lines


@pytest.mark.anyio
async def test_a_failed_turn_and_step_are_logged(shards, fresh, caplog):
    bot, _ = fresh
    bot.answer(OpenAIStub.GARBAGE, OpenAIStub.GARBAGE, OpenAIStub.GARBAGE)

    svc = shards(stubs=fresh)
    result = await run_turn(svc, "hello")
    await shards.close(svc)
    assert result.turn.status == "failed"
    lines = [r.message for r in caplog.records if r.name == "openbot.turns"]
    assert any(
        m.startswith(f"step of bot b1 in chat chat_1 (turn {result.turn.id}) failed") for m in lines
    ), lines
    assert any(m.startswith(f"turn {result.turn.id} in chat chat_1 failed") for m in lines), lines


@pytest.mark.anyio
async def test_a_failed_learning_step_is_retried_and_then_succeeds(shards, fresh):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    learn = {"content": "Ann lives in Oslo", "items": [{"chat": CHAT.id, "item": "i-1"}]}
    mem.answer(
        completion("I hear you."),
        OpenAIStub.GARBAGE,
        completion(None, tool_calls=[("learn_fact", learn)]),
    )

    svc = shards(stubs=fresh)
    svc.learning.retry_delay = 0.0
    await run_turn(svc, "I moved to Oslo")
    page = await svc.read_memory(POOL, ANN)
    jobs = await svc.learning_jobs(POOL)
    await shards.close(svc)
    assert [e.content for e in page.entries] == ["Ann lives in Oslo"]
    assert jobs[0].status == "done" and jobs[0].attempts == 2


@pytest.mark.anyio
async def test_auto_record_learns_after_every_turn_without_confide(shards, fresh):
    bot, mem = fresh
    bot.answer(completion("Nice."), completion("Sure."))
    learn = {"content": "Ann likes tea", "items": [{"chat": CHAT.id, "item": "i-1"}]}
    mem.answer(completion(None, tool_calls=[("learn_fact", learn)]))
    auto = msgspec.structs.replace(
        ORG, settings=msgspec.structs.replace(ORG.settings, autoRecord=True)
    )

    svc = shards(stubs=fresh)
    await run_turn(svc, "I like tea", org=auto)
    page = await svc.read_memory(POOL, ANN)
    jobs = await svc.learning_jobs(POOL)
    await shards.close(svc)
    assert [e.content for e in page.entries] == ["Ann likes tea"]
    assert len(jobs) == 1 and jobs[0].status == "done"


@pytest.mark.anyio
async def test_context_api_has_entries_and_validate_references(shards, fresh):
    svc = shards(stubs=fresh)
    a = await svc.remember(POOL, ANN, "a" * 50)
    b = await svc.remember(POOL, ANN, "b" * 50)
    ctx = await svc.context(POOL, ANN, 60)  # only the newest fits
    stranger = Reader(user="u_x", org="o1", uses_bot=True)
    out = (
        ctx,
        await svc.has_entries(POOL, ANN),
        await svc.has_entries(POOL, stranger),
        await svc.validate_references(POOL, ANN, [a.id, b.id]),  # pushed out still counts
    )
    await svc.forget(POOL, ANN, a.id)
    out += (await svc.validate_references(POOL, ANN, [a.id, b.id]),)  # a was taken back
    await shards.close(svc)
    ctx, has, stranger_has, valid_before, valid_after = out
    assert ctx.entries and len(ctx.entries) == 1 and ctx.hasEntries
    assert has and not stranger_has
    assert valid_before and not valid_after


@pytest.mark.anyio
async def test_learning_sees_only_what_the_turns_person_may_see(shards, fresh):
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    mem.answer(completion("I hear you."), completion("nothing to learn"))

    svc = shards(stubs=fresh)
    await svc.remember(POOL, Reader(user="u_bob", org="o1", uses_bot=True), "Bob's secret plan")
    mine = await svc.remember(POOL, ANN, "Ann likes tea")
    await run_turn(svc, "I moved to Oslo")
    await shards.close(svc)
    request = json.loads(mem.requests[-1]["messages"][-1]["content"])
    assert [e["id"] for e in request["entries"]] == [mine.id]
    assert "secret" not in mem.requests[-1]["messages"][-1]["content"]


@pytest.mark.anyio
async def test_items_of_a_running_turn_appear_once_stored(shards, fresh):
    bot, _ = fresh
    bot.answer(completion("Here you go."))

    svc = shards(stubs=fresh)
    gate = asyncio.Event()
    submit = svc.committer.submit

    def slow_end_of_turn(writes, after=None):
        fut = submit(writes, after)
        if not any(getattr(w, "table", "") == "turns" and w.row[3] == "done" for w in writes):
            return fut
        held = asyncio.get_running_loop().create_future()

        async def release():
            await gate.wait()
            await fut
            held.set_result(None)

        held.task = asyncio.ensure_future(release())
        return held

    svc.committer.submit = slow_end_of_turn
    org = Org(id="o1", name="o", settings=OrgSettings(botMemory=False))
    turn = await svc.start_turn(TurnStart(chat=CHAT, bot=BOT, org=org, operator="u_ann", text="hi"))
    log = await svc.chat_logs.log("chat_1")
    await until(lambda: len(log.items) >= 2, "the reply in memory, its commit held back")
    during = await svc.chat_items("chat_1")
    gate.set()
    await svc.wait_turn("chat_1", turn.id)
    after = await svc.chat_items("chat_1")
    await shards.close(svc)
    assert [i.kind for i in during] == ["person"]
    assert [i.kind for i in after] == ["person", "bot"]


@pytest.mark.parametrize("turns", [10, 24])
@pytest.mark.anyio
async def test_concurrent_turns_spend_a_budget_of_one_call_once(shards, fresh, turns):
    """A budget of exactly one memory-bot call: `turns` chats of the bot confide at once, each
    turn asking the memory bot for a confessor's answer. One call is made and charged; the
    others find the budget spent (calm answers), and learning waits for the next period."""
    bot, mem = fresh
    gate = threading.Event()

    def bot_answer(body):
        if body["messages"][-1]["role"] == "tool":
            return completion("OK.")
        return completion(None, tool_calls=[CONFIDE])

    def mem_answer(body):  # the confessor's calls (no tools) are held until the gate opens
        return None if body.get("tools") else ("gate", gate, completion("Thank you."))

    bot.routes.append(bot_answer)
    mem.routes.append(mem_answer)
    price = Price(input_micros_per_mtok=1_000_000)  # the stub's 10 input tokens: 10 micros
    models = {
        "bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"),
        "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model", price=price),
    }
    chats = [msgspec.structs.replace(CHAT, id=f"chat_{k}") for k in range(turns)]

    svc = shards(stubs=fresh, models=models, answer_wait=120.0)
    try:
        patch = SettingsPatch(expected=0, budget=Budget(period="day", limitMicros=10))
        await svc.patch_memory_bot_settings(POOL, patch)
        started = [
            await svc.start_turn(TurnStart(chat=c, bot=BOT, org=ORG, operator=c.owner, text="hi"))
            for c in chats
        ]
        # Every turn is either at the model or waiting for the budget, then the model answers.
        for _ in range(6000):
            if len(mem.requests) + svc.memory_bot.waiting >= turns:
                break
            await asyncio.sleep(0.01)
        gate.set()
        for c, t in zip(chats, started, strict=True):
            await svc.wait_turn(c.id, t.id)
        await svc.learning_idle()
        calm = [(await svc.confessions(c.id))[0].calm for c in chats]
        jobs = await svc.learning_jobs(POOL)
        spent = await svc.chats.spend(POOL, period_key("day", svc.kernel.clock()))
    finally:
        gate.set()  # (the stub's held calls never outlive the test)
    assert len(mem.requests) == 1
    assert spent == (10, 0)
    assert sorted(calm) == [False] + [True] * (turns - 1)
    assert {j.status for j in jobs} == {"waiting"}


@pytest.mark.anyio
async def test_a_failed_call_gives_its_reservation_back(shards, fresh):
    """A budget of one call: the first confessor call fails (nothing charged), so the next
    turn's call still fits and is answered."""
    bot, mem = fresh
    bot.answer(
        completion(None, tool_calls=[CONFIDE]),
        completion("OK."),
        completion(None, tool_calls=[CONFIDE]),
        completion("OK."),
    )
    mem.answer(400, completion("Thank you."))
    price = Price(input_micros_per_mtok=1_000_000)
    models = {
        "bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"),
        "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model", price=price),
    }
    # Learning (with tools) reports no usage: only the confessor's calls cost anything.
    mem.routes.append(lambda body: completion("OK.", usage=None) if body.get("tools") else None)

    svc = shards(stubs=fresh, models=models)
    patch = SettingsPatch(expected=0, budget=Budget(period="day", limitMicros=10))
    await svc.patch_memory_bot_settings(POOL, patch)
    await run_turn(svc, "first")
    await run_turn(svc, "second")
    confessions = await svc.confessions("chat_1")
    assert [c.calm for c in confessions] == [True, False]


@pytest.mark.anyio
async def test_a_spend_total_read_late_does_not_undo_a_charge(shards, fresh, monkeypatch):
    """Turn A reads the period's spend from disk, slowly; turn B reads it meanwhile, makes the
    one call the budget allows and is charged; A's late read must not put the total back to
    what the disk said: A is refused."""
    from storage.chat_store import ChatStore

    bot, mem = fresh
    bot.routes.append(
        lambda body: (
            completion("OK.")
            if body["messages"][-1]["role"] == "tool"
            else completion(None, tool_calls=[CONFIDE])
        )
    )
    mem.routes.append(lambda body: completion("OK.", usage=None) if body.get("tools") else None)
    price = Price(input_micros_per_mtok=1_000_000)
    models = {
        "bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"),
        "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model", price=price),
    }
    reading, go = asyncio.Event(), asyncio.Event()
    spend = ChatStore.spend

    async def slow_first(self, pool, period):
        found = await spend(self, pool, period)
        if not reading.is_set():
            reading.set()
            await go.wait()
        return found

    monkeypatch.setattr(ChatStore, "spend", slow_first)
    a, b = (msgspec.structs.replace(CHAT, id=f"chat_{k}") for k in "ab")

    async def start(svc, chat):
        start = TurnStart(chat=chat, bot=BOT, org=ORG, operator=chat.owner, text="hi")
        return await svc.start_turn(start)

    svc = shards(stubs=fresh, models=models, answer_wait=60.0)
    try:
        patch = SettingsPatch(expected=0, budget=Budget(period="day", limitMicros=10))
        await svc.patch_memory_bot_settings(POOL, patch)
        turn_a = await start(svc, a)
        await asyncio.wait_for(reading.wait(), 30)
        turn_b = await start(svc, b)
        await svc.wait_turn(b.id, turn_b.id)
        go.set()
        await svc.wait_turn(a.id, turn_a.id)
        await svc.learning_idle()
        calm = [(await svc.confessions(c.id))[0].calm for c in (a, b)]
    finally:
        go.set()  # (a held read never outlives the test)
    assert calm == [True, False]
    assert len([r for r in mem.requests if not r.get("tools")]) == 1
