"""Org boundaries in the admin API and the routes that use bots.

A bot's owner and grantees, and a channel's people and bots, belong to the org of the bot or
channel (422 and nothing stored otherwise). A person of another org cannot use a bot, and its
id answers exactly like a free one; memory written through a bot is tagged with the bot's org.
Explicit project ids are namespaced per account, so creating one never tells whether another
account (or org) holds that id."""

from __future__ import annotations

import secrets

import pytest

from engine.directory import Bot, User, bot_org, require_use, require_write
from engine.errors import Forbidden, NotFound
from tests.conftest import user_client

WS = "/api/app/workspace"


def _error(r, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()["error"]["code"]


@pytest.fixture
def foreign(admin, server):
    """A second org with its own person (dave) and bot."""
    org = admin.post("/v1/admin/orgs", json={"name": "other " + secrets.token_hex(3)}).json()
    dave = admin.post("/v1/admin/users", json={"name": "dave", "orgs": [org["id"]]}).json()
    bot = admin.post(
        "/v1/admin/bots", json={"name": "theirs", "org": org["id"], "owner": dave["id"]}
    ).json()
    return {"org": org["id"], "dave": dave, "bot": bot["id"]}


def test_a_bots_owner_is_a_person_of_its_org(admin, world, foreign):
    bid = "b_own" + secrets.token_hex(4)
    body = {"id": bid, "name": "x", "org": world.org, "owner": foreign["dave"]["id"]}
    assert _error(admin.post("/v1/admin/bots", json=body), 422) == "not_in_org"
    # Nothing was stored: the id is still free.
    ok = admin.post("/v1/admin/bots", json={**body, "owner": world.users["alice"]})
    assert ok.status_code == 201 and ok.json()["id"] == bid


def test_grantees_are_people_of_the_bots_org(admin, world, foreign, server):
    body = {"bot": world.bot, "user": foreign["dave"]["id"], "permission": "read"}
    assert _error(admin.post("/v1/admin/grants", json=body), 422) == "not_in_org"
    with user_client(server, foreign["dave"]["token"]) as dave:
        assert _error(dave.get(f"/v1/bots/{world.bot}/memory"), 404) == "bot_not_found"


def test_a_channels_people_and_bots_are_of_its_org(admin, world, foreign):
    people = {"org": world.org, "people": [foreign["dave"]["id"]], "bots": [world.bot]}
    assert _error(admin.post("/v1/admin/channels", json=people), 422) == "not_in_org"
    bots = {"org": world.org, "people": [world.users["alice"]], "bots": [foreign["bot"]]}
    assert _error(admin.post("/v1/admin/channels", json=bots), 422) == "bot_not_in_org"


def _same_as_free(r_taken, r_free, taken: str, free: str) -> None:
    """Two answers that differ only by the id the request named."""
    assert r_taken.status_code == r_free.status_code
    assert r_taken.text.replace(taken, "ID") == r_free.text.replace(free, "ID")


def test_another_orgs_bot_answers_like_a_free_id(world, foreign, server):
    theirs, free = foreign["bot"], "b_free" + secrets.token_hex(6)
    with world.client("alice") as alice:
        for method, path, body in [
            ("GET", "/v1/bots/{}/memory", None),
            ("POST", "/v1/bots/{}/memory", {"command": {"_tag": "Remember", "content": "x"}}),
            ("GET", "/v1/bots/{}/memory/log", None),
            ("GET", "/v1/bots/{}/node", None),
            ("GET", WS + "/bots/{}/rules", None),
            ("POST", "/v1/chats", {"bot": "{}"}),
        ]:

            def send(bot: str, method=method, path=path, body=body):
                b = None if body is None else _fill(body, bot)
                return alice.request(method, path.format(bot), json=b)

            taken, missing = send(theirs), send(free)
            assert _error(taken, 404) == "bot_not_found", path
            _same_as_free(taken, missing, theirs, free)


def _fill(body, bot: str):
    if isinstance(body, dict):
        return {k: _fill(v, bot) for k, v in body.items()}
    return bot if body == "{}" else body


def test_another_orgs_channel_answers_like_a_free_id(world, admin, foreign):
    theirs = admin.post(
        "/v1/admin/channels",
        json={"org": foreign["org"], "people": [foreign["dave"]["id"]], "bots": [foreign["bot"]]},
    ).json()["id"]
    free = "c_free" + secrets.token_hex(6)
    with world.client("alice") as alice:
        taken = alice.post("/v1/chats", json={"channel": theirs})
        missing = alice.post("/v1/chats", json={"channel": free})
    assert _error(taken, 404) == "channel_not_found"
    _same_as_free(taken, missing, theirs, free)


def test_another_orgs_chat_answers_like_a_free_id(world, foreign, server):
    with user_client(server, foreign["dave"]["token"]) as dave:
        theirs = dave.post("/v1/chats", json={"bot": foreign["bot"]}).json()["id"]
    free = "chat_" + secrets.token_hex(8)
    with world.client("alice") as alice:
        for method, path, body in [
            ("GET", "/v1/chats/{}/items", None),
            ("POST", "/v1/chats/{}/turns", {"text": "hi"}),
            ("GET", "/v1/chats/{}/confessions", None),
            ("GET", "/v1/chats/{}/enrichments", None),
        ]:
            taken = alice.request(method, path.format(theirs), json=body)
            missing = alice.request(method, path.format(free), json=body)
            assert _error(taken, 404) == "chat_not_found", path
            _same_as_free(taken, missing, theirs, free)


def test_memory_through_a_bot_is_tagged_with_the_bots_org(admin, world, foreign, server):
    """A person of two orgs (the bot's is not their first) remembers through the bot: the
    entry says `org:<the bot's org>`. Naming their other org is refused."""
    both = admin.post(
        "/v1/admin/users", json={"name": "erin", "orgs": [foreign["org"], world.org]}
    ).json()
    grant = {"bot": world.bot, "user": both["id"], "permission": "read"}
    assert admin.post("/v1/admin/grants", json=grant).status_code == 201
    path = f"/v1/bots/{world.bot}/memory"
    remember = {"command": {"_tag": "Remember", "content": "I like tea"}}
    with user_client(server, both["token"]) as erin:
        entry = erin.post(path, json=remember).json()
        assert f"org:{world.org}" in entry["tags"]
        assert f"org:{foreign['org']}" not in entry["tags"]
        other = erin.post(path, json=remember, headers={"OpenBot-Org": foreign["org"]})
        assert _error(other, 403) == "wrong_org"
        same = erin.post(path, json=remember, headers={"OpenBot-Org": world.org})
        assert same.status_code == 201
        # A direct chat with the bot works in the bot's org too.
        chat = erin.post("/v1/chats", json={"bot": world.bot}).json()
        assert chat["org"] == world.org
        refused = erin.post(
            "/v1/chats", json={"bot": world.bot}, headers={"OpenBot-Org": foreign["org"]}
        )
        assert _error(refused, 403) == "wrong_org"


def test_explicit_project_ids_cannot_be_probed(world, foreign, server):
    key, free = "p_probe" + secrets.token_hex(4), "p_free" + secrets.token_hex(4)
    with world.client("alice") as alice:
        mine = alice.post(
            f"{WS}/projects", json={"requestId": "a1", "id": key, "name": "Secret"}
        ).json()
        again = alice.post(f"{WS}/projects", json={"requestId": "a2", "id": key, "name": "S"})
        assert _error(again, 409) == "exists"  # your own project: you may know it
    with user_client(server, foreign["dave"]["token"]) as dave:
        taken = dave.post(f"{WS}/projects", json={"requestId": "d1", "id": key, "name": "Mine"})
        missing = dave.post(f"{WS}/projects", json={"requestId": "d2", "id": free, "name": "Mine"})
        assert taken.status_code == missing.status_code == 201
        assert set(taken.json()) == set(missing.json())
        assert taken.json()["id"] != mine["id"]
        # Changing another account's project is "not found", as for an id nobody has.
        change = {"requestId": "d3", "id": mine["id"], "expectedRevision": 1, "name": "Mine"}
        r_taken = dave.post(f"{WS}/projects", json=change)
        r_free = dave.post(f"{WS}/projects", json={**change, "requestId": "d4", "id": "p_nobody"})
        assert _error(r_taken, 404) == "project_not_found"
        _same_as_free(r_taken, r_free, mine["id"], "p_nobody")
    with world.client("alice") as alice:
        (project,) = alice.get(f"{WS}/projects").json()["projects"]
        assert project["name"] == "Secret" and project["members"] == [world.users["alice"]]


# --- the policy itself (pure) -----------------------------------------------------------------

ANN = User(id="u_ann", name="Ann", orgs=("o_a",))
BOT = Bot(id="b_1", name="One", org="o_b", owner="u_owner", grants={"u_ann": "write"})


def test_a_grant_from_another_org_gives_no_use():
    """Rows written before grants were checked: a grant to a person of another org still gives
    nothing, and the bot is as unknown to them as a free id."""
    with pytest.raises(NotFound):
        require_use(BOT, ANN)
    with pytest.raises(NotFound):
        require_write(BOT, ANN)
    with pytest.raises(NotFound):
        bot_org(BOT, ANN, None)


def test_the_org_header_must_be_the_bots_org():
    ann = User(id="u_ann", name="Ann", orgs=("o_a", "o_b"))
    assert bot_org(BOT, ann, None) == "o_b"
    assert bot_org(BOT, ann, "o_b") == "o_b"
    with pytest.raises(Forbidden):
        bot_org(BOT, ann, "o_a")
    with pytest.raises(Forbidden):
        bot_org(BOT, ann, "o_elsewhere")


def test_a_chat_selects_only_a_project_of_its_org(admin, world, foreign, server):
    """A project's memory goes into the bot's prompt: a chat with a bot of one org cannot
    select a project of another org, even one its person is a member of (404, as for a project
    they are not in)."""
    both = admin.post(
        "/v1/admin/users", json={"name": "fay", "orgs": [world.org, foreign["org"]]}
    ).json()
    grant = {"bot": world.bot, "user": both["id"], "permission": "read"}
    assert admin.post("/v1/admin/grants", json=grant).status_code == 201
    with user_client(server, both["token"]) as fay:
        there = fay.post(
            f"{WS}/projects",
            json={"requestId": "f1", "name": "There"},
            headers={"OpenBot-Org": foreign["org"]},
        ).json()
        here = fay.post(f"{WS}/projects", json={"requestId": "f2", "name": "Here"}).json()
        assert (there["org"], here["org"]) == (foreign["org"], world.org)
        refused = fay.post("/v1/chats", json={"bot": world.bot, "project": there["id"]})
        assert _error(refused, 404) == "project_not_found"
        ok = fay.post("/v1/chats", json={"bot": world.bot, "project": here["id"]})
        assert ok.status_code == 201 and ok.json()["project"] == here["id"]
