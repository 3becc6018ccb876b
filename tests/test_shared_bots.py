"""Bots shared across orgs (MB-1, memory bot settings), through the HTTP API of a real
server: an admin shares a bot of one org with another (`POST /v1/admin/bots/{bot}/orgs`) and
stops sharing it (`DELETE /v1/admin/bots/{bot}/orgs/{org}`); a person of the other org with a
read grant works with the bot there. Memory written while working in an org carries `org:<it>`
and reaches only work in that org: the memory view, the workspace listing, its search, the
Markdown export, the prompt and the event sockets. Stopping the share closes access at once.
Every check-then-act is one step in the directory: many concurrent shares, grants, revocations
and chat creations lose nothing and let nothing through."""

from __future__ import annotations

import asyncio
import json
import secrets
from concurrent.futures import ThreadPoolExecutor

import pytest
from websockets.asyncio.client import connect

from engine.directory import bot_pool
from engine.memory_entries import EntryMeta, Layer
from tests.conftest import _ok, user_client
from tests.openai_stub import completion

WS = "/api/app/workspace"
FANOUT = 24


def _code(r, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()["error"]["code"]


class Shared:
    """The world's org (home, with alice the bot's owner) and another org X with dave (only X)
    and erin (both orgs; X is her first). The bot talks on the `bot` model."""

    def __init__(self, admin, world, server) -> None:
        self.admin, self.world, self.server = admin, world, server
        self.home = world.org
        self.x = _ok(admin.post("/v1/admin/orgs", json={"name": "x " + secrets.token_hex(3)}))["id"]
        people = {"dave": [self.x], "erin": [self.x, self.home]}
        self.users: dict[str, dict] = {
            n: _ok(admin.post("/v1/admin/users", json={"name": n, "orgs": orgs}))
            for n, orgs in people.items()
        }
        self.name = f"Shared{secrets.token_hex(3)}"
        self.bot = _ok(
            admin.post(
                "/v1/admin/bots",
                json={
                    "name": self.name,
                    "org": self.home,
                    "owner": world.users["alice"],
                    "model": "bot",
                },
            )
        )["id"]

    def client(self, name: str):
        if name in self.users:
            return user_client(self.server, self.users[name]["token"])
        return self.world.client(name)

    def share(self, org: str | None = None):
        return self.admin.post(f"/v1/admin/bots/{self.bot}/orgs", json={"org": org or self.x})

    def unshare(self, org: str | None = None):
        return self.admin.delete(f"/v1/admin/bots/{self.bot}/orgs/{org or self.x}")

    def grant(self, name: str, permission: str = "read"):
        user = self.users[name]["id"] if name in self.users else self.world.users[name]
        body = {"bot": self.bot, "user": user, "permission": permission}
        return self.admin.post("/v1/admin/grants", json=body)

    def record(self, name: str, content: str, org: str | None = None) -> dict:
        """A bot-scope workspace record written by `name` (in `org` when given)."""
        body = {"requestId": "r" + secrets.token_hex(4), "scope": "bot", "bot": self.bot}
        headers = {"OpenBot-Org": org} if org else {}
        with self.client(name) as c:
            return _ok(c.post(f"{WS}/memories", json={**body, "content": content}, headers=headers))

    def admin_view(self, org: str | None = None) -> dict | None:
        """The bot as the admin list of bots of `org` (default: its home org) shows it."""
        bots = _ok(self.admin.get("/v1/admin/bots", params={"org": org or self.home}))
        found = [b for b in bots["items"] if b["id"] == self.bot]
        return found[0] if found else None


@pytest.fixture
def shared(admin, world, server) -> Shared:
    return Shared(admin, world, server)


def test_mb1_an_admin_shares_a_bot_once_however_often_asked(shared):
    """Sharing is idempotent (again, or with the bot's home org: no change) and listed in the
    bot's admin view; an unknown org or bot is 404; only the admin token may share; stopping a
    share that is not there is 404."""
    assert _ok(shared.share())["sharedOrgs"] == [shared.x]
    assert _ok(shared.share())["sharedOrgs"] == [shared.x]
    assert _ok(shared.share(shared.home))["sharedOrgs"] == [shared.x]
    assert shared.admin_view()["sharedOrgs"] == [shared.x]
    assert shared.admin_view(shared.x)["sharedOrgs"] == [shared.x]  # listed with X's bots
    assert _code(shared.share("o_nobody" + secrets.token_hex(3)), 404) == "org_not_found"
    r = shared.admin.post("/v1/admin/bots/b_nobody/orgs", json={"org": shared.x})
    assert _code(r, 404) == "bot_not_found"
    with shared.client("alice") as alice:  # the bot's owner is not an admin
        r = alice.post(f"/v1/admin/bots/{shared.bot}/orgs", json={"org": shared.x})
        assert r.status_code in (401, 403), r.text
        assert alice.delete(f"/v1/admin/bots/{shared.bot}/orgs/{shared.x}").status_code in (
            401,
            403,
        )
    assert _ok(shared.unshare())["sharedOrgs"] == []
    assert _code(shared.unshare(), 404) == "share_not_found"
    assert shared.admin_view()["sharedOrgs"] == []
    assert shared.admin_view(shared.x) is None


def test_mb1_people_of_a_shared_org_work_with_the_bot_in_their_org(shared):
    """Before the share, dave (org X) cannot be granted and the bot answers him like a free id;
    after it, with a read grant (write stays with the home org), his chat works in X, and
    erin's chat works in the org she names (the home org by default)."""
    assert _code(shared.grant("dave"), 422) == "not_in_org"
    with shared.client("dave") as dave:
        assert _code(dave.post("/v1/chats", json={"bot": shared.bot}), 404) == "bot_not_found"
    _ok(shared.share())
    assert _code(shared.grant("dave", "write"), 422) == "write_needs_home_org"
    _ok(shared.grant("dave"))
    _ok(shared.grant("erin"))
    with shared.client("dave") as dave:
        chat = _ok(dave.post("/v1/chats", json={"bot": shared.bot}))
        assert chat["org"] == shared.x
        r = dave.post("/v1/chats", json={"bot": shared.bot}, headers={"OpenBot-Org": shared.home})
        assert _code(r, 403) == "not_in_org"
        # Managing the bot (its memory bot's settings, purge) is for its home org.
        assert _code(dave.get(f"/v1/bots/{shared.bot}/memory/bot"), 403) == "no_write"
        bots = _ok(dave.get("/v1/bots"))
        assert shared.bot in [b["id"] for b in bots["items"]]
    with shared.client("erin") as erin:
        assert _ok(erin.post("/v1/chats", json={"bot": shared.bot}))["org"] == shared.home
        there = erin.post("/v1/chats", json={"bot": shared.bot}, headers={"OpenBot-Org": shared.x})
        assert _ok(there)["org"] == shared.x
    # The home org's boundary holds for everyone else: a third org's person is not let in.
    other = _ok(shared.admin.post("/v1/admin/orgs", json={"name": "y" + secrets.token_hex(3)}))
    fay = _ok(shared.admin.post("/v1/admin/users", json={"name": "fay", "orgs": [other["id"]]}))
    body = {"bot": shared.bot, "user": fay["id"], "permission": "read"}
    assert _code(shared.admin.post("/v1/admin/grants", json=body), 422) == "not_in_org"


def test_mb1_memory_written_in_an_org_reaches_only_work_in_that_org(shared, model_stubs):
    """alice writes in the home org, dave and erin in X (erin also reads as the home org): the
    memory view, the workspace listing, its search, the export and the prompt of each org hold
    that org's records only."""
    _ok(shared.share())
    _ok(shared.grant("dave"))
    _ok(shared.grant("erin"))
    home_text = f"Home secret {secrets.token_hex(3)} the vault code"
    x_text = f"Xorg secret {secrets.token_hex(3)} the vault code"
    home_rec = shared.record("alice", home_text)
    x_rec = shared.record("dave", x_text)
    assert f"org:{shared.home}" in home_rec["tags"] and f"org:{shared.x}" in x_rec["tags"]
    assert f"org:{shared.home}" not in x_rec["tags"]
    # erin names X: her record is X's; by default she works in the home org.
    erin_x = shared.record("erin", "Erin wrote this in X", shared.x)
    assert f"org:{shared.x}" in erin_x["tags"]
    erin_home = shared.record("erin", "Erin wrote this at home")
    assert f"org:{shared.home}" in erin_home["tags"]

    def seen(name: str, org: str | None = None) -> dict[str, set[str]]:
        headers = {"OpenBot-Org": org} if org else {}
        params = {"scope": "bot", "bot": shared.bot}
        with shared.client(name) as c:
            listing = _ok(c.get(f"{WS}/memories", params=params, headers=headers))
            found = _ok(c.get(f"{WS}/memories", params={**params, "q": "vault"}, headers=headers))
            view = _ok(c.get(f"/v1/bots/{shared.bot}/memory", headers=headers))
            export = c.get(f"{WS}/memory-export", headers=headers).text
        contents = [home_text, x_text, "Erin wrote this in X", "Erin wrote this at home"]
        return {
            "listing": {e["content"] for e in listing["entries"]},
            "search": {e["content"] for e in found["entries"]},
            "view": {e["content"] for e in view["entries"]},
            "export": {t for t in contents if t in export},
        }

    home_only = {home_text, "Erin wrote this at home"}
    x_only = {x_text, "Erin wrote this in X"}
    for who, org, expected in [
        ("alice", None, home_only),
        ("erin", None, home_only),
        ("erin", shared.home, home_only),
        ("erin", shared.x, x_only),
        ("dave", None, x_only),
        ("dave", shared.x, x_only),
    ]:
        got = seen(who, org)
        assert got["listing"] == expected, (who, org, got)
        assert got["view"] == expected, (who, org, got)
        assert got["export"] == expected, (who, org, got)
        assert got["search"] == expected & {home_text, x_text}, (who, org, got)

    # The prompt: each org's chat packs its own org's records only.
    # The prompt and the bot's own memory search: each org's chat gets its own org's records.
    prompts: list[str] = []
    found: list[str] = []

    def route(body):
        if not body["messages"][0]["content"].startswith(f"You are {shared.name}."):
            return None
        last = body["messages"][-1]
        if last["role"] == "tool":
            found.append(last["content"])
            return completion("Found.")
        prompts.append(body["messages"][0]["content"])
        if "look it up" in str(last["content"]):
            return completion(None, tool_calls=[("workspace_memory_search", {"query": "vault"})])
        return None

    model_stubs["bot"].routes.append(route)
    try:
        for who, org, expected in [
            ("dave", None, x_only),
            ("alice", None, home_only),
            ("erin", shared.x, x_only),
        ]:
            headers = {"OpenBot-Org": org} if org else {}
            with shared.client(who) as c:
                chat = _ok(c.post("/v1/chats", json={"bot": shared.bot}, headers=headers))
                turns = f"/v1/chats/{chat['id']}/turns?wait=true"
                _ok(c.post(turns, json={"text": "look it up"}))
            system = prompts[-1]
            assert {t for t in home_only | x_only if t in system} == expected, (who, system)
            hits = {e["content"] for e in json.loads(found[-1])["entries"]}
            assert hits == expected & {home_text, x_text}, (who, hits)
    finally:
        model_stubs["bot"].routes.remove(route)


def test_mb1_a_remembered_entry_carries_the_org_of_the_work(shared):
    """`Remember` through the bot in org X is tagged `org:X`; naming an org the bot does not
    work in is refused."""
    _ok(shared.share())
    _ok(shared.grant("erin"))
    remember = {"command": {"_tag": "Remember", "content": "I like tea"}}
    path = f"/v1/bots/{shared.bot}/memory"
    with shared.client("erin") as erin:
        there = _ok(erin.post(path, json=remember, headers={"OpenBot-Org": shared.x}))
        assert f"org:{shared.x}" in there["tags"] and f"org:{shared.home}" not in there["tags"]
        home = _ok(erin.post(path, json=remember))
        assert f"org:{shared.home}" in home["tags"]
        in_x = _ok(erin.get(path, headers={"OpenBot-Org": shared.x}))["entries"]
        assert [e["id"] for e in in_x] == [there["id"]]
        assert [e["id"] for e in _ok(erin.get(path))["entries"]] == [home["id"]]
    _ok(shared.unshare())
    with shared.client("erin") as erin:
        r = erin.post(path, json=remember, headers={"OpenBot-Org": shared.x})
        assert _code(r, 403) == "wrong_org"


def test_mb1_stopping_a_share_closes_access_at_once(shared):
    """Once the DELETE returned: dave's chat in X takes no turn, the bot is unknown to him,
    erin's X chat is refused while her home-org chat goes on, and sharing again gives dave
    nothing back (his grant went with the share)."""
    _ok(shared.share())
    _ok(shared.grant("dave"))
    _ok(shared.grant("erin"))
    with shared.client("dave") as dave:
        dave_chat = _ok(dave.post("/v1/chats", json={"bot": shared.bot}))["id"]
    with shared.client("erin") as erin:
        erin_x = _ok(
            erin.post("/v1/chats", json={"bot": shared.bot}, headers={"OpenBot-Org": shared.x})
        )["id"]
        erin_home = _ok(erin.post("/v1/chats", json={"bot": shared.bot}))["id"]
    _ok(shared.unshare())
    with shared.client("dave") as dave:
        r = dave.post(f"/v1/chats/{dave_chat}/turns", json={"text": "hi"})
        assert _code(r, 404) == "bot_not_found"
        assert _code(dave.get(f"/v1/bots/{shared.bot}/memory"), 404) == "bot_not_found"
    with shared.client("erin") as erin:
        r = erin.post(f"/v1/chats/{erin_x}/turns", json={"text": "hi"})
        assert _code(r, 403) == "org_not_shared"
        assert erin.post(f"/v1/chats/{erin_home}/turns", json={"text": "hi"}).status_code == 202
        r = erin.get(f"{WS}/memories", params={"scope": "bot"}, headers={"OpenBot-Org": shared.x})
        assert _ok(r)["entries"] == []
    _ok(shared.share())
    with shared.client("dave") as dave:
        r = dave.post(f"/v1/chats/{dave_chat}/turns", json={"text": "hi"})
        assert _code(r, 403) == "no_access"
    assert shared.world.users["alice"] == shared.admin_view()["owner"]
    assert shared.users["erin"]["id"] in shared.admin_view()["grants"]
    assert shared.users["dave"]["id"] not in shared.admin_view()["grants"]


async def _open(server, token: str):
    ws = await connect(
        f"{server.url.replace('http', 'ws')}/v1/events",
        additional_headers={"Authorization": f"Bearer {token}"},
    )
    assert json.loads(await ws.recv())["type"] == "hello"
    return ws


async def _write(engine, shared: Shared, org: str, text: str) -> str:
    """An entry of the bot's memory for everyone who uses it in `org`."""
    import ray

    meta = EntryMeta(
        id=f"mem_{secrets.token_hex(6)}",
        pool=bot_pool(shared.bot),
        layer=Layer.PINNED,
        tags=("for:bot", f"org:{org}"),
        created_at=1,
        updated_at=1,
    )
    shard = engine.shard_for(shared.world.users["alice"])
    await asyncio.to_thread(ray.get, shard.add_entries.remote(bot_pool(shared.bot), [(meta, text)]))
    return meta.id


async def _until(ws, entry: str) -> list[str]:
    """The entries of the frames up to the one about `entry` (known to come)."""
    seen: list[str] = []
    async with asyncio.timeout(30):
        while True:
            frame = json.loads(await ws.recv())
            seen.append((frame.get("data") or {}).get("entry"))
            if seen[-1] == entry:
                return seen


def test_mb1_an_event_of_one_orgs_memory_is_heard_only_in_that_org(engine, shared, server):
    """Events of the bot's memory go to who uses it in the entry's org: dave (X) hears X's
    entries and not the home org's; alice (home) hears the home org's and not X's. Once the
    share stopped, erin (both orgs) hears the home org's entries and no longer X's."""
    _ok(shared.share())
    _ok(shared.grant("dave"))
    _ok(shared.grant("erin"))

    async def scenario():
        dave = await _open(server, shared.users["dave"]["token"])
        alice = await _open(server, shared.world.tokens["alice"])
        erin = await _open(server, shared.users["erin"]["token"])
        try:
            x1 = await _write(engine, shared, shared.x, "for X")
            home = await _write(engine, shared, shared.home, "for home")
            x2 = await _write(engine, shared, shared.x, "for X again")
            heard = {"dave": await _until(dave, x2), "alice": await _until(alice, home)}
            heard["erin"] = await _until(erin, x2)
            x3 = await _write(engine, shared, shared.x, "for X once more")
            home2 = await _write(engine, shared, shared.home, "for home again")
            heard["alice"] += await _until(alice, home2)
            r = await asyncio.to_thread(shared.unshare)
            assert r.status_code == 200, r.text
            x4 = await _write(engine, shared, shared.x, "for X after the share stopped")
            home3 = await _write(engine, shared, shared.home, "for home after")
            heard["erin after"] = await _until(erin, home3)
        finally:
            for ws in (dave, alice, erin):
                await ws.close()
        return (x1, x2, x3, x4), (home, home2, home3), heard

    (x1, x2, x3, x4), (home, home2, home3), heard = asyncio.run(scenario())
    assert x1 in heard["dave"] and x2 in heard["dave"] and home not in heard["dave"]
    assert home in heard["alice"] and home2 in heard["alice"]
    assert not {x1, x2, x3} & set(heard["alice"])
    assert {x1, x2, home} <= set(heard["erin"])
    assert home3 in heard["erin after"] and x4 not in heard["erin after"]


def _many(calls) -> list:
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_mb1_concurrent_shares_and_grants_lose_nothing(shared, admin):
    """24 shares with distinct orgs, 24 shares with one org and 24 grants, all at once: every
    org and every grant is there after, the repeated org once."""
    orgs = [_ok(admin.post("/v1/admin/orgs", json={"name": f"c{k}"}))["id"] for k in range(FANOUT)]
    _ok(shared.share())
    people = [
        _ok(admin.post("/v1/admin/users", json={"name": f"p{k}", "orgs": [shared.x]}))["id"]
        for k in range(FANOUT)
    ]
    calls = [lambda o=o: shared.share(o) for o in orgs]
    calls += [lambda: shared.share() for _ in range(FANOUT)]
    calls += [
        lambda u=u: admin.post(
            "/v1/admin/grants", json={"bot": shared.bot, "user": u, "permission": "read"}
        )
        for u in people
    ]
    assert all(r.is_success for r in _many(calls))
    view = shared.admin_view()
    assert sorted(view["sharedOrgs"]) == sorted([shared.x, *orgs])
    assert set(people) <= set(view["grants"])


def test_mb1_concurrent_revocations_answer_once(shared):
    """24 revocations of one share at once: exactly one stops it, the others find no share."""
    _ok(shared.share())
    answers = _many([shared.unshare for _ in range(FANOUT)])
    assert sorted(r.status_code for r in answers) == [200] + [404] * (FANOUT - 1)
    assert shared.admin_view()["sharedOrgs"] == []


def test_mb1_chats_created_while_the_share_stops_take_no_turn_after(shared):
    """24 chat creations by dave race one revocation: each either made a chat in X or was
    refused as for a bot he cannot see; once the revocation returned, none of the chats takes
    a turn and no new one is made."""
    _ok(shared.share())
    _ok(shared.grant("dave"))
    with shared.client("dave") as dave:

        def create():
            return dave.post("/v1/chats", json={"bot": shared.bot})

        answers = _many([create for _ in range(FANOUT)] + [shared.unshare])
        revoked, created = answers[-1], answers[:-1]
        assert revoked.status_code == 200, revoked.text
        chats = [r.json() for r in created if r.status_code == 201]
        refused = [r for r in created if r.status_code != 201]
        assert all(c["org"] == shared.x for c in chats)
        assert all(_code(r, 404) == "bot_not_found" for r in refused)
        for chat in chats:
            r = dave.post(f"/v1/chats/{chat['id']}/turns", json={"text": "hi"})
            assert _code(r, 404) == "bot_not_found"
        assert _code(create(), 404) == "bot_not_found"


def test_mb1_the_memory_model_comes_from_the_org_of_the_chat(shared, admin, engine, model_stubs):
    """The home org has no memory model, X has `mem` and records long-term facts: dave's turn
    in X is learned from by `mem` and the fact is tagged `org:X`, seen by erin in X and not by
    her in the home org; alice's turn in the home org asks no memory model."""
    import ray

    said = f"My locker number is {secrets.token_hex(3)}"
    settings = {"botMemoryModel": "mem", "autoRecord": True}
    _ok(admin.patch(f"/v1/admin/orgs/{shared.x}", json={"settings": settings}))
    _ok(admin.patch(f"/v1/admin/orgs/{shared.home}", json={"settings": {"botMemoryModel": None}}))
    _ok(shared.share())
    _ok(shared.grant("dave"))
    _ok(shared.grant("erin"))
    asked: list[str] = []

    def learner(body):
        if not any(t["function"]["name"] == "learn_fact" for t in body.get("tools", [])):
            return None
        request = json.loads(body["messages"][-1]["content"])
        mine = [e for e in request["evidence"] if e["kind"] == "person" and said in e["text"]]
        if not mine:
            return None
        asked.extend(e["chat"] for e in mine)
        items = [{"chat": e["chat"], "item": e["item"]} for e in mine]
        fact = {"content": f"Shared fact: {said}", "items": items}
        return completion(None, tool_calls=[("learn_fact", fact)])

    model_stubs["mem"].routes.append(learner)
    try:
        chats = {}
        for who in ("dave", "alice"):
            with shared.client(who) as c:
                chat = _ok(c.post("/v1/chats", json={"bot": shared.bot}))
                chats[who] = chat
                _ok(c.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": said}))
        ray.get(engine.shard_for(shared.world.users["alice"]).learning_idle.remote())
    finally:
        model_stubs["mem"].routes.remove(learner)
    assert chats["dave"]["org"] == shared.x and chats["alice"]["org"] == shared.home
    assert set(asked) == {chats["dave"]["id"]}  # the home org's chat asked no memory model
    path = f"/v1/bots/{shared.bot}/memory"
    with shared.client("dave") as dave:
        (fact,) = _ok(dave.get(path))["entries"]
    assert fact["layer"] == "fact" and f"org:{shared.x}" in fact["tags"]
    assert f"org:{shared.home}" not in fact["tags"]
    with shared.client("alice") as alice:
        assert fact["id"] not in {e["id"] for e in _ok(alice.get(path))["entries"]}


@pytest.fixture(scope="module")
def caching(engine):
    """A second gateway that caches who may do what for a minute and re-reads it only when the
    directory says so."""
    from gateway.app import create_app
    from gateway.live_server import LiveServer
    from tests.conftest import ADMIN

    live = LiveServer(create_app(engine, ADMIN, cache_ttl=60.0, listener_refresh=3600))
    yield live
    live.stop()


def test_mb1_a_stopped_share_is_applied_by_every_gateway_before_it_returns(shared, caching):
    """dave's access is cached by another gateway than the one the admin stops the share on:
    once the DELETE returned, that gateway refuses him too."""
    _ok(shared.share())
    _ok(shared.grant("dave"))
    with user_client(caching, shared.users["dave"]["token"]) as dave:
        chat = _ok(dave.post("/v1/chats", json={"bot": shared.bot}))["id"]
        _ok(dave.get(f"/v1/bots/{shared.bot}/memory"))  # cached there now
        _ok(shared.unshare())  # through the other gateway
        assert _code(dave.get(f"/v1/bots/{shared.bot}/memory"), 404) == "bot_not_found"
        r = dave.post(f"/v1/chats/{chat}/turns", json={"text": "hi"})
        assert _code(r, 404) == "bot_not_found"


def test_mb1_an_owners_export_holds_the_orgs_it_shares_its_bot_with(shared, admin):
    """The account file tree of the bot's owner keeps the share and the org it names, so an
    import elsewhere knows where the bot's memory of that org was written."""
    _ok(shared.share())
    tree = _ok(admin.get("/v1/admin/export", params={"account": shared.world.users["alice"]}))
    (doc,) = [json.loads(t) for p, t in tree["files"].items() if p.endswith("account.json")]
    (bot,) = [b for b in doc["bots"] if b["id"] == shared.bot]
    assert bot["sharedOrgs"] == [shared.x]
    assert shared.x in {o["id"] for o in doc["orgs"]}
