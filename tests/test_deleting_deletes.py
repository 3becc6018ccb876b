"""Deleting deletes, and memory reaches only whom it is for (bot memory purge and forget,
API-2 … API-5, SC-1), through the real HTTP API.

Purge by `from:`, `org:` or `chat:` covers every store of the bot's one memory: its learned and
pinned entries, the workspace records people wrote for it, and the user and project facts its
memory bot learned from a purged chat. Forget works on every entry the bot's memory lists that
the caller may forget; the memory log shows workspace record changes; a person's user memory
reaches only the bots of their own account; the memory bot's settings are read with write.
"""

from __future__ import annotations

import asyncio
import json
import secrets

import httpx

from tests.openai_stub import completion

WS = "/api/app/workspace"


def _ok(r: httpx.Response, code: int = 200) -> dict:
    assert r.status_code == code, r.text
    return r.json()


def _rid() -> str:
    return "r-" + secrets.token_hex(6)


def _bot(admin, world, owner: str, name: str | None = None) -> tuple[str, str]:
    name = name or f"B{secrets.token_hex(4)}"
    body = {"name": name, "org": world.org, "owner": world.users[owner], "model": "bot"}
    return _ok(admin.post("/v1/admin/bots", json=body), 201)["id"], name


def _grant(admin, bot: str, user: str, permission: str = "read") -> None:
    body = {"bot": bot, "user": user, "permission": permission}
    _ok(admin.post("/v1/admin/grants", json=body), 201)


def _record(client, bot: str, content: str, scope: str = "bot", **extra) -> dict:
    body = {"requestId": _rid(), "scope": scope, "bot": bot, "content": content, **extra}
    return _ok(client.post(f"{WS}/memories", json=body), 201)


# --- user memory is for the bots of the same account (SC-1) -------------------------------------


def test_a_persons_user_memory_reaches_only_the_bots_of_their_own_account(world, admin, bot_model):
    """Alice's user memory is in the prompt and the search tool of her own bot, and in neither
    of a bot Bob owns that she uses through a grant."""
    mine, mine_name = _bot(admin, world, "alice")
    theirs, theirs_name = _bot(admin, world, "bob")
    _grant(admin, theirs, world.users["alice"])
    secret = f"My bike lock code is {secrets.randbelow(10**6):06d}"
    prompts: dict[str, list[dict]] = {mine_name: [], theirs_name: []}

    def route(body):
        system = body["messages"][0]["content"]
        name = next((n for n in prompts if system.startswith(f"You are {n}.")), None)
        if name is None:
            return None
        prompts[name].append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            return completion("Looked.")
        if "look it up" in str(last["content"]):
            return completion(None, tool_calls=[("workspace_memory_search", {"query": "bike"})])
        return completion("Hi.")

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        _record(alice, mine, secret, scope="user")
        for bot in (mine, theirs):
            chat = _ok(alice.post("/v1/chats", json={"bot": bot}), 201)
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Hello"}))
            turn = {"text": "look it up"}
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json=turn))
    # Her own bot: in the prompt and found by its search tool.
    first = prompts[mine_name][0]["messages"][0]["content"]
    assert secret in first
    found = json.loads(prompts[mine_name][-1]["messages"][-1]["content"])["entries"]
    assert secret in [e["content"] for e in found]
    # Bob's bot: neither.
    assert prompts[theirs_name], "Bob's bot was asked"
    assert all(secret not in json.dumps(p) for p in prompts[theirs_name])
    found = json.loads(prompts[theirs_name][-1]["messages"][-1]["content"])["entries"]
    assert found == []


# --- the workspace records of a bot's one memory in the bot memory routes -----------------------


def _memory(client, bot: str) -> dict[str, dict]:
    return {e["id"]: e for e in _ok(client.get(f"/v1/bots/{bot}/memory"))["entries"]}


def _forget(client, bot: str, entry: str, request_id: str | None = None):
    body: dict = {"command": {"_tag": "Forget", "id": entry}}
    if request_id is not None:
        body["requestId"] = request_id
    return client.post(f"/v1/bots/{bot}/memory", json=body)


def test_forget_works_on_a_workspace_record_the_memory_lists(world):
    """API-2 on every entry `GET /memory` lists that the caller may forget: a record written
    through the workspace for the bot (seen by everyone who uses the bot in its org) is
    forgotten by the memory API's Forget, once per request id; an id of no entry stays
    `not_yours`, and someone who does not use the bot forgets nothing."""
    world.grant("bob", "read")
    with world.client("alice") as alice, world.client("bob") as bob:
        record = _record(alice, world.bot, "Standup is at nine")
        assert record["id"] in _memory(bob, world.bot)
        rid = _rid()
        r = _forget(bob, world.bot, record["id"], rid)
        assert r.status_code == 200, r.text
        assert r.json()["id"] == record["id"] and r.json()["status"] == "retracted"
        again = _forget(bob, world.bot, record["id"], rid)
        assert again.status_code == 200 and again.json() == r.json()
        assert _memory(alice, world.bot)[record["id"]]["status"] == "retracted"
        (gone,) = _ok(alice.get(f"{WS}/memories", params={"scope": "bot", "status": "forgotten"}))[
            "entries"
        ]
        assert gone["id"] == record["id"] and gone["revision"] == 2
        # Forgetting it again changes nothing and is no error.
        assert _forget(alice, world.bot, record["id"]).status_code == 200
        r = _forget(bob, world.bot, "mem_" + secrets.token_hex(12))
        assert r.status_code == 409 and r.json()["error"]["code"] == "not_yours"
    with world.client("carol") as carol:  # does not use the bot
        assert _forget(carol, world.bot, record["id"]).status_code in (403, 404)


def _at_rest(engine, where, ids: set[str], pool: str) -> list[tuple]:
    """What a backup of the stored data keeps of records `ids` of `pool` beside their rows:
    search terms and vectors (sealed, but derived from their words)."""
    from storage.data_dir_io import drain_journal, read_only

    asyncio.run(engine.backup(where))
    found: list[tuple] = []
    for path in sorted(where.glob("shard-*.duckdb")):
        drain_journal(path)
        with read_only(path) as con:
            found += con.execute(
                "SELECT 'terms', entry FROM search_terms WHERE pool = ?", [pool]
            ).fetchall()
            found += con.execute(
                "SELECT 'vectors', entry FROM ws_vectors WHERE pool = ?", [pool]
            ).fetchall()
            found += con.execute(
                "SELECT 'block', entries FROM ws_vector_blocks WHERE pool = ?", [pool]
            ).fetchall()
    return [row for row in found if any(i in row[1] for i in ids)]


def test_purge_by_from_and_org_deletes_the_bots_workspace_records_too(
    world, admin, engine, tmp_path
):
    """API-4 over every store of the bot's one memory: the records people wrote for the bot
    carry `from:<writer>` and `org:<bot's org>`; a purge by either deletes them with their
    revisions, barriers, answers, search terms and vectors, and neither `GET /memory` nor the
    workspace lists them any more."""
    import ray

    world.grant("bob", "write")
    alice_id = world.users["alice"]
    with world.client("alice") as alice, world.client("bob") as bob:
        mine = _record(alice, world.bot, "Alice's note for the bot")
        theirs = _record(bob, world.bot, "Bob's note for the bot")
        ray.get(engine.shard_for(alice_id).search_idle.remote())  # their vectors are stored
        pinned = _ok(
            alice.post(
                f"/v1/bots/{world.bot}/memory",
                json={"command": {"_tag": "Remember", "content": "Alice's pinned"}},
            ),
            201,
        )
        assert {mine["id"], theirs["id"], pinned["id"]} <= set(_memory(alice, world.bot))
        # Forgotten, it leaves a forget barrier (its fingerprint and evidence): purged too.
        forget = {"requestId": _rid(), "id": mine["id"], "expectedRevision": 1}
        _ok(alice.post(f"{WS}/memories/forget", json=forget))
        r = alice.post(f"/v1/bots/{world.bot}/memory/purge", json={"tag": f"from:{alice_id}"})
        assert _ok(r) == {"count": 2}
        assert set(_memory(alice, world.bot)) == {theirs["id"]}
        assert _at_rest(engine, tmp_path / "after-from", {mine["id"]}, f"bot:{world.bot}") == []
        listed = _ok(alice.get(f"{WS}/memories", params={"scope": "bot", "status": "all"}))
        assert [e["id"] for e in listed["entries"]] == [theirs["id"]]
        r = alice.get(f"{WS}/memories/{mine['id']}/revisions")
        assert r.status_code == 404, r.text
        assert _forget(alice, world.bot, mine["id"]).status_code == 409  # gone: not yours
        # The org tag: every record of the bot's org.
        r = bob.post(f"/v1/bots/{world.bot}/memory/purge", json={"tag": f"org:{world.org}"})
        assert _ok(r) == {"count": 1}
        assert _memory(alice, world.bot) == {} and _memory(bob, world.bot) == {}
        assert _ok(bob.get(f"{WS}/memories", params={"scope": "bot"}))["entries"] == []
        # Searches find nothing of them either.
        found = _ok(bob.get(f"{WS}/memories", params={"scope": "bot", "q": "note"}))
        assert found["entries"] == []
        assert _ok(bob.get(f"/v1/bots/{world.bot}/memory", params={"q": "note"}))["entries"] == []
    # Nothing is kept of them: the file tree of the stored data (records, their revisions and
    # barriers) has neither.
    for account in (alice_id, world.users["bob"]):
        files = _ok(admin.get("/v1/admin/export", params={"account": account}))["files"]
        for gone in ("note for the bot", mine["id"], theirs["id"]):
            assert gone not in json.dumps(files), [p for p, t in files.items() if gone in t]


def test_the_memory_log_shows_workspace_record_changes(world):
    """API-3: the log lists changes to every entry the caller sees, the bot's workspace
    records included: their creation, edit and forgetting, by a person."""
    world.grant("bob", "read")
    with world.client("alice") as alice, world.client("bob") as bob:
        record = _record(alice, world.bot, "Release on Fridays")
        change = {
            "requestId": _rid(),
            "id": record["id"],
            "expectedRevision": 1,
            "content": "Release on Thursdays",
        }
        _ok(alice.post(f"{WS}/memories", json=change))
        assert _forget(bob, world.bot, record["id"]).status_code == 200
        for client in (alice, bob):
            changes = _ok(client.get(f"/v1/bots/{world.bot}/memory/log"))["changes"]
            rows = [(c["entry"], c["version"], c["who"], c["change"]) for c in changes]
            assert rows == [
                (record["id"], 1, "person", "created"),
                (record["id"], 2, "person", "updated"),
                (record["id"], 3, "person", "retracted"),
            ], rows
    with world.client("carol") as carol:
        r = carol.get(f"/v1/bots/{world.bot}/memory/log")
        assert r.status_code in (403, 404)


# --- purging a chat takes what was learned from it, in every scope (API-5) -----------------------


def test_purging_a_chat_deletes_the_user_and_project_facts_learned_from_it(
    world, admin, model_stubs, engine, tmp_path
):
    """The memory bot learned a bot fact, a user fact (the person's own words) and a project
    fact from each of two chats; purging `chat:<first>` deletes the three learned from it,
    wherever they are kept, and keeps the second chat's."""
    import time

    import ray

    from tests.conftest import learning_bot

    mem = model_stubs["mem"]
    alice_id = world.users["alice"]
    bot, _ = learning_bot(world, admin, "Purger")
    said = {}  # chat id -> what alice said there

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        request = json.loads(body["messages"][-1]["content"])
        mine = [e for e in request["evidence"] if e["chat"] in said and e["kind"] == "person"]
        if not mine:
            return completion(None)
        chat, item, text = mine[-1]["chat"], mine[-1]["item"], mine[-1]["text"]
        items = [{"chat": chat, "item": item}]
        calls = [
            ("learn_fact", {"content": text, "items": items, "scope": "user"}),
            (
                "learn_fact",
                {"content": f"Team decided: {text}", "items": items, "scope": "project"},
            ),
            ("learn_fact", {"content": f"Bot knows: {text}", "items": items}),
        ]
        return completion(None, tool_calls=calls)

    def job_done(client, chat: str) -> dict:
        deadline = time.monotonic() + 30
        while True:
            jobs = [j for j in _ok(client.get(f"{WS}/memory-jobs"))["jobs"] if j["chat"] == chat]
            if jobs and jobs[0]["status"] in ("done", "failed"):
                return jobs[0]
            assert time.monotonic() < deadline, jobs
            time.sleep(0.05)

    mem.routes.append(mem_route)
    try:
        with world.client("alice") as alice:
            project = _ok(
                alice.post(f"{WS}/projects", json={"requestId": _rid(), "name": "Purge plan"}), 201
            )
            chats = []
            for text in ("I keep my passport in the blue drawer", "I water the plants on Sundays"):
                chat = _ok(
                    alice.post("/v1/chats", json={"bot": bot, "project": project["id"]}), 201
                )
                said[chat["id"]] = text
                chats.append(chat["id"])
                _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": text}))
                ray.get(engine.shard_for(alice_id).learning_idle.remote())
                job = job_done(alice, chat["id"])
                assert job["status"] == "done" and not job["rejections"], json.dumps(job)

            def contents(scope: str, **params) -> set[str]:
                got = _ok(alice.get(f"{WS}/memories", params={"scope": scope, **params}))
                return {e["content"] for e in got["entries"]}

            first, second = said[chats[0]], said[chats[1]]
            assert contents("user") == {first, second}
            assert contents("project", project=project["id"]) == {
                f"Team decided: {first}",
                f"Team decided: {second}",
            }
            user_fact = next(
                e
                for e in _ok(alice.get(f"{WS}/memories", params={"scope": "user"}))["entries"]
                if e["content"] == first
            )
            bot_fact = next(
                i for i, e in _memory(alice, bot).items() if e["content"] == f"Bot knows: {first}"
            )
            # A semantic search embeds the bot's learned entries (their vectors are stored).
            _ok(alice.get(f"{WS}/memories", params={"scope": "bot", "q": "passport drawer"}))
            learned = f"bot:{bot}#learned"
            ray.get(engine.shard_for(alice_id).search_idle.remote())  # the records' vectors too
            assert _at_rest(engine, tmp_path / "before", {bot_fact}, learned) != []
            r = alice.post(f"/v1/bots/{bot}/memory/purge", json={"tag": f"chat:{chats[0]}"})
            assert _ok(r) == {"count": 3}
            assert _at_rest(engine, tmp_path / "after", {bot_fact}, learned) == []
            assert (
                _at_rest(engine, tmp_path / "after-user", {user_fact["id"]}, f"user:{alice_id}")
                == []
            )
            assert contents("user", status="all") == {second}
            assert contents("project", project=project["id"], status="all") == {
                f"Team decided: {second}"
            }
            bot_facts = {e["content"] for e in _memory(alice, bot).values()}
            assert bot_facts == {f"Bot knows: {second}"}
            r = alice.get(f"{WS}/memories/{user_fact['id']}/revisions")
            assert r.status_code == 404, r.text
            found = _ok(alice.get(f"{WS}/memories", params={"scope": "user", "q": "passport"}))
            assert found["entries"] == []
        # The stored data keep the chat's words in the chat only (a purge leaves the chat).
        files = _ok(admin.get("/v1/admin/export", params={"account": alice_id}))["files"]
        kept = [p for p, text in files.items() if "passport" in text]
        assert kept == [f"bot-workspace/{alice_id}/chats/{chats[0]}/items.md"], kept
    finally:
        mem.routes.remove(mem_route)
