"""Checkpoints beside commits (storage/group_commit.py `background`) and reads beside a busy
database thread (storage/database.py `run`).

A shard's flush loop starts its own checkpoints (threshold, idle) on the database thread and
goes on committing: a hop or a person's turn never waits for a checkpoint of other writes. A
record appended while one runs stays in the file and is applied once, also after a crash; past
`BACKGROUND_SLACK` times the threshold, commits wait for a checkpoint (the file is emptied even
when commits never pause). A read that names its scope and needs nothing from the journal runs
on the second connection while the database thread is busy; one that needs a journal record
waits for it. Real DuckDB files, no Ray.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from storage import group_commit
from storage.database import Database, ReadScope
from storage.group_commit import BACKGROUND_SLACK, GroupCommitter, Insert
from storage.journal_file import HEADER, scan
from tests.journal_kit import KV, KV_SQL, crash_copy, journal_of
from tests.waiting import until

pytestmark = pytest.mark.usefixtures("no_env_key")


class _Held:
    """Make the next checkpoints' apply wait until released (database thread)."""

    def __init__(self, monkeypatch) -> None:
        self.entered, self.release = threading.Event(), threading.Event()
        original = group_commit.MergedWrites.apply

        def held_apply(merged, con):
            self.entered.set()
            assert self.release.wait(20)
            return original(merged, con)

        monkeypatch.setattr(group_commit.MergedWrites, "apply", held_apply)

    async def wait_entered(self) -> None:
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, self.entered.wait, 10)


@pytest.mark.anyio
async def test_a_commit_is_durable_while_a_background_checkpoint_runs(tmp_path, monkeypatch):
    """With `background`, the threshold checkpoint after k0 runs on the database thread while
    k1 commits (without it, k1 waits for that checkpoint and the wait below times out); a crash
    copy taken then holds both records, and reopening applies each exactly once."""
    path = tmp_path / "a" / "t.duckdb"

    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV], checkpoint_rows=1, checkpoint_idle=3600, background=True)
    held = _Held(monkeypatch)
    await gc.submit([Insert("kv", ("k0", "g", 0))])
    await held.wait_entered()  # the checkpoint of k0 is applying it, held
    await asyncio.wait_for(gc.submit([Insert("kv", ("k1", "g", 1))]), 5)
    assert [seq for seq, _ in scan(journal_of(path).read_bytes())[0]] == [1, 2]
    crash_copy(path.parent, tmp_path / "a-crash")
    held.release.set()
    await gc.close()
    assert db.query("SELECT k, count(*) FROM kv GROUP BY k ORDER BY k") == [
        ("k0", 1),
        ("k1", 1),
    ]
    assert journal_of(path).stat().st_size == HEADER  # close applied and emptied it
    db.close()
    monkeypatch.undo()
    db = Database(tmp_path / "a-crash" / "t.duckdb", [KV_SQL])
    gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
    assert db.query("SELECT k, count(*) FROM kv GROUP BY k ORDER BY k") == [("k0", 1), ("k1", 1)]
    await gc.close()
    db.close()


@pytest.mark.anyio
async def test_commits_wait_for_a_checkpoint_past_the_slack(tmp_path, monkeypatch):
    """While a background checkpoint is held, commits go on until the list holds
    `BACKGROUND_SLACK` times the threshold; the next one waits for a checkpoint, which then
    applies everything and empties the file (nothing was appended meanwhile)."""
    path = tmp_path / "a" / "t.duckdb"
    rows = 2

    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV], checkpoint_rows=rows, checkpoint_idle=3600, background=True)
    held = _Held(monkeypatch)
    n = 0
    for _ in range(rows):
        await gc.submit([Insert("kv", (f"k{n}", "g", n))])
        n += 1
    await held.wait_entered()
    while gc.unapplied < rows * BACKGROUND_SLACK:  # these go on
        await asyncio.wait_for(gc.submit([Insert("kv", (f"k{n}", "g", n))]), 5)
        n += 1
    late = asyncio.ensure_future(gc.submit([Insert("kv", (f"k{n}", "g", n))]))
    n += 1
    await asyncio.sleep(0.3)
    assert not late.done()  # backpressure: it waits for the checkpoint
    held.release.set()
    await asyncio.wait_for(late, 10)
    assert gc.unapplied <= 1
    await gc.close()
    assert db.query("SELECT count(*), count(DISTINCT k) FROM kv") == [(n, n)]
    db.close()


@pytest.mark.anyio
async def test_an_idle_background_checkpoint_empties_thejournal_of(tmp_path):
    path = tmp_path / "a" / "t.duckdb"

    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=0.05, background=True)
    for n in range(3):
        await gc.submit([Insert("kv", (f"k{n}", "g", n))])
    for _ in range(100):
        if journal_of(path).stat().st_size == HEADER and gc.caught_up():
            break
        await asyncio.sleep(0.02)
    assert journal_of(path).stat().st_size == HEADER and gc.checkpoints >= 1
    await gc.close()
    db.close()


@pytest.mark.anyio
async def test_a_scoped_read_runs_beside_a_busy_database_thread(tmp_path):
    """The database thread is held (a long checkpoint, here a held job): a read whose scope
    has no journal record answers from the second connection meanwhile; a read whose scope
    has one waits for the thread and sees the row (its catch-up applies it)."""
    path = tmp_path / "a" / "t.duckdb"

    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
    await gc.submit([Insert("kv", ("a0", "a", 0))])
    await db.run(lambda con: None)  # (a read of anything: the journal is applied)
    await gc.submit([Insert("kv", ("b0", "b", 0))])  # in the journal only
    hold = threading.Event()
    busy = asyncio.ensure_future(db.run_write(lambda con: hold.wait(20)))
    await asyncio.sleep(0.05)

    def select(group: str):
        return lambda con: con.execute(
            "SELECT k FROM kv WHERE grp = ? ORDER BY k", [group]
        ).fetchall()

    a = db.run(select("a"), (ReadScope("kv", "grp", ("a",)),))
    assert await asyncio.wait_for(a, 5) == [("a0",)]
    b = asyncio.ensure_future(db.run(select("b"), (ReadScope("kv", "grp", ("b",)),)))
    await asyncio.sleep(0.2)
    assert not b.done()  # needs the journal's record: waits for the thread
    hold.set()
    assert await asyncio.wait_for(b, 5) == [("b0",)]
    await busy
    await gc.close()
    db.close()


@pytest.mark.anyio
async def test_the_event_loop_serves_while_the_journal_syncs_and_answers_after(
    tmp_path, monkeypatch
):
    """`sync_aside`: the journal's fdatasync runs on a thread of its own. While it is held the
    event loop keeps running other work (without it the loop is stuck in the sync: no tick
    until the sync is let go), and the write is acknowledged only after its sync."""
    import os

    path = tmp_path / "a" / "t.duckdb"
    real = os.fdatasync
    holding, release = threading.Event(), threading.Event()

    def held_sync(fd: int) -> None:
        if not release.is_set():
            holding.set()
            assert release.wait(20)
        real(fd)

    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600, sync_aside=True)
    await gc.submit([Insert("kv", ("k0", "g", 0))])  # the file exists
    monkeypatch.setattr(os, "fdatasync", held_sync)
    ticks = 0
    timer = threading.Timer(1.0, release.set)  # lets go even if the loop is stuck
    timer.start()
    write = asyncio.ensure_future(gc.submit([Insert("kv", ("k1", "g", 1))]))
    await until(holding.is_set, "the checkpoint holds")
    for _ in range(20):  # the loop runs while the sync is held
        await asyncio.sleep(0.005)
        if not release.is_set():
            ticks += 1
    assert not write.done() or release.is_set()
    was_done_before_release = write.done() and not release.is_set()
    release.set()
    await asyncio.wait_for(write, 5)
    timer.cancel()
    monkeypatch.undo()
    assert ticks >= 10 and not was_done_before_release
    assert [seq for seq, _ in scan(journal_of(path).read_bytes())[0]] == [1, 2]
    await gc.close()
    db.close()
