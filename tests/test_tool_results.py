"""Tool results as sources (MEM-3, LRN-9, ACL-5).

A bot's app tool calls and their results are stored as `tool_result` chat items of the turn,
authored by the tool. Learning may cite one beside what a person said, and the fact then carries
`app:<tool>`; a tool result alone never becomes memory.
"""

from __future__ import annotations

import json
import time

import ray

from tests.conftest import learning_bot
from tests.openai_stub import completion

WS = "/api/app/workspace"


def _ok(r, code=200):
    assert r.status_code == code, r.text
    return r.json()


def test_mem3_tool_results_are_chat_items_and_support_a_persons_fact_with_app_provenance(
    world, admin, model_stubs, engine
):
    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    alice_id = world.users["alice"]
    bot, name = learning_bot(world, admin, "Tooler")
    box: dict = {}
    seen: list[dict] = []

    def bot_route(body):
        if not body["messages"][0]["content"].startswith(f"You are {name}."):
            return None
        if body["messages"][-1]["role"] == "tool":
            return completion("Nothing stored about your flight yet.")
        args = {"query": "flight"}
        calls = [("workspace_memory_search", args), ("no_such_tool", {"x": 1})]
        return completion(None, tool_calls=calls)

    def mem_route(body):
        if "You keep a bot's memory" not in body["messages"][0]["content"]:
            return None
        request = json.loads(body["messages"][-1]["content"])
        evidence = [e for e in request["evidence"] if e["chat"] == box.get("chat")]
        if not evidence:
            return None
        seen.append(request)
        person = next(e for e in evidence if e["kind"] == "person")
        tool = next(e for e in evidence if e["kind"] == "tool_result")
        ref = lambda e: {"chat": e["chat"], "item": e["item"]}  # noqa: E731
        calls = [
            # A tool result alone: refused (LRN-9).
            ("learn_fact", {"content": "Memory holds no flight", "items": [ref(tool)]}),
            # What the person said, supported by the tool result: kept, with app:<tool>.
            (
                "learn_fact",
                {"content": "Alice flies to Oslo on Friday", "items": [ref(person), ref(tool)]},
            ),
        ]
        return completion(None, tool_calls=calls)

    bot_model.routes.append(bot_route)
    mem.routes.append(mem_route)
    try:
        with world.client("alice") as alice:
            chat = _ok(alice.post("/v1/chats", json={"bot": bot}), 201)
            box["chat"] = chat["id"]
            text = "I fly to Oslo on Friday, do you remember my flight?"
            done = _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": text}))
            kinds = [(i["kind"], i["author"]) for i in done["items"]]
            # The made-up tool is not recorded; the real one is, before the reply.
            assert kinds == [
                ("person", alice_id),
                ("tool_result", "workspace_memory_search"),
                ("bot", bot),
            ]
            items = _ok(alice.get(f"/v1/chats/{chat['id']}/items"))["items"]
            tool_item = next(i for i in items if i["kind"] == "tool_result")
            recorded = json.loads(tool_item["text"])
            assert recorded["tool"] == "workspace_memory_search"
            assert json.loads(recorded["arguments"]) == {"query": "flight"}
            assert json.loads(recorded["result"]) == {"entries": []}

            ray.get(engine.shard_for(alice_id).learning_idle.remote())
            deadline = time.monotonic() + 20
            while True:
                jobs = _ok(alice.get(f"{WS}/memory-jobs"))["jobs"]
                job = next((j for j in jobs if j["chat"] == chat["id"]), None)
                if job and job["status"] in ("done", "failed"):
                    break
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert job["status"] == "done" and job["error"] == "1 proposed change(s) rejected"
            (entry,) = _ok(alice.get(f"/v1/bots/{bot}/memory"))["entries"]
            assert entry["content"] == "Alice flies to Oslo on Friday"
            assert "app:workspace_memory_search" in entry["tags"]
            assert f"from:{alice_id}" in entry["tags"]
            assert "from:workspace_memory_search" not in entry["tags"]
            assert entry["sources"] == [
                {"chat": chat["id"], "item": "i-1"},
                {"chat": chat["id"], "item": tool_item["id"]},
            ]
            # Tags select it like any system tag.
            tagged = alice.get(
                f"/v1/bots/{bot}/memory", params={"tags": "app:workspace_memory_search"}
            )
            assert [e["id"] for e in _ok(tagged)["entries"]] == [entry["id"]]
        with world.client("bob") as bob:  # the chat's items are Alice's
            assert bob.get(f"/v1/chats/{chat['id']}/items").status_code in (403, 404)
    finally:
        bot_model.routes.remove(bot_route)
        mem.routes.remove(mem_route)
