"""One memory per bot (MEM-1, SC-1, SC-5, ENR-1, ENR-2, ENR-5, ACL-1, ACL-7).

A bot's learned facts and the records a person wrote for it through the workspace are one
memory: every reader of the bot's memory sees both, each under its visibility rule, in the
prompt, the memory view, the workspace listing, search, the export and enrichment; nobody
sees more than before.
"""

from __future__ import annotations

import json
import secrets
import time

import ray

from tests.conftest import learning_bot, user_client
from tests.openai_stub import completion

WS = "/api/app/workspace"
SAID = "My dog is called Biscuit and she is nine"
FACT = "Alice's dog Biscuit is nine years old"


def _ok(r, code=200):
    assert r.status_code == code, r.text
    return r.json()


def _job_done(client, chat: str) -> dict:
    deadline = time.monotonic() + 20
    while True:
        jobs = [j for j in _ok(client.get(f"{WS}/memory-jobs"))["jobs"] if j["chat"] == chat]
        if jobs and jobs[0]["status"] in ("done", "failed"):
            return jobs[0]
        assert time.monotonic() < deadline, jobs
        time.sleep(0.05)


def _contents(entries) -> list[str]:
    return [e["content"] for e in entries]


def test_mem1_a_learned_bot_fact_is_in_every_view_of_the_bots_one_memory(
    world, admin, model_stubs, engine
):
    """MEM-1/SC-1/SC-5/ENR-5: a fact the memory bot learned into the bot's pool reaches the
    prompt, `GET /v1/bots/:id/memory`, the workspace listing (scope=bot), its search, the bot's
    `workspace_memory_search` and the Markdown export of the person it is for, and nobody
    else's."""
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    alice_id = world.users["alice"]
    bot, name = learning_bot(world, admin, "Keeper")
    _ok(
        admin.post(
            "/v1/admin/grants", json={"bot": bot, "user": world.users["bob"], "permission": "read"}
        ),
        201,
    )
    box: dict = {}
    prompts: list[dict] = []

    def mem_route(body):
        system = body["messages"][0]["content"]
        if "You keep a bot's memory" not in system:
            return None
        request = json.loads(body["messages"][-1]["content"])
        mine = [e for e in request["evidence"] if e["chat"] == box.get("chat")]
        if not any(e["text"] == SAID for e in mine):
            return completion(None)  # bob's turns: nothing to learn
        items = [{"chat": box["chat"], "item": e["item"]} for e in mine if e["text"] == SAID]
        return completion(
            None, tool_calls=[("learn_fact", {"content": FACT, "items": items, "topics": ["pets"]})]
        )

    def bot_route(body):
        if not body["messages"][0]["content"].startswith(f"You are {name}."):
            return None
        prompts.append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            return completion("Found it.")
        if "look it up" in str(last["content"]):
            return completion(None, tool_calls=[("workspace_memory_search", {"query": "biscuit"})])
        return completion("Nice.")

    mem.routes.append(mem_route)
    bot_model.routes.append(bot_route)
    try:
        with world.client("alice") as alice:
            chat = _ok(alice.post("/v1/chats", json={"bot": bot}), 201)
            box["chat"] = chat["id"]
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": SAID}))
            ray.get(engine.shard_for(alice_id).learning_idle.remote())
            assert _job_done(alice, chat["id"])["status"] == "done"

            # The memory view.
            (entry,) = _ok(alice.get(f"/v1/bots/{bot}/memory"))["entries"]
            assert entry["content"] == FACT and entry["layer"] == "fact"
            # The prompt of the next turn (SC-5).
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Hi"}))
            system = prompts[-1]["messages"][0]["content"]
            assert FACT in system and "## Bot memory" in system
            # The workspace listing of the bot scope: the same entry, with its provenance.
            (record,) = _ok(alice.get(f"{WS}/memories", params={"scope": "bot", "bot": bot}))[
                "entries"
            ]
            assert record["id"] == entry["id"] and record["content"] == FACT
            assert record["pool"] == f"bot:{bot}" and record["contributor"] == bot
            assert record["layer"] == "fact" and record["origin"] == "synthesized"
            assert record["evidence"] == [f"{chat['id']}/i-1"]
            assert f"for:person:{alice_id}" in record["tags"] and "pets" in record["topics"]
            # Its search, and the bot's own search tool.
            found = _ok(alice.get(f"{WS}/memories", params={"scope": "bot", "q": "Biscuit"}))
            assert _contents(found["entries"]) == [FACT]
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "look it up"}))
            result = json.loads(prompts[-1]["messages"][-1]["content"])
            assert _contents(result["entries"]) == [FACT]
            # The Markdown export.
            text = alice.get(f"{WS}/memory-export").text
            assert f") {FACT}" in text

        # Bob uses the same bot: Alice's fact is for her only (ACL-1, ACL-7).
        with world.client("bob") as bob:
            assert _ok(bob.get(f"/v1/bots/{bot}/memory"))["entries"] == []
            assert _ok(bob.get(f"{WS}/memories", params={"scope": "bot"}))["entries"] == []
            assert FACT not in bob.get(f"{WS}/memory-export").text
            found = _ok(bob.get(f"{WS}/memories", params={"scope": "bot", "q": "Biscuit"}))
            assert found["entries"] == []
            chat = _ok(bob.post("/v1/chats", json={"bot": bot}), 201)
            _ok(bob.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "look it up"}))
            assert FACT not in prompts[-2]["messages"][0]["content"]
            assert json.loads(prompts[-1]["messages"][-1]["content"])["entries"] == []
            forget = {"requestId": "r-" + secrets.token_hex(4), "id": record["id"]}
            r = bob.post(f"{WS}/memories/forget", json={**forget, "expectedRevision": 1})
            assert r.status_code == 404, r.text  # not his: not found

        # The workspace routes reach the learned entry too: forgetting it is the memory API's
        # Forget (by revision); its words are the memory bot's, not an edit's.
        with world.client("alice") as alice:
            edit = {"requestId": "r-" + secrets.token_hex(4), "id": record["id"]}
            r = alice.post(f"{WS}/memories", json={**edit, "expectedRevision": 1, "content": "x"})
            assert r.status_code == 409 and r.json()["error"]["code"] == "learned_entry"
            forget = {"requestId": "r-" + secrets.token_hex(4), "id": record["id"]}
            r = alice.post(f"{WS}/memories/forget", json={**forget, "expectedRevision": 7})
            assert r.status_code == 409 and r.json()["error"]["code"] == "stale_revision"
            gone = _ok(alice.post(f"{WS}/memories/forget", json={**forget, "expectedRevision": 1}))
            assert gone["status"] == "forgotten" and gone["revision"] == 2
            assert _ok(alice.get(f"{WS}/memories", params={"scope": "bot"}))["entries"] == []
            (old,) = _ok(alice.get(f"/v1/bots/{bot}/memory"))["entries"]
            assert old["status"] == "retracted"  # history stays visible to her (MEM-4)
            assert FACT not in alice.get(f"{WS}/memory-export").text
    finally:
        mem.routes.remove(mem_route)
        bot_model.routes.remove(bot_route)


def test_mem1_an_owners_workspace_bot_record_is_used_by_enrichment_and_never_widened(
    world, admin, model_stubs
):
    """MEM-1/ENR-1/ENR-2: a bot-scope record the owner wrote through the workspace carries the
    system tags `from:<owner>`, `for:bot`, `org:<bot's org>`: it is in the memory view of
    everyone who uses the bot in that org, its enrichment uses it; a user of the bot reading as
    another of their orgs does not see it, nor does someone who does not use the bot."""
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"botMemoryModel": "mem"}})
    alice_id = world.users["alice"]
    name = f"Helper{secrets.token_hex(3)}"
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": name, "org": world.org, "owner": alice_id, "model": "bot"},
        ),
        201,
    )["id"]
    other_org = _ok(admin.post("/v1/admin/orgs", json={"name": "elsewhere"}), 201)["id"]
    both = {"name": "dave", "orgs": [world.org, other_org]}
    dave = _ok(admin.post("/v1/admin/users", json=both), 201)
    for user in (world.users["bob"], dave["id"]):
        _ok(
            admin.post("/v1/admin/grants", json={"bot": bot, "user": user, "permission": "read"}),
            201,
        )
    note = "Deploys happen on Thursdays after the standup"
    sent: list[dict] = []

    def mem_route(body):
        if not body["messages"][0]["content"].startswith("Rewrite the person's whole input"):
            return None
        payload = json.loads(body["messages"][-1]["content"])
        if payload["input"] != "When do we deploy?":
            return None
        sent.append(payload)
        ids = [e["id"] for e in payload["entries"] if e["content"] == note]
        rewrite = {"text": "When do we deploy? (Deploys are on Thursdays.)", "entries": ids}
        return completion(None, tool_calls=[("rewrite", rewrite)])

    def bot_route(body):
        if body["messages"][0]["content"].startswith(f"You are {name}."):
            return completion("Thursday.")
        return None

    mem.routes.append(mem_route)
    bot_model.routes.append(bot_route)
    try:
        with world.client("alice") as alice:
            body = {"requestId": secrets.token_hex(6), "scope": "bot", "bot": bot, "content": note}
            record = _ok(alice.post(f"{WS}/memories", json=body), 201)
            assert record["layer"] == "pinned"
            assert set(record["tags"]) == {f"from:{alice_id}", "for:bot", f"org:{world.org}"}
        with world.client("bob") as bob:
            (entry,) = _ok(bob.get(f"/v1/bots/{bot}/memory"))["entries"]
            assert entry["id"] == record["id"] and entry["content"] == note
            assert entry["layer"] == "pinned" and "for:bot" in entry["tags"]
            chat = _ok(bob.post("/v1/chats", json={"bot": bot}), 201)
            turn = {"text": "When do we deploy?"}
            _ok(bob.post(f"/v1/chats/{chat['id']}/turns?wait=true", json=turn))
            assert [e["id"] for e in sent[-1]["entries"]] == [record["id"]]
            (enriched,) = _ok(bob.get(f"/v1/chats/{chat['id']}/enrichments"))["enrichments"]
            assert enriched["entries"] == [record["id"]]
        with user_client(world.server, dave["token"]) as dave_client:
            assert [e["id"] for e in _ok(dave_client.get(f"/v1/bots/{bot}/memory"))["entries"]] == [
                record["id"]
            ]
            elsewhere = {"OpenBot-Org": other_org}
            r = dave_client.get(f"/v1/bots/{bot}/memory", headers=elsewhere)
            assert r.status_code == 403, r.text  # only work in the bot's org sees it
        with world.client("carol") as carol:  # does not use the bot
            change = {"requestId": "r-" + secrets.token_hex(4), "id": record["id"]}
            r = carol.post(f"{WS}/memories/forget", json={**change, "expectedRevision": 1})
            assert r.status_code == 404, r.text
            assert _ok(carol.get(f"{WS}/memories", params={"scope": "bot"}))["entries"] == []
    finally:
        mem.routes.remove(mem_route)
        bot_model.routes.remove(bot_route)


def test_mem1_fs1_learned_entries_are_in_the_owners_file_tree_and_come_back_as_they_were(
    world, admin, model_stubs, engine, tmp_path
):
    """MEM-1/FS-1/FS-2: the account file tree of a bot's owner carries the bot's learned
    entries the owner may see (memory lines, records.json with their tags, sources and access
    proofs); another person's learned fact stays out; an import restores them with the same
    rule, and exporting again gives the same bytes."""
    import asyncio

    from actors.directory import DirectoryService
    from actors.shard.service import ShardService
    from engine.memory_entries import Reader
    from storage import file_import
    from storage.file_export import render_data_dir
    from storage.tree_files import write_tree

    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    admin.patch(
        f"/v1/admin/orgs/{world.org}",
        json={"settings": {"botMemoryModel": "mem", "autoRecord": True}},
    )
    alice_id, bob_id = world.users["alice"], world.users["bob"]
    name = f"Filer{secrets.token_hex(3)}"
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": name, "org": world.org, "owner": alice_id, "model": "bot"},
        ),
        201,
    )["id"]
    grant = {"bot": bot, "user": bob_id, "permission": "read"}
    _ok(admin.post("/v1/admin/grants", json=grant), 201)
    said = {alice_id: "I live in Lyon", bob_id: "I live in Porto"}

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        request = json.loads(body["messages"][-1]["content"])
        calls = [
            ("learn_fact", {"content": f"{e['author']} lives in {e['text'][10:]}", "items": [e]})
            for e in request["evidence"]
            if e["kind"] == "person" and said.get(e["author"]) == e["text"]
        ]
        if not calls:
            return None
        for _, args in calls:
            args["items"] = [{"chat": e["chat"], "item": e["item"]} for e in args["items"]]
        return completion(None, tool_calls=calls)

    def bot_route(body):
        if body["messages"][0]["content"].startswith(f"You are {name}."):
            return completion("Noted.")
        return None

    mem.routes.append(mem_route)
    bot_model.routes.append(bot_route)
    try:
        for who in ("alice", "bob"):
            with world.client(who) as c:
                chat = _ok(c.post("/v1/chats", json={"bot": bot}), 201)
                text = said[world.users[who]]
                _ok(c.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": text}))
                ray.get(engine.shard_for(alice_id).learning_idle.remote())
                assert _job_done(c, chat["id"])["status"] == "done"
    finally:
        mem.routes.remove(mem_route)
        bot_model.routes.remove(bot_route)
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}), 201)
    first = render_data_dir(backup, alice_id)
    base = f"bot-workspace/{alice_id}/agents/{bot}/memory"
    lines = "".join(d.decode() for p, d in first.items() if p.startswith(f"{base}/log/"))
    assert f") {alice_id} lives in Lyon\n" in lines
    assert not any(b"Porto" in d for d in first.values())  # Bob's fact is not Alice's
    (record,) = json.loads(first[f"{base}/.dreaming/records.json"])["records"]
    assert record["memory"]["layer"] == "fact"
    assert f"for:person:{alice_id}" in record["memory"]["tags"]
    assert record["memory"]["proofs"][0]["audience"] == [f"for:person:{alice_id}"]
    assert f"{base}/.dreaming/synthesized/{record['id']}.json" in first

    write_tree(tmp_path / "tree", first)
    file_import.import_tree(tmp_path / "tree", tmp_path / "new", shards=1)
    assert render_data_dir(tmp_path / "new") == first

    async def serve() -> None:
        svc = ShardService(tmp_path / "new", 0)
        svc.peers.connect(directory=DirectoryService(tmp_path / "new"))
        try:
            mine = Reader(user=alice_id, org=world.org, uses_bot=True)
            page = await svc.read_memory(f"bot:{bot}", mine)
            assert [e.content for e in page.entries] == [f"{alice_id} lives in Lyon"]
            theirs = Reader(user=bob_id, org=world.org, uses_bot=True)
            assert (await svc.read_memory(f"bot:{bot}", theirs)).entries == ()
        finally:
            await svc.close()
            svc.peers.directory().store.db.close()

    asyncio.run(serve())


def test_enr5_learning_and_search_go_through_the_pools_one_visibility_checked_read(
    world, admin, model_stubs, engine
):
    """ENR-5/LRN-7/ACL-3: the learning step's entries and the bot's `workspace_memory_search`
    come from the pool's one read. The memory bot sees the owner's workspace record as part of
    the bot's memory and may build an observation on it (visible to whoever sees every
    source); the bot's search finds both."""
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    alice_id = world.users["alice"]
    bot, name = learning_bot(world, admin, "Reader")
    note = "The staging server is called kestrel"
    requests: list[dict] = []
    results: list[dict] = []
    box: dict = {}

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        request = json.loads(body["messages"][-1]["content"])
        if not any(e["chat"] == box.get("chat") for e in request["evidence"]):
            return None
        requests.append(request)
        ids = [e["id"] for e in request["entries"] if e["content"] == note]
        calls = [
            (
                "learn_observation",
                {"content": "Staging is kestrel", "entries": ids, "confidence": 0.9},
            )
        ]
        return completion(None, tool_calls=calls)

    def bot_route(body):
        if not body["messages"][0]["content"].startswith(f"You are {name}."):
            return None
        if body["messages"][-1]["role"] == "tool":
            results.append(json.loads(body["messages"][-1]["content"]))
            return completion("Done.")
        if "find" in str(body["messages"][-1]["content"]):
            return completion(None, tool_calls=[("workspace_memory_search", {"query": "kestrel"})])
        return completion("Ok.")

    mem.routes.append(mem_route)
    bot_model.routes.append(bot_route)
    try:
        with world.client("alice") as alice:
            body = {"requestId": secrets.token_hex(6), "scope": "bot", "bot": bot, "content": note}
            record = _ok(alice.post(f"{WS}/memories", json=body), 201)
            chat = _ok(alice.post("/v1/chats", json={"bot": bot}), 201)
            box["chat"] = chat["id"]
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Hello"}))
            ray.get(engine.shard_for(alice_id).learning_idle.remote())
            assert _job_done(alice, chat["id"])["status"] == "done"
            assert [e["id"] for e in requests[-1]["entries"]] == [record["id"]]
            entries = _ok(alice.get(f"/v1/bots/{bot}/memory"))["entries"]
            (obs,) = [e for e in entries if e["layer"] == "observation"]
            assert obs["sources"] == [{"entry": record["id"]}] and "for:bot" in obs["tags"]
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "find it"}))
            found = {e["content"] for e in results[-1]["entries"]}
            assert found == {note, "Staging is kestrel"}
        with world.client("bob") as bob:  # does not use the bot: nothing
            assert bob.get(f"/v1/bots/{bot}/memory").status_code in (403, 404)
    finally:
        mem.routes.remove(mem_route)
        bot_model.routes.remove(bot_route)
