"""One ranker everywhere: the workspace search, a bot's memory search, the bot's
`workspace_memory_search`, the prompt beyond its budget and chat history search order one query
the same way for the same reader; a group chat linked to a project packs and searches the
project's memory under its membership rules (SC-5). Real server: Ray actors, DuckDB files,
uvicorn, the model and embedding stubs (hybrid search)."""

from __future__ import annotations

import json
import secrets

import pytest

from tests.conftest import _ok
from tests.openai_stub import completion

pytestmark = pytest.mark.ray

WS = "/api/app/workspace"
# Texts that share the query's words in different measure: no two score alike by BM25 or by
# cosine under the stub's embedding (a tie would be broken by ids, which differ between paths).
TEXTS = [
    "The harbour ferry leaves at dawn",
    "Ferry tickets for the harbour ferry are sold at the harbour kiosk",
    "A ferry strike is planned for the spring",
    "The lighthouse keeper rows across the harbour every evening after supper",
    "Bus timetable for the airport",
    "Harbour",
    "Ferry ferry ferry: the timetable changed for the winter season",
]
QUERY = "harbour ferry timetable"


def _remember(client, **body) -> dict:
    return _ok(client.post(f"{WS}/memories", json={"requestId": secrets.token_hex(6), **body}))


def _bot(admin, world, name: str, owner: str = "alice") -> str:
    body = {"name": name, "org": world.org, "owner": world.users[owner], "model": "bot"}
    return _ok(admin.post("/v1/admin/bots", json=body))["id"]


class Stub:
    """The bot model for one bot (by name): calls `tool` with `args` when the person's text
    starts with "tool:", else says "Sure."; keeps every request made for the bot."""

    def __init__(self, model, name: str) -> None:
        self.name = name
        self.seen: list[dict] = []
        model.routes.append(self.route)

    def route(self, body):
        if not body["messages"][0]["content"].startswith(f"You are {self.name}."):
            return None
        self.seen.append(body)
        last = body["messages"][-1]
        if last["role"] == "tool":
            return completion("Done.")
        text = str(last.get("content") or "")
        if text.startswith("tool:"):
            tool, _, query = text.removeprefix("tool:").partition(" ")
            return completion(None, tool_calls=[(tool, {"query": query})])
        return completion("Sure.")

    def tool_result(self) -> dict:
        return json.loads(self.seen[-1]["messages"][-1]["content"])

    def system(self) -> str:
        return self.seen[-1]["messages"][0]["content"]


def test_every_memory_path_orders_a_query_the_same_way(world, admin, bot_model, engine):
    name = f"Ranker{secrets.token_hex(3)}"
    bot = _bot(admin, world, name)
    stub = Stub(bot_model, name)
    with world.client("alice") as alice:
        for n, text in enumerate(TEXTS):
            if n % 2:  # learned-like entries of the bot's one memory, and workspace records
                r = alice.post(
                    f"/v1/bots/{bot}/memory",
                    json={"command": {"_tag": "Remember", "content": text}},
                )
                assert r.status_code == 201, r.text
            else:
                _remember(alice, scope="bot", bot=bot, content=text, tier="note")
        _embedded(engine)
        q = {"q": QUERY, "limit": 50}
        workspace = _ok(alice.get(f"{WS}/memories", params={**q, "scope": "bot", "bot": bot}))
        memory = _ok(alice.get(f"/v1/bots/{bot}/memory", params=q))
        ranked = [e["content"] for e in workspace["entries"]]
        assert len(ranked) >= 5 and "Bus timetable for the airport" in ranked  # both retrievers
        assert [e["content"] for e in memory["entries"]] == ranked
        assert [e["foundBy"] for e in memory["entries"]] == [
            e["foundBy"] for e in workspace["entries"]
        ]
        chat = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        _ok(alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "tool:" + _tool(QUERY)}))
        found = [e["content"] for e in stub.tool_result()["entries"]]
        assert found == ranked[: len(found)] and len(found) == min(10, len(ranked))


def _embedded(engine) -> None:
    """Every shard's background embedding done: all records have their vectors, so each
    search below ranks the same vectors (a search embeds inline only the newest writes)."""
    import ray

    ray.get([s.search_idle.remote() for s in engine.shards], timeout=60)


def _tool(query: str) -> str:
    return f"workspace_memory_search {query}"


def test_the_prompt_beyond_its_budget_takes_what_the_input_finds_first(
    world, admin, bot_model, engine
):
    """More log entries than the budget holds: the ones the turn's input ranks first are in
    the prompt (the same order as the memory search), the newest filler is not all there."""
    name = f"Packer{secrets.token_hex(3)}"
    bot = _bot(admin, world, name)
    stub = Stub(bot_model, name)
    filler = "A line about the weather and nothing else, repeated to fill the prompt. " * 6
    with world.client("alice") as alice:
        for text in TEXTS:
            _remember(alice, scope="bot", bot=bot, content=text, tier="log")
        for n in range(50):  # newer: first in the packing order without a query
            _remember(alice, scope="bot", bot=bot, content=f"{n} {filler}", tier="log")
        _embedded(engine)
        chat = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        _ok(alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": QUERY}))
        system = stub.system()
        ranked = _ok(alice.get(f"/v1/bots/{bot}/memory", params={"q": QUERY, "limit": 50}))
        top = [e["content"] for e in ranked["entries"] if e["content"] in TEXTS][:4]
        assert top and all(t in system for t in top)
        assert sum(f"{n} A line" in system for n in range(50)) < 50  # it did not all fit


def test_enrichment_beyond_its_context_takes_what_the_input_finds_first(
    world, admin, model_stubs, engine
):
    """The memory bot's enrichment context, when the bot's memory does not fit it, holds the
    entries the input ranks first by the memory search (semantic ones included)."""
    mem = model_stubs["mem"]
    r = admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"botMemoryModel": "mem"}})
    assert r.status_code == 200, r.text
    bot = _bot(admin, world, f"Enricher{secrets.token_hex(3)}")
    token = secrets.token_hex(4)
    asked: list[dict] = []

    def route(body):
        if token in body["messages"][-1]["content"] and "Rewrite" in body["messages"][0]["content"]:
            asked.append(json.loads(body["messages"][-1]["content"]))
            return completion("No rewrite.")
        return None

    mem.routes.append(route)
    filler = "A line about the weather and nothing else, repeated to fill the context. " * 6
    try:
        with world.client("alice") as alice:
            for text in TEXTS:
                _remember(alice, scope="bot", bot=bot, content=text, tier="log")
            for n in range(30):
                _remember(alice, scope="bot", bot=bot, content=f"{n} {filler}", tier="log")
            _embedded(engine)
            chat = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
            text = f"{QUERY} {token}"
            _ok(alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": text}))
            ranked = _ok(alice.get(f"/v1/bots/{bot}/memory", params={"q": text, "limit": 50}))
    finally:
        mem.routes.remove(route)
    (given,) = asked
    context = {e["content"] for e in given["entries"]}
    top = [e["content"] for e in ranked["entries"]][:4]
    assert top and set(top) <= context
    assert sum("weather" in c for c in context) < 30  # not all fit


def test_chat_search_ranks_items_as_the_workspace_ranks_the_same_texts(world, admin, engine):
    bot = _bot(admin, world, f"Echo{secrets.token_hex(3)}")
    with world.client("alice") as alice:
        chat = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        for text in TEXTS:
            turn = _ok(alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": text}))
            for item in turn["items"]:
                _remember(alice, scope="user", bot=bot, content=item["text"], tier="note")
        _embedded(engine)
        for using in ("keyword", "all"):
            q = {"q": QUERY, "limit": 50, "using": using}
            items = _ok(alice.get(f"/v1/chats/{chat}/items", params=q))["items"]
            records = _ok(alice.get(f"{WS}/memories", params={**q, "scope": "user"}))["entries"]
            found = [(i["text"], i["foundBy"]) for i in items]
            assert found and found == [(r["content"], r["foundBy"]) for r in records], using
            assert [i["score"] for i in items] == pytest.approx([r["score"] for r in records])
        assert any("semantic" in i["foundBy"] for i in items)  # hybrid: both retrievers


def test_a_group_linked_to_a_project_packs_and_searches_its_memory(world, admin, bot_model):
    """SC-5: the bots of a group whose channel is linked to a project see the project's
    profile in their prompt and find its notes with `workspace_memory_search`; a group of the
    same people not linked to it sees neither; another project linked elsewhere stays out."""
    users = world.users
    name = f"Grouper{secrets.token_hex(3)}"
    bot = _bot(admin, world, name)
    stub = Stub(bot_model, name)
    people = [users["alice"], users["carol"]]

    def channel() -> str:
        body = {"org": world.org, "people": people, "bots": [bot]}
        return _ok(admin.post("/v1/admin/channels", json=body))["id"]

    linked, plain = channel(), channel()
    with world.client("alice") as alice, world.client("carol") as carol:
        project = _ok(
            alice.post(
                f"{WS}/projects",
                json={
                    "requestId": secrets.token_hex(6),
                    "name": f"Bluebird {secrets.token_hex(2)}",
                    "members": people,
                    "channels": [linked],
                },
            )
        )["id"]
        elsewhere = _ok(
            alice.post(
                f"{WS}/projects",
                json={"requestId": secrets.token_hex(6), "name": "Private", "members": people},
            )
        )["id"]
        _remember(alice, scope="project", bot=bot, project=project, content="Codename Bluebird.")
        _remember(
            alice,
            scope="project",
            bot=bot,
            project=project,
            content="The Bluebird budget is forty thousand.",
            tier="note",
        )
        _remember(
            alice,
            scope="project",
            bot=bot,
            project=elsewhere,
            content="The unlinked budget is secret.",
            tier="note",
        )
        # Alice's own entry of the bot's memory: hers, never the room's.
        r = alice.post(
            f"/v1/bots/{bot}/memory",
            json={"command": {"_tag": "Remember", "content": "Alice's own budget worry."}},
        )
        assert r.status_code == 201, r.text
        group = _ok(carol.post("/v1/chats", json={"channel": linked}))["id"]
        _ok(carol.post(f"/v1/chats/{group}/turns?wait=true", json={"text": "Hello"}))
        assert "Codename Bluebird." in stub.system()
        assert "worry" not in stub.system()
        _ok(
            alice.post(
                f"/v1/chats/{group}/turns?wait=true", json={"text": "tool:" + _tool("budget")}
            )
        )
        found = [e["content"] for e in stub.tool_result()["entries"]]
        assert found == ["The Bluebird budget is forty thousand."]

        other = _ok(alice.post("/v1/chats", json={"channel": plain}))["id"]
        _ok(alice.post(f"/v1/chats/{other}/turns?wait=true", json={"text": "Hello"}))
        assert "Bluebird" not in stub.system()
        _ok(
            alice.post(
                f"/v1/chats/{other}/turns?wait=true", json={"text": "tool:" + _tool("budget")}
            )
        )
        assert stub.tool_result()["entries"] == []
