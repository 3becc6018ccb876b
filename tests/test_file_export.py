"""`openbot export` / `openbot import` (FS-1..FS-4) on real data: a running server's backup is
exported offline, imported into a new data directory, exported again byte for byte, and the
imported directory serves the same memory."""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
import zlib
from pathlib import Path

import msgspec
import pytest

from actors.runtime.placement import shard_of
from engine.errors import InvalidInput
from gateway.cli import main
from storage import data_dir_io, file_import, tree_files
from storage.file_export import DataDirReader, render_data_dir
from storage.tree_files import read_tree
from tests.conftest import ADMIN, LiveServer, user_client

WS = "/api/app/workspace"
LINE = re.compile(r"^- \(\d{4}-\d{2}-\d{2}\) \S.*$")


def _rid() -> str:
    return "r-" + secrets.token_hex(6)


def _ok(resp) -> dict:
    assert resp.is_success, (resp.status_code, resp.text)
    return resp.json()


def _create(client, **body) -> dict:
    return _ok(client.post(f"{WS}/memories", json={"requestId": _rid(), **body}))


@pytest.fixture
def filled(world, admin):
    """Alice owns the bot and a project with Bob, linked to their channel; memories in every
    scope, one edited and one forgotten; Bob keeps user memory through the bot too."""
    w = world
    w.grant("bob", "read")
    alice, bob = w.users["alice"], w.users["bob"]
    w.channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={"org": w.org, "people": [alice, bob], "bots": [w.bot]},
        )
    )["id"]
    with w.client("alice") as a, w.client("bob") as b:
        w.project = _ok(
            a.post(
                f"{WS}/projects",
                json={
                    "requestId": _rid(),
                    "name": "Launch 发布",
                    "members": [bob],
                    "channels": [w.channel],
                    "metadata": {"goal": "ship\nsoon"},
                },
            )
        )["id"]
        w.replay = {
            "requestId": _rid(),
            "scope": "bot",
            "bot": w.bot,
            "content": "Answers briefly.\nNo emoji.",
        }
        w.facts = {
            "bot": _ok(a.post(f"{WS}/memories", json=w.replay)),
            "user": _create(a, scope="user", bot=w.bot, content="我住在里昂。", tier="log"),
            "project": _create(
                a, scope="project", bot=w.bot, project=w.project, content="Ship on Friday."
            ),
            "bob": _create(b, scope="user", bot=w.bot, content="Bob likes tea."),
            "gone": _create(a, scope="bot", bot=w.bot, content="Old habit.", tier="log"),
        }
        edited = _ok(
            a.post(
                f"{WS}/memories",
                json={
                    "requestId": _rid(),
                    "id": w.facts["project"]["id"],
                    "expectedRevision": 1,
                    "content": "Ship on Monday.",
                },
            )
        )
        assert edited["revision"] == 2
        forgotten = _ok(
            a.post(
                f"{WS}/memories/forget",
                json={"requestId": _rid(), "id": w.facts["gone"]["id"], "expectedRevision": 1},
            )
        )
        assert forgotten["status"] == "forgotten"
    return w


def _tree_of(files: dict[str, bytes], account: str) -> dict[str, bytes]:
    base = f"bot-workspace/{account}/"
    return {p.removeprefix(base): d for p, d in files.items() if p.startswith(base)}


def test_export_import_export_is_byte_identical_and_the_import_serves(filled, admin, tmp_path):
    w = filled
    alice, bob = w.users["alice"], w.users["bob"]
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))

    out1, out2, new = tmp_path / "tree1", tmp_path / "tree2", tmp_path / "imported"
    assert main(["export", str(out1), "--data-dir", str(backup)]) == 0
    assert main(["import", str(out1), "--data-dir", str(new), "--shards", "2"]) == 0
    assert main(["export", str(out2), "--data-dir", str(new)]) == 0
    first, second = read_tree(out1), read_tree(out2)
    assert first.keys() == second.keys()
    assert first == second
    assert (out1 / "bot-workspace" / alice / ".transactions").is_dir()
    assert list((out1 / "bot-workspace" / alice / ".transactions").iterdir()) == []

    # FS-1 / FS-2 paths and formats of Alice's tree.
    mine = _tree_of(first, alice)
    bot_mem = f"agents/{w.bot}/memory"
    assert mine[f"{bot_mem}/profile.md"].decode() == (
        f"- ({_day(w.facts['bot'])}) Answers briefly.\\nNo emoji.\n"
    )
    assert "Old habit." not in mine[f"{bot_mem}/profile.md"].decode()
    gone = w.facts["gone"]["id"]
    tomb = msgspec.json.decode(mine[f"{bot_mem}/.dreaming/tombstones/{gone}.2.json"])
    assert (tomb["content"], tomb["reason"]) == ("Old habit.", "forgotten")
    records = msgspec.json.decode(mine[f"{bot_mem}/.dreaming/records.json"])
    assert {r["id"]: r["status"] for r in records["records"]} == {
        w.facts["bot"]["id"]: "active",
        gone: "forgotten",
    }
    assert f"{bot_mem}/.dreaming/explicit/{gone}.json" in mine
    revs = msgspec.json.decode(mine[f"{bot_mem}/.dreaming/revisions/{gone}.json"])
    assert [(r["change"], r["operator"]) for r in revs["revisions"]] == [
        ("created", alice),
        ("forgotten", alice),
    ]
    month = _day(w.facts["user"])[:7]
    user_log = mine[f"user-memory/agents/{w.bot}/log/{month}.md"].decode()
    assert user_log == f"- ({_day(w.facts['user'])}) 我住在里昂。\n"
    projects = msgspec.json.decode(mine[f"agents/{w.bot}/projects.json"])
    assert [(p["id"], p["channels"]) for p in projects["projects"]] == [(w.project, [w.channel])]
    project_md = mine[f"projects/{w.project}/project.md"].decode()
    assert project_md.startswith(f'---\nid: "{w.project}"\nname: "Launch 发布"\n')
    assert (
        '\nmetadata: {"goal":"ship\\nsoon"}\n' in project_md and "\n# Launch 发布\n" in project_md
    )
    groups = msgspec.json.decode(mine[f"projects/{w.project}/groups.json"])
    assert [(g["id"], g["people"]) for g in groups["groups"]] == [(w.channel, [alice, bob])]
    pmem = f"projects/{w.project}/memory"
    plines = [
        line
        for path, d in mine.items()
        if path.startswith(f"{pmem}/agents/{w.bot}/")
        for line in d.decode().splitlines()
    ]
    assert [line.split(") ", 1)[1] for line in plines] == ["Ship on Monday."]
    assert all(LINE.match(line) for line in plines)
    (barrier,) = [p for p in mine if p.startswith(f"{pmem}/.dreaming/tombstones/")]
    assert msgspec.json.decode(mine[barrier])["content"] == "Ship on Friday."
    assert sum(p.startswith(".commands/") for p in mine) == 7  # project, 4 creates, edit, forget
    # Bob's user memory is in his own tree, not in Alice's.
    theirs = _tree_of(first, bob)
    assert theirs[f"user-memory/agents/{w.bot}/profile.md"].decode().endswith(") Bob likes tea.\n")
    assert not any("Bob likes tea." in d.decode() for p, d in mine.items() if p.endswith(".md"))

    # The imported directory runs and serves the same memory, with new tokens.
    from actors.runtime.engine import Engine
    from gateway.app import create_app

    (tokens_file,) = new.glob("import-tokens-*.json")
    tokens = json.loads(tokens_file.read_text())
    imported = Engine.start(new, shards=2, prefix="imported-" + secrets.token_hex(3))
    server = LiveServer(create_app(imported, ADMIN, cache_ttl=0.0))
    try:
        with w.client("alice") as before, user_client(server, tokens[alice]) as after:
            for params in ({}, {"scope": "project"}, {"status": "forgotten"}):
                old = _ok(before.get(f"{WS}/memories", params=params))["entries"]
                now = _ok(after.get(f"{WS}/memories", params=params))["entries"]
                assert now == old
            old = _ok(before.get(f"{WS}/projects"))["projects"]
            assert _ok(after.get(f"{WS}/projects"))["projects"] == old
            assert after.get(f"{WS}/memory-export").text == before.get(f"{WS}/memory-export").text
            fact = w.facts["project"]
            again = after.get(f"{WS}/memories/{fact['id']}/revisions")
            assert [r["change"] for r in _ok(again)["revisions"]] == ["created", "edited"]
            # The receipts came along: repeating a request returns its first answer, once.
            assert _ok(after.post(f"{WS}/memories", json=w.replay)) == w.facts["bot"]
            assert len(_ok(after.get(f"{WS}/memories", params={"scope": "bot"}))["entries"]) == 1
        # Forget barriers were keyed again under the new master key: the forgotten and the
        # revised wordings are still kept out (SC-3); something new is not.
        import ray

        shard = imported.shard_for(alice)
        for pool, text in (
            (f"bot:{w.bot}", "old habit"),
            (f"project:{w.project}", "Ship on Friday"),
        ):
            assert ray.get(shard.workspace_blocked.remote(pool, text)) is not None
        assert ray.get(shard.workspace_blocked.remote(f"bot:{w.bot}", "A new habit.")) is None
    finally:
        server.stop()
        imported.stop()


def test_running_server_export_route_matches_the_offline_export(filled, admin, tmp_path):
    w = filled
    alice = w.users["alice"]
    r = admin.get("/v1/admin/export", params={"account": alice})
    assert r.status_code == 200, r.text
    online = {p: t.encode() for p, t in r.json()["files"].items()}
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))
    assert online == render_data_dir(backup, alice)
    assert all(p.startswith(f"bot-workspace/{alice}/") for p in online)
    with w.client("alice") as a:
        assert a.get("/v1/admin/export").status_code == 403
    # The CLI against the running server writes the same tree.
    out = tmp_path / "tree"
    args = ["export", str(out), "--url", w.server.url, "--token", ADMIN, "--account", alice]
    assert main(args) == 0
    assert read_tree(out) == online


def test_import_refuses_an_interrupted_tree_or_a_used_data_dir(filled, admin, tmp_path):
    w = filled
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))
    out = tmp_path / "tree"
    assert main(["export", str(out), "--data-dir", str(backup), "--account", w.users["alice"]]) == 0
    assert main(["export", str(out), "--data-dir", str(backup)]) == 2  # not empty
    assert main(["import", str(out), "--data-dir", str(backup)]) == 2  # holds data
    log = out / "bot-workspace" / w.users["alice"] / ".transactions" / "x.json"
    log.write_text("{}")
    assert main(["import", str(out), "--data-dir", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new" / "directory.duckdb").exists()


def test_extraction_jobs_are_exported_and_come_back(world, admin, model_stubs, engine, tmp_path):
    import ray

    from tests.openai_stub import completion

    mem, bot_model = model_stubs["mem"], model_stubs["bot"]
    settings = {"botMemoryModel": "mem", "autoRecord": True}
    _ok(admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": settings}))
    alice = world.users["alice"]
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": "Jobber", "org": world.org, "owner": alice, "model": "bot"},
        )
    )["id"]
    bot_model.answer(completion("Fine."))
    mem.answer(completion("Nothing to keep."))
    with world.client("alice") as a:
        chat = _ok(a.post("/v1/chats", json={"bot": bot}))
        a.post(f"/v1/chats/{chat['id']}/turns?wait=true", json={"text": "I like tea"})
        ray.get(engine.shard_for(alice).learning_idle.remote())
        (job,) = [j for j in _ok(a.get(f"{WS}/memory-jobs"))["jobs"] if j["chat"] == chat["id"]]
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))
    first = render_data_dir(backup, alice)
    mine = _tree_of(first, alice)
    doc = msgspec.json.decode(mine[f"agents/{bot}/memory/.dreaming/jobs/{job['id']}.json"])
    assert (doc["chat"], doc["status"], doc["attempts"]) == (chat["id"], job["status"], 1)
    assert doc["turn"] and "error" in doc
    assert mine[f"agents/{bot}/memory/.dreaming/next-refresh-at"] == b"none\n"
    # One account alone round-trips too.
    tree_files.write_tree(tmp_path / "tree", first)
    file_import.import_tree(tmp_path / "tree", tmp_path / "new", shards=3)
    assert render_data_dir(tmp_path / "new") == first


def test_storage_routes_accounts_as_the_actors_do():
    for key in ("u_1", "u_abc", "p_x" * 9, "用户"):
        for n in (1, 2, 3, 7):
            assert data_dir_io.shard_of(key, n) == shard_of(key, n) == zlib.crc32(key.encode()) % n


def _day(view: dict) -> str:
    import datetime

    at = datetime.datetime.fromtimestamp(view["updatedAt"] / 1000, datetime.UTC)
    return at.date().isoformat()


def test_import_merges_an_account_into_a_data_dir_with_another(world, admin, tmp_path):
    """An exported account merges into a data directory that already holds another
    account (its master key and shard count kept); a second import of the same account is
    refused for its id clashes and changes nothing."""
    from tests.conftest import World

    other = World(admin, world.server)
    alice, dana = world.users["alice"], other.users["alice"]
    with world.client("alice") as a:
        _create(a, scope="user", bot=world.bot, content="Alice plays the cello.")
    with other.client("alice") as d:
        _create(d, scope="user", bot=other.bot, content="Dana keeps bees.")
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))
    mine, theirs = render_data_dir(backup, alice), render_data_dir(backup, dana)
    tree_files.write_tree(tmp_path / "a", mine)
    tree_files.write_tree(tmp_path / "d", theirs)
    target = tmp_path / "target"
    file_import.import_tree(tmp_path / "d", target, shards=2)
    key_before = (target / "master.key").read_bytes()

    result = file_import.import_tree(tmp_path / "a", target, shards=5)  # shard count: target's
    assert result.accounts == [alice]
    assert sorted(p.name for p in target.glob("shard-*.duckdb")) == [
        "shard-0.duckdb",
        "shard-1.duckdb",
    ]
    assert (target / "master.key").read_bytes() == key_before
    assert render_data_dir(target, alice) == mine
    assert render_data_dir(target, dana) == theirs
    # Each import wrote its own users' tokens to a new file; the first one's is untouched.
    files = {str(p) for p in target.glob("import-tokens-*.json")}
    assert result.tokens_file in files and len(files) == 2
    first = json.loads(Path(*(files - {result.tokens_file})).read_text())
    second = json.loads(Path(result.tokens_file).read_text())
    assert dana in first and alice not in first
    assert alice in second and dana not in second
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o600 for f in files)

    before = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
    with pytest.raises(InvalidInput) as clash:
        file_import.import_tree(tmp_path / "a", target)
    assert clash.value.code == "id_clash" and f"user {alice}" in clash.value.message
    assert f"bot {world.bot}" in clash.value.details["clashes"]
    assert {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == before


def test_import_joins_an_existing_org_only_when_told(world, admin, tmp_path, capsys):
    """A tree whose org has the id, name and settings of one the target holds is
    refused (`id_clash`, nothing written) unless `--join-org` names that org; each import's
    tokens go to a new 0600 file of its own (umask 022), whose path is printed."""
    alice, bob = world.users["alice"], world.users["bob"]
    bobs = {"name": "bob's bot", "org": world.org, "owner": bob}
    _ok(admin.post("/v1/admin/bots", json=bobs))
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))
    tree_files.write_tree(tmp_path / "a", render_data_dir(backup, alice))
    tree_files.write_tree(tmp_path / "b", render_data_dir(backup, bob))
    target = tmp_path / "target"
    old_umask = os.umask(0o022)
    try:
        first = file_import.import_tree(tmp_path / "a", target)
        before = {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()}
        with pytest.raises(InvalidInput) as clash:
            file_import.import_tree(tmp_path / "b", target)
        assert clash.value.code == "id_clash"
        assert any(c.startswith(f"org {world.org} ") for c in clash.value.details["clashes"])
        assert {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == before
        wrong = ["import", str(tmp_path / "b"), "--data-dir", str(target), "--join-org", "o_x"]
        assert main(wrong) == 2  # an org not in both: refused, nothing written
        assert {p.name: p.read_bytes() for p in target.iterdir() if p.is_file()} == before
        capsys.readouterr()

        told = ["import", str(tmp_path / "b"), "--data-dir", str(target)]
        assert main([*told, "--join-org", world.org]) == 0
    finally:
        os.umask(old_umask)
    out = capsys.readouterr()
    second = json.loads(out.out)["tokensFile"]
    assert second in out.err and second != first.tokens_file
    assert stat.S_IMODE(os.stat(second).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(first.tokens_file).st_mode) == 0o600
    assert json.loads(Path(first.tokens_file).read_text()).keys() >= {alice}
    assert bob not in json.loads(Path(first.tokens_file).read_text())
    assert bob in json.loads(Path(second).read_text())
    assert alice not in json.loads(Path(second).read_text())
    reader = DataDirReader(target)
    assert reader.users[bob].orgs == (world.org,) and list(reader.orgs) == [world.org]


def test_a_tokens_file_is_never_written_through_an_existing_name(tmp_path, monkeypatch):
    """The tokens file is created, never opened: a file or a symbolic link already at its name
    (planted, or an older import's) fails the write and is left as it was."""
    from storage import data_dir_io

    monkeypatch.setattr(data_dir_io.secrets, "token_hex", lambda n: "f" * 2 * n)
    monkeypatch.setattr(data_dir_io.time, "strftime", lambda fmt, t: "20260101T000000Z")
    name = f"{data_dir_io.TOKENS_PREFIX}20260101T000000Z-ffffffff.json"
    planted, elsewhere = tmp_path / name, tmp_path / "elsewhere"
    planted.write_text('{"u_old": "obt_live"}')
    with pytest.raises(FileExistsError):
        data_dir_io.write_new_tokens(tmp_path, {"u_new": "obt_new"})
    assert planted.read_text() == '{"u_old": "obt_live"}'
    planted.unlink()
    planted.symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        data_dir_io.write_new_tokens(tmp_path, {"u_new": "obt_new"})
    assert not elsewhere.exists()
