"""WS-7 after creation: a direct chat's current project is set, changed or cleared with
`PATCH /v1/chats/{chat}` under the rule of creation (the person is a member of the project, of
the chat's org, and owns the chat), each change announced once as `chat.updated`; real server,
actors, DuckDB files and websockets."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import msgspec
import pytest
from websockets.asyncio.client import connect

from gateway.app import create_app
from gateway.live_server import LiveServer
from tests.conftest import ADMIN, _ok, user_client
from tests.openai_stub import completion

WS = "/api/app/workspace"
CONCURRENT = 24


def _project(client, name: str, **body) -> dict:
    return _ok(
        client.post(
            f"{WS}/projects", json={"requestId": secrets.token_hex(6), "name": name, **body}
        )
    )


def _remember(client, bot: str, project: str, content: str) -> None:
    body = {
        "requestId": secrets.token_hex(6),
        "scope": "project",
        "bot": bot,
        "project": project,
        "content": content,
        "tier": "profile",
    }
    _ok(client.post(f"{WS}/memories", json=body))


def _listed_project(client, chat: str) -> str | None:
    chats = _ok(client.get("/v1/chats", params={"limit": 200}))["items"]
    return next(c for c in chats if c["id"] == chat)["project"]


def _error(resp, status: int) -> str:
    assert resp.status_code == status, (resp.status_code, resp.text)
    return resp.json()["error"]["code"]


class Socket:
    """One live `/v1/events` connection: subscribed once `hello` arrived (no sleep needed)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url.replace("http://", "ws://") + "/v1/events"
        self.token = token

    async def __aenter__(self) -> Socket:
        self.ws = await connect(
            self.url, additional_headers={"Authorization": f"Bearer {self.token}"}
        )
        hello = msgspec.json.decode(await asyncio.wait_for(self.ws.recv(), 10))
        assert hello["type"] == "hello", hello
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()

    async def chat_updates(self, chat: str, count: int, timeout: float = 20) -> list[dict]:
        """The next `count` chat.updated frames about `chat` (other frames skipped)."""
        out: list[dict] = []

        async def read() -> None:
            while len(out) < count:
                frame = msgspec.json.decode(await self.ws.recv())
                if frame["type"] == "chat.updated" and frame["data"]["chat"] == chat:
                    out.append(frame["data"])

        await asyncio.wait_for(read(), timeout)
        return out


def test_ws7_a_direct_chats_project_is_set_changed_and_cleared_later(world, admin, bot_model):
    """The turn after each change packs the memory of the project the chat has then."""
    tag = secrets.token_hex(3)
    name = f"Later{tag}"
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
        )
    )["id"]
    prompts: list[str] = []

    def route(body):
        system = body["messages"][0]["content"]
        if not system.startswith(f"You are {name}."):
            return None
        prompts.append(system)
        return completion("Noted.")

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        apollo = _project(alice, f"Apollo {tag}")
        gemini = _project(alice, f"Gemini {tag}")
        _remember(alice, bot, apollo["id"], "Apollo ships on Thursdays.")
        _remember(alice, bot, gemini["id"], "Gemini ships on Mondays.")
        chat = _ok(alice.post("/v1/chats", json={"bot": bot}))
        assert chat["project"] is None and chat["revision"] == 1

        def turn() -> str:
            _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "When?"}))
            return prompts[-1]

        assert "ships on" not in turn()
        set_ = _ok(alice.patch(f"/v1/chats/{chat['id']}", json={"project": apollo["id"]}))
        assert (set_["project"], set_["revision"]) == (apollo["id"], 2)
        assert _listed_project(alice, chat["id"]) == apollo["id"]
        prompt = turn()
        assert "Apollo ships on Thursdays." in prompt and "Gemini" not in prompt

        changed = _ok(alice.patch(f"/v1/chats/{chat['id']}", json={"project": gemini["id"]}))
        assert (changed["project"], changed["revision"]) == (gemini["id"], 3)
        prompt = turn()
        assert "Gemini ships on Mondays." in prompt and "Apollo" not in prompt

        # The same value again changes nothing (no new revision).
        same = _ok(alice.patch(f"/v1/chats/{chat['id']}", json={"project": gemini["id"]}))
        assert same["revision"] == 3

        cleared = _ok(alice.patch(f"/v1/chats/{chat['id']}", json={"project": None}))
        assert (cleared["project"], cleared["revision"]) == (None, 4)
        assert _listed_project(alice, chat["id"]) is None
        assert "ships on" not in turn()


@pytest.fixture
def fay(world, admin, server):
    """A person of the world's org and of a second org, who uses the world's bot."""
    other = _ok(admin.post("/v1/admin/orgs", json={"name": f"other {secrets.token_hex(3)}"}))
    made = _ok(
        admin.post("/v1/admin/users", json={"name": "fay", "orgs": [world.org, other["id"]]})
    )
    grant = {"bot": world.bot, "user": made["id"], "permission": "read"}
    _ok(admin.post("/v1/admin/grants", json=grant))
    with user_client(server, made["token"]) as client:
        yield client, other["id"]


@pytest.mark.anyio
async def test_ws7_refusals_change_nothing_and_announce_nothing(world, admin, server, fay):
    """A project the person is not a member of (another account's), one of another org, a
    missing one: 404 as at creation; another person's chat: 403; a group chat: 422; a bad
    body: 400. The chat keeps its project and no event goes out; the next real change is
    the next event."""
    fay_client, other_org = fay
    world.grant("bob", "read")

    with (
        world.client("alice") as alice,
        world.client("bob") as bob,
        world.client("carol") as carol,
    ):
        mine = _project(alice, "Mine", members=[world.users["bob"]])
        carols = _project(carol, "Carol's")
        chat = _ok(alice.post("/v1/chats", json={"bot": world.bot, "project": mine["id"]}))
        path = f"/v1/chats/{chat['id']}"
        async with Socket(server.url, world.tokens["alice"]) as sock:
            # Another account's project alice is not a member of, and one that does not
            # exist: not found, whatever exists.
            r = await asyncio.to_thread(alice.patch, path, json={"project": carols["id"]})
            assert _error(r, 404) == "project_not_found"
            r = await asyncio.to_thread(alice.patch, path, json={"project": "p_nosuch"})
            assert _error(r, 404) == "project_not_found"
            # Bob is a member of the project and uses the bot, but the chat is alice's.
            r = await asyncio.to_thread(bob.patch, path, json={"project": None})
            assert _error(r, 403) == "not_chat_owner"
            # Carol's own project, on a chat that is not hers.
            r = await asyncio.to_thread(carol.patch, path, json={"project": carols["id"]})
            assert _error(r, 403) == "not_chat_owner"
            for bad in ({}, {"project": 7}, {"project": None, "name": "x"}):
                r = await asyncio.to_thread(alice.patch, path, json=bad)
                assert _error(r, 400) in ("invalid_body", "invalid_json"), bad
            r = await asyncio.to_thread(alice.patch, path, json={"project": "../x"})
            assert r.status_code == 400, r.text
            assert _listed_project(alice, chat["id"]) == mine["id"]
            # The next chat.updated is the next real change: the refusals sent none.
            _ok(await asyncio.to_thread(alice.patch, path, json={"project": None}))
            (event,) = await sock.chat_updates(chat["id"], 1)
            assert event == {
                "chat": chat["id"],
                "revision": 2,
                "change": "project",
                "project": None,
            }
        # A group chat works in its channel's linked projects: it selects none.
        channel = _ok(
            admin.post(
                "/v1/admin/channels",
                json={"org": world.org, "people": [world.users["alice"]], "bots": [world.bot]},
            )
        )
        group = _ok(alice.post("/v1/chats", json={"channel": channel["id"]}))
        r = alice.patch(f"/v1/chats/{group['id']}", json={"project": mine["id"]})
        assert _error(r, 422) == "chat_kind_has_no_project"

    # A project of another org, though fay is a member: not found, as at creation.
    there = _ok(
        fay_client.post(
            f"{WS}/projects",
            json={"requestId": secrets.token_hex(6), "name": "There"},
            headers={"OpenBot-Org": other_org},
        )
    )
    here = _project(fay_client, "Here")
    assert there["org"] == other_org and here["org"] == world.org
    chat = _ok(fay_client.post("/v1/chats", json={"bot": world.bot}))
    r = fay_client.patch(f"/v1/chats/{chat['id']}", json={"project": there["id"]})
    assert _error(r, 404) == "project_not_found"
    assert _listed_project(fay_client, chat["id"]) is None
    ok = _ok(fay_client.patch(f"/v1/chats/{chat['id']}", json={"project": here["id"]}))
    assert ok["project"] == here["id"]


@pytest.mark.anyio
async def test_ws7_the_owner_hears_chat_updated_and_others_do_not(world, server):
    world.grant("bob", "read")

    with world.client("alice") as alice, world.client("bob") as bob:
        project = _project(alice, "Heard")
        chat = _ok(alice.post("/v1/chats", json={"bot": world.bot}))
        bobs = _ok(bob.post("/v1/chats", json={"bot": world.bot}))
        async with (
            Socket(server.url, world.tokens["alice"]) as a,
            Socket(server.url, world.tokens["bob"]) as b,
        ):
            path = f"/v1/chats/{chat['id']}"
            _ok(await asyncio.to_thread(alice.patch, path, json={"project": project["id"]}))
            (event,) = await a.chat_updates(chat["id"], 1)
            assert event == {
                "chat": chat["id"],
                "revision": 2,
                "change": "project",
                "project": project["id"],
            }
            # Bob's next chat.updated is about his own chat, not alice's; setting the
            # project a chat already has changes nothing and announces nothing.
            _ok(
                await asyncio.to_thread(
                    bob.patch, f"/v1/chats/{bobs['id']}", json={"project": None}
                )
            )
            mine = _ok(bob.post(f"{WS}/projects", json={"requestId": "b1", "name": "B"}))
            _ok(
                await asyncio.to_thread(
                    bob.patch, f"/v1/chats/{bobs['id']}", json={"project": mine["id"]}
                )
            )
            frame = msgspec.json.decode(await asyncio.wait_for(_next_update(b), 20))
            # His first: the real change (revision 2), not the no-op before it.
            assert (frame["data"]["chat"], frame["data"]["revision"]) == (bobs["id"], 2)


async def _next_update(sock: Socket) -> bytes:
    while True:
        raw = await sock.ws.recv()
        if msgspec.json.decode(raw)["type"] == "chat.updated":
            return raw


@pytest.mark.anyio
async def test_ws7_concurrent_changes_leave_one_value_and_one_event_each(world, server):
    """24 changes at once, each to another project: each answers its own revision, one event
    each, and the chat ends with the project of the highest revision, as the last answer,
    the listing and the events all say."""

    with world.client("alice") as alice:
        projects = [_project(alice, f"P{k}")["id"] for k in range(CONCURRENT)]
        chat = _ok(alice.post("/v1/chats", json={"bot": world.bot}))
        path = f"/v1/chats/{chat['id']}"
        async with Socket(server.url, world.tokens["alice"]) as sock:
            answers = await asyncio.gather(
                *(asyncio.to_thread(alice.patch, path, json={"project": p}) for p in projects)
            )
            events = await sock.chat_updates(chat["id"], CONCURRENT)
        stored = _listed_project(alice, chat["id"])
    bodies = [_ok(a) for a in answers]
    revisions = sorted(b["revision"] for b in bodies)
    assert revisions == list(range(2, CONCURRENT + 2))
    assert sorted(e["revision"] for e in events) == revisions
    by_revision = {e["revision"]: e["project"] for e in events}
    assert by_revision == {b["revision"]: b["project"] for b in bodies}
    assert stored == by_revision[max(by_revision)]


@pytest.fixture(scope="module")
def caching(engine) -> Iterator[LiveServer]:
    """A gateway that caches chat records (as `openbot serve` does)."""
    live = LiveServer(create_app(engine, ADMIN, cache_ttl=60.0))
    yield live
    live.stop()


def test_ws7_a_caching_gateway_uses_the_new_project_at_the_next_turn(
    world, admin, bot_model, caching
):
    tag = secrets.token_hex(3)
    name = f"Cached{tag}"
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
        )
    )["id"]
    prompts: list[str] = []

    def route(body):
        system = body["messages"][0]["content"]
        if system.startswith(f"You are {name}."):
            prompts.append(system)
            return completion("Noted.")
        return None

    bot_model.routes.append(route)
    with user_client(caching, world.tokens["alice"]) as alice:
        first = _project(alice, "First")
        second = _project(alice, "Second")
        _remember(alice, bot, first["id"], "First meets at nine.")
        _remember(alice, bot, second["id"], "Second meets at ten.")
        chat = _ok(alice.post("/v1/chats", json={"bot": bot, "project": first["id"]}))
        turns = f"/v1/chats/{chat['id']}/turns?wait=true"
        for _ in range(2):  # the chat's context is cached after the first
            _ok(alice.post(turns, json={"text": "When?"}))
            assert "First meets at nine." in prompts[-1]
        _ok(alice.patch(f"/v1/chats/{chat['id']}", json={"project": second["id"]}))
        _ok(alice.post(turns, json={"text": "When?"}))
        assert "Second meets at ten." in prompts[-1] and "First" not in prompts[-1]


def test_ws7_a_caching_gateway_never_keeps_a_changed_chat(world, admin, bot_model, caching):
    """The chat's old record is not used once its change returned, even when the org and bot
    it is read with are cached again meanwhile (by a turn in another chat with the bot)."""
    tag = secrets.token_hex(3)
    name = f"Kept{tag}"
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
        )
    )["id"]
    prompts: list[str] = []

    def route(body):
        system = body["messages"][0]["content"]
        if system.startswith(f"You are {name}."):
            prompts.append(system)
            return completion("Noted.")
        return None

    bot_model.routes.append(route)
    with user_client(caching, world.tokens["alice"]) as alice, world.client("alice") as elsewhere:
        first = _project(alice, "One")
        second = _project(alice, "Two")
        _remember(alice, bot, first["id"], "One meets at nine.")
        _remember(alice, bot, second["id"], "Two meets at ten.")
        chat = _ok(alice.post("/v1/chats", json={"bot": bot, "project": first["id"]}))
        other = _ok(alice.post("/v1/chats", json={"bot": bot}))
        _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "When?"}))
        assert "One meets at nine." in prompts[-1]
        # Changed through another gateway: returns once the caching one applied it.
        patched = elsewhere.patch(f"/v1/chats/{chat['id']}", json={"project": second["id"]})
        _ok(patched)
        _ok(alice.post(f"/v1/chats/{other['id']}/turns?wait=true", json={"text": "Hi"}))
        _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "When?"}))
        assert "Two meets at ten." in prompts[-1] and "One" not in prompts[-1]


@pytest.mark.anyio
async def test_ws7_the_directory_checks_owner_use_kind_and_org_itself(directory):
    """Whoever calls the directory (not only the gateway's checks): only the chat's owner, who
    still uses its bot, changes a direct chat's project, and only to one of the chat's org."""
    from engine.directory import Permission
    from engine.errors import Forbidden, NotFound, Unprocessable

    d = directory
    org = await d.create_org("o", "o_1")
    await d.create_user("Ann", [org.id], "u_ann")
    await d.create_user("Bo", [org.id], "u_bo")
    bot = await d.create_bot(name="B", org=org.id, owner="u_bo")
    await d.grant(bot.id, "u_ann", Permission.READ)
    chat = await d.create_chat("u_ann", None, bot=bot.id)
    with pytest.raises(Forbidden):
        await d.set_chat_project(chat.id, "u_bo", None, None)
    with pytest.raises(NotFound):
        await d.set_chat_project(chat.id, "u_ann", "p_1", "o_other")
    done = await d.set_chat_project(chat.id, "u_ann", "p_1", org.id)
    assert (done.project, done.revision) == ("p_1", 2)
    await d.revoke_grant(bot.id, "u_ann")
    with pytest.raises(Forbidden):
        await d.set_chat_project(chat.id, "u_ann", None, None)
    assert (await d.get_chat(chat.id)).project == "p_1"
    channel = await d.create_channel(org=org.id, people=["u_ann"], bots=[bot.id])
    group = await d.group_chat(channel.id)
    with pytest.raises(Unprocessable):
        await d.set_chat_project(group.id, "u_ann", "p_1", org.id)


@pytest.mark.anyio
async def test_ws7_a_chat_read_before_a_change_is_not_cached_after_it():
    """A gateway's chat read that the directory answered before a change this gateway already
    applied is used for that request only: kept, it would be served (with an org and bot cached
    afresh by another chat) after the change returned."""
    from engine.directory import Bot, Chat, ChatContext, Org
    from gateway.auth import Auth

    org = Org(id="o_1", name="o")
    bot = Bot(id="b_1", name="B", org="o_1", owner="u_ann")

    def chat(chat_id: str, project: str | None, revision: int = 1) -> Chat:
        return Chat(
            id=chat_id,
            kind="direct",
            owner="u_ann",
            org="o_1",
            bot="b_1",
            project=project,
            revision=revision,
        )

    class Directory:
        """The directory at access revision 5; `stale` answers one read from revision 4."""

        def __init__(self) -> None:
            self.applied = asyncio.Event()
            self.stale: dict[str, tuple[int, ChatContext]] = {}
            self.reads: list[str] = []

        async def watch_access(
            self, watcher: str, since: int, wait: float
        ) -> tuple[int, tuple[str, ...] | None]:
            if since >= 5:
                self.applied.set()
                await asyncio.sleep(wait)
            return 5, None  # (what changed is not named: everything)

        async def chat_context_at(self, chat_id: str) -> tuple[int, ChatContext]:
            self.reads.append(chat_id)
            if chat_id in self.stale:
                return self.stale.pop(chat_id)
            now = chat(chat_id, "p_new", 2) if chat_id == "chat_x" else chat(chat_id, None)
            return 5, ChatContext(chat=now, org=org, bot=bot)

    class Engine:
        directory_port = Directory()

    engine = Engine()
    auth = Auth(engine, "admin", ttl=60.0)  # type: ignore[arg-type]
    auth.watch()
    await asyncio.wait_for(engine.directory_port.applied.wait(), 5)
    engine.directory_port.stale["chat_x"] = (
        4,
        ChatContext(chat=chat("chat_x", "p_old"), org=org, bot=bot),
    )
    assert (await auth.context("chat_x")).chat.project == "p_old"  # that request's read
    await auth.context("chat_y")  # the org and the bot cached at revision 5
    assert (await auth.context("chat_x")).chat.project == "p_new"
    assert engine.directory_port.reads == ["chat_x", "chat_y", "chat_x"]
    # An answer about an older revision that arrives late (a slower change's) is not kept.
    auth.know_chat(chat("chat_x", "p_old"))
    assert (await auth.context("chat_x")).chat.project == "p_new"
    assert len(engine.directory_port.reads) == 3
