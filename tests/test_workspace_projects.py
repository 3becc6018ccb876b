"""Workspace projects end to end (WS-7, WA-1, WA-2): real server, actors, files."""

from __future__ import annotations

import asyncio
import secrets

import pytest

from gateway.client import EventClient

WS = "/api/app/workspace"


def _rid() -> str:
    return "r-" + secrets.token_hex(6)


def _projects(client) -> list[dict]:
    r = client.get(f"{WS}/projects")
    assert r.status_code == 200, r.text
    return r.json()["projects"]


def _create(client, **body) -> dict:
    r = client.post(f"{WS}/projects", json={"requestId": _rid(), **body})
    assert r.status_code == 201, r.text
    return r.json()


def _channel(world, *people) -> str:
    r = world.admin.post(
        "/v1/admin/channels",
        json={"org": world.org, "people": [world.users[p] for p in people], "bots": [world.bot]},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_same_request_id_twice_creates_one_project(world):
    with world.client("alice") as alice, world.client("bob") as bob:
        body = {"requestId": _rid(), "name": "Launch", "members": [world.users["bob"]]}
        first = alice.post(f"{WS}/projects", json=body)
        again = alice.post(f"{WS}/projects", json=body)
        assert first.status_code == again.status_code == 201, (first.text, again.text)
        assert first.json() == again.json()
        project = first.json()
        assert project["id"].startswith("p_") and project["revision"] == 1
        assert project["owner"] == world.users["alice"]
        assert set(project["members"]) == {world.users["alice"], world.users["bob"]}
        assert [p["id"] for p in _projects(alice)] == [project["id"]]
        assert [p["id"] for p in _projects(bob)] == [project["id"]]
        # The same requestId with another body is refused and creates nothing.
        other = alice.post(f"{WS}/projects", json={**body, "name": "Other"})
        assert other.status_code == 409, other.text
        assert other.json()["error"]["code"] == "request_id_reused"
        assert [p["name"] for p in _projects(alice)] == ["Launch"]
    with world.client("carol") as carol:
        assert _projects(carol) == []


def test_stale_expected_revision_gets_409_and_changes_nothing(world):
    with world.client("alice") as alice:
        p = _create(alice, name="Roadmap", metadata={"quarter": "Q3"})
        change = {"requestId": _rid(), "id": p["id"], "expectedRevision": 1, "name": "Roadmap 2"}
        r = alice.post(f"{WS}/projects", json=change)
        assert r.status_code == 200, r.text
        assert r.json()["revision"] == 2 and r.json()["name"] == "Roadmap 2"
        # A repeat of the same change returns the first answer (not a conflict).
        again = alice.post(f"{WS}/projects", json=change)
        assert again.status_code == 200 and again.json() == r.json()
        stale = {"requestId": _rid(), "id": p["id"], "expectedRevision": 1, "name": "Draft"}
        r = alice.post(f"{WS}/projects", json=stale)
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "stale_revision" and error["currentRevision"] == 2
        (now,) = _projects(alice)
        assert now["name"] == "Roadmap 2" and now["revision"] == 2
        assert now["metadata"] == {"quarter": "Q3"}
        assert now["id"] == p["id"]  # the id never changes with the name


def test_linking_a_channel_needs_every_person_to_be_a_member(world):
    everyone = _channel(world, "alice", "bob", "carol")
    with world.client("alice") as alice:
        # At creation: refused, and no project is made.
        r = alice.post(
            f"{WS}/projects",
            json={
                "requestId": _rid(),
                "name": "Ops",
                "members": [world.users["bob"]],
                "channels": [everyone],
            },
        )
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "channel_members_not_in_project"
        assert error["people"] == [world.users["carol"]]
        assert _projects(alice) == []

        p = _create(alice, name="Ops", members=[world.users["bob"]])
        link = {"requestId": _rid(), "id": p["id"], "expectedRevision": 1, "channels": [everyone]}
        r = alice.post(f"{WS}/projects", json=link)
        assert r.status_code == 409 and r.json()["error"]["people"] == [world.users["carol"]]
        (now,) = _projects(alice)
        assert now["channels"] == [] and now["revision"] == 1

        members = [world.users[n] for n in ("alice", "bob", "carol")]
        add = {"requestId": _rid(), "id": p["id"], "expectedRevision": 1, "members": members}
        assert alice.post(f"{WS}/projects", json=add).status_code == 200
        link = {"requestId": _rid(), "id": p["id"], "expectedRevision": 2, "channels": [everyone]}
        r = alice.post(f"{WS}/projects", json=link)
        assert r.status_code == 200, r.text
        assert r.json()["channels"] == [everyone] and r.json()["revision"] == 3

        # Carol cannot be removed while in a linked channel.
        drop = {
            "requestId": _rid(),
            "id": p["id"],
            "expectedRevision": 3,
            "members": members[:2],
        }
        r = alice.post(f"{WS}/projects", json=drop)
        assert r.status_code == 409 and r.json()["error"]["code"] == "member_in_linked_channel"
        assert _projects(alice)[0]["revision"] == 3


def test_a_channel_is_linked_only_by_one_of_its_people(world):
    bob_and_carol = _channel(world, "bob", "carol")
    with world.client("alice") as alice:
        members = [world.users[n] for n in ("bob", "carol")]
        p = _create(alice, name="Side", members=members)
        link = {
            "requestId": _rid(),
            "id": p["id"],
            "expectedRevision": 1,
            "channels": [bob_and_carol],
        }
        r = alice.post(f"{WS}/projects", json=link)
        assert r.status_code == 404 and r.json()["error"]["code"] == "channel_not_found"
    with world.client("bob") as bob:
        r = bob.post(f"{WS}/projects", json={**link, "requestId": _rid()})
        assert r.status_code == 200, r.text
        assert r.json()["channels"] == [bob_and_carol]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"name": "x"}, 400, "invalid_body"),  # no requestId
        ({"requestId": "a b", "name": "x"}, 400, "invalid_request_id"),
        ({"requestId": "ok", "name": "   "}, 400, "invalid_name"),
        ({"requestId": "ok", "name": "x", "colour": "red"}, 400, "invalid_body"),
        ({"requestId": "ok", "name": "x", "members": ["u_nobody"]}, 404, "user_not_found"),
        ({"requestId": "ok", "name": "x", "channels": ["c_nowhere"]}, 404, "channel_not_found"),
        ({"requestId": "ok", "name": "x", "id": "bad id!"}, 400, "invalid_id"),
    ],
)
def test_bad_project_requests_change_nothing(world, body, status, code):
    with world.client("alice") as alice:
        r = alice.post(f"{WS}/projects", json=body)
        assert r.status_code == status, r.text
        assert r.json()["error"]["code"] == code
        assert _projects(alice) == []
        r = alice.post(f"{WS}/projects", content=b"[1, 2")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_outsiders_cannot_change_or_learn_of_a_project(world):
    with world.client("alice") as alice, world.client("carol") as carol:
        p = _create(alice, name="Secret")
        change = {"requestId": _rid(), "id": p["id"], "expectedRevision": 1, "name": "Mine"}
        r = carol.post(f"{WS}/projects", json=change)
        assert r.status_code == 404 and r.json()["error"]["code"] == "project_not_found"
        missing = {**change, "id": "p_does_not_exist"}
        assert carol.post(f"{WS}/projects", json=missing).status_code == 404
        assert _projects(alice)[0]["name"] == "Secret"


def test_project_changed_events_reach_members_only(world):
    async def scenario():
        bob_c = EventClient(world.server.url, world.tokens["bob"])
        carol_c = EventClient(world.server.url, world.tokens["carol"])
        bob_it, carol_it = aiter(bob_c), aiter(carol_c)
        bob_next = asyncio.ensure_future(asyncio.wait_for(bob_it.__anext__(), 10))
        carol_next = asyncio.ensure_future(asyncio.wait_for(carol_it.__anext__(), 10))
        await asyncio.sleep(0.5)  # both connected and live
        with world.client("alice") as alice:
            p = await asyncio.to_thread(
                _create, alice, name="Evented", members=[world.users["bob"]]
            )
        frame = await bob_next
        assert frame.type == "project.changed"
        assert frame.data == {"project": p["id"], "revision": 1, "change": "created"}
        # Carol hears only of her own project, created after Alice's.
        with world.client("carol") as carol:
            mine = await asyncio.to_thread(_create, carol, name="Carol's")
        frame = await carol_next
        assert frame.type == "project.changed" and frame.data["project"] == mine["id"]
        await bob_c.close()
        await carol_c.close()

    asyncio.run(scenario())


def test_capabilities_announce_projects(server):
    import httpx

    from tests.conftest import ADMIN

    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        caps = c.get("/v1/capabilities").json()
        assert "bot-projects-v1" in caps["capabilities"]
        assert "bot-projects-v1" not in caps["unavailable"]
