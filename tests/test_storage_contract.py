"""The storage layer's contracts, run against a DuckDB file and an in-memory database (STYLE 3:
one suite, every adapter). Each test writes through the group committer as a shard does, then
reads back through fresh store objects: after a restart (the file closed and opened again) or,
in memory, over the same connection (what a store keeps in Python is never the truth)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from engine import commands
from engine.chat_records import Confession, LearningJob, Turn
from engine.errors import Conflict, StorageError
from engine.events import Audience, ChatItemCreated
from engine.memory_entries import Reader, Scope, Tier
from engine.projects import Project
from engine.scoped_memory import ForgetBarrier, Revision, WorkspaceEntry
from storage.chat_store import ChatStore, Item
from storage.crypto import Keyring
from storage.database import Database
from storage.event_log import EventLog
from storage.group_commit import GroupCommitter, Put, Write
from storage.memory_store import MemoryStore
from storage.receipts import Receipts, fingerprint, receipt_key
from storage.shard_schema import CONFESSIONS, LEARN_POSITIONS, MIGRATIONS, TABLES, TURNS
from storage.term_keys import TF_MAX, Counted, in_context
from storage.term_store import TermStore
from storage.vector_store import VectorStore
from storage.workspace_store import WorkspaceStore

MASTER = os.urandom(32)


@dataclass
class Store:
    """One shard's database as a shard opens it: the file, its committer, its keyring."""

    db: Database
    committer: GroupCommitter
    keyring: Keyring

    async def commit(self, writes: list[Write]) -> None:
        await self.committer.submit(writes)

    async def close(self) -> None:
        await self.committer.close()
        self.db.close()


def _open(where: str) -> Store:
    db = Database(where, MIGRATIONS)
    return Store(db, GroupCommitter(db, TABLES), Keyring(MASTER))


@pytest.fixture(params=["file", "memory"])
def where(request, tmp_path: Path) -> str:
    return str(tmp_path / "shard-0.duckdb") if request.param == "file" else ":memory:"


@contextlib.asynccontextmanager
async def opened(where: str) -> AsyncIterator[list[Store]]:
    """`stores[0]` is the open store; `await restart(stores)` replaces it by a fresh one."""
    stores = [_open(where)]
    try:
        yield stores
    finally:
        await stores[0].close()


async def restart(stores: list[Store]) -> Store:
    old = stores[0]
    if old.db.path == ":memory:":  # nothing to reopen: fresh stores over the same connection
        await old.committer.drain()
        stores[0] = Store(old.db, old.committer, Keyring(MASTER))
    else:
        await old.close()
        stores[0] = _open(old.db.path)
    return stores[0]


def _pos(key: str, seq: int) -> Put:
    return Put(LEARN_POSITIONS.name, (key, "pool", "chat", seq))


def _positions(s: Store) -> dict[str, int]:
    return dict(s.db.query(f"SELECT key, seq FROM {LEARN_POSITIONS.name}"))


def run(coro) -> None:
    asyncio.run(coro)


# --- group commit -------------------------------------------------------------------------------


def test_every_batch_settles_in_submission_order(where: str):
    """32 batches submitted at once: each caller's future resolves once its batch is stored,
    batches apply in the order they were submitted (the last Put of a key wins), and a read
    right after sees all of them (the journal is applied before any read)."""

    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            batches = [[_pos("k", n), _pos(f"k{n}", n)] for n in range(32)]
            await asyncio.gather(*(s.committer.submit(b) for b in batches))
            assert s.committer.transactions < 32  # merged, not one transaction each
            rows = _positions(s)
            assert rows["k"] == 31
            assert all(rows[f"k{n}"] == n for n in range(32))
            s = await restart(stores)
            assert _positions(s)["k"] == 31

    run(go())


def test_a_bad_batch_fails_only_its_own_caller(where: str):
    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            good = [s.committer.submit([_pos(f"g{n}", n)]) for n in range(12)]
            bad = s.committer.submit([Put(LEARN_POSITIONS.name, ("bad", "p", "c", "1"))])
            more = [s.committer.submit([_pos(f"h{n}", n)]) for n in range(12)]
            results = await asyncio.gather(*good, bad, *more, return_exceptions=True)
            assert isinstance(results[12], StorageError)
            assert [r for i, r in enumerate(results) if i != 12] == [None] * 24
            keys = set(_positions(s))
            assert {f"g{n}" for n in range(12)} | {f"h{n}" for n in range(12)} <= keys
            assert "bad" not in keys

    run(go())


# --- memory pools --------------------------------------------------------------------------------


def test_a_memory_pool_reads_back_what_was_committed(where: str):
    """A new pool gets a key on load; its first change stores the wrapped key with it, and after
    a restart the entry, its sealed content and its log row open again."""
    ann = Reader(user="u_ann", org="o_1")

    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            mem = MemoryStore(s.db, s.keyring)
            pool = await mem.load("user:u_ann")
            assert not pool.persisted and pool.version == 0
            outcome = commands.remember(
                pool="user:u_ann", entry_id="m1", reader=ann, topics=["tea"], now=5, version=0
            )
            sealed = {"m1": mem.seal_content(pool, "m1", "likes green tea")}
            await s.commit(mem.outcome_writes(pool, outcome, sealed))
            s = await restart(stores)
            mem = MemoryStore(s.db, s.keyring)
            again = await mem.load("user:u_ann")
            assert again.persisted and again.version == 1
            assert again.entries["m1"] == outcome.upserts[0]
            assert mem.open_content(again, "m1") == "likes green tea"
            assert [(r.version, r.entry) for r in again.log] == [(1, "m1")]
            forget = commands.forget(
                entries=again.entries, entry_id="m1", reader=ann, now=6, version=1
            )
            await s.commit(mem.outcome_writes(again, forget))
            after = await MemoryStore(s.db, s.keyring).load("user:u_ann")
            assert after.entries["m1"] == forget.upserts[0]  # retracted: history for Ann
            assert after.version == forget.version == 2

    run(go())


# --- chats ---------------------------------------------------------------------------------------


def test_a_chat_log_reads_back_items_turns_records_and_jobs(where: str):
    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            chats = ChatStore(MemoryStore(s.db, s.keyring))
            log = await chats.load("chat_1")
            assert log.items == [] and log.next_seq == 1
            items = [
                (Item(chat="chat_1", seq=1, turn="t1", kind="person", author="u", at=1), "hi"),
                (Item(chat="chat_1", seq=2, turn="t1", kind="bot", author="b", at=2), "hello"),
            ]
            turn = Turn(id="t1", chat="chat_1", operator="u", status="done", at=1)
            job = LearningJob(
                id="job_1",
                pool="bot:b",
                chat="chat_1",
                turn="t1",
                upto=2,
                org="o",
                grant="for:person:u",
            )
            writes = [
                *chats.memory.key_rows(log.key),
                *chats.add_items(log, items),
                chats.put_turn(log, turn),
                chats.confession_row(
                    log, Confession(turn="t1", text="hi", answer="noted", calm=True, at=2), 0
                ),
                chats.job_row(job, new=True),
                chats.position_row("bot:b", "chat_1", 2),
            ]
            await s.commit(writes)
            s = await restart(stores)
            chats = ChatStore(MemoryStore(s.db, s.keyring))
            again = await chats.load("chat_1")
            assert [(i.seq, i.kind) for i in again.items] == [(1, "person"), (2, "bot")]
            assert [chats.text(again, i.seq) for i in again.items] == ["hi", "hello"]
            assert again.turns == {"t1": turn} and again.next_seq == 3
            (confession,) = await chats.records(CONFESSIONS.name, again)
            assert confession.answer == "noted"
            assert [j.id for j in await chats.open_jobs()] == ["job_1"]
            assert [j.id for j in await chats.jobs("bot:b")] == ["job_1"]
            assert await chats.position("bot:b", "chat_1") == 2
            await s.commit(chats.delete_items(again))
            emptied = await chats.load("chat_1")
            assert emptied.items == [] and emptied.next_seq == 3  # seqs are never reused
            assert s.db.query(f"SELECT count(*) FROM {TURNS.name}") == [(1,)]

    run(go())


# --- workspace -----------------------------------------------------------------------------------


def test_a_workspace_pool_reads_back_records_revisions_barriers_and_projects(where: str):
    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            ws = WorkspaceStore(s.db, MASTER)
            mem = MemoryStore(s.db, s.keyring)
            pool = await mem.load("project:p1")
            entry = WorkspaceEntry(
                id="w1",
                scope=Scope.PROJECT,
                pool="project:p1",
                contributor="b1",
                tier=Tier.LOG,
                content_fp="fp",
                created_at=1,
                updated_at=1,
            )
            revision = Revision(
                entry="w1",
                revision=1,
                operator="u",
                at=1,
                change="created",
                after="launch on monday",
            )
            barrier = ForgetBarrier(pool="project:p1", fingerprint="fp0", evidence=(), at=1)
            project = Project(id="p1", org="o", owner="u", name="Launch")
            await s.commit(
                [
                    *mem.key_rows(pool),
                    ws.entry_row(
                        entry, ws.seal(pool.cipher, "project:p1", "w1", "launch"), new=True
                    ),
                    ws.revision_row("project:p1", revision, pool.cipher),
                    ws.barrier_row(barrier, 1),
                    ws.project_row(project, pool.cipher),
                ]
            )
            s = await restart(stores)
            ws = WorkspaceStore(s.db, MASTER)
            cipher = (await MemoryStore(s.db, s.keyring).load("project:p1")).cipher
            loaded = await ws.load_pool("project:p1")
            assert loaded.entries == {"w1": entry} and loaded.barriers == [barrier]
            assert ws.open(cipher, "project:p1", "w1", loaded.sealed["w1"]) == "launch"
            assert await ws.revisions("project:p1", "w1", cipher) == [revision]
            assert await ws.entry_pool("w1") == "project:p1"
            assert await ws.entry_pool("nope") is None
            projects, legacy = await ws.load_projects(s.keyring)
            assert projects == {"p1": project} and legacy == []
            # A fingerprint key is derived from the master key: the same after a restart.
            assert ws.fingerprint_key("project:p1") == WorkspaceStore(s.db, MASTER).fingerprint_key(
                "project:p1"
            )

    run(go())


# --- events --------------------------------------------------------------------------------------


def test_events_are_numbered_once_and_resume_after_a_restart(where: str):
    everyone = Audience(org="o")

    def created(n: int) -> ChatItemCreated:
        return ChatItemCreated(chat="chat_1", item=f"i-{n}", kind="person")

    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            log = EventLog(s.db)
            events, writes = log.stage([(created(n), everyone) for n in (1, 2, 3)], at=10)
            assert [e.seq for e in events] == [1, 2, 3] and log.published == 0
            await s.commit(writes)
            log.publish(events)
            assert [e.seq for e in await log.after(0)] == [1, 2, 3]
            epoch = log.epoch
            s = await restart(stores)
            log = EventLog(s.db)
            assert (log.epoch, log.head().head) == (epoch, 3)
            assert [e.data for e in await log.after(1)] == [created(2), created(3)]
            more, writes = log.stage([(created(4), everyone)], at=11)
            assert [e.seq for e in more] == [4]  # numbering resumes, never repeats

    run(go())


# --- receipts and search terms ----------------------------------------------------------------


def test_a_receipt_answers_its_request_again_and_refuses_another(where: str):
    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            cipher = (await MemoryStore(s.db, s.keyring).load("ws:u_ann")).cipher
            key = receipt_key("ws", "u_ann", "req-1")
            asked = fingerprint({"content": "x"})
            await s.commit([Receipts.row(key, asked, b'{"id":"m1"}', cipher, "ws", 5)])
            s = await restart(stores)
            receipts = Receipts(s.db)
            assert await receipts.find(key, asked, cipher, "ws") == b'{"id":"m1"}'
            assert (
                await receipts.find(receipt_key("ws", "u_ann", "req-2"), asked, cipher, "ws")
                is None
            )
            with pytest.raises(Conflict):
                await receipts.find(key, fingerprint({"content": "y"}), cipher, "ws")
            assert await receipts.keys("ws") == {key}
            assert await receipts.keys_with_prefix(key[:4]) == {key}

    run(go())


def test_search_terms_read_back_and_delete(where: str):
    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            keys = np.array([3, 7, 11], dtype=np.int64)
            await s.commit(
                [
                    TermStore.row("user:u", "m1", "fp1", keys),
                    TermStore.row("user:u", "m2", "fp2", keys[:1]),
                ]
            )
            s = await restart(stores)
            terms = await TermStore(s.db).load("user:u")
            assert sorted(terms) == ["m1", "m2"]
            assert terms["m1"][0] == "fp1" and terms["m1"][1].tolist() == [3, 7, 11]
            await s.commit([TermStore.delete("user:u", "m1")])
            assert sorted(await TermStore(s.db).load("user:u")) == ["m2"]
            assert await TermStore(s.db).load("user:other") == {}

    run(go())


def test_counted_term_rows_read_back_as_every_repeat_beside_plain_ones(where: str):
    """A record indexed among its neighbours stores each distinct key once with its count;
    every way rows are read (a pool's load, its snapshot's build, a memory pool's rows) gives
    the same sorted keys with their repeats as a row storing every repeat would, rows of both
    kinds mixed in one read, in the order the rows are read."""
    rnd = np.random.default_rng(7)

    def keys(n: int) -> list[int]:
        return sorted(rnd.integers(-(2**63), 2**63 - 1, size=n, dtype=np.int64).tolist())

    rows: dict[str, list[int] | Counted] = {}
    for i in range(40):
        own, before, after = keys(int(rnd.integers(0, 6))), keys(3), keys(int(rnd.integers(0, 4)))
        rows[f"m{i}"] = in_context(own, before, after) if i % 3 else own
    rows["big"] = Counted([5, 9], [TF_MAX + 1, 2], TF_MAX + 3)  # a count past uint16: repeats
    expanded = {e: k.expanded() if isinstance(k, Counted) else k for e, k in rows.items()}

    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            await s.commit([TermStore.row("user:u", e, "fp", k) for e, k in rows.items()])
            assert any(isinstance(k, Counted) for k in rows.values())
            s = await restart(stores)
            terms = TermStore(s.db)
            loaded = await terms.load("user:u")
            assert {e: k.tolist() for e, (_, k) in loaded.items()} == expanded
            for read in (
                lambda con: terms.read_flat(con, "user:u"),
                lambda con: terms.read_all(con, "user:u")[:3],
                lambda con: (lambda t: (t.ids, t.lengths, t.flat))(terms.read_load(con, "user:u")),
            ):
                ids, lengths, flat = await s.db.run(read)
                assert sum(lengths) == flat.size
                ends = np.cumsum(lengths).tolist()
                got = {
                    e: flat[end - n : end].tolist()
                    for e, n, end in zip(ids, lengths.tolist(), ends, strict=True)
                }
                assert got == expanded

    run(go())


def test_vector_blocks_read_back_as_unit_rows_old_and_new_formats(where: str):
    """Vector blocks are stored as int8 directions (a quarter of float32's bytes)
    and read back as unit float32 rows close to the originals; blocks stored as float32 by
    an earlier version still load beside them; a later block's vector of a record wins, a
    zero vector stays zero (never a hit), and nothing of the vectors is stored in the clear."""
    from storage.crypto import Cipher
    from storage.vector_store import block_aad, pack

    async def go() -> None:
        async with opened(where) as stores:
            s = stores[0]
            cipher = Cipher(os.urandom(32))
            rnd = np.random.default_rng(5)
            old = rnd.normal(size=(3, 16)).astype(np.float32)  # an earlier version's block
            new = rnd.normal(size=(4, 16)).astype(np.float32) * 7.0
            new[3] = 0.0
            listed = '[["a","f1"],["b","f2"],["c","f3"]]'
            sealed_old = cipher.seal(pack(old.ravel()), block_aad("user:u", "m:16", 1, listed))
            row_old = ("user:u\x00m:16\x001", "user:u", "m:16", 1, listed, sealed_old)
            items = [
                ("b", "f2b", new[0]),
                ("d", "f4", new[1]),
                ("e", "f5", new[2]),
                ("z", "f6", new[3]),
            ]
            await s.commit(
                [
                    Put("ws_vector_blocks", row_old),
                    VectorStore.block("user:u", "m:16", 2, items, cipher),
                    VectorStore.block("user:other", "m:16", 3, items[:1], cipher),
                ]
            )
            s = await restart(stores)
            ids, fps, mat, row, scale = await VectorStore(s.db).load_all("user:u", "m:16", cipher)
            assert scale is not None and mat.dtype == np.float32
            mat = mat * scale[:, None]  # directions and their factors: unit rows
            assert ids == ["a", "c", "b", "d", "e", "z"] and row == {
                i: k for k, i in enumerate(ids)
            }
            assert fps == ["f1", "f3", "f2b", "f4", "f5", "f6"]  # b: the later block's
            assert mat.dtype == np.float32 and mat.shape == (6, 16)
            want = np.stack([old[0], old[2], new[0], new[1], new[2]])
            want /= np.linalg.norm(want, axis=1, keepdims=True)
            assert np.allclose(np.linalg.norm(mat[:5], axis=1), 1.0, atol=1e-5)
            assert np.allclose(mat[:2], want[:2], atol=1e-6)  # float32 blocks: exact
            assert (np.sum(mat[2:5] * want[2:], axis=1) > 0.999).all()  # int8: near
            assert not mat[5].any()
            stored = await s.db.run(
                lambda con: con.execute(
                    "SELECT vecs FROM ws_vector_blocks WHERE seq = 2"
                ).fetchall()
            )
            (blob,) = stored[0]
            assert len(blob) == 12 + 16 + 8 + 4 * (4 + 16)  # nonce, tag, head, 4 rows of 4 + 16
            assert pack(new[0])[:8] not in blob and b"OBI8" not in blob  # sealed, head too
            assert (await VectorStore(s.db).load_all("user:u", "other:16", cipher))[0] == []

    run(go())


def test_the_memory_database_is_its_own(tmp_path: Path):
    """Two in-memory databases in one process share nothing (a test's shards stay apart)."""

    async def go() -> None:
        a, b = _open(":memory:"), _open(":memory:")
        try:
            await a.commit([_pos("only-a", 1)])
            assert _positions(a) == {"only-a": 1} and _positions(b) == {}
        finally:
            await a.close()
            await b.close()

    run(go())
