"""The memory bot's learning step writes user- and project-scope facts into the workspace pools
(SC-1..SC-3, SC-6): user facts only in the user's own words, never back once
forgotten (reworded or not), bot facts still in the bot's pool."""

from __future__ import annotations

import secrets
import time

import ray

from engine.scoped_memory import Extraction, SourceItem
from tests.openai_stub import completion

WS = "/api/app/workspace"
SAID = "I drink green tea every morning"


def _list(client, **params) -> list[dict]:
    r = client.get(f"{WS}/memories", params=params)
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def _job(client, chat: str) -> dict:
    deadline = time.monotonic() + 20
    while True:
        r = client.get(f"{WS}/memory-jobs")
        assert r.status_code == 200, r.text
        jobs = [j for j in r.json()["jobs"] if j["chat"] == chat]
        if jobs and jobs[0]["status"] in ("done", "failed"):
            return jobs[0]
        assert time.monotonic() < deadline, jobs
        time.sleep(0.05)


def test_learned_user_fact_goes_to_user_memory_and_stays_forgotten(
    world, admin, model_stubs, engine
):
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    settings = {"botMemoryModel": "mem", "autoRecord": True}
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings})
    alice_id = world.users["alice"]
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": "Keeper", "org": world.org, "owner": alice_id, "model": "bot"},
    ).json()["id"]
    bot_model.answer(completion("Noted."))
    chat_box: dict = {}

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        items = [{"chat": chat_box["id"], "item": "i-1"}]
        calls = [
            # Her own words: kept in her user memory.
            ("learn_fact", {"content": SAID, "items": items, "scope": "user", "tier": "profile"}),
            # Not her words: refused.
            ("learn_fact", {"content": "Alice is a tea lover", "items": items, "scope": "user"}),
            # A direct chat without a project: no project memory to keep it in.
            ("learn_fact", {"content": "The team drinks tea", "items": items, "scope": "project"}),
            # Bot scope: the bot's own pool, as before.
            ("learn_fact", {"content": "Alice likes tea", "items": items}),
        ]
        return completion(None, tool_calls=calls)

    mem.routes.append(mem_route)
    shard = engine.shard_for(alice_id)
    try:
        with world.client("alice") as alice:
            chat = alice.post("/v1/chats", json={"bot": bot}).json()
            chat_box["id"] = chat["id"]
            alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": SAID})
            ray.get(engine.shard_for(alice_id).learning_idle.remote())
            job = _job(alice, chat["id"])
            assert job["status"] == "done", job
            assert job["error"] == "2 proposed change(s) rejected"

            (fact,) = _list(alice, scope="user")
            assert fact["content"] == SAID
            assert fact["pool"] == f"user:{alice_id}" and fact["contributor"] == bot
            assert fact["tier"] == "profile" and fact["origin"] == "synthesized"
            assert fact["evidence"] == [f"{chat['id']}/i-1"] and not fact["protected"]
            bot_facts = [
                e["content"] for e in alice.get(f"/v1/bots/{bot}/memory").json()["entries"]
            ]
            assert bot_facts == ["Alice likes tea"]  # user/project facts stay out of the bot pool
            with world.client("bob") as bob:  # someone else's user memory: nothing
                assert _list(bob, scope="user") == []

            forget = {"requestId": "r-" + secrets.token_hex(6), "id": fact["id"]}
            r = alice.post(f"{WS}/memories/forget", json={**forget, "expectedRevision": 1})
            assert r.status_code == 200, r.text
            assert _list(alice, scope="user") == []

            # A later extraction over the same turn proposes it reworded (still her words).
            pool = f"user:{alice_id}"
            source = SourceItem(
                chat=chat["id"], item="i-1", kind="person", author=alice_id, text=SAID
            )
            reworded = Extraction(
                pool=pool,
                contributor=bot,
                content="green tea every morning",
                evidence=(source.marker,),
            )
            same = Extraction(pool=pool, contributor=bot, content=SAID, evidence=(source.marker,))
            decisions = ray.get(
                shard.workspace_extract.remote(pool, bot, [reworded, same], [source], "later-1")
            )
            assert [(d.outcome, d.code) for d in decisions] == [
                ("refused", "forgotten"),
                ("refused", "forgotten"),
            ]
            assert _list(alice, scope="user") == []
            (gone,) = _list(alice, scope="user", status="forgotten")
            assert gone["id"] == fact["id"] and gone["revision"] == 2
    finally:
        mem.routes.clear()


def test_extraction_checks_the_users_words_and_a_repeat_stores_once(
    world, admin, model_stubs, engine
):
    """Direct `workspace_extract`: a quote must be the person's, and one request id stores once."""
    alice_id = world.users["alice"]
    shard = engine.shard_for(alice_id)
    pool = f"user:{alice_id}"
    chat = "chat-" + secrets.token_hex(4)
    mine = SourceItem(chat=chat, item="i-1", kind="person", author=alice_id, text="I walk to work")
    theirs = SourceItem(
        chat=chat, item="i-2", kind="person", author=world.users["bob"], text="Alice runs daily"
    )
    proposals = [
        Extraction(pool=pool, contributor=world.bot, content="walk to work", evidence=("x",)),
        Extraction(
            pool=pool, contributor=world.bot, content="I walk to work", evidence=(mine.marker,)
        ),
        Extraction(
            pool=pool, contributor=world.bot, content="Alice runs daily", evidence=(theirs.marker,)
        ),
    ]
    first = ray.get(
        shard.workspace_extract.remote(pool, world.bot, proposals, [mine, theirs], "job-a")
    )
    assert [(d.outcome, d.code) for d in first] == [
        ("refused", "no_evidence"),
        ("created", ""),
        ("refused", "not_users_words"),
    ]
    again = ray.get(
        shard.workspace_extract.remote(pool, world.bot, proposals, [mine, theirs], "job-a")
    )
    assert again == first  # the first answer, nothing stored twice
    with world.client("alice") as alice:
        assert [e["content"] for e in _list(alice, scope="user")] == ["I walk to work"]


def test_user_fact_from_a_group_chat_is_refused(world, admin, model_stubs, engine):
    """A group's turn is kept for its channel, not for one person: no user memory from it."""
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    settings = {"botMemoryModel": "mem", "autoRecord": True}
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings})
    alice_id = world.users["alice"]
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": "Grouper", "org": world.org, "owner": alice_id, "model": "bot"},
    ).json()["id"]
    channel = admin.post(
        "/v1/admin/channels",
        json={"org": world.org, "people": [alice_id, world.users["bob"]], "bots": [bot]},
    )
    assert channel.status_code == 201, channel.text
    bot_model.answer(completion("Noted."))
    chat_box: dict = {}

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        items = [{"chat": chat_box["id"], "item": "i-1"}]
        return completion(
            None, tool_calls=[("learn_fact", {"content": SAID, "items": items, "scope": "user"})]
        )

    mem.routes.append(mem_route)
    shard = engine.shard_for(alice_id)
    try:
        with world.client("alice") as alice:
            chat = alice.post("/v1/chats", json={"channel": channel.json()["id"]}).json()
            chat_box["id"] = chat["id"]
            r = alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": SAID})
            assert r.status_code in (200, 201), r.text
            deadline = time.monotonic() + 20
            while True:
                ray.get(shard.learning_idle.remote())
                jobs = ray.get(shard.learning_jobs.remote(f"bot:{bot}"))
                if jobs and all(j.status in ("done", "failed") for j in jobs):
                    break
                assert time.monotonic() < deadline, jobs
                time.sleep(0.05)
            (job,) = jobs
            assert job.grant.startswith("for:channel:")
            assert job.status == "done" and job.error == "1 proposed change(s) rejected"
            assert _list(alice, scope="user") == []
    finally:
        mem.routes.clear()


def test_lrn5_user_and_project_facts_of_one_step_on_one_shard_are_both_stored(
    world, admin, model_stubs, engine
):
    """One step learns a user fact and a project fact whose pools live on the same shard (the
    project is Alice's): each pool's group is sent under a receipt of its own, so neither is
    taken for a repeat of the other."""
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    settings = {"botMemoryModel": "mem", "autoRecord": True}
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings})
    alice_id = world.users["alice"]
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": "Planner", "org": world.org, "owner": alice_id, "model": "bot"},
    ).json()["id"]
    bot_model.answer(completion("Noted."))
    said = "I drink green tea and the launch moves to Friday"
    chat_box: dict = {}

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        items = [{"chat": chat_box["id"], "item": "i-1"}]
        calls = [
            ("learn_fact", {"content": "I drink green tea", "items": items, "scope": "user"}),
            ("learn_fact", {"content": "Launch on Friday", "items": items, "scope": "project"}),
        ]
        return completion(None, tool_calls=calls)

    mem.routes.append(mem_route)
    try:
        with world.client("alice") as alice:
            r = alice.post(f"{WS}/projects", json={"requestId": secrets.token_hex(6), "name": "L"})
            assert r.status_code == 201, r.text
            project = r.json()["id"]
            chat = alice.post("/v1/chats", json={"bot": bot, "project": project}).json()
            chat_box["id"] = chat["id"]
            alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": said})
            ray.get(engine.shard_for(alice_id).learning_idle.remote())
            job = _job(alice, chat["id"])
            assert (job["status"], job["error"]) == ("done", None), job
            assert [e["content"] for e in _list(alice, scope="user")] == ["I drink green tea"]
            facts = _list(alice, scope="project", project=project)
            assert [e["content"] for e in facts] == ["Launch on Friday"]
    finally:
        mem.routes.clear()
