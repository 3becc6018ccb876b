"""A checkpoint's writes folded per key (`MergedWrites`) and applied to a real DuckDB table:
the last write per key wins, a stored row that is written again is replaced (never doubled), and
deletes by key or by column reach rows stored earlier and rows of the same merge alike."""

from __future__ import annotations

import duckdb

from storage.group_commit import (
    Delete,
    DeleteBelow,
    DeleteWhere,
    Insert,
    MergedWrites,
    Put,
    Table,
)

T = Table("t", (("k", "VARCHAR"), ("grp", "VARCHAR"), ("n", "BIGINT")))


class Later(Put):
    """A subclass of a write kind: taken as its kind."""


def _table() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    con.execute("CREATE TABLE t (k VARCHAR PRIMARY KEY, grp VARCHAR, n BIGINT)")
    con.execute("INSERT INTO t VALUES ('stored', 'a', 1), ('gone', 'a', 2), ('old', 'b', 3)")
    return con


def _apply(*records: list) -> list[tuple]:
    con = _table()
    merged = MergedWrites({T.name: T})
    for writes in records:
        merged.add(writes)
    con.begin()
    merged.apply(con)
    con.commit()
    return sorted(con.execute("SELECT k, grp, n FROM t").fetchall())


def test_a_stored_row_written_again_is_replaced_once():
    got = _apply(
        [Put("t", ("stored", "a", 10))],
        [Insert("t", ("new", "a", 20)), Put("t", ("new", "a", 21))],  # created, then edited
        [Later("t", ("old", "b", 30))],
    )
    assert got == [("gone", "a", 2), ("new", "a", 21), ("old", "b", 30), ("stored", "a", 10)]


def test_a_key_put_then_inserted_in_one_merge_is_not_taken_for_a_new_one():
    # The insert comes after a put of the same key in this merge: the stored row must still go.
    got = _apply([Put("t", ("stored", "a", 10))], [Insert("t", ("stored", "a", 11))])
    assert ("stored", "a", 11) in got and len([r for r in got if r[0] == "stored"]) == 1


def test_deletes_reach_stored_rows_and_rows_of_the_same_merge():
    got = _apply(
        [Insert("t", ("x", "a", 5)), Delete("t", "gone")],
        [DeleteWhere("t", "grp", ("a",)), Insert("t", ("y", "a", 6))],  # y comes after: kept
        [DeleteBelow("t", "n", 4)],
    )
    assert got == [("y", "a", 6)]
