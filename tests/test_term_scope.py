"""`storage.term_store.load_scope` against the shard's real tables: a pool's first term read
aside (`TermStore.load_aside`) skips the journal's writes of other pools but sees its own (a
scope naming a table or column that does not exist would skip them silently)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from storage.database import Database
from storage.group_commit import GroupCommitter
from storage.shard_schema import MIGRATIONS, TABLES
from storage.term_store import TermStore, load_scope


def _keys(*k: int) -> np.ndarray:
    return np.asarray(k, dtype=np.int64)


def test_the_scoped_aside_read_sees_a_pending_record_of_its_pool(tmp_path: Path) -> None:
    async def main() -> None:
        db = Database(str(tmp_path / "shard-0.duckdb"), MIGRATIONS)
        gc = GroupCommitter(db, TABLES, checkpoint_rows=10_000, checkpoint_idle=3600)
        terms = TermStore(db)
        try:
            await gc.submit([TermStore.row("ws_p", "e1", "f1", _keys(1, 2), seq=1)])
            await db.run(lambda con: None)  # applied: the tables have e1
            base = gc.checkpoints
            # Acknowledged, in the journal only: another pool's row, then this pool's.
            await gc.submit([TermStore.row("ws_q", "q1", "fq", _keys(9), seq=1)])
            first = await terms.load_aside("ws_p")
            assert first.ids == ["e1"]
            assert gc.checkpoints == base  # another pool's write: not applied first
            await gc.submit([TermStore.row("ws_p", "e2", "f2", _keys(3), seq=2)])
            second = await terms.load_aside("ws_p")
            assert sorted(second.ids) == ["e1", "e2"] and second.last_seq == 2
            assert gc.checkpoints == base + 1
            await gc.submit([TermStore.snapshot_row("ws_p", 2, b"snap")])
            third = await terms.load_aside("ws_p")
            assert (third.covers, third.snapshot, third.ids) == (2, b"snap", [])
            # Every scope names a real table and column of the shard's schema.
            for scope in load_scope("ws_p"):
                cols = await db.run(
                    lambda con, t=scope.table: [
                        r[0] for r in con.execute(f"DESCRIBE {t}").fetchall()
                    ]
                )
                assert scope.column in cols
        finally:
            await gc.close()
            db.close()

    asyncio.run(main())
