"""Project names and metadata, bot rules and prompts (also in the WAL) and a
delivery verdict's note are sealed at rest. The whole data directory (DuckDB files, their WAL,
the group committer's journal) is scanned for planted strings before and after a checkpoint,
and after a restart everything reads back."""

from __future__ import annotations

from pathlib import Path

import duckdb
import msgspec
import pytest

from actors.shard.batch import Batch
from actors.shard.service import ShardService
from engine.chat_records import Turn
from engine.directory import BotRules, Chat, OrgSettings
from engine.projects import ProjectCreate
from engine.self_rules import Editor, RulesUpdate
from storage.sealed_doc import is_sealed
from tests.shard_kit import Shards

PROJECT_NAME = "narwhal-4471-project-name"
PROJECT_META = "ibex-2209-project-metadata"
BOT_PROMPT = "pangolin-8812-bot-prompt"
BOT_DUTIES = "tapir-6630-bot-duties"
NEW_PROMPT = "axolotl-3090-edited-prompt"
NOTE = "wombat-1187-verdict-note"
ORG_NAME = "caracal-5520-org-name"
PLANTED = (PROJECT_NAME, PROJECT_META, BOT_PROMPT, BOT_DUTIES, NEW_PROMPT, NOTE, ORG_NAME)


pytestmark = pytest.mark.usefixtures("no_env_key")


def _scan(data: Path, when: str) -> None:
    files = [p for p in data.rglob("*") if p.is_file()]
    assert any(p.name.endswith(".wal") for p in files) or when != "before checkpoint", files
    for path in files:
        raw = path.read_bytes()
        for secret in PLANTED:
            assert secret.encode() not in raw, (when, path.name, secret)


def _open(shards: Shards) -> ShardService:
    return shards(directory=True)  # the directory: what the features call without Ray


async def _plant(svc: ShardService) -> tuple[str, str]:
    d = svc.peers.directory()
    org = await d.create_org(ORG_NAME, "o_1", OrgSettings())
    await d.create_user("Ann", [org.id], "u_ann")
    rules = BotRules(name="helper", prompt=BOT_PROMPT, duties=BOT_DUTIES)
    bot = await d.create_bot(name="helper", org=org.id, owner="u_ann", id="b_1", rules=rules)
    await d.update_rules(
        bot.id,
        RulesUpdate(expectedRevision=bot.revision, prompt=NEW_PROMPT),
        Editor(kind="user", id="u_ann"),
    )
    create = ProjectCreate(requestId="p1", name=PROJECT_NAME, metadata={"goal": PROJECT_META})
    await svc.workspace_save_project("u_ann", org.id, create, "p_1")
    # A delivery verdict's note, stored with its turn on the chat's shard.
    conv = svc.chat_logs
    chat = Chat(id="chat_1", kind="group", owner="u_ann", org=org.id, channel="c_1")
    log = await conv.log(chat.id)
    turn = Turn(id="turn_1", chat=chat.id, operator="u_ann", status="done", at=1, goal="delivering")
    sink = Batch(writes=[conv.store.put_turn(log, turn)])
    conv.append(log, chat, [(conv.item(log, turn.id, "person", "u_ann"), "make it")], sink)
    await conv.commit(chat.id, sink)
    done = msgspec.structs.replace(turn, goal="accepted", verdict_by="u_ann", verdict_note=NOTE)
    await conv.commit(chat.id, Batch(writes=[conv.store.put_turn(log, done)]))
    return chat.id, turn.id


@pytest.mark.anyio
async def test_project_bot_and_verdict_documents_are_sealed(shards, tmp_path: Path):
    svc = _open(shards)
    chat_id, turn_id = await _plant(svc)
    await svc.flush()
    _scan(tmp_path, "before checkpoint")  # WAL and the commit journal
    await svc.db.run(lambda con: con.execute("CHECKPOINT"))
    await svc.peers.directory().store.db.run(lambda con: con.execute("CHECKPOINT"))
    _scan(tmp_path, "after checkpoint")
    await shards.close(svc)
    shards.close_directory()
    _scan(tmp_path, "after close")

    svc = _open(shards)
    projects = await svc.workspace_projects("u_ann")
    bot = await svc.peers.directory().get_bot("b_1")
    org = await svc.peers.directory().get_org("o_1")
    turn = (await svc.chat_logs.log(chat_id)).turns[turn_id]
    assert [(p.name, p.metadata) for p in projects] == [(PROJECT_NAME, {"goal": PROJECT_META})]
    assert (bot.rules.prompt, bot.rules.duties) == (NEW_PROMPT, BOT_DUTIES)
    assert org.name == ORG_NAME
    assert (turn.goal, turn.verdict_note) == ("accepted", NOTE)


@pytest.mark.anyio
async def test_plain_documents_of_an_older_version_are_read_and_sealed(
    shards, directory, tmp_path: Path
):
    """A directory written before sealing: its plain rows still load and are rewritten sealed."""
    org = await directory.create_org("Acme", "o_1")
    await directory.create_user("Ann", [org.id], "u_ann")
    rules = BotRules(name="helper", prompt=BOT_PROMPT)
    await directory.create_bot(name="helper", org=org.id, owner="u_ann", id="b_1", rules=rules)
    shards.close_directory()
    path = str(tmp_path / "directory.duckdb")
    con = duckdb.connect(path)  # what an older version stored: the plain JSON document
    from engine.directory import Bot

    plain = Bot(id="b_1", name="helper", org="o_1", owner="u_ann", rules=BotRules(prompt="old"))
    con.execute("UPDATE bots SET doc = ? WHERE id = 'b_1'", [msgspec.json.encode(plain).decode()])
    con.close()

    d = shards.directory_service()
    assert d.records.bots["b_1"].rules.prompt == "old"
    (doc,) = d.store.db.query("SELECT doc FROM bots WHERE id = 'b_1'")[0]
    assert is_sealed(doc)


@pytest.mark.anyio
async def test_plain_turns_of_an_older_version_are_read_and_sealed(shards, tmp_path: Path):
    svc = shards()
    conv = svc.chat_logs
    chat = Chat(id="chat_1", kind="direct", owner="u_ann", org="o_1", bot="b_1")
    log = await conv.log(chat.id)
    turn = Turn(id="turn_1", chat=chat.id, operator="u_ann", status="done", at=1)
    sink = Batch(writes=[conv.store.put_turn(log, turn)])
    conv.append(log, chat, [(conv.item(log, turn.id, "person", "u_ann"), "hi")], sink)
    await conv.commit(chat.id, sink)
    await shards.close(svc)
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))  # as an older version stored it
    plain = Turn(
        id="turn_1", chat="chat_1", operator="u_ann", status="done", at=1, verdict_note=NOTE
    )
    con.execute(
        "UPDATE turns SET meta = ? WHERE id = 'turn_1'", [msgspec.json.encode(plain).decode()]
    )
    con.close()

    svc = shards()
    log = await svc.chat_logs.log("chat_1")
    await svc.flush()
    rows = await svc.db.run(lambda con: con.execute("SELECT meta FROM turns").fetchall())
    assert log.turns["turn_1"].verdict_note == NOTE
    assert [is_sealed(meta) for (meta,) in rows] == [True]
