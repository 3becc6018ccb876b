"""Workspace storage across a restart (docs/design.md §7): ShardService and DirectoryService
driven directly (no Ray), on real DuckDB files. Projects, records, revisions, barriers, receipts
and the project → owner index come back; content is sealed at rest."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
import pytest

from actors.contracts import WorkspaceAccess, WorkspaceQuery
from actors.shard.service import ShardService
from engine.errors import Conflict
from engine.memory_entries import Scope
from engine.projects import ProjectChange, ProjectCreate
from engine.scoped_memory import (
    Revision,
    WorkspaceForget,
    WorkspaceMemoryChange,
    WorkspaceMemoryCreate,
)
from storage.crypto import Cipher, aad
from storage.receipts import Receipts, receipt_key
from storage.workspace_store import WorkspaceStore
from tests.shard_kit import Shards

SECRET = "quokka-marker-5531"


pytestmark = pytest.mark.usefixtures("no_env_key")


def _open(shards: Shards) -> ShardService:
    return shards(directory=True)  # the directory: what the features call without Ray


async def _close(shards: Shards, svc: ShardService) -> None:
    """Closes the shard and the directory, to open them again from their files."""
    await shards.close(svc)
    shards.close_directory()


@pytest.mark.anyio
async def test_workspace_survives_a_restart(shards, tmp_path: Path):
    svc = _open(shards)
    d = svc.peers.directory()
    org = await d.create_org("Acme", "o_1")
    await d.create_user("Ann", [org.id], "u_ann")
    await d.create_user("Ben", [org.id], "u_ben")
    ann = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))
    p = await svc.workspace_save_project(
        "u_ann",
        org.id,
        ProjectCreate(requestId="p1", name="Launch", members=["u_ben"]),
        "p_launch",
    )
    changed = await svc.workspace_save_project(
        "u_ann",
        org.id,
        ProjectChange(requestId="p2", id=p.id, expectedRevision=1, name="Launch v2"),
        p.id,
    )
    assert changed.revision == 2
    create = WorkspaceMemoryCreate(
        requestId="m1", scope=Scope.PROJECT, bot="b_1", project=p.id, content=SECRET
    )
    fact = await svc.workspace_create_memory(ann, create)
    note = await svc.workspace_create_memory(
        ann, WorkspaceMemoryCreate(requestId="m2", scope=Scope.USER, bot="b_1", content="Tea.")
    )
    await svc.workspace_change_memory(
        ann,
        WorkspaceMemoryChange(requestId="m3", id=note.id, expectedRevision=1, content="Coffee."),
    )
    await svc.workspace_change_memory(
        ann, WorkspaceForget(requestId="m4", id=note.id, expectedRevision=2)
    )
    await _close(shards, svc)
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("*.duckdb*"))
    assert SECRET.encode() not in raw and b"Coffee." not in raw  # sealed at rest

    svc = _open(shards)
    ann = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))
    ben = WorkspaceAccess(account="u_ben", bots=frozenset())
    assert await svc.peers.directory().project_owner("p_launch") == "u_ann"
    (project,) = await svc.workspace_projects("u_ben")
    assert (project.name, project.revision) == ("Launch v2", 2)
    listing = await svc.workspace_entries(ben, WorkspaceQuery(projects=None))
    assert [e.content for e in listing.entries] == [SECRET]
    # The same request again: the first answer, nothing new.
    assert await svc.workspace_create_memory(ann, create) == fact
    assert len((await svc.workspace_entries(ann, WorkspaceQuery(projects=None))).entries) == 1
    with pytest.raises(Conflict):
        await svc.workspace_create_memory(
            ann,
            WorkspaceMemoryCreate(requestId="m1", scope=Scope.USER, bot="b_1", content="other"),
        )
    user = WorkspaceQuery(pools=("user:u_ann",), status="all")
    (note,) = (await svc.workspace_entries(ann, user)).entries
    assert (note.status, note.revision, note.content) == ("forgotten", 3, "Coffee.")
    revs = await svc.workspace_revisions(ann, note.id)
    assert [(r.change, r.before, r.after) for r in revs] == [
        ("created", None, "Tea."),
        ("edited", "Tea.", "Coffee."),
        ("forgotten", "Coffee.", None),
    ]
    barriers = await svc.workspace_barriers("user:u_ann")
    assert [b.reason for b in barriers] == ["revised", "forgotten"]
    assert (await svc.workspace_blocked("user:u_ann", "coffee")).reason == "forgotten"


@pytest.mark.anyio
async def test_mem1_migration_7_links_old_bot_records_into_the_bots_one_memory(
    shards, tmp_path: Path
):
    """MEM-1: a workspace bot record stored before migration 7 has no system tags.
    The migration stamps `from:<its first revision's operator>` and `for:bot`, and loading the
    pool adds `org:<the bot's org>` from the directory: it is then part of the bot's memory for
    whoever uses the bot in that org, and for nobody in another org."""
    import duckdb
    import msgspec

    from engine.memory_entries import Reader

    svc = _open(shards)
    d = svc.peers.directory()
    await d.create_org("Acme", "o_1")
    await d.create_org("Other", "o_2")
    await d.create_user("Ann", ["o_1"], "u_ann")
    await d.create_bot(name="Bo", org="o_1", owner="u_ann", id="b_1")
    ann = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}), orgs=("o_1",))
    body = WorkspaceMemoryCreate(requestId="m1", scope=Scope.BOT, bot="b_1", content=SECRET)
    made = await svc.workspace_create_memory(ann, body)
    await _close(shards, svc)
    entry_id = made.id
    # Make the file look as it did before migration 7: records without tags.
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))
    for key, meta in con.execute("SELECT key, meta FROM ws_entries").fetchall():
        doc = msgspec.json.decode(meta)
        doc.pop("tags", None)
        con.execute(
            "UPDATE ws_entries SET meta = ? WHERE key = ?", [msgspec.json.encode(doc).decode(), key]
        )
    con.execute("DELETE FROM schema_migrations WHERE version = 7")
    con.close()

    svc = _open(shards)
    (meta,) = svc.db.query("SELECT meta FROM ws_entries")[0]
    assert msgspec.json.decode(meta)["tags"] == ["from:u_ann", "for:bot"]
    ann = Reader(user="u_ann", org="o_1", uses_bot=True)
    page = await svc.read_memory("bot:b_1", ann)
    assert [(e.id, e.content) for e in page.entries] == [(entry_id, SECRET)]
    assert set(page.entries[0].tags) == {"from:u_ann", "for:bot", "org:o_1"}
    elsewhere = Reader(user="u_ann", org="o_2", uses_bot=True)
    assert (await svc.read_memory("bot:b_1", elsewhere)).entries == ()
    listing = await svc.workspace_entries(
        WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}), orgs=("o_1",)),
        WorkspaceQuery(pools=("bot:b_1",)),
    )
    assert [e.id for e in listing.entries] == [entry_id]


@pytest.mark.anyio
async def test_acl4_mem1_concurrent_widen_and_forget_by_revision_apply_once(shards):
    """24 concurrent requests each (ACL-4, MEM-1): a widening adds its grant once (one new
    version), and forgetting a learned entry through the workspace by `expectedRevision` wins
    once; the others see the change (not widened again / stale revision)."""
    from engine.memory_entries import AccessProof, EntryMeta, Layer, Reader, Source

    svc = _open(shards)
    d = svc.peers.directory()
    await d.create_org("Acme", "o_1")
    await d.create_user("Ann", ["o_1"], "u_ann")
    await d.create_bot(name="Bo", org="o_1", owner="u_ann", id="b_1")
    ann = Reader(user="u_ann", org="o_1", uses_bot=True)
    pinned = await svc.remember("bot:b_1", ann, "Standup at 9:30")
    learned = EntryMeta(
        id="mem_learned",
        pool="bot:b_1",
        layer=Layer.FACT,
        tags=("from:u_ann", "for:person:u_ann", "org:o_1", "chat:k1"),
        created_at=1,
        updated_at=1,
        sources=(Source(chat="k1", item="i-1"),),
        proofs=(AccessProof(chat="k1", item="i-1", org="o_1", audience=("for:person:u_ann",)),),
    )
    await svc.add_entries("bot:b_1", [(learned, "Ann likes tea")])
    done = await asyncio.gather(
        *(svc.widen("bot:b_1", pinned.id, "for:bot", "u_ann") for _ in range(24))
    )
    assert sum(1 for x in done if x["widened"]) == 1
    assert len({x["version"] for x in done}) == 1  # every answer after the one change
    page = await svc.read_memory("bot:b_1", Reader(user="u_ben", org="o_1", uses_bot=True))
    assert [e.id for e in page.entries] == [pinned.id]

    access = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}), orgs=("o_1",))
    forgets = [
        svc.workspace_change_memory(
            access, WorkspaceForget(requestId=f"f{k}", id="mem_learned", expectedRevision=1)
        )
        for k in range(24)
    ]
    results = await asyncio.gather(*forgets, return_exceptions=True)
    ok = [r for r in results if not isinstance(r, BaseException)]
    assert len(ok) == 1 and ok[0].status == "forgotten"
    assert all(
        isinstance(r, Conflict) and r.code == "stale_revision" for r in results if r not in ok
    )


@pytest.mark.anyio
async def test_loaded_records_decode_when_read_and_keep_their_order(shards):
    """A pool's records load as stored JSON and are decoded when first read (the
    first search after a shard opens reads a few hundred of 100,000); reads, writes, deletes,
    fingerprints and walks see the same records in the same order as a plain dict would."""
    from storage.workspace_store import LazyEntries

    ann = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))

    svc = _open(shards)
    made = []
    for n in range(30):
        body = WorkspaceMemoryCreate(
            requestId=f"r-lazy-{n}", scope=Scope.USER, bot="b_1", content=f"topic{n} note"
        )
        made.append(await svc.workspace_create_memory(ann, body))
    await _close(shards, svc)
    svc = _open(shards)
    # A search decodes only the records its ranking reached.
    listing = await svc.workspace_entries(ann, WorkspaceQuery(pools=("user:u_ann",), q="topic7"))
    found = [e.id for e in listing.entries]  # (the notes around it hold its words)
    assert sorted(found) == sorted([made[n].id for n in (6, 7, 8, 9)])
    entries = (await svc.workspace_pools.pool("user:u_ann")).stored.entries
    assert isinstance(entries, LazyEntries) and entries.undecoded == 26
    ids = [m.id for m in made]
    assert list(entries) == [i for i in entries] and sorted(entries) == sorted(ids)
    plain = {i: entries[i] for i in ids}  # decoded on read, once
    assert entries.undecoded == 0 and entries[ids[2]] is plain[ids[2]]
    assert entries.fp(ids[2]) == plain[ids[2]].content_fp
    # Partly decoded: the same answers as a plain dict, in the same order.
    lazy = LazyEntries({i: msgspec.json.encode(e).decode() for i, e in plain.items()})
    assert lazy.fp(ids[0]) == plain[ids[0]].content_fp and lazy.undecoded == 30
    assert lazy.get(ids[0]) == plain[ids[0]] and lazy.get("nope") is None
    assert "nope" not in lazy and ids[1] in lazy and lazy.fp("nope") is None
    del lazy[ids[1]]
    lazy[ids[3]] = plain[ids[4]]
    lazy["new"] = plain[ids[0]]
    want = dict(plain)
    del want[ids[1]]
    want[ids[3]] = plain[ids[4]]
    want["new"] = plain[ids[0]]
    assert lazy.keys() == want.keys() and lazy.undecoded == 27
    assert list(lazy.items()) == list(want.items()) and lazy.undecoded == 0
    assert lazy.pop(ids[0]) == plain[ids[0]] and len(lazy) == len(want) - 1


def test_decoded_records_and_hits_are_not_tracked_by_the_cycle_collector():
    """Every search decodes the records its rankings reach (about 1,700 of a 100,000
    record pool at first) and they stay decoded; tracked by the cyclic GC they made gen-2
    collections of 50-100 ms in the middle of searches (hybrid p99). Records and hits hold only
    strings, numbers and tuples of strings: no cycle can run through them."""
    import gc

    from engine.scoped_memory import WorkspaceEntry
    from engine.workspace_search import Hit
    from storage.workspace_store import LazyEntries

    entry = WorkspaceEntry(
        id="m1",
        scope=Scope.USER,
        pool="user:u",
        contributor="b_1",
        tier="note",
        content_fp="fp",
        created_at=1,
        updated_at=1,
        topics=("a",),
        tags=("from:u",),
    )
    decoded = LazyEntries({"m1": msgspec.json.encode(entry).decode()})["m1"]
    assert decoded == entry
    assert not gc.is_tracked(decoded) and not gc.is_tracked(entry)
    assert not gc.is_tracked(Hit(id="m1", score=1.0, kinds=("keyword",)))


def test_receipt_and_revision_rows_keep_the_stored_format():
    """Rows written now open as rows written by earlier versions did, and the other way round:
    a receipt's columns are its key's parts and its answer opens under `aad(scope, "receipt"
    + key)`; a revision's body is the JSON pair (before, after) under its own associated data."""
    cipher = Cipher(os.urandom(32))
    key = receipt_key("ws", "u_ann", "r-1\x00user:u_ann")
    answer = b'{"id":"mem_1","content":"Tea at 5."}'
    table, row = Receipts.row(key, "f" * 64, answer, cipher, "user:u_ann", 7)
    assert (table, row[:4], row[5]) == ("receipts", (key, "ws", "r-1\x00user:u_ann", "f" * 64), 7)
    assert cipher.open(row[4], aad("user:u_ann", "receipt\x00" + key)) == answer

    for before, after in ((None, "Tea at 5."), ("Tea at 5.", "Tea at 6."), ("Tea at 6.", None)):
        rev = Revision(entry="mem_1", revision=3, operator="u_ann", at=9, change="edited",
                       before=before, after=after)  # fmt: skip
        table, row = WorkspaceStore.revision_row("user:u_ann", rev, cipher)
        assert table == "ws_revisions"
        assert row[:7] == (
            "user:u_ann\x00mem_1\x003",
            "user:u_ann",
            "mem_1",
            3,
            9,
            "u_ann",
            "edited",
        )
        opened = cipher.open(row[7], aad("user:u_ann", "ws-rev\x00mem_1\x003"))
        assert opened == msgspec.json.encode([before, after])
        assert WorkspaceStore.open_revision(cipher, "user:u_ann", "mem_1", 3, row[7]) == (
            before,
            after,
        )
