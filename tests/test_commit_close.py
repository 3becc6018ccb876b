"""Closing the group committer (storage/group_commit.py `close`) while writes still come in:
every write's future is settled, either durable (and then on disk after a reopen) or failed
with a clear error; none is left waiting forever, none is acknowledged and lost. Real DuckDB
files, no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.errors import StorageError
from storage.database import Database
from storage.group_commit import GroupCommitter, Put
from tests.journal_kit import KV, KV_SQL


def _stored(path: Path) -> set[str]:
    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV])  # applies what the journal holds
    try:
        return {k for (k,) in db.query("SELECT k FROM kv")}
    finally:
        db.call(gc.release)
        db.close()


@pytest.mark.parametrize("sync_aside", [False, True])
def test_writes_racing_close_are_all_settled_and_none_acknowledged_is_lost(
    tmp_path: Path, sync_aside: bool
):
    path = tmp_path / "s.duckdb"

    async def main() -> tuple[dict[str, asyncio.Future], bool]:
        db = Database(path, [KV_SQL])
        gc = GroupCommitter(db, [KV], background=True, sync_aside=sync_aside, checkpoint_rows=4)
        futs: dict[str, asyncio.Future] = {}
        for n in range(24):
            futs[f"w{n}"] = gc.submit([Put("kv", (f"w{n}", "g", n))])
        closing = asyncio.ensure_future(gc.close())
        n = 0
        # Writes keep coming at every turn of the loop until the close has finished.
        while not closing.done() and n < 5000:
            futs[f"late{n}"] = gc.submit([Put("kv", (f"late{n}", "g", n))])
            n += 1
            await asyncio.sleep(0 if n % 3 else 0.001)
        futs["after"] = gc.submit([Put("kv", ("after", "g", 0))])
        await asyncio.wait([closing], timeout=10)
        _, pending = await asyncio.wait(list(futs.values()), timeout=5)
        if closing.done() and not pending:
            db.close()
        return futs, closing.done() and not pending

    futs, all_settled = asyncio.run(main())
    assert all_settled, [k for k, f in futs.items() if not f.done()]
    ok = {k for k, f in futs.items() if f.exception() is None}
    failed = {k: f.exception() for k, f in futs.items() if f.exception() is not None}
    assert all(isinstance(e, StorageError) for e in failed.values()), failed
    assert {f"w{n}" for n in range(24)} <= ok  # submitted before close: committed
    assert "after" in failed  # submitted after close: refused, clearly
    assert "closing" in failed["after"].message
    assert _stored(path) == ok  # every acknowledged write is on disk, nothing else
