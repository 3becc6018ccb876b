"""The web console in a real browser (docs/design.md §11): Playwright drives Debian's Chromium
(/usr/bin/chromium; `./run test` installs it where missing, never a downloaded build) against the
real server fixture, with the bots' model served by the loopback stub. Only the contract's test
hooks (`data-testid`) are used to find things. Each test leaves a screenshot in
`artifacts/console/` (git-ignored)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ADMIN, World, _ok
from tests.openai_stub import bot_of, completion
from tests.waiting import wait_until

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "console"
CONSOLE_FILES = Path(__file__).resolve().parent.parent / "gateway" / "console"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """One browser for every browser test (they all live in this module); each test gets its own
    context, and Chromium runs on a fresh temporary user-data-dir. Not session-scoped: while
    Playwright's sync API is open it keeps its event loop running in this thread, and the later
    tests' `asyncio.run` would refuse to start."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `./run test` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, request, server) -> Iterator:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    pg.set_default_timeout(15_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    # Whatever the page's policy refuses (a script, an image, the events socket) is an error.
    pg.on(
        "console",
        lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None,
    )
    pg.errors = errors  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        try:
            pg.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
        finally:
            context.close()
    assert not errors, errors


def _sign_in(page, url: str, token: str, hash_: str = "") -> None:
    page.goto(f"{url}/{hash_}")
    page.get_by_test_id("token-input").fill(token)
    page.get_by_test_id("sign-in").click()


def _watch_requests(page) -> list[str]:
    seen: list[str] = []
    page.on("request", lambda r: seen.append(f"{r.method} {r.url}"))
    return seen


def _group(world: World, admin, n: int = 3) -> tuple[list[dict], dict]:
    tag = secrets.token_hex(3)
    owners = list(world.users.values())
    bots = [
        _ok(
            admin.post(
                "/v1/admin/bots",
                json={
                    "name": f"C{k}{tag}",
                    "org": world.org,
                    "owner": owners[k % len(owners)],
                    "model": "bot",
                },
            )
        )
        for k in range(n)
    ]
    channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={
                "org": world.org,
                "name": f"Team {tag}",
                "people": [world.users["alice"], world.users["bob"]],
                "bots": [b["id"] for b in bots],
            },
        )
    )
    return bots, channel


def test_a_two_round_discussion_appears_live_once_and_resumes_after_a_drop(
    world: World, admin, server, bot_model, page
):
    bots, channel = _group(world, admin)
    names = {b["name"] for b in bots}

    def route(body):
        name = bot_of(body)
        if name not in names:
            return None
        said = " ".join(str(m["content"]) for m in body["messages"])
        r = re.findall(r"\(round (\d+) of", said)
        # A little time per reply, so the stream is dropped while the discussion runs.
        return ("delay", 0.4, completion(f"{name} says hello in round {r[-1] if r else 1}"))

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = _ok(alice.post("/v1/chats", json={"channel": channel["id"]}))
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    requests = _watch_requests(page)

    _sign_in(page, server.url, world.tokens["alice"])
    page.get_by_test_id("chat-list").wait_for()
    entry = page.locator(f'[data-testid="chat-entry"][data-chat-id="{chat["id"]}"]')
    entry.click()
    page.get_by_test_id("message-input").fill("discuss in 2 rounds")
    page.get_by_test_id("send").click()

    bot_items = page.locator('[data-testid="item"][data-kind="bot"]')
    bot_items.first.wait_for(timeout=20_000)
    page.evaluate("window.openbotConsole.drop()")  # a network drop in the middle
    # A string expression, as outside checks write them: the page's policy must let it run.
    page.wait_for_function(
        "() => document.querySelectorAll('[data-testid=item][data-kind=bot]').length >= 6",
        timeout=20_000,
    )
    texts = bot_items.all_inner_texts()
    assert len(texts) == 6, texts
    for name in names:
        assert sum(name in t and "round 1" in t for t in texts) == 1, (name, texts)
        assert sum(name in t and "round 2" in t for t in texts) == 1, (name, texts)
    person = page.locator('[data-testid="item"][data-kind="person"]')
    assert person.all_inner_texts()[0].endswith("discuss in 2 rounds")

    # Resumed with the cursor, without a duplicate: 7 distinct items, each fetched once.
    assert len(sockets) >= 2 and "cursor=" in sockets[-1], sockets
    ids = page.locator('[data-testid="item"]').evaluate_all("els => els.map(e => e.dataset.itemId)")
    assert ids == [f"i-{k}" for k in range(1, 8)], ids
    one_by_one = [r for r in requests if re.search(rf"/chats/{chat['id']}/items/i-\d+$", r)]
    assert len(one_by_one) == len(set(one_by_one)), one_by_one
    whole = [r for r in requests if r.endswith(f"/chats/{chat['id']}/items")]
    assert len(whole) == 1, whole  # read once on opening; afterwards only what events name

    # Idle: the console does not poll.
    before = len(requests)
    page.wait_for_timeout(1500)
    assert requests[before:] == []


def test_a_channel_without_a_chat_is_listed_and_mentions_pick_one_bot(
    world: World, admin, server, bot_model, page
):
    bots, channel = _group(world, admin, n=2)
    names = {b["name"] for b in bots}
    bot_model.routes.append(
        lambda body: completion(f"{bot_of(body)} answers") if bot_of(body) in names else None
    )
    _sign_in(page, server.url, world.tokens["bob"])
    group = page.locator('[data-testid="chat-entry"][data-kind="group"]')
    group.first.wait_for()
    assert group.count() == 1
    with world.client("bob") as bob:
        listed = _ok(bob.get("/v1/chats", params={"kind": "group"}))["items"]
    assert [c["channel"] for c in listed] == [channel["id"]]
    assert group.first.get_attribute("data-chat-id") == listed[0]["id"]
    group.first.click()
    target = bots[1]["name"]
    page.get_by_test_id("message-input").fill(f"@{target} what do you think?")
    page.get_by_test_id("send").click()
    page.locator('[data-testid="item"][data-kind="bot"]').first.wait_for(timeout=20_000)
    page.wait_for_timeout(500)
    texts = page.locator('[data-testid="item"][data-kind="bot"]').all_inner_texts()
    assert len(texts) == 1 and f"{target} answers" in texts[0], texts


def _chain_bots(world: World, admin) -> tuple[dict, dict]:
    tag = secrets.token_hex(3)
    made = []
    for role in ("Asker", "Helper"):
        made.append(
            _ok(
                admin.post(
                    "/v1/admin/bots",
                    json={
                        "name": f"{role}{tag}",
                        "org": world.org,
                        "owner": world.users["alice"],
                        "model": "bot",
                    },
                )
            )
        )
    return made[0], made[1]


def _chain_route(asker: dict, helper: dict, helper_answer):
    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name == asker["name"]:
            if last["role"] == "tool":
                return completion("I asked my colleague.")
            if "[delivery from" in str(last["content"]):
                return completion("My colleague says the build is green.")
            msg = {"agent": helper["name"], "message": "Is the build green?"}
            return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
        if name == helper["name"]:
            return helper_answer
        return None

    return route


def test_a_running_chain_is_shown_and_stopped(world: World, admin, server, bot_model, page):
    asker, helper = _chain_bots(world, admin)
    # The helper takes its time, so the chain is still running when it is stopped.
    bot_model.routes.append(_chain_route(asker, helper, ("delay", 4, completion("Yes, green."))))
    with world.client("alice") as alice:
        chat = _ok(alice.post("/v1/chats", json={"bot": asker["id"]}))
    _sign_in(page, server.url, world.tokens["alice"])
    page.locator(f'[data-testid="chat-entry"][data-chat-id="{chat["id"]}"]').click()
    page.get_by_test_id("message-input").fill("Check CI with your colleague")
    page.get_by_test_id("send").click()

    chain = page.locator('[data-testid="chain-list"] [data-testid="chain-entry"]')
    chain.first.wait_for(timeout=20_000)
    assert chain.first.get_attribute("data-status") == "running"
    assert asker["name"] in chain.first.inner_text()
    chain.first.get_by_test_id("chain-stop").click()
    page.locator('[data-testid="chain-entry"][data-status="stopped"]').wait_for(timeout=10_000)
    assert page.get_by_test_id("chain-stop").first.is_disabled()
    with world.client("alice") as alice:
        chains = _ok(alice.get("/api/app/workspace/collaboration"))["items"]
    mine = [c for c in chains if c["rootChat"] == chat["id"]]
    assert [c["status"] for c in mine] == ["stopped"]
    # The reason, with the ids in it shown as names.
    assert mine[0]["reason"] == f"stopped by {world.users['alice']}"
    assert page.get_by_test_id("chain-reason").first.inner_text() == "why: stopped by alice (you)"


def test_a_delivery_shows_the_communication_display(world: World, admin, server, bot_model, page):
    asker, helper = _chain_bots(world, admin)
    bot_model.routes.append(_chain_route(asker, helper, completion("Yes, the build is green.")))
    with world.client("alice") as alice:
        chat = _ok(alice.post("/v1/chats", json={"bot": asker["id"]}))
    _sign_in(page, server.url, world.tokens["alice"])
    page.locator(f'[data-testid="chat-entry"][data-chat-id="{chat["id"]}"]').click()
    page.get_by_test_id("message-input").fill("Check CI")
    page.get_by_test_id("send").click()
    # The asking bot's chat holds both records (UI-1): "sent to" the helper, then its answer.
    items = '[data-testid="item"][data-kind="delivery"]'
    comm = '[data-testid="communication"]'
    delivery = page.locator(f'{items}:has({comm}[data-direction="received"])')
    delivery.wait_for(timeout=20_000)
    sent = page.locator(f'{items}:has({comm}[data-direction="sent"])')
    assert sent.get_by_test_id("communication").inner_text().split()[:2] == ["sent", "to"]
    head = delivery.get_by_test_id("communication")
    assert head.get_attribute("data-direction") == "received"
    assert head.inner_text().split() == ["message", "from", helper["name"][0], helper["name"]]
    assert "Yes, the build is green." in delivery.inner_text()
    # UI-1: centred above the body, 12 px text, 16 px avatar, 6 px gap, no rules or borders.
    style = head.evaluate(
        """el => { const s = getComputedStyle(el), a = el.querySelector('.avatar');
                   const r = a.getBoundingClientRect();
                   return [s.justifyContent, s.fontSize, s.columnGap, s.borderTopStyle,
                           s.borderBottomStyle, r.width, r.height]; }"""
    )
    assert style == ["center", "12px", "6px", "none", "none", 16, 16], style
    page.locator('[data-testid="chain-entry"][data-status="done"]').wait_for(timeout=10_000)


def test_memory_panel_shows_a_remember_made_elsewhere_live(world: World, admin, server, page):
    requests = _watch_requests(page)
    # The panel opens from its address too.
    _sign_in(page, server.url, world.tokens["alice"], f"#/bots/{world.bot}/memory")
    panel = page.get_by_test_id("memory-panel")
    panel.wait_for()
    assert panel.get_attribute("data-bot-id") == world.bot
    assert page.get_by_test_id("memory-entry").count() == 0

    with world.client("alice") as alice:
        r = alice.post(
            f"/v1/bots/{world.bot}/memory",
            json={
                "command": {
                    "_tag": "Remember",
                    "content": "Deploys are on Tuesdays.",
                    "tags": ["ops"],
                }
            },
        )
        assert r.status_code == 201, r.text
    entry = page.get_by_test_id("memory-entry").filter(has_text="Deploys are on Tuesdays.")
    entry.wait_for(timeout=20_000)  # pushed by the event stream: the page is not reloaded
    assert entry.get_attribute("data-layer") == "pinned"
    assert "ops" in entry.inner_text() and "alice (you)" in entry.inner_text()

    # Remember and Forget from the panel.
    page.get_by_test_id("remember-input").fill("Coffee is in the kitchen.")
    page.get_by_test_id("remember").click()
    mine = page.get_by_test_id("memory-entry").filter(has_text="Coffee is in the kitchen.")
    mine.wait_for(timeout=5_000)
    mine.get_by_test_id("forget").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('[data-testid="memory-entry"]')]
                 .filter(e => e.innerText.includes('Coffee'))
                 .every(e => e.dataset.status !== 'active')""",
        timeout=5_000,
    )
    with world.client("alice") as alice:
        stored = {
            e["content"]: e["status"]
            for e in alice.get(f"/v1/bots/{world.bot}/memory").json()["entries"]
        }
    assert stored.get("Coffee is in the kitchen.", "retracted") == "retracted"

    # Bob uses the bot too, but his panel never shows alice's entries.
    bob_page = page.context.browser.new_context().new_page()
    try:
        world.grant("bob", "read")
        _sign_in(bob_page, server.url, world.tokens["bob"])
        bob_page.locator(f'[data-testid="bot-entry"][data-bot-id="{world.bot}"]').click()
        bob_page.get_by_test_id("memory-panel").wait_for()
        bob_page.wait_for_timeout(300)
        assert bob_page.get_by_test_id("memory-entry").count() == 0
    finally:
        bob_page.context.close()
    assert any("/memory" in r for r in requests)


def test_admin_view_creates_an_org_a_user_a_bot_with_a_model_and_a_channel(admin, server, page):
    tag = secrets.token_hex(3)
    _sign_in(page, server.url, ADMIN)
    page.get_by_test_id("admin-view").wait_for()
    org_form = page.get_by_test_id("create-org")
    org_form.locator('input[name="name"]').fill(f"Org {tag}")
    org_form.locator('input[name="botMemoryModel"]').fill("mem")
    org_form.get_by_role("button").click()
    page.get_by_test_id("admin-orgs").get_by_text(f"Org {tag}").wait_for()
    orgs = _ok(admin.get("/v1/admin/orgs", params={"limit": 200}))["items"]
    org = next(o for o in orgs if o["name"] == f"Org {tag}")
    assert org["settings"]["botMemoryModel"] == "mem"

    user_form = page.get_by_test_id("create-user")
    user_form.locator('input[name="name"]').fill(f"Uma {tag}")
    user_form.locator('select[name="org"]').select_option(org["id"])
    user_form.get_by_role("button").click()
    token = page.get_by_test_id("new-token").locator(".token")
    token.wait_for()
    assert token.inner_text().startswith("obt_")
    users = _ok(admin.get("/v1/admin/users", params={"org": org["id"]}))["items"]
    assert [u["name"] for u in users] == [f"Uma {tag}"]

    bot_form = page.get_by_test_id("create-bot")
    bot_form.locator('input[name="name"]').fill(f"Bo {tag}")
    bot_form.locator('select[name="org"]').select_option(org["id"])
    bot_form.locator('select[name="owner"]').select_option(users[0]["id"])
    bot_form.locator('input[name="model"]').fill("bot")
    bot_form.get_by_role("button").click()
    page.get_by_test_id("admin-bots").get_by_text(f"Bo {tag}").wait_for()
    bots = _ok(admin.get("/v1/admin/bots", params={"org": org["id"]}))["items"]
    assert [(b["name"], b["model"]) for b in bots] == [(f"Bo {tag}", "bot")]

    ch_form = page.get_by_test_id("create-channel")
    ch_form.locator('input[name="name"]').fill(f"Room {tag}")
    ch_form.locator('select[name="org"]').select_option(org["id"])
    ch_form.locator(f'input[name="people"][value="{users[0]["id"]}"]').check()
    ch_form.locator(f'input[name="bots"][value="{bots[0]["id"]}"]').check()
    ch_form.get_by_role("button").click()
    page.get_by_test_id("admin-channels").get_by_text(f"Room {tag}").wait_for()
    channels = _ok(admin.get("/v1/admin/channels", params={"org": org["id"]}))["items"]
    assert [(c["name"], c["people"], c["bots"]) for c in channels] == [
        (f"Room {tag}", [users[0]["id"]], [bots[0]["id"]])
    ]

    # The new user's token signs in to a console that lists the new group chat.
    user_page = page.context.new_page()
    _sign_in(user_page, server.url, token.inner_text())
    user_page.locator('[data-testid="chat-entry"][data-kind="group"]').wait_for()
    user_page.close()


def test_console_files_are_public_and_locked_down(server):
    import httpx

    with httpx.Client(base_url=server.url) as c:
        index = c.get("/")
        assert index.status_code == 200 and 'data-testid="token-input"' in index.text
        policy = index.headers["content-security-policy"]
        directives = {
            name: set(values)
            for name, *values in (d.split() for d in policy.split(";") if d.strip())
        }
        # No eval, images from this server or inline only, connections (the events
        # websocket included) to this origin only; nothing from anywhere.
        assert directives["default-src"] == {"'self'"}
        assert directives["script-src"] == {"'self'"}
        assert directives["img-src"] == {"'self'", "data:"}
        assert directives["connect-src"] == {"'self'"}
        assert directives["object-src"] == {"'none'"}
        assert directives["frame-ancestors"] == {"'none'"}
        assert "unsafe-eval" not in policy and "*" not in policy and "ws:" not in policy
        js = c.get("/console/app.js")
        assert js.status_code == 200 and "javascript" in js.headers["content-type"]
        assert js.headers["content-security-policy"] == policy
        # No eval in the console's own code either (the policy would refuse it at run time).
        code = "".join(p.read_text() for p in CONSOLE_FILES.glob("*.js"))
        assert not re.search(r"\beval\s*\(|new\s+Function\s*\(|\bFunction\s*\(", code)
        assert c.get("/console/nosuch.js").status_code == 404
        # Nothing but the console's own files: no way up into the package (401 or 404, as the
        # path is normalised to one outside the public ones).
        escape = c.get("/console/../gateway/app.py")
        assert escape.status_code in (401, 404) and "import" not in escape.text


@pytest.fixture
def mem_model(model_stubs):
    stub = model_stubs["mem"]
    yield stub
    stub.routes.clear()


def test_records_and_workspace_memory(world: World, admin, server, bot_model, mem_model, page):
    """A chat's confessions and failed memory job (with its reason), and workspace memory found
    by search, as a person sees them."""
    admin.patch(
        f"/v1/admin/orgs/{world.org}",
        json={"settings": {"botMemoryModel": "mem", "autoRecord": True}},
    )
    name = f"Jobber{secrets.token_hex(3)}"
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
        )
    )

    def speak(body):
        if bot_of(body) != name:
            return None
        if body["messages"][-1]["role"] == "tool":
            return completion("Done, and I said how it went.")
        return completion(None, tool_calls=[("confide", {"text": "I am unsure about the tea."})])

    bot_model.routes.append(speak)
    # The confessor answers; every learning step gets garbage, so the job fails with a reason.
    mem_model.routes.append(
        lambda body: mem_model.GARBAGE if body.get("tools") else completion("Unsure is fine.")
    )
    with world.client("alice") as alice:
        chat = _ok(alice.post("/v1/chats", json={"bot": bot["id"]}))
        _ok(alice.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "I like tea"}))
        memory = {
            "requestId": secrets.token_hex(8),
            "scope": "bot",
            "bot": bot["id"],
            "content": "The release train leaves on Fridays.",
            "topics": ["release"],
        }
        _ok(alice.post("/api/app/workspace/memories", json=memory))
        wait_until(
            lambda: any(
                j["chat"] == chat["id"] and j["status"] == "failed"
                for j in _ok(alice.get("/api/app/workspace/memory-jobs"))["jobs"]
            ),
            "the learning job failed",
        )

    _sign_in(page, server.url, world.tokens["alice"])
    page.locator(f'[data-testid="chat-entry"][data-chat-id="{chat["id"]}"]').click()
    page.get_by_test_id("load-records").click()
    confession = page.get_by_test_id("confession")
    confession.wait_for()
    assert "I am unsure about the tea." in confession.inner_text()
    assert "Unsure is fine." in confession.inner_text()
    job = page.locator('[data-testid="memory-job"][data-status="failed"]')
    job.wait_for()
    assert "why:" in job.inner_text()

    page.goto(f"{server.url}/#/workspace")
    page.get_by_test_id("workspace").wait_for()
    page.get_by_test_id("ws-search").fill("release train")
    page.get_by_test_id("ws-search-button").click()
    hit = page.get_by_test_id("ws-entry").filter(has_text="The release train leaves on Fridays.")
    hit.wait_for()
    assert "release" in hit.inner_text() and name in hit.inner_text()
    page.locator('[data-testid="memory-job"][data-status="failed"]').first.wait_for()


def test_the_browser_refuses_eval_foreign_images_and_foreign_sockets(browser, server):
    """What the console's policy refuses, a real Chromium refuses: eval, an image
    from another origin, a websocket to another origin; its own origin's websocket opens."""
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(f"{server.url}/")
        seen = pg.evaluate(
            """async () => {
                const refused = [];
                document.addEventListener("securitypolicyviolation",
                    (e) => refused.push(e.effectiveDirective));
                // Later, as the page's own task: the driver's call itself may eval.
                setTimeout(() => {
                    try { eval("1"); refused.push("eval ran"); } catch (e) { refused.push(e.name); }
                }, 0);
                const img = new Image();
                img.src = "http://127.0.0.2:9/avatar.png";
                document.body.append(img);
                try { new WebSocket("ws://127.0.0.2:9/"); } catch (e) { refused.push(e.name); }
                const own = await new Promise((done) => {
                    const ws = new WebSocket(`ws://${location.host}/v1/events`);
                    ws.onopen = () => { done("open"); ws.close(); };
                    ws.onclose = () => done("closed");
                    ws.onerror = () => done("error");
                });
                for (let n = 0; n < 250 && refused.length < 4; n++) {
                    await new Promise((r) => setTimeout(r, 20));
                }
                return { refused: refused.sort(), own };
            }"""
        )
    finally:
        context.close()
    assert seen["refused"] == ["EvalError", "connect-src", "img-src", "script-src"], seen
    # Its own origin's socket was let through (the server then closes it: no token).
    assert seen["own"] in ("open", "closed"), seen


def test_enr3_a_person_asks_for_approval_and_the_decision_wakes_the_bot(
    world: World, admin, server, bot_model, page
):
    """ENR-3: "Ask for approval" opens a request with the composer's text; Approve decides it
    once, and the bot's answer to the decision arrives in the chat live."""
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={
                "name": f"Clerk{secrets.token_hex(3)}",
                "org": world.org,
                "owner": world.users["alice"],
                "model": "bot",
            },
        )
    )

    def route(body):
        if bot_of(body) != bot["name"]:
            return None
        if str(body["messages"][-1]["content"]).startswith("[request "):
            return completion("Booking the room as approved.")
        return completion("OK.")

    bot_model.routes.append(route)
    with world.client("alice") as alice:
        chat = _ok(alice.post("/v1/chats", json={"bot": bot["id"]}))
    _sign_in(page, server.url, world.tokens["alice"])
    page.locator(f'[data-testid="chat-entry"][data-chat-id="{chat["id"]}"]').click()
    page.get_by_test_id("message-input").fill("Book the big meeting room on Friday")
    page.get_by_test_id("request-open").click()
    entry = page.locator('[data-testid="request-list"] [data-testid="request-entry"]')
    entry.first.wait_for(timeout=10_000)
    assert entry.first.get_attribute("data-status") == "pending"
    assert "Book the big meeting room on Friday" in entry.first.inner_text()
    entry.first.get_by_test_id("request-approve").click()
    page.locator('[data-testid="request-entry"][data-status="approved"]').wait_for(timeout=10_000)
    answer = page.locator('[data-testid="item"][data-kind="bot"]')
    answer.first.wait_for(timeout=20_000)
    assert answer.first.inner_text().endswith("Booking the room as approved.")
    notice = page.locator('[data-testid="item"][data-kind="notification"]')
    assert notice.first.inner_text() == "Request “Book the big meeting room on Friday” approved."
    with world.client("alice") as alice:
        (req,) = [q for q in _ok(alice.get("/v1/requests"))["requests"] if q["chat"] == chat["id"]]
    assert req["openedBy"] == world.users["alice"] and req["status"] == "approved"
    assert page.get_by_test_id("request-approve").count() == 0
