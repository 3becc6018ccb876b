"""Guards of learning: the time limits (MB-4, MB-5), evidence applied once and committed with the
read position (LRN-5), and the extraction request's size (SC-6)."""

from __future__ import annotations

import asyncio
import json

import pytest

from actors.shard.service import ShardService, TurnStart
from engine.directory import Org, OrgSettings
from engine.memory_bot_settings import SettingsPatch
from engine.turns import CALM_ANSWER
from tests.guards.kit import (
    CONFIDE,
    LEARN,
    fact_meta,
    learning_requests,
    learning_route,
    route_rewrite,
    tool_names,
)
from tests.openai_stub import completion
from tests.shard_kit import ANN, BOT, CHAT, ORG, POOL, run_turn, shard_service
from tests.waiting import TIMEOUT

# --- MB-4, MB-5: the time limits ------------------------------------------------------------------


def test_MB_4_MB_5_default_limits_are_15_seconds_and_2_minutes(tmp_path):
    """The limits themselves (the tests below shorten them through the same attributes).

    Breaks tried: `ANSWER_WAIT = 15.0` → `150.0` → `(150.0, 120.0) == (15.0, 120.0)` fails
    (it first *survived*: `ShardService` had its own literal 15.0, so the constant was dead; the
    default now comes from `engine.turns.ANSWER_WAIT`); `LEARNING_STEP_LIMIT = 120.0` →
    `1200.0` → fails."""

    async def go():
        svc = ShardService(tmp_path, 0, models={})
        try:
            return svc.memory_bot.answer_wait, svc.learning.step_limit
        finally:
            await svc.close()

    assert asyncio.run(go()) == (15.0, 120.0)


def test_MB_4_the_wait_for_a_busy_slot_counts_toward_the_answer_limit(tmp_path, fresh):
    """With the memory bot's one slot busy, the rewrite and the confide answer each give up
    after `answer_wait` (15 s in production, 1 s here): unchanged input, the calm answer.

    Break tried: in `MemoryBotRuntime.call`, `done = await asyncio.wait_for(run(), timeout)` →
    `done = await run()` (the model's own timeout still applies, the slot wait is unbounded) →
    the turn waits for the slot (until the holder lets go) and then gets the rewrite."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you."))

    async def go():
        svc = shard_service(tmp_path, fresh, answer_wait=1.0)
        svc.learning.step_limit = 1.0
        release = asyncio.Event()
        try:
            mine = await svc.remember(POOL, ANN, "Ann prefers trains")
            mem.routes.append(route_rewrite("Plan my trip to Oslo by train", [mine.id]))
            settings = await svc.patch_memory_bot_settings(
                POOL, SettingsPatch(expected=0, concurrency=1)
            )
            held = asyncio.Event()

            async def hold():
                async with svc.memory_bot.slot(POOL, settings):
                    held.set()
                    await release.wait()

            holder = asyncio.create_task(hold())
            await held.wait()
            async with asyncio.timeout(TIMEOUT):  # unbounded, the turn would wait for `release`
                turn = await svc.start_turn(
                    TurnStart(chat=CHAT, bot=BOT, org=ORG, operator="u_ann", text="Plan my trip")
                )
                await svc.wait_turn(CHAT.id, turn.id)
            held_throughout = not holder.done()
            release.set()
            await holder
            await svc.learning_idle()
            confessions = await svc.confessions("chat_1")
            return held_throughout, confessions, await svc.enrichments("chat_1")
        finally:
            release.set()
            await svc.close()

    held_throughout, confessions, enrichments = asyncio.run(go())
    assert held_throughout  # the turn ended while the slot was still busy
    assert bot.requests[0]["messages"][-1]["content"] == "Plan my trip"  # unchanged input
    assert enrichments == []
    assert [(c.answer, c.calm) for c in confessions] == [(CALM_ANSWER, True)]


def test_MB_5_a_slow_learning_step_ends_safely_and_the_evidence_stays_unread(tmp_path, fresh):
    """A learning step over the limit (2 min in production, 0.5 s here) ends the execution as
    failed with a safe message; the read position does not move, nothing is stored, and a later
    confide learns from the same evidence.

    Break tried: in `LearningRunner._execute`, `timeout=self.step_limit` → `timeout=600.0` →
    the slow step (3 s) completes and stores the fact (`status == "failed"` fails)."""
    bot, mem = fresh
    bot.answer(
        completion(None, tool_calls=[CONFIDE]),
        completion("Sorry, Ann."),
        completion(None, tool_calls=[CONFIDE]),
        completion("Done."),
    )
    learn = completion(None, tool_calls=[("learn_fact", LEARN)])
    slow = [True]
    mem.routes.append(
        lambda b: (
            (("delay", 3.0, learn) if slow[0] else learn) if "learn_fact" in tool_names(b) else None
        )
    )

    async def go():
        svc = shard_service(tmp_path, fresh)
        svc.learning.step_limit = 0.5
        try:
            await run_turn(svc, "I moved to Oslo")
            first = (
                await svc.learning_jobs(POOL),
                await svc.learning.store.position(POOL, "chat_1"),
                await svc.read_memory(POOL, ANN),
            )
            slow[0] = False
            await run_turn(svc, "Did you get that?")
            second = (
                await svc.learning_jobs(POOL),
                await svc.learning.store.position(POOL, "chat_1"),
                await svc.read_memory(POOL, ANN),
            )
            return first, second
        finally:
            await svc.close()

    (jobs, position, page), (jobs2, position2, page2) = asyncio.run(go())
    assert [(j.status, j.error) for j in jobs] == [
        ("failed", "the learning step took longer than 2 minutes")
    ]
    assert position == 0 and page.entries == ()
    assert sorted(j.status for j in jobs2) == ["done", "failed"]
    assert position2 == 4 and [e.content for e in page2.entries] == ["Ann lives in Oslo"]


# --- LRN-5: the same evidence is never applied twice ----------------------------------------------


def test_LRN_5_concurrent_learning_applies_the_same_evidence_once(tmp_path, fresh):
    """Two executions over the same items, started together: one model step, one fact, and the
    read position, the fact and both jobs' ends are on disk after a restart.

    Breaks tried: in `LearningRunner._run`, `lock = self._chains.setdefault(...)` →
    `lock = asyncio.Lock()` (no per-chat exclusion) → fails, "the same evidence went to the
    model twice" (the `_apply` re-check still keeps one fact); that break plus `if await
    self._position(...) >= job.upto:` in `_apply` → `if False:` → fails, "applied twice" (two
    facts). Survived (harmless): `if start >= job.upto:` in `_execute` → `if False:` alone —
    the evidence window `start < seq <= upto` is then empty, so the job ends without a model
    call."""
    bot, mem = fresh
    bot.answer(completion("Noted."))
    mem.routes.append(
        learning_route(("delay", 0.3, completion(None, tool_calls=[("learn_fact", LEARN)])))
    )
    plain = Org(id="o1", name="o", settings=OrgSettings(botMemory=True, botMemoryModel="mem"))

    async def go():
        svc = shard_service(tmp_path, fresh)
        try:
            await run_turn(svc, "I moved to Oslo", org=plain)  # no confide: nothing learned yet
            jobs = [
                svc.conversations.new_job(BOT, CHAT, f"turn-{k}", 2, "for:person:u_ann", plain)
                for k in range(2)
            ]
            await asyncio.gather(*(svc.learning.schedule(j) for j in jobs))
            await svc.learning_idle()
        finally:
            await svc.close()
        svc = shard_service(tmp_path, fresh)
        try:
            return (
                await svc.read_memory(POOL, ANN),
                await svc.learning_jobs(POOL),
                await svc.learning.store.position(POOL, "chat_1"),
            )
        finally:
            await svc.close()

    page, jobs, position = asyncio.run(go())
    assert [e.content for e in page.entries] == ["Ann lives in Oslo"], "applied twice"
    assert len(learning_requests(mem)) == 1, "the same evidence went to the model twice"
    assert [j.status for j in jobs] == ["done", "done"] and position == 2


def test_LRN_5_learned_changes_read_position_and_job_end_commit_together(
    tmp_path, fresh, monkeypatch
):
    """If the transaction carrying the read position fails, the learned fact and the job's end
    are not on disk either (each batch is its own transaction here, so a split would show).

    Break tried: in `LearningRunner._apply`, moving `self.store.position_row(...)` out of
    `extra` into its own `kernel.stage(Batch(...))` → the fact and "done" are stored
    while the position is not (fails `assert ['Ann lives in Oslo'] == []`)."""
    from engine.errors import StorageError
    from storage.group_commit import GroupCommitter

    original = GroupCommitter.append_record
    failed = []

    def append(self, batches):
        writes = [w for batch in batches for w in batch]
        # Every time: the automatic retries (CO-3) fail the same way.
        if any(getattr(w, "table", "") == "learn_positions" for w in writes):
            failed.append(True)
            raise StorageError("disk full (simulated)")
        return original(self, batches)

    monkeypatch.setattr(GroupCommitter, "append_record", append)
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    mem.answer(completion("I hear you."))
    mem.routes.append(learning_route(completion(None, tool_calls=[("learn_fact", LEARN)])))

    async def go():
        svc = shard_service(tmp_path, fresh, group_commit=False)
        try:
            await run_turn(svc, "I moved to Oslo")
        finally:
            await svc.close()
        svc = shard_service(tmp_path, fresh)  # what is on disk (no call starts recovery)
        try:
            return (
                await svc.read_memory(POOL, ANN),
                await svc.learning_jobs(POOL),
                await svc.learning.store.position(POOL, "chat_1"),
            )
        finally:
            await svc.close()

    page, jobs, position = asyncio.run(go())
    assert failed, "the learning transaction was never attempted"
    assert position == 0
    assert [e.content for e in page.entries] == []
    assert [j.status for j in jobs] == ["failed"]


# --- SC-6: the extraction request stays under 60,000 characters ---------------------------------


def test_SC_6_build_request_keeps_whole_json_under_the_limit_person_words_first():
    """Engine rule: at most 60,000 characters (minus the caller's overhead), sized on the JSON,
    whole strings only, person items before other items, the JSON whole.

    Breaks tried (each fails): `REQUEST_LIMIT = 60_000` → `600_000`; `if sizes_i[k] <= room:`
    → `if True:`; `key=lambda k: (evidence[k].kind != "person", -k)` → `key=lambda k: -k`."""
    from engine.learning import REQUEST_LIMIT, ContextEntry, EvidenceItem, build_request

    assert REQUEST_LIMIT == 60_000
    evidence = []
    for k in range(120):
        kind = "person" if k % 3 == 0 else "bot"
        text = f"{kind}-{k:03d} " + '\u00e9"\\' * 300 + " end"  # escapes grow the JSON
        evidence.append(EvidenceItem(chat="c", item=f"i-{k}", kind=kind, author="a", text=text))
    entries = [
        ContextEntry(
            id=f"mem_{k}",
            layer="fact",
            tier="log",
            scope="bot",
            content="x" * 500,
            topics=("t",),
            status="active",
        )
        for k in range(200)
    ]
    text, kept = build_request(evidence, entries, {"t": 200}, overhead=400)
    assert len(text) <= REQUEST_LIMIT - 400
    body = json.loads(text)
    originals = {e.item: e.text for e in evidence}
    assert all(e["text"] == originals[e["item"]] for e in body["evidence"])  # never truncated
    kinds = [e.kind for e in kept]
    persons = sum(1 for e in evidence if e.kind == "person")
    if "bot" in kinds:
        assert kinds.count("person") == persons, "a bot item displaced a person's words"
    assert kinds.count("person") > 0


@pytest.mark.anyio
async def test_SC_6_the_learning_request_with_its_instructions_fits_60000(shards, fresh):
    """Through the runner: system text + request ≤ 60,000 characters with a pool far larger.

    Break tried: in `LearningRunner._execute`, `overhead=len(LEARNING_SYSTEM)` → `overhead=0`
    → the messages together exceed 60,000."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    mem.answer(completion("I hear you."))
    mem.routes.append(learning_route(completion("nothing new")))

    svc = shards(stubs=fresh)
    await svc.add_entries(
        POOL,
        [(fact_meta(f"mem_{k:04d}", "u_ann", 10 + k), f"{k:04d} " + "y" * 150) for k in range(400)],
    )
    await run_turn(svc, "I moved to Oslo")
    await shards.close(svc)
    (request,) = learning_requests(mem)
    total = sum(len(m["content"] or "") for m in request["messages"])
    assert 55_000 < total <= 60_000, total
