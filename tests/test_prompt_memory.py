"""SC-5 in a live turn: the bot's prompt carries its own, the person's and the chat's project
memory within one budget; a group sees only the bot's own scope; what is left out is found with
`workspace_memory_search`."""

from __future__ import annotations

import json
import re
import secrets

from tests.openai_stub import completion

WS = "/api/app/workspace"


def _remember(client, **body) -> dict:
    r = client.post(f"{WS}/memories", json={"requestId": secrets.token_hex(6), **body})
    assert r.status_code == 201, r.text
    return r.json()


def test_direct_prompts_pack_the_scopes_and_groups_keep_people_private(world, admin, bot_model):
    tag = secrets.token_hex(3)
    name = f"Packer{tag}"
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
    ).json()["id"]
    admin.post(
        "/v1/admin/grants", json={"bot": bot, "user": world.users["bob"], "permission": "read"}
    )
    seen: list = []

    def route(body):
        if not body["messages"][0]["content"].startswith(f"You are {name}."):
            return None
        seen.append(body)
        if body["messages"][-1]["role"] == "tool":
            return completion("Found it.")
        if "search" in str(body["messages"][-1]["content"]):
            args = {"query": "marmalade"}
            return completion(None, tool_calls=[("workspace_memory_search", args)])
        return completion("Hello.")

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        _remember(alice, scope="bot", bot=bot, content="I answer briefly.", tier="profile")
        _remember(alice, scope="user", bot=bot, content="Alice is vegetarian.", tier="profile")
        _remember(alice, scope="user", bot=bot, content="Alice hates marmalade.", tier="note")
        chat = alice.post("/v1/chats", json={"bot": bot}).json()
        alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Dinner ideas?"})
        system = seen[-1]["messages"][0]["content"]
        assert "I answer briefly." in system and "Alice is vegetarian." in system
        assert re.search(r"^- \(\d{4}-\d{2}-\d{2}\) Alice is vegetarian\. \[user:", system, re.M)
        assert "marmalade" not in system  # a note is never packed: search finds it
        alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "please search"})
        found = json.loads(seen[-1]["messages"][-1]["content"])
        assert [e["content"] for e in found["entries"]] == ["Alice hates marmalade."]
    with world.client("bob") as bob:  # bob's chat with the same bot: not alice's memory
        chat = bob.post("/v1/chats", json={"bot": bot}).json()
        bob.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "Dinner ideas?"})
        system = seen[-1]["messages"][0]["content"]
        assert "I answer briefly." in system and "vegetarian" not in system
    channel = admin.post(
        "/v1/admin/channels",
        json={
            "org": world.org,
            "people": [world.users["alice"], world.users["bob"]],
            "bots": [bot],
        },
    ).json()
    with world.client("alice") as alice:
        group = alice.post("/v1/chats", json={"channel": channel["id"]}).json()
        alice.post(f"/v1/chats/{group['id']}/turns?wait=true", json={"text": "Dinner ideas?"})
        system = seen[-1]["messages"][0]["content"]
        assert "I answer briefly." in system and "vegetarian" not in system


def test_a_chat_selects_only_a_project_of_its_person_and_packs_its_memory(world, admin, bot_model):
    tag = secrets.token_hex(3)
    name = f"Proj{tag}"
    bot = admin.post(
        "/v1/admin/bots",
        json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
    ).json()["id"]
    admin.post(
        "/v1/admin/grants", json={"bot": bot, "user": world.users["bob"], "permission": "read"}
    )
    seen: list = []

    def route(body):
        if body["messages"][0]["content"].startswith(f"You are {name}."):
            seen.append(body)
            return completion("Sure.")
        return None

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        project = alice.post(
            f"{WS}/projects", json={"requestId": secrets.token_hex(6), "name": f"Apollo {tag}"}
        ).json()
        _remember(
            alice,
            scope="project",
            bot=bot,
            project=project["id"],
            content="We ship on Thursdays.",
            tier="profile",
        )
        chat = alice.post("/v1/chats", json={"bot": bot, "project": project["id"]})
        assert chat.status_code == 201, chat.text
        alice.post(f"/v1/chats/{chat.json()['id']}/turns?wait=true", json={"text": "When?"})
        assert "We ship on Thursdays." in seen[-1]["messages"][0]["content"]
    with world.client("bob") as bob:  # not a member: cannot select it, so never sees it
        r = bob.post("/v1/chats", json={"bot": bot, "project": project["id"]})
        assert r.status_code == 404
