"""Chats in `openbot export` / `openbot import`, on a real server and real DuckDB
files: a direct chat whose bot collaborated (person, bot and delivery items, agent chats), a
group chat over two rounds, and bot memory are exported from a backup, imported into a new
data directory and exported again byte for byte; the imported directory serves the same items
in the same order and holds no item text in the clear. A merge that clashes changes nothing,
and an import interrupted before its commit point can simply be run again."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import pytest

from engine.errors import InvalidInput
from gateway.cli import main
from storage import file_import, tree_files
from storage.file_export import render_data_dir
from storage.tree_files import read_tree
from tests.conftest import ADMIN, LiveServer, World, learning_bot, user_client
from tests.openai_stub import bot_of, completion

WS = "/api/app/workspace"
TAG = secrets.token_hex(3)
ASK = f"okapi-{TAG}-please check the build"
REPLY = f"quokka-{TAG}-the build is green"
GROUP = f"marmot-{TAG}-plan the launch"
SEED = f"ibis-{TAG}-prefers tea"
BOBS = f"tapir-{TAG}-bob keeps bees"  # Bob's own, which the bot's owner may not see
SECRETS = (ASK, REPLY, GROUP, SEED, BOBS)


def _ok(resp) -> dict:
    assert resp.is_success, (resp.status_code, resp.text)
    return resp.json()


def _wait(fn, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("never happened")


@pytest.fixture
def chatted(world, admin, model_stubs, engine):
    """Alice's learning bot asks her helper bot (a chain: agent chat, deliveries); a group of
    Alice, Bob and both bots talks for two rounds; Alice and Bob each have the bot remember
    something."""
    import ray

    stub = model_stubs["bot"]
    asker, asker_name = learning_bot(world, admin, "Ask")
    helper = _ok(
        admin.post(
            "/v1/admin/bots",
            json={
                "name": f"Help{TAG}",
                "org": world.org,
                "owner": world.users["alice"],
                "model": "bot",
            },
        )
    )
    world.grant = lambda bot, name: _ok(
        admin.post(
            "/v1/admin/grants",
            json={"bot": bot, "user": world.users[name], "permission": "read"},
        )
    )
    world.grant(asker, "bob")

    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name == asker_name:
            if last["role"] == "tool":
                return completion("I asked my colleague.")
            if "[delivery from" in str(last["content"]):
                return completion("My colleague says: green.")
            if ASK in str(last["content"]):
                msg = {"agent": helper["name"], "message": "Is the build green?"}
                return completion(None, tool_calls=[("workspace_send_to_agent", msg)])
            return completion(f"{asker_name} on the plan")
        if name == helper["name"]:
            return completion(REPLY if "build" in str(body["messages"]) else "Helper agrees.")
        return None

    stub.routes.append(route)
    channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={
                "org": world.org,
                "people": [world.users["alice"], world.users["bob"]],
                "bots": [asker, helper["id"]],
            },
        )
    )["id"]
    try:
        with world.client("alice") as a, world.client("bob") as b:
            direct = _ok(a.post("/v1/chats", json={"bot": asker}))["id"]
            _ok(a.post(f"/v1/chats/{direct}/turns?wait=true", json={"text": ASK}))
            (chain,) = _wait(
                lambda: [
                    c
                    for c in _ok(a.get(f"{WS}/collaboration"))["items"]
                    if c["rootChat"] == direct and c["status"] == "done"
                ]
            )
            _wait(lambda: len(_ok(a.get(f"/v1/chats/{direct}/items"))["items"]) >= 5)
            # The agent chat reaches the directory a moment after its delivery.
            agent = chain["links"][0]["agentChat"]
            _wait(lambda: agent in {c["id"] for c in _ok(a.get("/v1/chats"))["items"]})
            group = _ok(b.post("/v1/chats", json={"channel": channel}))["id"]
            turn = {"text": GROUP, "rounds": 2}
            _ok(b.post(f"/v1/chats/{group}/turns?wait=true", json=turn))
            remember = {"command": {"_tag": "Remember", "content": SEED}}
            _ok(a.post(f"/v1/bots/{asker}/memory", json=remember))
            remember = {"command": {"_tag": "Remember", "content": BOBS}}
            _ok(b.post(f"/v1/bots/{asker}/memory", json=remember))
            for shard in engine.shards:
                ray.get(shard.learning_idle.remote())
    finally:
        stub.routes.clear()
    world.chats = {"direct": direct, "group": group}
    world.asker, world.helper, world.channel = asker, helper["id"], channel
    return world


def _tree_of(files: dict[str, bytes], account: str) -> dict[str, bytes]:
    base = f"bot-workspace/{account}/"
    return {p.removeprefix(base): d for p, d in files.items() if p.startswith(base)}


def _views(client, world, kinds) -> dict:
    """What the HTTP API shows of the chats and the bot memory, per person."""
    out = {}
    for kind in kinds:
        out[kind] = _ok(client.get(f"/v1/chats/{world.chats[kind]}/items"))["items"]
    listed = _ok(client.get("/v1/chats", params={"limit": 200}))
    out["chats"] = sorted(c["id"] for c in listed["items"])
    out["memory"] = _ok(client.get(f"/v1/bots/{world.asker}/memory"))
    return out


def _scan(data: Path, needles) -> None:
    for path in (p for p in data.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        for needle in needles:
            assert needle.encode() not in raw, (path.name, needle)


def test_chats_round_trip_and_the_import_serves_them_sealed(chatted, admin, tmp_path):
    w = chatted
    alice, bob = w.users["alice"], w.users["bob"]
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))
    out1, out2, new = tmp_path / "tree1", tmp_path / "tree2", tmp_path / "imported"
    assert main(["export", str(out1), "--data-dir", str(backup)]) == 0
    assert main(["import", str(out1), "--data-dir", str(new), "--shards", "3"]) == 0
    assert main(["export", str(out2), "--data-dir", str(new)]) == 0
    first = read_tree(out1)
    assert read_tree(out2) == first

    # The layout: the direct chat and its agent chat with Alice (her bot keeps them), the
    # group chat with Bob (he started it); texts in the transcript, camelCase JSON.
    direct, group = w.chats["direct"], w.chats["group"]
    mine, theirs = _tree_of(first, alice), _tree_of(first, bob)
    transcript = mine[f"chats/{direct}/items.md"].decode()
    assert f"i-1 {alice}: {ASK}\n" in transcript and f"i-4 {w.helper}: {REPLY}\n" in transcript
    items = json.loads(mine[f"chats/{direct}/items.json"])["items"]
    assert [i["kind"] for i in items] == ["person", "bot", "delivery", "delivery", "bot"]
    assert items[2]["communication"] == {"direction": "sent", "peer": w.helper}
    agent = [p for p in mine if p.startswith("chats/chat_agent_") and p.endswith("items.md")]
    assert len(agent) == 1 and "Is the build green?" in mine[agent[0]].decode()
    chat_doc = json.loads(theirs[f"chats/{group}/chat.json"])
    assert chat_doc["channel"]["id"] == w.channel and chat_doc["chat"]["owner"] == bob
    assert chat_doc["members"]["bots"] == [w.asker, w.helper]
    turns = json.loads(theirs[f"chats/{group}/turns.json"])["turns"]
    assert [(t["operator"], t["rounds"], t["status"]) for t in turns] == [(bob, 2, "done")]
    group_items = json.loads(theirs[f"chats/{group}/items.json"])["items"]
    assert [i["kind"] for i in group_items] == ["person", "bot", "bot", "bot", "bot"]
    assert f"chats/{group}/items.md" not in mine
    positions = json.loads(mine[f"agents/{w.asker}/memory/.dreaming/read-positions.json"])
    assert {p["chat"] for p in positions["positions"]} >= {direct}
    assert any(SEED in d.decode() for p, d in mine.items() if p.startswith("agents/"))
    # Bob's fact is in his tree, not in the bot owner's.
    assert not [p for p, d in mine.items() if BOBS.encode() in d]
    kept = [p for p, d in theirs.items() if BOBS.encode() in d]
    assert kept and all(p.startswith(f"other-agents/{w.asker}/memory/") for p in kept), kept
    assert all(s.encode() in b"".join(first.values()) for s in SECRETS)

    # Sealed at rest: no item text (nor the remembered fact) in the clear in the new data dir.
    _scan(new, SECRETS)

    from actors.runtime.engine import Engine
    from gateway.app import create_app

    (tokens_file,) = new.glob("import-tokens-*.json")
    tokens = json.loads(tokens_file.read_text())
    imported = Engine.start(new, shards=3, prefix="chats-" + secrets.token_hex(3))
    server = LiveServer(create_app(imported, ADMIN, cache_ttl=0.0))
    try:
        for name, kinds in (("alice", ("direct", "group")), ("bob", ("group",))):
            with w.client(name) as before, user_client(server, tokens[w.users[name]]) as after:
                assert _views(after, w, kinds) == _views(before, w, kinds)
        # The chat goes on where it was: the next item gets the next number.
        with user_client(server, tokens[bob]) as b:
            r = _ok(b.post(f"/v1/chats/{group}/turns?wait=true", json={"text": "again"}))
            assert r["items"][0]["id"] == f"i-{len(group_items) + 1}"
    finally:
        server.stop()
        imported.stop()
    _scan(new, SECRETS)


def _tree(admin, tmp_path: Path, account: str, name: str) -> Path:
    backup = tmp_path / f"backup-{name}"
    if not backup.exists():
        _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))
    tree_files.write_tree(tmp_path / name, render_data_dir(backup, account))
    return tmp_path / name


def _files(data: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(data.iterdir()) if p.is_file()}


def _rename_chat(tree: Path, old: str, new: str) -> None:
    (chat_dir,) = tree.glob(f"bot-workspace/*/chats/{old}")
    for f in chat_dir.iterdir():
        f.write_bytes(f.read_bytes().replace(old.encode(), new.encode()))
    chat_dir.rename(chat_dir.with_name(new))


def test_a_chat_id_clash_refuses_the_merge_and_writes_nothing(world, admin, tmp_path):
    other = World(admin, world.server)
    alice, dana = world.users["alice"], other.users["alice"]
    with world.client("alice") as a, other.client("alice") as d:
        mine = _ok(a.post("/v1/chats", json={"bot": world.bot}))["id"]
        _ok(a.post(f"/v1/chats/{mine}/turns?wait=true", json={"text": "hello"}))
        theirs = _ok(d.post("/v1/chats", json={"bot": other.bot}))["id"]
        _ok(d.post(f"/v1/chats/{theirs}/turns?wait=true", json={"text": "hi"}))
    tree_a = _tree(admin, tmp_path, alice, "a")
    tree_d = _tree(admin, tmp_path, dana, "d")
    target = tmp_path / "target"
    file_import.import_tree(tree_d, target, shards=2)
    _rename_chat(tree_a, mine, theirs)  # Alice's chat now has the id of Dana's
    before = _files(target)
    with pytest.raises(InvalidInput) as clash:
        file_import.import_tree(tree_a, target)
    assert clash.value.code == "id_clash"
    assert clash.value.details["clashes"] == [f"chat {theirs}"]
    assert _files(target) == before
    # The same tree under its own chat id merges; both accounts read back as exported.
    _rename_chat(tree_a, theirs, mine)
    file_import.import_tree(tree_a, target)
    assert render_data_dir(target, alice) == read_tree(tree_a)
    assert render_data_dir(target, dana) == read_tree(tree_d)


def test_an_interrupted_merge_can_run_again_and_writes_each_row_once(
    world, admin, tmp_path, monkeypatch
):
    other = World(admin, world.server)
    alice, dana = world.users["alice"], other.users["alice"]
    with world.client("alice") as a:
        chat = _ok(a.post("/v1/chats", json={"bot": world.bot}))["id"]
        _ok(a.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "hello"}))
        remember = {"command": {"_tag": "Remember", "content": "keeps notes"}}
        _ok(a.post(f"/v1/bots/{world.bot}/memory", json=remember))
    tree_a = _tree(admin, tmp_path, alice, "a")
    tree_d = _tree(admin, tmp_path, dana, "d")
    target = tmp_path / "target"
    file_import.import_tree(tree_d, target, shards=2)

    def crash(*args, **kwargs):
        raise OSError("power cut before the directory was written")

    with monkeypatch.context() as m:
        m.setattr(file_import, "_write_directory", crash)
        with pytest.raises(OSError):
            file_import.import_tree(tree_a, target)
    assert render_data_dir(target, dana) == read_tree(tree_d)  # nothing of Alice's is there
    file_import.import_tree(tree_a, target)
    assert render_data_dir(target, alice) == read_tree(tree_a)  # every row once
    assert f"bot-workspace/{alice}/chats/{chat}/items.md" in read_tree(tree_a)
