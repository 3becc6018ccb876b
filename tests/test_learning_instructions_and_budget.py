"""The learning side: the owner's instructions reach the learning step (MB-2), every
attempt keeps its sealed call record and is listed (LRN-4), and a job stopped by the budget runs
again at the start of the next period without waiting for another job (MB-3)."""

from __future__ import annotations

import asyncio
import datetime
import json
import secrets
import time

import ray

from actors.contracts import TurnStart
from actors.models.registry import OpenAIModel
from actors.shard.service import ShardService
from engine.directory import Bot, Chat, Org, OrgSettings
from engine.learning import REQUEST_LIMIT
from engine.memory_bot_settings import Budget, SettingsPatch
from engine.memory_entries import Reader
from engine.models import Price
from tests.conftest import LiveServer
from tests.openai_stub import OpenAIStub, completion

WS = "/api/app/workspace"


def _learning_requests(stub: OpenAIStub, marker: str) -> list[dict]:
    """The learning steps (offered `learn_fact`) whose request mentions `marker`."""
    return [
        r
        for r in stub.requests
        if any(t["function"]["name"] == "learn_fact" for t in r.get("tools", []))
        and marker in json.dumps(r["messages"])
    ]


def _learner(body: dict):
    """A memory model that learns the last person item of the evidence."""
    if not any(t["function"]["name"] == "learn_fact" for t in body.get("tools", [])):
        return None
    request = json.loads(body["messages"][-1]["content"])
    person = [e for e in request["evidence"] if e["kind"] == "person"]
    if not person:
        return completion(None)
    e = person[-1]
    fact = {"content": f"Fact: {e['text'][:40]}", "items": [{"chat": e["chat"], "item": e["item"]}]}
    return completion(None, tool_calls=[("learn_fact", fact)])


def _bot_with_memory(world, admin, *, auto_record: bool) -> str:
    settings = {"botMemoryModel": "mem", "autoRecord": auto_record}
    assert admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings}).is_success
    return admin.post(
        "/v1/admin/bots",
        json={"name": "Learner", "org": world.org, "owner": world.users["alice"], "model": "bot"},
    ).json()["id"]


def test_mb2_owner_instructions_reach_the_learning_step_within_60000(
    world, admin, model_stubs, engine
):
    """MB-2: the memory bot's `instructions` are in the learning step's request, which stays
    within SC-6's 60,000 characters even with the longest instructions and large evidence."""
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    bot = _bot_with_memory(world, admin, auto_record=False)
    marker = "rule-" + secrets.token_hex(6)
    instructions = f"Decisions of the team may be shared with the team ({marker}). " + "x" * 7900
    shard = engine.shard_for(world.users["alice"])
    with world.client("alice") as alice:
        patched = alice.patch(
            f"/v1/bots/{bot}/memory/bot", json={"expected": 0, "instructions": instructions}
        )
        assert patched.status_code == 200, patched.text
        chat = alice.post("/v1/chats", json={"bot": bot}).json()["id"]
        big = f"{marker} " + "word " * 5_900  # ~30,000 characters each
        bot_model.answer(completion("Noted."))
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": big}).is_success
        bot_model.answer(
            completion(None, tool_calls=[("confide", {"text": "I hope I got that right"})]),
            completion("Done."),
        )
        mem.answer(completion("I hear you."))  # the confessor's answer
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": big}).is_success
        ray.get(shard.learning_idle.remote())
    (request,) = _learning_requests(mem, marker)
    system = request["messages"][0]
    assert system["role"] == "system" and instructions in system["content"]
    total = sum(len(m["content"] or "") for m in request["messages"])
    assert total <= REQUEST_LIMIT
    evidence = json.loads(request["messages"][-1]["content"])["evidence"]
    assert evidence, "the evidence was not dropped to make room for the instructions"


def test_lrn4_every_failed_attempt_keeps_its_record_and_is_listed(
    world, admin, model_stubs, engine
):
    """LRN-4: each attempt of a learning step has its own (sealed) call record; a later
    attempt never overwrites an earlier one, and memory-jobs lists them all."""
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    bot = _bot_with_memory(world, admin, auto_record=True)
    bot_model.answer(completion("Fine."))
    mem.answer(*[OpenAIStub.GARBAGE] * 4)
    shard = engine.shard_for(world.users["alice"])
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": bot}).json()["id"]
        alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "I like green tea"})
        ray.get(shard.learning_idle.remote())
        (job,) = [j for j in alice.get(f"{WS}/memory-jobs").json()["jobs"] if j["chat"] == chat]
        assert job["status"] == "failed" and job["attempts"] == 4
        records = job["attemptRecords"]
        assert [r["attempt"] for r in records] == [1, 2, 3, 4]
        assert all(r["outcome"] == "failed" and r["error"] for r in records)
        learn = {"content": "Alice likes green tea", "items": [{"chat": chat, "item": "i-1"}]}
        mem.answer(completion(None, tool_calls=[("learn_fact", learn)]))
        assert alice.post(f"{WS}/memory-jobs/{job['id']}/retry").status_code == 200
        ray.get(shard.learning_idle.remote())
        deadline = time.monotonic() + 10
        while True:
            (done,) = [
                j for j in alice.get(f"{WS}/memory-jobs").json()["jobs"] if j["id"] == job["id"]
            ]
            if done["status"] == "done" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert done["status"] == "done"
    outcomes = [(r["attempt"], r["outcome"]) for r in done["attemptRecords"]]
    assert outcomes == [(1, "failed"), (2, "failed"), (3, "failed"), (4, "failed"), (5, "answered")]


# --- MB-3 on a shard with a clock the test moves (the timer is read on the shard's clock) ---


class MovableClock:
    """Real time, shifted by an offset the test sets."""

    def __init__(self, start_ms: int) -> None:
        self.offset = start_ms - time.time_ns() // 1_000_000

    def set(self, at_ms: int) -> None:
        self.offset = at_ms - time.time_ns() // 1_000_000

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset


def test_mb3_a_job_stopped_by_the_budget_runs_at_the_next_period_on_its_own(tmp_path):
    """MB-3: budget spent → the job waits with `wake_at` = the next period's start, and runs
    then without any other job starting."""
    bot_stub, mem = OpenAIStub(), OpenAIStub()
    mem.routes.append(_learner)
    servers = [LiveServer(bot_stub.app), LiveServer(mem.app)]
    price = Price(input_micros_per_mtok=10_000_000, output_micros_per_mtok=10_000_000)
    models = {
        "bot": OpenAIModel("bot", base_url=servers[0].url + "/v1", model="b"),
        "mem": OpenAIModel("mem", base_url=servers[1].url + "/v1", model="m", price=price),
    }
    noon = int(datetime.datetime(2026, 3, 31, 12, tzinfo=datetime.UTC).timestamp() * 1000)
    midnight = int(datetime.datetime(2026, 4, 1, tzinfo=datetime.UTC).timestamp() * 1000)
    clock = MovableClock(noon)
    org = Org(id="o1", name="o", settings=OrgSettings(botMemoryModel="mem", autoRecord=True))
    bot = Bot(id="b1", name="Helper", org="o1", owner="u_owner", model="bot")
    chat = Chat(id="chat_1", kind="direct", owner="u_ann", org="o1", bot="b1")

    async def turn(svc, text):
        t = await svc.start_turn(
            TurnStart(chat=chat, bot=bot, org=org, operator="u_ann", text=text)
        )
        await svc.wait_turn(chat.id, t.id)
        return t

    async def go():
        svc = ShardService(tmp_path, 0, models=models, clock=clock, answer_wait=2.0)
        patch = SettingsPatch(expected=0, budget=Budget(period="day", limitMicros=100))
        await svc.patch_memory_bot_settings("bot:b1", patch)
        await turn(svc, "I moved to Oslo")  # one learning step: 150 micros, the day's budget
        await svc.learning_idle()
        clock.set(midnight - 600)  # the same day, 0.6 s before it ends
        second = await turn(svc, "I work at the harbour")
        deadline = time.monotonic() + 3
        while True:
            (job,) = [j for j in await svc.learning_jobs("bot:b1") if j.turn == second.id]
            if job.status == "waiting" or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.02)
        waiting = job
        deadline = time.monotonic() + 8  # no other job starts: only the timer can wake it
        while job.status != "done" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            (job,) = [j for j in await svc.learning_jobs("bot:b1") if j.turn == second.id]
        page = await svc.read_memory("bot:b1", Reader(user="u_ann", org="o1", uses_bot=True))
        await svc.close()
        return waiting, job, [e.content for e in page.entries]

    try:
        waiting, job, contents = asyncio.run(go())
    finally:
        for s in servers:
            s.stop()
    assert waiting.status == "waiting" and waiting.wake_at == midnight
    assert job.status == "done"
    assert "Fact: I work at the harbour" in contents


def test_mb3_memory_jobs_show_when_a_budget_stopped_job_runs_again(world, admin, engine):
    """MB-3 through HTTP: with the budget spent the job is `waiting` and says when it runs
    again: the start of the next budget period (here the next UTC day)."""
    bot = _bot_with_memory(world, admin, auto_record=True)
    shard = engine.shard_for(world.users["alice"])
    with world.client("alice") as alice:
        budget = {"period": "day", "limitMicros": 0}
        r = alice.patch(f"/v1/bots/{bot}/memory/bot", json={"expected": 0, "budget": budget})
        assert r.status_code == 200, r.text
        chat = alice.post("/v1/chats", json={"bot": bot}).json()["id"]
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "hi"}).is_success
        ray.get(shard.learning_idle.remote())
        (job,) = [j for j in alice.get(f"{WS}/memory-jobs").json()["jobs"] if j["chat"] == chat]
    assert job["status"] == "waiting"
    stopped = datetime.datetime.fromtimestamp(job["updatedAt"] / 1000, datetime.UTC)
    next_day = datetime.datetime.combine(
        stopped.date() + datetime.timedelta(days=1), datetime.time(), datetime.UTC
    )
    assert job["wakeAt"] == int(next_day.timestamp() * 1000)


def test_mb6_usage_the_provider_did_not_report_is_counted_apart_not_charged(tmp_path, fresh):
    """MB-6: the confessor's call reports its usage and is charged; the learning step's call
    reports none: it costs nothing and is counted as unknown, in the settings view (the
    `GET /v1/bots/:botId/memory/bot` body), before and after a restart."""
    from tests.shard_kit import BOT, CHAT, ORG, POOL, shard_service

    bot, mem = fresh
    bot.answer(
        completion(None, tool_calls=[("confide", {"text": "I hope I got it right"})]),
        completion("Noted."),
    )
    # The confessor's call has no tools: usage reported. The learning step's: none reported.
    mem.routes.append(
        lambda body: completion("OK.", usage=None) if body.get("tools") else completion("I hear.")
    )
    price = Price(input_micros_per_mtok=1_000_000)  # the stub's 10 input tokens: 10 micros
    models = {
        "bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"),
        "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model", price=price),
    }

    async def go():
        svc = shard_service(tmp_path, fresh, models=models)
        try:
            start = TurnStart(chat=CHAT, bot=BOT, org=ORG, operator="u_ann", text="hi")
            turn = await svc.start_turn(start)
            await svc.wait_turn(CHAT.id, turn.id)
            await svc.learning_idle()
            before = await svc.memory_bot_view(POOL)
        finally:
            await svc.close()
        again = shard_service(tmp_path, fresh, models=models)
        try:
            return before, await again.memory_bot_view(POOL)
        finally:
            await again.close()

    before, after = asyncio.run(go())
    assert len([r for r in mem.requests if r.get("tools")]) == 1  # the learning step was asked
    for view in (before, after):
        assert [(s.period.split(":")[0], s.micros, s.unknownCalls) for s in view.spend] == [
            ("day", 10, 1),
            ("month", 10, 1),
        ]
