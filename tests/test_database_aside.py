"""Reads beside the database thread (storage/database.py `run_aside`): a pool's vectors are
read on a second connection while its records are read on the first (the first search after a
shard opens). Such a read sees every committed write, the journal's too, and does not wait for
the database thread. Real DuckDB files, no Ray."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from storage.database import Database, ReadScope
from storage.group_commit import GroupCommitter, Put, Table

KV = Table("kv", (("k", "VARCHAR"), ("grp", "VARCHAR"), ("n", "BIGINT")))
KV_SQL = "CREATE TABLE kv (k VARCHAR, grp VARCHAR, n BIGINT)"


def _keys(con) -> list[str]:
    return sorted(k for (k,) in con.execute("SELECT k FROM kv").fetchall())


@pytest.mark.anyio
async def test_a_read_aside_sees_the_journal_and_does_not_wait_for_the_database_thread(
    tmp_path: Path,
):
    db = Database(tmp_path / "s.duckdb", [KV_SQL])
    # The journal is applied to the tables only before a read (or at close).
    gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
    try:
        await gc.submit([Put("kv", ("a", "g", 1))])
        assert not gc.caught_up()  # in the journal, not in the tables yet
        assert await db.run_aside(_keys) == ["a"]  # so read after it is applied
        assert gc.caught_up()

        started, release = threading.Event(), threading.Event()

        def busy(con) -> None:
            started.set()
            release.wait(10)

        held = asyncio.ensure_future(db.run(busy))  # the database thread, busy
        await asyncio.to_thread(started.wait, 10)
        try:
            assert await asyncio.wait_for(db.run_aside(_keys), 5) == ["a"]
        finally:
            release.set()
            await held
        # Several at once, beside writes: each sees a committed state.
        writes = [gc.submit([Put("kv", (f"w{n}", "g", n))]) for n in range(24)]
        reads = [db.run_aside(_keys) for _ in range(24)]
        seen = await asyncio.gather(*reads)
        await asyncio.gather(*writes)
        assert all(s[0] == "a" and set(s) <= {"a", *(f"w{n}" for n in range(24))} for s in seen)
        assert len(await db.run_aside(_keys)) == 25
    finally:
        await gc.close()
        db.close()


@pytest.mark.anyio
async def test_a_small_read_aside_does_not_wait_for_a_large_one(tmp_path: Path):
    """A pool's vectors (tens of MB) are read aside while the same search's small reads (its
    entry pool, its keyword snapshot) are too: they do not queue behind them."""

    db = Database(tmp_path / "s.duckdb", [KV_SQL])
    try:
        await db.run(lambda con: con.execute("INSERT INTO kv VALUES ('a', 'g', 1)"))
        started, release = threading.Event(), threading.Event()

        def large(con) -> list[str]:
            started.set()
            release.wait(10)
            return _keys(con)

        held = asyncio.ensure_future(db.run_aside(large))
        await asyncio.to_thread(started.wait, 10)
        try:
            assert await asyncio.wait_for(db.run_aside(_keys), 5) == ["a"]
        finally:
            release.set()
        assert await held == ["a"]
        # Many at once: each runs on a connection no other uses meanwhile.
        assert await asyncio.gather(*(db.run_aside(_keys) for _ in range(24))) == [["a"]] * 24
    finally:
        db.close()


@pytest.mark.anyio
async def test_an_in_memory_database_reads_on_its_thread(tmp_path: Path):
    db = Database(":memory:", [KV_SQL])
    try:
        await db.run(lambda con: con.execute("INSERT INTO kv VALUES ('m', 'g', 1)"))
        assert await db.run_aside(_keys) == ["m"]
    finally:
        db.close()


def _both(between: threading.Event | None = None, go: threading.Event | None = None):
    """A read of two statements: the rows of group "a", then those of group "b" (every write
    puts one of each, so a consistent read counts as many of both)."""

    def read(con) -> tuple[int, int]:
        ((a,),) = con.execute("SELECT count(*) FROM kv WHERE grp = 'a'").fetchall()
        if between is not None and go is not None:
            between.set()
            go.wait(10)
        else:
            time.sleep(0.001)  # a wider window for a commit or checkpoint in between
        ((b,),) = con.execute("SELECT count(*) FROM kv WHERE grp = 'b'").fetchall()
        return a, b

    return read


def _pair(n: int) -> list[Put]:
    return [Put("kv", (f"a{n}", "a", n)), Put("kv", (f"b{n}", "b", n))]


SCOPE = [ReadScope("kv", "grp", ("a", "b"))]


@pytest.mark.parametrize("how", ["run_aside", "scoped"])
def test_a_read_aside_of_several_statements_sees_one_state(tmp_path: Path, how: str):
    """A checkpoint (or any commit) on the database thread between two statements of a read
    aside must not show the read half of it: the read runs in one transaction."""

    async def main() -> tuple[int, int]:
        db = Database(tmp_path / "s.duckdb", [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
        try:
            await gc.submit(_pair(0))
            await db.run(lambda con: None)  # applied: the tables hold everything
            between, go = threading.Event(), threading.Event()
            if how == "run_aside":
                reading = asyncio.ensure_future(db.run_aside(_both(between, go)))
            else:  # the scoped read goes aside because the database thread is busy
                started, release = threading.Event(), threading.Event()
                held = asyncio.ensure_future(db.run(lambda con: (started.set(), release.wait(10))))
                await asyncio.to_thread(started.wait, 10)
                reading = asyncio.ensure_future(db.run(_both(between, go), SCOPE))
            await asyncio.to_thread(between.wait, 10)
            if how != "run_aside":
                release.set()
                await held
            await gc.submit(_pair(1))  # committed to the journal ...
            await db.run(lambda con: None)  # ... and applied to the tables, mid-read
            go.set()
            return await asyncio.wait_for(reading, 10)
        finally:
            await gc.close()
            db.close()

    a, b = asyncio.run(main())
    assert a == b == 1


@pytest.mark.anyio
async def test_reads_aside_stay_consistent_beside_24_concurrent_writers_and_checkpoints(
    tmp_path: Path,
):
    db = Database(tmp_path / "s.duckdb", [KV_SQL])
    # Every commit is followed by a checkpoint beside the next commits.
    gc = GroupCommitter(db, [KV], checkpoint_rows=1, background=True, sync_aside=True)
    seen: list[tuple[int, int]] = []
    try:

        async def reader() -> None:
            for _ in range(16):
                seen.append(await db.run_aside(_both()))
                seen.append(await db.run(_both(), SCOPE))

        async def writer(k: int) -> None:
            for n in range(k, 72, 24):
                await gc.submit(_pair(n))

        await asyncio.gather(*(writer(k) for k in range(24)), *(reader() for _ in range(6)))
        seen.append(await db.run(_both()))
    finally:
        await gc.close()
        db.close()
    assert seen[-1] == (72, 72)
    assert all(a == b for a, b in seen), [s for s in seen if s[0] != s[1]]
