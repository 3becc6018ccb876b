"""Reads that name their scope (storage/database.py `ReadScope`) skip the journal's catch-up
only when no record still in the journal writes a row they read: a read never misses an
acknowledged write it depends on, whatever kind of write it is, also while 32 writers and
readers run at once and threshold checkpoints interleave. Real DuckDB files (and the in-memory
database, whose journal is a list), no Ray."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from storage.chat_store import ChatStore, Item
from storage.crypto import Keyring
from storage.database import Database, ReadScope
from storage.group_commit import (
    Delete,
    DeleteBelow,
    DeleteWhere,
    GroupCommitter,
    Insert,
    Put,
    Table,
    Write,
)
from storage.memory_store import MemoryStore
from storage.shard_schema import MIGRATIONS, TABLES

KV = Table("kv", (("k", "VARCHAR"), ("grp", "VARCHAR"), ("n", "BIGINT")))
KV_SQL = "CREATE TABLE kv (k VARCHAR, grp VARCHAR, n BIGINT)"
BASE = [("k1", "a", 1), ("k2", "a", 2), ("k3", "b", 3)]


@pytest.fixture(params=["file", "memory"])
def where(request, tmp_path: Path) -> str:
    return str(tmp_path / "kv.duckdb") if request.param == "file" else ":memory:"


def _open(where: str, **options) -> tuple[Database, GroupCommitter]:
    db = Database(where, [KV_SQL])
    options.setdefault("checkpoint_rows", 10_000)
    options.setdefault("checkpoint_idle", 3600)
    return db, GroupCommitter(db, [KV], **options)


async def _group(db: Database, scope: ReadScope) -> set[tuple]:
    rows = await db.run(
        lambda con: con.execute(
            f"SELECT k, grp, n FROM kv WHERE {scope.column} IN (SELECT unnest(?))",
            [list(scope.values)],
        ).fetchall(),
        (scope,),
    )
    return set(rows)


A = ReadScope("kv", "grp", ("a",))
CASES: dict[str, tuple[list[Write], ReadScope, set[tuple]]] = {
    "insert": ([Insert("kv", ("k4", "a", 4))], A, {*BASE[:2], ("k4", "a", 4)}),
    "put replacing a row": ([Put("kv", ("k1", "a", 9))], A, {("k1", "a", 9), BASE[1]}),
    "delete by key": ([Delete("kv", "k1")], A, {BASE[1]}),
    "delete by the scope's column": ([DeleteWhere("kv", "grp", ("a",))], A, set()),
    "delete by another column": ([DeleteWhere("kv", "k", ("k2",))], A, {BASE[0]}),
    "delete below": ([DeleteBelow("kv", "n", 2)], A, {BASE[1]}),
    "delete by key, scoped by key": (
        [Delete("kv", "k1")],
        ReadScope("kv", "k", ("k1", "k2")),
        {BASE[1]},
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", list(CASES))
async def test_a_scoped_read_sees_every_acknowledged_write_in_its_scope(
    where: str, case: str
) -> None:
    writes, scope, expected = CASES[case]

    db, gc = _open(where)
    await gc.submit([Insert("kv", row) for row in BASE])
    await db.run(lambda con: None)  # an unscoped read: the base rows are applied
    assert gc.checkpoints == 1
    await gc.submit(writes)  # acknowledged: durable in the journal, not in the table yet
    assert await _group(db, scope) == expected
    assert gc.checkpoints == 2 and gc.reads_without_catch_up == 0
    await gc.close()
    db.close()


@pytest.mark.anyio
async def test_a_read_that_no_pending_record_touches_skips_the_checkpoint(where: str) -> None:
    db, gc = _open(where)
    await gc.submit([Insert("kv", row) for row in BASE])
    await db.run(lambda con: None)
    await gc.submit([Insert("kv", ("k5", "b", 5)), Put("kv", ("k3", "b", 7))])
    # Group a: nothing pending touches it, so the table as it is holds all of it.
    assert await _group(db, A) == set(BASE[:2])
    assert (gc.checkpoints, gc.reads_without_catch_up) == (1, 1)
    assert await _group(db, ReadScope("kv", "k", ("k9",))) == set()
    assert (gc.checkpoints, gc.reads_without_catch_up) == (1, 2)
    # Group b is written by a pending record: the read applies the journal first.
    assert await _group(db, ReadScope("kv", "grp", ("b",))) == {
        ("k3", "b", 7),
        ("k5", "b", 5),
    }
    assert gc.checkpoints == 2
    await gc.close()
    db.close()


def test_concurrent_writers_always_read_their_own_acknowledged_writes(where: str) -> None:
    """32 writers each write their group five times and read it back (scoped) after every
    acknowledged write, while 8 readers read groups nobody writes and threshold checkpoints
    (every 7 records) run in between: nobody ever misses a write of its own."""

    async def writer(db: Database, gc: GroupCommitter, i: int) -> None:
        scope = ReadScope("kv", "grp", (f"g{i}",))
        for r in range(5):
            await gc.submit([Insert("kv", (f"{i}-{r}", f"g{i}", r))])
            wrote = {(f"{i}-{x}", f"g{i}", 100 if x == 0 and r > 2 else x) for x in range(r + 1)}
            assert await _group(db, scope) == wrote
            if r == 2:  # rewrite an earlier row: the replacement is what is read
                await gc.submit([Put("kv", (f"{i}-0", f"g{i}", 100))])
                got = await _group(db, scope)
                assert (f"{i}-0", f"g{i}", 100) in got and (f"{i}-0", f"g{i}", 0) not in got

    async def reader(db: Database, i: int) -> None:
        for _ in range(10):
            assert await _group(db, ReadScope("kv", "grp", (f"idle{i}",))) == set()
            await asyncio.sleep(0)

    async def main() -> None:
        db, gc = _open(where, checkpoint_rows=7, checkpoint_idle=0.01)
        await asyncio.gather(
            *(writer(db, gc, i) for i in range(32)), *(reader(db, i) for i in range(8))
        )
        rows = db.query("SELECT k, grp, n FROM kv")
        assert len(rows) == 32 * 5 and len({k for k, _, _ in rows}) == 32 * 5
        await gc.close()
        db.close()

    asyncio.run(main())


@pytest.mark.anyio
async def test_a_chat_log_loads_its_journaled_items_and_a_new_chat_waits_for_nothing(
    tmp_path: Path,
) -> None:
    """What the shard reads this way: a chat's log (items, turns, communications and its key
    row) and a memory pool. A fresh store (nothing cached) reads the items a commit left in
    the journal; a chat nothing pending writes is read without a checkpoint."""

    db = Database(tmp_path / "shard-0.duckdb", MIGRATIONS)
    gc = GroupCommitter(db, TABLES, checkpoint_rows=10_000, checkpoint_idle=3600)
    keyring = Keyring(os.urandom(32))
    chats = ChatStore(MemoryStore(db, keyring))
    log = await chats.load("chat_a")
    item = Item(chat="chat_a", seq=1, turn="t1", kind="person", author="u", at=1)
    writes = [*chats.memory.key_rows(log.key), *chats.add_items(log, [(item, "hello")])]
    writes.append(chats.communication_row(log, 1, "sent", "bot_b"))
    await gc.submit(writes)
    before = gc.checkpoints
    again = await ChatStore(MemoryStore(db, keyring)).load("chat_a")
    assert [(i.seq, i.kind) for i in again.items] == [(1, "person")]
    assert chats.text(again, 1) == "hello" and again.comms == {1: ("sent", "bot_b")}
    assert gc.checkpoints == before + 1
    more = Item(chat="chat_a", seq=2, turn="t1", kind="bot", author="b", at=2)
    await gc.submit(chats.add_items(again, [(more, "more")]))  # pending: chat_a only
    other = await ChatStore(MemoryStore(db, keyring)).load("chat_new")
    assert other.items == [] and gc.checkpoints == before + 1
    assert gc.reads_without_catch_up >= 1
    await gc.close()
    db.close()


@pytest.mark.anyio
async def test_a_pools_term_rows_are_read_with_their_pending_writes(tmp_path: Path) -> None:
    """A pool's term rows (its keyword index's source) are read the same way: a pending row of
    the pool is read, a pending delete of it is applied first, another pool waits for nothing."""
    import numpy as np

    from storage.term_store import TermStore

    db = Database(tmp_path / "shard-0.duckdb", MIGRATIONS)
    gc = GroupCommitter(db, TABLES, checkpoint_rows=10_000, checkpoint_idle=3600)
    terms = TermStore(db)
    keys = np.array([3, 1, 2], dtype=np.uint64)
    await gc.submit([terms.row("bot:a", "m1", "fp1", keys)])
    assert await terms.fingerprints("bot:b") == [] and gc.checkpoints == 0
    assert await terms.fingerprints("bot:a") == [("m1", "fp1")] and gc.checkpoints == 1
    await gc.submit([terms.delete("bot:a", "m1"), terms.row("bot:a", "m2", "fp2", keys)])
    entries, fps, _ = await terms.load_raw("bot:a")
    assert (entries, fps) == (["m2"], ["fp2"]) and gc.checkpoints == 2
    await gc.close()
    db.close()


@pytest.mark.anyio
async def test_a_chat_log_is_one_trip_to_the_database_and_a_new_one_reads_only_its_key_row(
    tmp_path: Path,
) -> None:
    """A chat's log is read in one call on the database thread; a chat without its key row
    (new: the row goes with anything sealed with the key) reads nothing else."""

    db = Database(tmp_path / "shard-0.duckdb", MIGRATIONS)
    gc = GroupCommitter(db, TABLES)
    chats = ChatStore(MemoryStore(db, Keyring(os.urandom(32))))
    run, trips, statements = db.run, [], []

    async def counted(fn, scope=None):
        def traced(con):
            execute = con.execute

            class Counting:
                def execute(self, *args):
                    statements[-1] += 1
                    return execute(*args)

            return fn(Counting())

        trips.append(1)
        statements.append(0)
        return await run(traced, scope)

    db.run = counted  # type: ignore[method-assign]
    new = await chats.load("chat_new")
    item = Item(chat="chat_new", seq=1, turn="t1", kind="person", author="u", at=1)
    await gc.submit([*chats.memory.key_rows(new.key), *chats.add_items(new, [(item, "hi")])])
    again = await ChatStore(chats.memory).load("chat_new")
    assert [i.seq for i in again.items] == [1] and chats.text(again, 1) == "hi"
    await gc.close()
    db.close()
    assert trips == [1, 1] and statements == [1, 6]


@pytest.mark.anyio
async def test_a_workspace_pools_rows_are_read_with_their_pending_writes(tmp_path: Path) -> None:
    """A workspace pool's first load (its records and forget barriers) reads a pending record
    of the pool (the journal is applied first), and another pool's waits for nothing."""
    from storage.group_commit import Insert
    from storage.shard_schema import WORKSPACE_ENTRIES
    from storage.workspace_store import WorkspaceStore, entry_key, pool_scope

    db = Database(tmp_path / "shard-0.duckdb", MIGRATIONS)
    gc = GroupCommitter(db, TABLES, checkpoint_rows=10_000, checkpoint_idle=3600)
    store = WorkspaceStore(db, b"k" * 32)
    row = (entry_key("user:a", "e1"), "user:a", "e1", '{"id":"e1"}', b"sealed")
    await gc.submit([Insert(WORKSPACE_ENTRIES.name, row)])
    cols, barriers = await db.run(lambda con: store.read_pool(con, "user:b"), pool_scope("user:b"))
    assert list(cols["id"]) == [] and barriers == [] and gc.checkpoints == 0
    cols, _ = await db.run(lambda con: store.read_pool(con, "user:a"), pool_scope("user:a"))
    assert list(cols["id"]) == ["e1"] and gc.checkpoints == 1
    await gc.close()
    db.close()


@pytest.mark.anyio
async def test_a_scoped_read_aside_skips_the_checkpoint_unless_a_pending_record_touches_it(
    tmp_path: Path,
) -> None:
    """`run_aside` with the journal behind the tables runs as `run` does, with its scope: a
    workspace pool's first load of its term rows (actors/workspace/pools.py) no longer applies
    every other chat's and pool's writes first (seen: a checkpoint of 15-57 ms before each
    bot's first step in a collaboration chain)."""

    def group(name: str):
        sql = "SELECT k, grp, n FROM kv WHERE grp = ?"
        return lambda con: set(con.execute(sql, [name]).fetchall())

    db, gc = _open(str(tmp_path / "kv.duckdb"))
    await gc.submit([Insert("kv", row) for row in BASE])
    await db.run(lambda con: None)
    await gc.submit([Insert("kv", ("k5", "b", 5))])  # acknowledged, in the journal only
    assert await db.run_aside(group("a"), (A,)) == set(BASE[:2])
    assert (gc.checkpoints, gc.reads_without_catch_up) == (1, 1)
    b = ReadScope("kv", "grp", ("b",))
    assert await db.run_aside(group("b"), (b,)) == {BASE[2], ("k5", "b", 5)}
    assert gc.checkpoints == 2
    await gc.submit([Insert("kv", ("k6", "b", 6))])
    assert await db.run_aside(group("b")) == {BASE[2], ("k5", "b", 5), ("k6", "b", 6)}
    assert gc.checkpoints == 3  # without a scope: every pending record first
    await gc.close()
    db.close()
