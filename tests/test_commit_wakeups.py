"""How the group committer's flush loop wakes (storage/group_commit.py): a batch wakes the idle
loop a turn later, so a batch submitted in that turn joins the same record; the idle checkpoint
comes `checkpoint_idle` seconds after the LAST write (one timer per idle stretch, moved on when
writes keep coming), also when `checkpoint_idle` was shortened meanwhile; appends on the journal
thread (`sync_aside`) answer each caller with their own outcome, in order. Real DuckDB files; the
idle tests run on an event loop whose clock the test moves (no sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from engine.errors import StorageError
from storage.database import Database
from storage.group_commit import GroupCommitter, Insert
from storage.journal_file import scan
from tests.journal_kit import KV, KV_SQL, journal_of

pytestmark = pytest.mark.usefixtures("no_env_key")


class _ClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` (what its timers run by) the test sets."""

    now = 1000.0

    def time(self) -> float:
        return self.now


def _on_clock(body: Callable[[_ClockLoop], Awaitable[None]]) -> None:
    loop = _ClockLoop()
    try:
        loop.run_until_complete(body(loop))
    finally:
        loop.close()


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _settled(db: Database) -> None:
    """Let due timers fire, then wait until the database thread has run what they started
    (one thread, in order: a no-op queued behind a checkpoint ends after it)."""
    await _turns()
    await db.run_write(lambda con: None)
    await _turns()


def test_a_batch_submitted_a_turn_after_the_first_joins_its_record(tmp_path) -> None:
    async def main() -> None:
        db = Database(tmp_path / "t.duckdb", [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
        await gc.submit([Insert("kv", ("k0", "g", 0))])  # the loop runs, and is idle now
        before = gc.transactions
        first = gc.submit([Insert("kv", ("k1", "g", 1))])
        await asyncio.sleep(0)  # the next turn: the call after it arrives
        second = gc.submit([Insert("kv", ("k2", "g", 2))])
        await asyncio.gather(first, second)
        assert gc.transactions - before == 1
        await gc.close()
        db.close()

    asyncio.run(main())


def test_the_idle_checkpoint_waits_for_quiet_after_the_last_write(tmp_path) -> None:
    async def main(loop: _ClockLoop) -> None:
        db = Database(tmp_path / "t.duckdb", [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=0.5)
        for n in range(6):  # a write every 0.3 s: never 0.5 s without one
            await gc.submit([Insert("kv", (f"k{n}", "g", n))])
            await _turns()
            loop.now += 0.3
            await _settled(db)
            assert gc.checkpoints == 0 and gc.unapplied == n + 1
        loop.now += 0.3  # 0.6 s after the last write
        await _settled(db)
        assert gc.checkpoints == 1
        assert gc.unapplied == 0
        assert db.query("SELECT count(*) FROM kv") == [(6,)]
        await gc.close()
        db.close()

    _on_clock(main)


def test_a_shortened_idle_time_applies_from_the_next_wait(tmp_path) -> None:
    async def main(loop: _ClockLoop) -> None:
        db = Database(tmp_path / "t.duckdb", [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
        await gc.submit([Insert("kv", ("k0", "g", 0))])
        await _turns()
        gc.checkpoint_idle = 0.05
        await gc.submit([Insert("kv", ("k1", "g", 1))])
        await _turns()
        loop.now += 0.1
        await _settled(db)
        assert gc.checkpoints == 1
        assert gc.unapplied == 0
        await gc.close()
        db.close()

    _on_clock(main)


def test_journal_thread_appends_answer_each_caller_in_order(tmp_path, monkeypatch) -> None:
    """With `sync_aside`, a failing append fails its own batch (retried alone) and no other;
    the records on disk are the others', in the order submitted."""
    path = tmp_path / "t.duckdb"

    async def main() -> None:
        db = Database(path, [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600, sync_aside=True)
        original = GroupCommitter.append_record

        def append(self, batches):
            if any(w.row[0] == "bad" for b in batches for w in b):
                raise OSError("disk says no")
            original(self, batches)

        monkeypatch.setattr(GroupCommitter, "append_record", append)
        futs = [gc.submit([Insert("kv", (k, "g", n))]) for n, k in enumerate(["a", "bad", "c"])]
        done = await asyncio.gather(*futs, return_exceptions=True)
        assert done[0] is None and done[2] is None
        assert isinstance(done[1], StorageError)
        await gc.close()
        db.close()

    asyncio.run(main())
    records = scan(journal_of(path).read_bytes())[0]
    assert records == [] or [seq for seq, _ in records] == [1, 2]
    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV])
    assert sorted(k for (k,) in db.query("SELECT k FROM kv")) == ["a", "c"]
    db.call(gc.release)
    db.close()
