"""LRN-5 on a shard (no Ray), with real HTTP to a loopback OpenAI-compatible server: jobs of one
pool and chat run one at a time, so evidence two jobs cover is learned from once, with one model
step, however the jobs are started."""

from __future__ import annotations

import asyncio

from engine.chat_records import LearningJob
from tests.openai_stub import completion
from tests.shard_kit import ANN, CHAT, POOL, run_turn, shard_service


def test_two_jobs_over_the_same_evidence_learn_it_once(tmp_path, fresh):
    bot, mem = fresh
    bot.answer(completion("Nice."))
    learn = {"content": "Ann likes tea", "items": [{"chat": CHAT.id, "item": "i-1"}]}
    # Enough answers for both jobs, should both reach the model.
    mem.answer(*[completion(None, tool_calls=[("learn_fact", learn)])] * 2)

    async def go():
        svc = shard_service(tmp_path, fresh)
        result = await run_turn(svc, "I like tea")  # no confide, no auto-record: no job
        assert await svc.learning_jobs(POOL) == []
        upto = len(result.items)  # items i-1 … i-n have seqs 1 … n
        jobs = [
            LearningJob(
                id=f"job_{k}",
                pool=POOL,
                chat=CHAT.id,
                turn=result.turn.id,
                upto=upto,
                org="o1",
                grant=f"for:person:{ANN.user}",
                model="mem",
            )
            for k in ("a", "b")
        ]
        await asyncio.gather(*(svc.learning.schedule(j) for j in jobs))
        await svc.learning_idle()
        page = await svc.read_memory(POOL, ANN)
        stored = await svc.learning_jobs(POOL)
        await svc.close()
        return page, stored

    page, stored = asyncio.run(go())
    assert [e.content for e in page.entries] == ["Ann likes tea"]
    assert len(mem.requests) == 1  # the second job found the evidence learned already
    assert sorted((j.id, j.status) for j in stored) == [("job_a", "done"), ("job_b", "done")]
