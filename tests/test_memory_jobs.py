"""`/api/app/workspace/memory-jobs`: the background learning of a person's turns, its automatic
retries (CO-3), a manual retry, and who may see and retry what."""

from __future__ import annotations

import time

import ray

from tests.openai_stub import OpenAIStub, completion

WS = "/api/app/workspace"


def _jobs(client) -> list[dict]:
    r = client.get(f"{WS}/memory-jobs")
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


def test_failed_learning_is_retried_listed_and_retried_by_hand(world, admin, model_stubs, engine):
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    settings = {"botMemoryModel": "mem", "autoRecord": True}
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings})
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": "Jobber", "org": world.org, "owner": world.users["alice"], "model": "bot"},
    ).json()["id"]
    bot_model.answer(completion("Fine."))
    mem.answer(*[OpenAIStub.GARBAGE] * 4)
    shard = engine.shard_for(world.users["alice"])
    with world.client("alice") as alice:
        chat = alice.post("/v1/chats", json={"bot": bot}).json()
        alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "I like tea"})
        ray.get(shard.learning_idle.remote())
        (job,) = [j for j in _jobs(alice) if j["chat"] == chat["id"]]
        assert job["status"] == "failed" and job["attempts"] == 4  # 1 + 3 automatic retries
        learn = {"content": "Alice likes tea", "items": [{"chat": chat["id"], "item": "i-1"}]}
        mem.answer(completion(None, tool_calls=[("learn_fact", learn)]))
        with world.client("bob") as bob:  # not bob's turn: not listed, not retried
            assert all(j["id"] != job["id"] for j in _jobs(bob))
            assert bob.post(f"{WS}/memory-jobs/{job['id']}/retry").status_code == 404
        again = alice.post(f"{WS}/memory-jobs/{job['id']}/retry")
        assert again.status_code == 200 and again.json()["status"] == "pending"
        ray.get(shard.learning_idle.remote())
        deadline = time.monotonic() + 10
        while (done := next(j for j in _jobs(alice) if j["id"] == job["id"]))["status"] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert alice.post(f"{WS}/memory-jobs/{job['id']}/retry").status_code == 409
        (entry,) = alice.get(f"/v1/bots/{bot}/memory").json()["entries"]
    assert entry["content"] == "Alice likes tea" and done["attempts"] == 5
