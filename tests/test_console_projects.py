"""The console's project pages, capabilities and node hint in a real browser (WS-7, ND-1,
ND-3; docs/design.md §11): the same Playwright and Chromium as tests/test_console.py (its
fixtures), the real server fixture, only `data-testid` hooks. Screenshots go to
`artifacts/console/`."""

from __future__ import annotations

import re
import secrets

from tests import test_console as console
from tests.conftest import World, _ok
from tests.test_console import ARTIFACTS, _sign_in
from tests.waiting import wait_until

# The browser fixtures of the console tests (module-scoped there, so one browser here too).
browser, page = console.browser, console.page


def _project_world(world: World, admin) -> tuple[dict, dict, dict]:
    """Alice's project with bob, linked to a group of theirs, and a project memory of alice's
    that she edited once (two revisions)."""
    ws = "/api/app/workspace"
    channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={
                "org": world.org,
                "name": f"Crew {secrets.token_hex(2)}",
                "people": [world.users["alice"], world.users["bob"]],
                "bots": [world.bot],
            },
        )
    )
    with world.client("alice") as alice:
        project = _ok(
            alice.post(
                f"{ws}/projects",
                json={
                    "requestId": secrets.token_hex(6),
                    "name": "Apollo",
                    "members": [world.users["bob"]],
                    "channels": [channel["id"]],
                },
            )
        )
        memory = _ok(
            alice.post(
                f"{ws}/memories",
                json={
                    "requestId": secrets.token_hex(6),
                    "scope": "project",
                    "bot": world.bot,
                    "project": project["id"],
                    "content": "We ship on Thursdays.",
                },
            )
        )
        memory = _ok(
            alice.post(
                f"{ws}/memories",
                json={
                    "requestId": secrets.token_hex(6),
                    "id": memory["id"],
                    "expectedRevision": memory["revision"],
                    "content": "We ship on Fridays.",
                },
            )
        )
    return project, channel, memory


def test_ws7_project_page_members_groups_memory_history_export_and_chat_project(
    world: World, admin, server, page
):
    """Seed-002 project page: members, linked groups, memory with its revision history and the
    Markdown export; live from memory.changed. A direct chat's project is picked in the chat
    and follows chat.updated from elsewhere."""
    project, channel, memory = _project_world(world, admin)
    _sign_in(page, server.url, world.tokens["alice"])
    page.get_by_test_id("nav-projects").click()  # offered: the server announces bot-projects-v1
    entry = page.locator(f'[data-testid="project-entry"][data-project-id="{project["id"]}"]')
    entry.click()
    panel = page.get_by_test_id("project-page")
    panel.wait_for()
    assert panel.get_attribute("data-project-id") == project["id"]
    assert page.get_by_test_id("project-name").inner_text() == "Apollo"
    members = page.get_by_test_id("project-member")
    members.first.wait_for()
    got = members.evaluate_all("els => els.map(e => e.dataset.userId)")
    assert sorted(got) == sorted([world.users["alice"], world.users["bob"]])
    assert "alice (you)" in page.get_by_test_id("project-members").inner_text()
    linked = page.get_by_test_id("project-channel")
    assert linked.evaluate_all("els => els.map(e => e.dataset.channelId)") == [channel["id"]]
    assert channel["name"] in linked.first.inner_text()

    card = page.locator(f'[data-testid="project-memory"][data-entry-id="{memory["id"]}"]')
    card.wait_for()
    assert "We ship on Fridays." in card.inner_text() and "revision 2" in card.inner_text()
    card.get_by_test_id("memory-history").click()
    revisions = card.get_by_test_id("memory-revision")
    revisions.nth(1).wait_for()
    changes = revisions.evaluate_all("els => els.map(e => [e.dataset.revision, e.dataset.change])")
    assert [r for r, _ in changes] == ["1", "2"], changes
    assert "before: We ship on Thursdays." in revisions.nth(1).inner_text()
    assert "after: We ship on Fridays." in revisions.nth(1).inner_text()

    page.get_by_test_id("project-export").click()
    exported = page.get_by_test_id("project-export-text")
    exported.wait_for()
    assert re.search(r"^- \(\d{4}-\d{2}-\d{2}\) We ship on Fridays\.$", exported.inner_text(), re.M)
    assert "Thursdays" not in exported.inner_text()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "project-page.png"), full_page=True)

    with world.client("alice") as alice:  # a write made elsewhere shows live
        _ok(
            alice.post(
                "/api/app/workspace/memories",
                json={
                    "requestId": secrets.token_hex(6),
                    "scope": "project",
                    "bot": world.bot,
                    "project": project["id"],
                    "content": "Demo day is in May.",
                },
            )
        )
        page.get_by_test_id("project-memory").filter(has_text="Demo day is in May.").wait_for(
            timeout=5_000
        )
        # The history stays open across the reload the event caused.
        card.get_by_test_id("memory-revision").nth(1).wait_for()
        assert card.get_by_test_id("memory-revision").count() == 2

        # A direct chat picks the project in its header; the API agrees.
        chat = _ok(alice.post("/v1/chats", json={"bot": world.bot}))
        page.goto(f"{server.url}/#/chats/{chat['id']}")
        picker = page.get_by_test_id("chat-project")
        picker.locator(f'option[value="{project["id"]}"]').wait_for(state="attached")
        picker.select_option(project["id"])
        wait_until(
            lambda: _listed_project(alice, chat["id"]) == project["id"],
            "the console sets the chat's project",
        )
        # Cleared elsewhere: the picker follows chat.updated.
        _ok(alice.patch(f"/v1/chats/{chat['id']}", json={"project": None}))
    page.wait_for_function(
        "() => document.querySelector('[data-testid=chat-project]').value === ''", timeout=5_000
    )
    assert page.get_by_test_id("chat-project-error").inner_text() == ""


def _listed_project(client, chat: str):
    chats = _ok(client.get("/v1/chats", params={"limit": 200}))["items"]
    return next(c for c in chats if c["id"] == chat)["project"]


ND1 = {"bot-collaboration-v1", "bot-discussion-v1", "bot-file-memory-v1", "bot-projects-v1"}


def test_nd1_nd3_capabilities_are_shown_and_a_node_without_isolation_gets_a_hint(
    world: World, admin, server, page
):
    tag = secrets.token_hex(3)
    made = {}
    for name, model in (("Iso", "bot"), ("Edge", "edge")):  # built-in worker; an absent node
        made[name] = _ok(
            admin.post(
                "/v1/admin/bots",
                json={
                    "name": f"{name}{tag}",
                    "org": world.org,
                    "owner": world.users["alice"],
                    "model": model,
                },
            )
        )["id"]
    _sign_in(page, server.url, world.tokens["alice"], f"#/bots/{made['Edge']}/memory")
    page.get_by_test_id("memory-panel").wait_for()
    hint = page.get_by_test_id("node-upgrade-hint")
    hint.wait_for()
    assert hint.get_attribute("data-node-id") == "edge-1"
    status = page.get_by_test_id("node-status")
    assert status.get_attribute("data-memory-injected") == "false"
    # ND-3: never a claim that isolation or extraction is on.
    said = status.inner_text().lower()
    assert "memory isolated" not in said and "extraction on" not in said
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "node-upgrade-hint.png"), full_page=True)

    page.locator(f'[data-testid="bot-entry"][data-bot-id="{made["Iso"]}"]').click()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=node-status]')"
        "?.dataset.memoryInjected === 'true'"
    )
    assert "memory isolated" in page.get_by_test_id("node-status").inner_text()
    assert page.get_by_test_id("node-upgrade-hint").count() == 0

    page.get_by_test_id("nav-workspace").click()
    caps = page.get_by_test_id("capability")
    caps.first.wait_for()
    shown = set(caps.evaluate_all("els => els.map(e => e.dataset.capability)"))
    assert shown >= ND1, shown
    builtin = page.locator('[data-testid="node-entry"][data-node-id="builtin"]')
    assert builtin.get_attribute("data-isolated") == "true"
    assert builtin.get_by_test_id("node-upgrade-hint").count() == 0
