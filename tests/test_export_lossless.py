"""A lossless export (FS-1..FS-3): a data directory built through the
real API (direct and group chats, bot memory, workspace records, a project, a confession, an
enrichment, a collaboration chain and a decided approval request) is exported, imported into a
fresh data directory (offline) and into a running server (`openbot import --url`), and
everything a person can read through the API is the same on both sides."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from pathlib import Path

import pytest

from engine import file_tree as ft
from gateway.cli import main
from storage.data_dir_io import TOKENS_PREFIX
from storage.file_export import render_data_dir
from storage.tree_files import read_tree, write_tree
from tests.conftest import ADMIN, LiveServer, learning_bot, user_client
from tests.openai_stub import bot_of, completion

WS = "/api/app/workspace"
TAG = secrets.token_hex(3)
ASK = f"okapi-{TAG}-please buy a laptop and check the build"
REPLY = f"quokka-{TAG}-the build is green"
CONFIDED = f"heron-{TAG}-I am unsure about the budget"
PROPOSAL = f"lynx-{TAG}-Buy the ThinkPad X1 for 450 EUR."
MARKER = f"ENRICHED-{TAG}"
SEED = f"ibis-{TAG}-laptop budget is 500 EUR"
NOTE = f"wren-{TAG}-go ahead"
# (A decision's note is stored in the clear by the server itself, so it is not scanned for.)
SECRETS = (ASK, REPLY, CONFIDED, PROPOSAL, SEED)


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


def _tools(body) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools", [])}


@pytest.fixture
def whole(world, admin, model_stubs, engine):
    """Alice's learning bot, asked in her direct chat, rewrites the input from memory
    (enrichment), confides, asks for approval and sends work to her helper bot (a chain);
    she approves. Bob starts a group chat with both bots. Alice owns a project with Bob linked
    to their channel; workspace records in every scope."""
    import ray

    bot_stub, mem = model_stubs["bot"], model_stubs["mem"]
    asker, asker_name = learning_bot(world, admin, "Ask")
    helper = _ok(
        admin.post(
            "/v1/admin/bots",
            json={"name": f"Help{TAG}", "org": world.org, "owner": world.users["alice"]}
            | {"model": "bot"},
        )
    )
    _ok(
        admin.post(
            "/v1/admin/grants",
            json={"bot": asker, "user": world.users["bob"], "permission": "read"},
        )
    )

    def rewrite(body):
        if "rewrite" not in _tools(body):
            return None
        asked = json.loads(body["messages"][-1]["content"])
        ids = [e["id"] for e in asked["entries"]]
        text = f"{MARKER} {asked['input']}"
        return completion(None, tool_calls=[("rewrite", {"text": text, "entries": ids})])

    def route(body):
        name, last = bot_of(body), body["messages"][-1]
        if name == asker_name:
            if last["role"] == "tool":
                return completion("I asked my colleague and you.")
            if "[delivery from" in str(last["content"]):
                return completion("My colleague says: green.")
            if MARKER in str(last["content"]) and ASK in str(last["content"]):
                calls = [
                    ("workspace_send_to_agent", {"agent": helper["name"], "message": "Green?"}),
                    ("confide", {"text": CONFIDED}),
                    ("workspace_request_approval", {"title": "Laptop", "proposal": PROPOSAL}),
                ]
                return completion(None, tool_calls=calls)
            return completion(f"{asker_name} on the plan")
        if name == helper["name"]:
            return completion(REPLY if "Green?" in str(body["messages"]) else "Helper agrees.")
        return None

    mem.routes.append(rewrite)
    bot_stub.routes.append(route)
    alice, bob = world.users["alice"], world.users["bob"]
    channel = _ok(
        admin.post(
            "/v1/admin/channels",
            json={"org": world.org, "people": [alice, bob], "bots": [asker, helper["id"]]},
        )
    )["id"]
    try:
        with world.client("alice") as a, world.client("bob") as b:
            remember = {"command": {"_tag": "Remember", "content": SEED}}
            _ok(a.post(f"/v1/bots/{asker}/memory", json=remember))
            direct = _ok(a.post("/v1/chats", json={"bot": asker}))["id"]
            _ok(a.post(f"/v1/chats/{direct}/turns?wait=true", json={"text": ASK}))
            (chain,) = _wait(
                lambda: [
                    c
                    for c in _ok(a.get(f"{WS}/collaboration", params={"limit": 200}))["items"]
                    if c["rootChat"] == direct and c["status"] == "done"
                ]
            )
            # The agent chat reaches the directory a moment after its delivery.
            agent = chain["links"][0]["agentChat"]
            _wait(lambda: agent in {c["id"] for c in _ok(a.get("/v1/chats"))["items"]})
            (req,) = [q for q in _ok(a.get("/v1/requests"))["requests"] if q["chat"] == direct]
            _ok(a.post(f"/v1/requests/{req['id']}/decision", json={"approved": True, "note": NOTE}))
            group = _ok(b.post("/v1/chats", json={"channel": channel}))["id"]
            _ok(b.post(f"/v1/chats/{group}/turns?wait=true", json={"text": "plan", "rounds": 2}))
            rid = lambda: "r-" + secrets.token_hex(6)  # noqa: E731
            project = _ok(
                a.post(
                    f"{WS}/projects",
                    json={"requestId": rid(), "name": "Launch", "members": [bob]}
                    | {"channels": [channel]},
                )
            )["id"]
            for who, body in (
                (a, {"scope": "bot", "content": "Answers briefly."}),
                (a, {"scope": "user", "content": "Alice lives in Lyon.", "tier": "log"}),
                (a, {"scope": "project", "project": project, "content": "Ship on Friday."}),
                (b, {"scope": "user", "content": "Bob likes tea."}),
            ):
                _ok(who.post(f"{WS}/memories", json={"requestId": rid(), "bot": asker, **body}))
            for shard in engine.shards:
                ray.get(shard.learning_idle.remote())
    finally:
        bot_stub.routes.clear()
        mem.routes.clear()
    world.asker, world.direct, world.group, world.request = asker, direct, group, req["id"]
    return world


def _state(client, w) -> dict:
    """Everything the person reads through the API: bot memory, chats with their items,
    confessions and enrichments, collaborations, requests, projects, workspace records."""
    out: dict = {"memory": _ok(client.get(f"/v1/bots/{w.asker}/memory"))}
    chats = _ok(client.get("/v1/chats", params={"limit": 200}))["items"]
    out["chats"] = sorted(chats, key=lambda c: c["id"])
    for c in out["chats"]:
        base = f"/v1/chats/{c['id']}"
        out[c["id"]] = {"items": _ok(client.get(f"{base}/items"))["items"]}
        for kind in ("confessions", "enrichments"):
            resp = client.get(f"{base}/{kind}")
            out[c["id"]][kind] = resp.json() if resp.is_success else resp.status_code
    chains = _ok(client.get(f"{WS}/collaboration", params={"limit": 200}))
    out["collaborations"] = chains["items"]
    out["requests"] = sorted(_ok(client.get("/v1/requests"))["requests"], key=lambda r: r["id"])
    out["projects"] = _ok(client.get(f"{WS}/projects"))
    out["records"] = _ok(client.get(f"{WS}/memories", params={"bot": w.asker}))
    return out


def _check_whole(w, source: dict) -> None:
    """The state holds what the fixture made (so an equal target is not equally empty)."""
    alice = source["alice"]
    direct = alice[w.direct]
    assert [c["text"] for c in direct["confessions"]["confessions"]] == [CONFIDED]
    assert MARKER in direct["enrichments"]["enrichments"][0]["text"]
    (chain,) = [c for c in alice["collaborations"] if c["rootChat"] == w.direct]
    assert chain["status"] == "done" and chain["links"][0]["result"] == REPLY
    (req,) = alice["requests"]
    assert (req["proposal"], req["status"], req["note"]) == (PROPOSAL, "approved", NOTE)
    assert w.group in source["bob"] and len(source["bob"][w.group]["items"]) >= 3
    assert alice["projects"] and alice["records"]


def _trees(admin, w, tmp_path: Path) -> Path:
    """Alice's and Bob's trees, exported from a backup of the running server."""
    backup = tmp_path / "backup"
    _ok(admin.post("/v1/admin/backup", json={"dir": str(backup), "withKey": True}))
    files: dict[str, bytes] = {}
    for name in ("alice", "bob"):
        files.update(render_data_dir(backup, w.users[name]))
    tree = tmp_path / "tree"
    write_tree(tree, files)
    return tree


def _compare(w, server: LiveServer, tokens: dict[str, str]) -> None:
    source, target = {}, {}
    for name in ("alice", "bob"):
        with w.client(name) as before, user_client(server, tokens[w.users[name]]) as after:
            source[name], target[name] = _state(before, w), _state(after, w)
    _check_whole(w, source)
    for name in ("alice", "bob"):
        for key in source[name]:
            assert target[name][key] == source[name][key], (name, key)


def _check_fingerprints(data: Path, w) -> None:
    """The imported chain's fingerprints are keyed with the new directory's key, as the
    server would have made them (its duplicate check compares them)."""
    import duckdb

    from engine.collaboration import fingerprint
    from storage.crypto import chain_fp_key, load_master_key

    found = []
    for path in data.glob("shard-*.duckdb"):
        con = duckdb.connect(str(path), read_only=True)
        try:
            found += con.execute("SELECT org, doc FROM chains").fetchall()
        finally:
            con.close()
    ((org, doc),) = found
    key = chain_fp_key(load_master_key(data), org)
    (link,) = json.loads(doc)["chain"]["links"]
    assert link["fingerprint"] == fingerprint("Green?", key)
    assert link["result_fingerprint"] == fingerprint(REPLY, key)


def _scan(data: Path) -> None:
    for path in (p for p in data.rglob("*") if p.is_file()):
        raw = path.read_bytes()
        for needle in SECRETS:
            assert needle.encode() not in raw, (path.name, needle)


def test_fs1_fs2_fs3_export_holds_confessions_enrichments_chains_and_requests(
    whole, admin, tmp_path
):
    """FS-1/FS-2: each chat's confessions, enrichments, chains rooted in it and requests made
    in it are files of its person's tree, texts readable, chain fingerprints unkeyed."""
    w = whole
    files = read_tree(_trees(admin, w, tmp_path))
    base = f"bot-workspace/{w.users['alice']}/chats/{w.direct}"
    confessions = json.loads(files[f"{base}/confessions.json"])["confessions"]
    assert [c["text"] for c in confessions] == [CONFIDED]
    enrichments = json.loads(files[f"{base}/enrichments.json"])["enrichments"]
    assert [e["original"] for e in enrichments] == [ASK]
    (chain,) = json.loads(files[f"{base}/chains.json"])["chains"]
    from engine.collaboration import digest

    assert chain["chain"]["links"][0]["fingerprint"] == digest("Green?")
    assert [t["result"] for t in chain["texts"]] == [REPLY]
    (req,) = json.loads(files[f"{base}/requests.json"])["requests"]
    assert (req["proposal"], req["request"]["status"]) == (PROPOSAL, "approved")


def test_fs1_fs2_fs3_offline_import_serves_the_whole_state(whole, admin, tmp_path):
    """Round trip through `openbot import --data-dir`: the fresh server serves the same memory,
    chats, items, confessions, enrichments, collaborations, requests, projects and records;
    sealed at rest; export again gives the same bytes."""
    from actors.runtime.engine import Engine
    from gateway.app import create_app

    w = whole
    tree, new, again = _trees(admin, w, tmp_path), tmp_path / "imported", tmp_path / "again"
    assert main(["import", str(tree), "--data-dir", str(new), "--shards", "3"]) == 0
    assert main(["export", str(again), "--data-dir", str(new)]) == 0
    assert read_tree(again) == read_tree(tree)
    _scan(new)
    _check_fingerprints(new, w)
    (tokens_file,) = new.glob(f"{TOKENS_PREFIX}*.json")
    tokens = json.loads(tokens_file.read_text())
    imported = Engine.start(new, shards=3, prefix="whole-" + secrets.token_hex(3))
    server = LiveServer(create_app(imported, ADMIN, cache_ttl=0.0))
    try:
        _compare(w, server, tokens)
    finally:
        server.stop()
        imported.stop()
    _scan(new)
    _check_fingerprints(new, w)  # the imported shards are in the current key format: kept


def test_fs1_fs2_fs3_import_url_merges_into_a_running_server(
    whole, admin, tmp_path, monkeypatch, capsys
):
    """Round trip through `openbot import --url` into a running server that has data of its
    own: the same whole state is served, its own records stay, sealed at rest. The tree's org
    exists there already: refused unless `--join-org` names it. An import cut off before the
    directory stored its records (FS-3) simply runs again; the same tree once imported is
    `id_clash` and changes nothing."""
    import httpx

    from actors.runtime.engine import Engine
    from engine.errors import InvalidInput, StorageError
    from gateway.app import create_app

    w = whole
    tree, data = _trees(admin, w, tmp_path), tmp_path / "running"
    (org_record,) = [o for s in ft.parse(read_tree(tree)) for o in s.orgs if o.id == w.org][:1]
    target = Engine.start(data, shards=3, prefix="live-" + secrets.token_hex(3))
    server = LiveServer(create_app(target, ADMIN, cache_ttl=0.0))
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}) as t:
            # (its own settings: a joined org's record there stays as it is)
            _ok(t.post("/v1/admin/orgs", json={"id": w.org, "name": org_record.name}))
            org = _ok(t.post("/v1/admin/orgs", json={"name": "theirs"}))["id"]
            own = _ok(t.post("/v1/admin/users", json={"name": "zed", "orgs": [org]}))
        with user_client(server, own["token"]) as z:  # every shard reads its tables now
            for path in ("/v1/requests", f"{WS}/collaboration", f"{WS}/projects"):
                _ok(z.get(path))
        cmd = ["import", str(tree), "--url", server.url, "--token", ADMIN]
        dirs = {n: tmp_path / n for n in ("refused", "cut", "done", "again")}
        for d in dirs.values():
            d.mkdir()
        capsys.readouterr()
        assert main([*cmd, "--tokens-dir", str(dirs["refused"])]) == 1
        assert "id_clash" in capsys.readouterr().err and not list(dirs["refused"].iterdir())
        cmd += ["--join-org", w.org]

        async def cut_off(self, rows):
            raise StorageError("the directory's commit failed")

        with monkeypatch.context() as m:  # the shards stored their rows, the directory not
            m.setattr(type(target.directory_port), "import_records", cut_off)
            assert main([*cmd, "--tokens-dir", str(dirs["cut"])]) == 1
        assert not list(dirs["cut"].iterdir())
        assert main([*cmd, "--tokens-dir", str(dirs["done"])]) == 0
        (tokens_file,) = dirs["done"].glob(f"{TOKENS_PREFIX}*.json")
        assert tokens_file.stat().st_mode & 0o777 == 0o600
        assert str(tokens_file) in capsys.readouterr().err
        tokens = json.loads(tokens_file.read_text())
        _compare(w, server, tokens)
        with user_client(server, own["token"]) as z:
            assert _ok(z.get("/v1/me"))["id"] == own["id"]
        # Again: every id is taken; refused whole, nothing changes, no tokens file.
        assert main([*cmd, "--tokens-dir", str(dirs["again"])]) == 1
        assert not list(dirs["again"].iterdir())
        _compare(w, server, tokens)
        # The directory's own check, for an id taken after the tree was checked.

        with pytest.raises(InvalidInput) as taken:
            asyncio.run(target.directory_port.import_records([("users", [(own["id"], "-")])]))
        assert taken.value.code == "id_clash"
        # A shard's own: a second key for a pool it holds would leave rows unreadable.
        pool_row = (f"bot:{w.asker}", 0, b"-", None)
        with pytest.raises(InvalidInput) as taken:
            asyncio.run(target.shard_port(w.users["alice"]).import_rows([("pools", [pool_row])]))
        assert taken.value.code == "id_clash"
    finally:
        server.stop()
        target.stop()
    _scan(data)


def test_fs3_import_url_refuses_a_tree_that_is_not_utf8_before_calling(tmp_path, capsys):
    account = tmp_path / "tree" / "bot-workspace" / "u_1"
    account.mkdir(parents=True)
    (account / "account.json").write_bytes(b'{"format": "\xff"}')
    tokens = tmp_path / "tokens"
    tokens.mkdir()
    cmd = ["import", str(tmp_path / "tree"), "--url", "http://127.0.0.1:9", "--token", "x"]
    assert main([*cmd, "--tokens-dir", str(tokens)]) == 2
    assert "not UTF-8" in capsys.readouterr().err and not list(tokens.iterdir())
