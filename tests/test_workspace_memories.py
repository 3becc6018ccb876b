"""Workspace memories end to end (SC-1..SC-3, FS-2, WA-1, WA-2, EV-1): real
server, actors and files. Who sees what: bot memory whoever uses the bot, user memory only the
account, project memory only the project's members — through the API, search, export, events."""

from __future__ import annotations

import asyncio
import re
import secrets

import pytest
import ray

from gateway.client import EventClient
from tests.conftest import user_client

WS = "/api/app/workspace"
LINE = re.compile(r"^- \(\d{4}-\d{2}-\d{2}\) \S.*$")


def _rid() -> str:
    return "r-" + secrets.token_hex(6)


def _create(client, **body) -> dict:
    r = client.post(f"{WS}/memories", json={"requestId": _rid(), **body})
    assert r.status_code == 201, r.text
    return r.json()


def _list(client, **params) -> list[dict]:
    r = client.get(f"{WS}/memories", params=params)
    assert r.status_code == 200, r.text
    return r.json()["entries"]


def _contents(client, **params) -> list[str]:
    return [e["content"] for e in _list(client, **params)]


def _export(client) -> str:
    r = client.get(f"{WS}/memory-export")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/markdown")
    return r.text


def _project(world, owner: str, *members: str) -> str:
    with world.client(owner) as c:
        r = c.post(
            f"{WS}/projects",
            json={
                "requestId": _rid(),
                "name": "Launch",
                "members": [world.users[m] for m in members],
            },
        )
        assert r.status_code == 201, r.text
        return r.json()["id"]


@pytest.fixture
def team(world):
    """Alice owns the bot; Bob and Carol use it (read grants). Alice and Bob are in a project,
    Carol is not."""
    world.grant("bob", "read")
    world.grant("carol", "read")
    world.project = _project(world, "alice", "bob")
    return world


def test_project_member_sees_project_memory_non_member_does_not(team):
    w = team
    with w.client("alice") as alice, w.client("bob") as bob, w.client("carol") as carol:
        fact = _create(
            alice,
            scope="project",
            bot=w.bot,
            project=w.project,
            content="Launch moves to Friday the 13th.",
            topics=["launch"],
        )
        assert fact["pool"] == f"project:{w.project}" and fact["scope"] == "project"
        assert fact["contributor"] == w.bot and fact["protected"] and fact["revision"] == 1
        # The member: by scope, by project, through search, in the export.
        assert _contents(bob, scope="project") == ["Launch moves to Friday the 13th."]
        assert [e["id"] for e in _list(bob, scope="project", project=w.project)] == [fact["id"]]
        assert [e["id"] for e in _list(bob, q="friday")] == [fact["id"]]
        assert "- (" in _export(bob) and "Launch moves to Friday the 13th." in _export(bob)
        # The non-member (who uses the same bot): nothing anywhere.
        assert _list(carol, scope="project") == []
        assert fact["id"] not in [e["id"] for e in _list(carol)]
        assert _list(carol, q="friday") == []
        assert "Friday" not in _export(carol)
        r = carol.get(f"{WS}/memories", params={"scope": "project", "project": w.project})
        assert r.status_code == 404 and r.json()["error"]["code"] == "project_not_found"
        r = carol.get(f"{WS}/memories/{fact['id']}/revisions")
        assert r.status_code == 404
        change = {"requestId": _rid(), "id": fact["id"], "expectedRevision": 1, "content": "x"}
        assert carol.post(f"{WS}/memories", json=change).status_code == 404
        forget = {"requestId": _rid(), "id": fact["id"], "expectedRevision": 1}
        assert carol.post(f"{WS}/memories/forget", json=forget).status_code == 404
        r = carol.post(
            f"{WS}/memories",
            json={
                "requestId": _rid(),
                "scope": "project",
                "bot": w.bot,
                "project": w.project,
                "content": "sneaky",
            },
        )
        assert r.status_code == 404
        assert _contents(alice, scope="project") == ["Launch moves to Friday the 13th."]


def test_project_memory_events_reach_members_only(team):
    w = team

    async def scenario():
        bob_c = EventClient(w.server.url, w.tokens["bob"])
        carol_c = EventClient(w.server.url, w.tokens["carol"])
        bob_it, carol_it = aiter(bob_c), aiter(carol_c)
        bob_next = asyncio.ensure_future(asyncio.wait_for(bob_it.__anext__(), 10))
        carol_next = asyncio.ensure_future(asyncio.wait_for(carol_it.__anext__(), 10))
        await asyncio.sleep(0.5)  # both connected and live
        with w.client("alice") as alice:
            fact = await asyncio.to_thread(
                _create,
                alice,
                scope="project",
                bot=w.bot,
                project=w.project,
                content="The budget is 40k.",
            )
        frame = await bob_next
        assert frame.type == "memory.changed"
        assert frame.data == {
            "pool": f"project:{w.project}",
            "entry": fact["id"],
            "version": 1,
            "change": "created",
            "bot": w.bot,
        }
        assert "40k" not in str(frame)  # events carry ids, never content
        # Carol's first event is her own user memory, written after the project's.
        with w.client("carol") as carol:
            mine = await asyncio.to_thread(
                _create, carol, scope="user", bot=w.bot, content="I prefer tea."
            )
        frame = await carol_next
        assert frame.data["pool"] == f"user:{w.users['carol']}"
        assert frame.data["entry"] == mine["id"]
        await bob_c.close()
        await carol_c.close()

    asyncio.run(scenario())


def test_bot_and_user_scopes_follow_use_and_account(team):
    w = team
    with w.client("alice") as alice, w.client("bob") as bob:
        bot_fact = _create(alice, scope="bot", bot=w.bot, content="Answers in English.")
        user_fact = _create(alice, scope="user", bot=w.bot, content="Call me Al.", tier="log")
        assert bot_fact["pool"] == f"bot:{w.bot}"
        assert user_fact["pool"] == f"user:{w.users['alice']}" and user_fact["tier"] == "log"
        # Bob uses the bot: he sees its bot memory, never Alice's user memory.
        assert _contents(bob, scope="bot", bot=w.bot) == ["Answers in English."]
        assert _list(bob, scope="user") == []
        assert "Call me Al." not in _export(bob)
        r = bob.get(f"{WS}/memories/{user_fact['id']}/revisions")
        assert r.status_code == 404
        assert set(_contents(alice)) == {"Answers in English.", "Call me Al."}
        assert _contents(alice, scope="user") == ["Call me Al."]
    # Someone who does not use the bot neither reads nor writes its memory.
    other = w.admin.post("/v1/admin/users", json={"name": "dan", "orgs": [w.org]}).json()
    with user_client(w.server, other["token"]) as dan:
        r = dan.get(f"{WS}/memories", params={"scope": "bot", "bot": w.bot})
        assert r.status_code == 403
        assert _list(dan) == []
        r = dan.post(
            f"{WS}/memories",
            json={"requestId": _rid(), "scope": "user", "bot": w.bot, "content": "x"},
        )
        assert r.status_code == 403


def test_same_request_id_once_and_stale_revision_409(team):
    w = team
    with w.client("alice") as alice:
        body = {"requestId": _rid(), "scope": "user", "bot": w.bot, "content": "Likes jazz."}
        first = alice.post(f"{WS}/memories", json=body)
        again = alice.post(f"{WS}/memories", json=body)
        assert first.status_code == again.status_code == 201
        assert first.json() == again.json()
        assert _contents(alice, scope="user") == ["Likes jazz."]
        other = alice.post(f"{WS}/memories", json={**body, "content": "Likes rock."})
        assert other.status_code == 409 and other.json()["error"]["code"] == "request_id_reused"

        entry = first.json()
        edit = {
            "requestId": _rid(),
            "id": entry["id"],
            "expectedRevision": 1,
            "content": "Likes modal jazz.",
            "topics": ["music"],
        }
        r = alice.post(f"{WS}/memories", json=edit)
        assert r.status_code == 200, r.text
        assert r.json()["revision"] == 2 and r.json()["topics"] == ["music"]
        stale = {**edit, "requestId": _rid(), "content": "Hates jazz."}
        r = alice.post(f"{WS}/memories", json=stale)
        assert r.status_code == 409
        error = r.json()["error"]
        assert error["code"] == "stale_revision" and error["currentRevision"] == 2
        assert _contents(alice, scope="user") == ["Likes modal jazz."]


def test_forget_by_version_keeps_revisions_and_a_barrier(team, engine):
    w = team
    alice_id = w.users["alice"]
    pool = f"user:{alice_id}"
    with w.client("alice") as alice:
        e = _create(alice, scope="user", bot=w.bot, content="My locker code is 4521.")
        edit = {
            "requestId": _rid(),
            "id": e["id"],
            "expectedRevision": 1,
            "content": "My locker code is 7788.",
        }
        assert alice.post(f"{WS}/memories", json=edit).status_code == 200
        stale = {"requestId": _rid(), "id": e["id"], "expectedRevision": 1}
        r = alice.post(f"{WS}/memories/forget", json=stale)
        assert r.status_code == 409 and r.json()["error"]["currentRevision"] == 2
        forget = {"requestId": _rid(), "id": e["id"], "expectedRevision": 2}
        r = alice.post(f"{WS}/memories/forget", json=forget)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "forgotten" and r.json()["revision"] == 3
        assert alice.post(f"{WS}/memories/forget", json=forget).json() == r.json()  # repeat

        assert _list(alice, scope="user") == []
        gone = _list(alice, scope="user", status="forgotten")
        assert [g["id"] for g in gone] == [e["id"]]
        assert "7788" not in _export(alice)

        r = alice.get(f"{WS}/memories/{e['id']}/revisions")
        assert r.status_code == 200, r.text
        revs = r.json()["revisions"]
        assert [(v["revision"], v["change"]) for v in revs] == [
            (1, "created"),
            (2, "edited"),
            (3, "forgotten"),
        ]
        assert all(v["operator"] == alice_id and v["at"] > 0 for v in revs)
        assert (revs[0]["before"], revs[0]["after"]) == (None, "My locker code is 4521.")
        assert (revs[1]["before"], revs[1]["after"]) == (
            "My locker code is 4521.",
            "My locker code is 7788.",
        )
        assert (revs[2]["before"], revs[2]["after"]) == ("My locker code is 7788.", None)

    # The manual revision and the forgetting each left a barrier (SC-3), kept on disk.
    shard = engine.shard_for(alice_id)
    barriers = ray.get(shard.workspace_barriers.remote(pool))
    mine = [b for b in barriers if b.entry == e["id"]]
    assert [b.reason for b in mine] == ["revised", "forgotten"]
    blocked = ray.get(shard.workspace_blocked.remote(pool, "my LOCKER code is 7788"))
    assert blocked is not None and blocked.reason == "forgotten"
    assert (
        ray.get(shard.workspace_blocked.remote(pool, "my locker code is 4521!")).reason == "revised"
    )
    assert ray.get(shard.workspace_blocked.remote(pool, "Something else entirely.")) is None


def test_markdown_export_format(team):
    w = team
    with w.client("alice") as alice:
        _create(alice, scope="bot", bot=w.bot, content="Keeps answers short.")
        _create(alice, scope="user", bot=w.bot, content="Lives in\nLyon.", tier="profile")
        _create(alice, scope="project", bot=w.bot, project=w.project, content="Ship v2 in May.")
        text = _export(alice)
    lines = text.splitlines()
    assert lines[0].startswith("# Memory export for ")
    headings = [ln for ln in lines if ln.startswith("## ")]
    assert [h.split(" · ")[0] for h in headings] == [
        "## Bot memory",
        "## User memory",
        "## Project memory",
    ]
    assert f"## Project memory · Launch ({w.project})" in headings
    assert sum(1 for ln in lines if ln.startswith("### ")) == 3  # one contributor per pool
    items = [ln for ln in lines if ln.startswith("- ")]
    assert len(items) == 3 and all(LINE.match(ln) for ln in items), items
    assert any(ln.endswith(") Lives in Lyon.") for ln in items)  # one record, one line


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"scope": "galaxy", "content": "x"}, 400, "invalid_body"),
        ({"scope": "user", "content": ""}, 400, "invalid_content"),
        ({"scope": "user", "content": "x" * 2001}, 400, "content_too_long"),
        ({"scope": "user", "content": "x", "tier": "huge"}, 400, "invalid_body"),
        ({"scope": "user", "content": "x", "colour": 1}, 400, "invalid_body"),
        ({"scope": "project", "content": "x"}, 400, "project_required"),
        ({"scope": "project", "content": "x", "project": "p_nope"}, 404, "project_not_found"),
        ({"scope": "user", "content": "x", "requestId": ""}, 400, "invalid_request_id"),
    ],
)
def test_bad_memory_requests_change_nothing(team, body, status, code):
    w = team
    with w.client("alice") as alice:
        r = alice.post(f"{WS}/memories", json={"requestId": _rid(), "bot": w.bot, **body})
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code
        assert _list(alice) == []
        r = alice.get(f"{WS}/memories", params={"scope": "planet"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_scope"
