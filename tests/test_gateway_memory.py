"""The bot memory routes end to end: real uvicorn, real Ray actors, real DuckDB files."""

from __future__ import annotations

import ray

from engine.directory import bot_pool
from engine.memory_entries import AccessProof, EntryMeta, Layer, Source

REMEMBER = {"command": {"_tag": "Remember", "content": "Run the tests first.", "tags": ["testing"]}}


def _remember(client, bot, content="Run the tests first.", tags=("testing",)):
    r = client.post(
        f"/v1/bots/{bot}/memory",
        json={"command": {"_tag": "Remember", "content": content, "tags": list(tags)}},
    )
    assert r.status_code == 201, r.text
    return r.json()


def test_remember_is_pinned_with_system_tags_and_private_to_the_caller(world):
    world.grant("bob", "write")
    with world.client("alice") as alice, world.client("bob") as bob:
        entry = _remember(alice, world.bot)
        alice_id, org = world.users["alice"], world.org
        assert entry["layer"] == "pinned"
        assert entry["status"] == "active"
        assert sorted(entry["tags"]) == sorted(
            [f"from:{alice_id}", f"for:person:{alice_id}", f"org:{org}", "testing"]
        )
        assert entry["sources"] == []
        mine = alice.get(f"/v1/bots/{world.bot}/memory").json()
        assert [e["id"] for e in mine["entries"]] == [entry["id"]]
        assert mine["version"] == 1
        # Bob has write on the bot and still cannot read memory about Alice.
        theirs = bob.get(f"/v1/bots/{world.bot}/memory").json()
        assert theirs["entries"] == []
        assert bob.get(f"/v1/bots/{world.bot}/memory/log").json()["changes"] == []


def test_tags_filter_needs_all_tags(world):
    with world.client("alice") as alice:
        a = _remember(alice, world.bot, "one", ("x", "y"))
        _remember(alice, world.bot, "two", ("x",))
        got = alice.get(f"/v1/bots/{world.bot}/memory", params={"tags": "x,y"}).json()
        assert [e["id"] for e in got["entries"]] == [a["id"]]
        assert len(alice.get(f"/v1/bots/{world.bot}/memory?tags=x").json()["entries"]) == 2


def test_forget_own_entry_retracts_and_keeps_history(world):
    with world.client("alice") as alice:
        entry = _remember(alice, world.bot)
        r = alice.post(
            f"/v1/bots/{world.bot}/memory", json={"command": {"_tag": "Forget", "id": entry["id"]}}
        )
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "retracted"
        listed = alice.get(f"/v1/bots/{world.bot}/memory").json()
        assert [(e["id"], e["status"]) for e in listed["entries"]] == [(entry["id"], "retracted")]
        assert listed["version"] == 2
        changes = alice.get(f"/v1/bots/{world.bot}/memory/log").json()["changes"]
        assert [(c["version"], c["who"], c["entry"]) for c in changes] == [
            (1, "person", entry["id"]),
            (2, "person", entry["id"]),
        ]
        assert all(isinstance(c["at"], int) and c["at"] > 1_600_000_000_000 for c in changes)


def test_forget_someone_elses_entry_is_409_and_changes_nothing(world):
    world.grant("bob", "read")
    with world.client("alice") as alice, world.client("bob") as bob:
        entry = _remember(alice, world.bot)
        for target in (entry["id"], "mem_does_not_exist"):
            r = bob.post(
                f"/v1/bots/{world.bot}/memory", json={"command": {"_tag": "Forget", "id": target}}
            )
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "not_yours"
        after = alice.get(f"/v1/bots/{world.bot}/memory").json()
        assert after["version"] == 1
        assert after["entries"][0]["status"] == "active"


def _shared_fact(engine, world, chat="chat_shared"):
    """A fact two people were present for (learned by the memory bot; no public route yet)."""
    alice, bob, org = world.users["alice"], world.users["bob"], world.org
    audience = (f"for:person:{alice}", f"for:person:{bob}")
    fact = EntryMeta(
        id=f"mem_fact_{world.bot}",
        pool=bot_pool(world.bot),
        layer=Layer.FACT,
        tags=(f"from:{alice}", *audience, f"org:{org}", f"chat:{chat}", "plans"),
        sources=(Source(chat=chat, item="i-1"),),
        proofs=(AccessProof(chat=chat, item="i-1", org=org, audience=audience),),
        created_at=1,
        updated_at=1,
    )
    obs = EntryMeta(
        id=f"mem_obs_{world.bot}",
        pool=bot_pool(world.bot),
        layer=Layer.OBSERVATION,
        tags=(*audience, f"org:{org}", f"chat:{chat}"),
        sources=(Source(entry=fact.id),),
        confidence=0.8,
        created_at=2,
        updated_at=2,
    )
    shard = engine.shard_for(alice)
    ray.get(
        shard.add_entries.remote(
            bot_pool(world.bot), [(fact, "They plan a trip"), (obs, "They like travel")]
        )
    )
    return fact, obs


def test_forget_shared_entry_drops_only_the_caller(engine, world):
    world.grant("bob", "read")
    fact, obs = _shared_fact(engine, world)
    with world.client("alice") as alice, world.client("bob") as bob:
        assert {e["id"] for e in bob.get(f"/v1/bots/{world.bot}/memory").json()["entries"]} == {
            fact.id,
            obs.id,
        }
        r = alice.post(
            f"/v1/bots/{world.bot}/memory", json={"command": {"_tag": "Forget", "id": fact.id}}
        )
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "active"
        assert f"for:person:{world.users['alice']}" not in r.json()["tags"]
        alice_sees = {e["id"] for e in alice.get(f"/v1/bots/{world.bot}/memory").json()["entries"]}
        assert fact.id not in alice_sees
        assert obs.id not in alice_sees  # its source is no longer Alice's
        bob_view = bob.get(f"/v1/bots/{world.bot}/memory").json()["entries"]
        assert {e["id"]: e["status"] for e in bob_view} == {fact.id: "active", obs.id: "active"}
        fact_view = next(e for e in bob_view if e["id"] == fact.id)
        assert fact_view["sources"] == [{"chat": "chat_shared", "item": "i-1"}]
        obs_view = next(e for e in bob_view if e["id"] == obs.id)
        assert obs_view["sources"] == [{"entry": fact.id}] and obs_view["confidence"] == 0.8
        # Bob's log: the memory bot's learning, then Alice's forget (he still sees the entry).
        changes = bob.get(f"/v1/bots/{world.bot}/memory/log").json()["changes"]
        assert [(c["who"], c["entry"]) for c in changes] == [
            ("memory_bot", fact.id),
            ("memory_bot", obs.id),
            ("person", fact.id),
        ]


def test_purge_by_system_tag_returns_only_the_count_and_takes_derived_observations(engine, world):
    _shared_fact(engine, world, chat="chat_purge")
    with world.client("alice") as alice:
        _remember(alice, world.bot, "unrelated")
        r = alice.post(
            f"/v1/bots/{world.bot}/memory/purge", json={"tag": f"from:{world.users['alice']}"}
        )
        assert r.status_code == 200, r.text
        # from:alice is on the fact and the pinned entry; the observation is derived from the fact.
        assert r.json() == {"count": 3}
        assert alice.get(f"/v1/bots/{world.bot}/memory").json()["entries"] == []
        assert alice.get(f"/v1/bots/{world.bot}/memory/log").json()["changes"] == []


def test_purge_by_chat_keeps_other_entries(engine, world):
    _shared_fact(engine, world, chat="chat_p2")
    with world.client("alice") as alice:
        kept = _remember(alice, world.bot, "stays")
        r = alice.post(f"/v1/bots/{world.bot}/memory/purge", json={"tag": "chat:chat_p2"})
        assert r.json() == {"count": 2}
        assert [e["id"] for e in alice.get(f"/v1/bots/{world.bot}/memory").json()["entries"]] == [
            kept["id"]
        ]


def test_purge_needs_write_on_a_non_linked_bot(world, admin):
    world.grant("bob", "read")
    with world.client("bob") as bob:
        r = bob.post(f"/v1/bots/{world.bot}/memory/purge", json={"tag": "chat:x"})
        assert r.status_code == 403
    linked = admin.post(
        "/v1/admin/bots",
        json={"name": "linked", "org": world.org, "owner": world.users["alice"], "linked": True},
    ).json()["id"]
    with world.client("alice") as alice:
        r = alice.post(f"/v1/bots/{linked}/memory/purge", json={"tag": "chat:x"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "linked"
        r = alice.patch(f"/v1/bots/{linked}/memory/bot", json={"expected": 0, "concurrency": 2})
        assert r.status_code == 403
        r = alice.get(f"/v1/bots/{linked}/memory/bot")
        assert r.status_code == 403 and r.json()["error"]["code"] == "linked", r.text


def test_memory_bot_settings_versioned_patch(world):
    world.grant("bob", "read")
    url = f"/v1/bots/{world.bot}/memory/bot"
    with world.client("alice") as alice, world.client("bob") as bob:
        got = alice.get(url).json()
        spend = got.pop("spend")
        assert got == {"version": 0, "instructions": "", "concurrency": None, "budget": None}
        # MB-6: this day's and month's confirmed cost and the calls without usage, apart.
        assert [s["period"].split(":")[0] for s in spend] == ["day", "month"]
        assert all(s["micros"] == 0 and s["unknownCalls"] == 0 for s in spend)
        body = {
            "expected": 0,
            "instructions": "Decisions of the team may be shared with the team.",
            "concurrency": 2,
            "budget": {"period": "month", "limitMicros": 5000000},
        }
        r = alice.patch(url, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["version"] == 1 and r.json()["concurrency"] == 2
        stale = alice.patch(url, json={"expected": 0, "concurrency": 3})
        assert stale.status_code == 409
        assert bob.patch(url, json={"expected": 1, "concurrency": 3}).status_code == 403
        # Reading the settings needs write, as changing them does.
        r = bob.get(url)
        assert r.status_code == 403 and r.json()["error"]["code"] == "no_write", r.text
        assert alice.get(url).json()["version"] == 1
        bad = alice.patch(url, json={"expected": 1, "budget": {"period": "week", "limitMicros": 1}})
        assert bad.status_code == 400
        cleared = alice.patch(url, json={"expected": 1, "budget": None, "concurrency": None})
        want = {k: v for k, v in body.items() if k != "expected"}
        assert cleared.json() == {**want, "version": 2, "concurrency": None, "budget": None}


def test_remember_with_request_id_is_done_once(world):
    url = f"/v1/bots/{world.bot}/memory"
    cmd = {"_tag": "Remember", "content": "once only", "tags": ["x"]}
    with world.client("alice") as alice:
        first = alice.post(url, json={"command": cmd, "requestId": "req-1"})
        again = alice.post(url, json={"command": cmd, "requestId": "req-1"})
        assert first.status_code == again.status_code == 201
        assert first.json() == again.json()
        page = alice.get(url).json()
        assert page["version"] == 1 and len(page["entries"]) == 1
        other = {**cmd, "content": "something else"}
        r = alice.post(url, json={"command": other, "requestId": "req-1"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "request_id_reused"
        assert alice.get(url).json()["version"] == 1
        forget = {"_tag": "Forget", "id": first.json()["id"]}
        a = alice.post(url, json={"command": forget, "requestId": "req-2"})
        b = alice.post(url, json={"command": forget, "requestId": "req-2"})
        assert a.json() == b.json() and a.json()["status"] == "retracted"
        assert alice.get(url).json()["version"] == 2


def test_admin_cli_against_a_running_server(server, world):
    import json
    import subprocess
    import sys

    from tests.conftest import ADMIN

    def cli(*args: str) -> dict:
        cmd = [sys.executable, "-m", "gateway.cli", "admin", "--url", server.url]
        out = subprocess.run(
            [*cmd, "--token", ADMIN, *args], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    org = cli("org", "create", "--name", "CLI org")["id"]
    assert cli("org", "set", org, "botMemory=false")["settings"]["botMemory"] is False
    user = cli("user", "create", "--name", "Cli", "--org", org)
    assert user["token"].startswith("obt_")
    bot = cli("bot", "create", "--name", "cb", "--org", org, "--owner", user["id"])["id"]
    # A grantee is a person of the bot's org (no grant across orgs).
    reader = cli("user", "create", "--name", "Reader", "--org", org)["id"]
    assert cli("grant", "--bot", bot, "--user", reader, "--permission", "read")
    channel = cli("channel", "create", "--org", org, "--person", user["id"], "--bot", bot)
    assert channel["bots"] == [bot] and channel["people"] == [user["id"]]
