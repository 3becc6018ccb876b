"""A batch submitted `after` an earlier one (storage/group_commit.py): stored with it or after
it, never without it. A collaboration hop submits its rows right after its peer's step, without
waiting for the send that made the hop, so this is what keeps "a failed send stores nothing"
true. Real DuckDB files and the in-memory database, no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engine.errors import StorageError
from storage.database import Database
from storage.group_commit import GroupCommitter, Insert, Table

KV = Table("kv", (("k", "VARCHAR"), ("grp", "VARCHAR"), ("n", "BIGINT")))
KV_SQL = "CREATE TABLE kv (k VARCHAR, grp VARCHAR, n BIGINT)"
BAD = Insert("kv", ("bad", "g", "not a number"))  # refused when journaled


@pytest.fixture(params=["file", "memory"])
def where(request, tmp_path: Path) -> str:
    return str(tmp_path / "kv.duckdb") if request.param == "file" else ":memory:"


def _row(k: str) -> Insert:
    return Insert("kv", (k, "g", 1))


async def _outcome(fut: asyncio.Future) -> str:
    try:
        await fut
    except StorageError:
        return "failed"
    return "stored"


def test_a_batch_after_a_failed_one_in_the_same_group_fails_too(where: str) -> None:
    async def main() -> dict[str, str]:
        db = Database(where, [KV_SQL])
        gc = GroupCommitter(db, [KV])
        a = gc.submit([BAD, _row("a")])
        b = gc.submit([_row("b")], after=a)  # queued before the flush loop ran: one group
        c = gc.submit([_row("c")], after=b)  # a chain of them
        d = gc.submit([_row("d")])  # unrelated: retried alone and stored
        out = {k: await _outcome(f) for k, f in zip("abcd", (a, b, c, d), strict=True)}
        out["rows"] = ",".join(k for (k,) in db.query("SELECT k FROM kv ORDER BY k"))
        await gc.close()
        db.close()
        return out

    assert asyncio.run(main()) == {
        "a": "failed",
        "b": "failed",
        "c": "failed",
        "d": "stored",
        "rows": "d",
    }


def test_a_batch_after_a_failed_one_in_an_earlier_group_fails_too(where: str) -> None:
    async def main() -> tuple[str, str, str, str]:
        db = Database(where, [KV_SQL])
        gc = GroupCommitter(db, [KV])
        a = gc.submit([BAD])
        assert await _outcome(a) == "failed"
        b = gc.submit([_row("b")], after=a)  # a later group: `a` has failed already
        ok = gc.submit([_row("ok")])
        ok_after = gc.submit([_row("ok_after")], after=ok)
        outcomes = (await _outcome(b), await _outcome(ok), await _outcome(ok_after))
        rows = ",".join(k for (k,) in db.query("SELECT k FROM kv ORDER BY k"))
        await gc.close()
        db.close()
        return (*outcomes, rows)

    assert asyncio.run(main()) == ("failed", "stored", "stored", "ok,ok_after")


def test_a_batch_after_a_stored_one_is_stored_and_nothing_else_is_waited_for(where: str) -> None:
    """After a stored batch (same group or earlier); after a future this committer never
    returned and that is still pending, the batch is refused rather than stored before it;
    without writes, the batch is the batch it comes after."""

    async def main() -> tuple:
        db = Database(where, [KV_SQL])
        gc = GroupCommitter(db, [KV])
        a = gc.submit([_row("a")])
        b = gc.submit([_row("b")], after=a)
        await b
        c = gc.submit([_row("c")], after=a)
        stranger = asyncio.get_running_loop().create_future()
        d = gc.submit([_row("d")], after=stranger)
        empty = gc.submit([], after=c)
        outcomes = (await _outcome(c), await _outcome(d), empty is c)
        rows = ",".join(k for (k,) in db.query("SELECT k FROM kv ORDER BY k"))
        await gc.close()
        db.close()
        return (*outcomes, rows)

    assert asyncio.run(main()) == ("stored", "failed", True, "a,b,c")


def test_a_cancelled_batch_after_a_failed_one_leaves_the_committer_working(where: str) -> None:
    """Its waiter gave up (the future is cancelled) before the group failed its dependency:
    failing it again raised InvalidStateError inside the flush loop, which then stored
    nothing more."""

    async def main() -> tuple[str, bool, str, str]:
        db = Database(where, [KV_SQL])
        gc = GroupCommitter(db, [KV])
        a = gc.submit([BAD])
        assert await _outcome(a) == "failed"
        b = gc.submit([_row("b")], after=a)
        b.cancel()
        later = gc.submit([_row("later")])
        outcome = await asyncio.wait_for(_outcome(later), 10)
        rows = ",".join(k for (k,) in db.query("SELECT k FROM kv ORDER BY k"))
        await gc.close()
        db.close()
        return outcome, b.cancelled(), rows, "ok"

    assert asyncio.run(main()) == ("stored", True, "later", "ok")
