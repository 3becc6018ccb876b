"""storage/: the DuckDB wrapper and its migrations, group commit, envelope encryption, and the
directory file's token hashing (docs/design.md §7, SEC-1). Real DuckDB files under tmp_path, no
Ray."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from pathlib import Path

import pytest

from engine.errors import InvalidInput, OpenBotError, StorageError
from storage.crypto import KEY_FILE, Cipher, Keyring, aad, load_master_key
from storage.database import Database
from storage.directory_store import hash_token
from storage.group_commit import Delete, DeleteWhere, GroupCommitter, Put, Table
from tests.waiting import until

KV = Table("kv", (("k", "VARCHAR"), ("grp", "VARCHAR"), ("n", "BIGINT")))
KV_SQL = "CREATE TABLE kv (k VARCHAR, grp VARCHAR, n BIGINT)"


def _rows(db: Database) -> dict[str, tuple[str, int]]:
    return {k: (g, n) for k, g, n in db.query("SELECT k, grp, n FROM kv")}


# --------------------------------------------------------------------------- Database


def test_migrations_run_once_and_are_recorded(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "a.duckdb"  # parent directory is created
    m1, m2 = KV_SQL, "CREATE TABLE other (x INTEGER); INSERT INTO other VALUES (1)"
    db = Database(path, [m1, m2])
    assert [r[0] for r in db.query("SELECT version FROM schema_migrations ORDER BY 1")] == [1, 2]
    db.close()

    # Reopening does not re-run them (a second CREATE TABLE would fail, a second INSERT would
    # duplicate the row); a new migration appended later runs alone.
    db = Database(path, [m1, m2, "INSERT INTO other VALUES (3)"])
    assert [r[0] for r in db.query("SELECT version FROM schema_migrations ORDER BY 1")] == [
        1,
        2,
        3,
    ]
    assert db.query("SELECT x FROM other ORDER BY x") == [(1,), (3,)]
    db.close()
    db = Database(path, [m1, m2, "INSERT INTO other VALUES (3)"])
    assert db.query("SELECT count(*) FROM schema_migrations") == [(3,)]
    assert db.query("SELECT count(*) FROM other") == [(2,)]
    db.close()


def test_migration_14_keeps_every_receipt_and_stores_answers_uncompressed(
    tmp_path: Path,
) -> None:
    """Migration 14 makes the receipts table again: every row as it was, its sealed answers
    stored without compression (and so are answers written after it)."""
    from storage.shard_schema import MIGRATIONS

    path = tmp_path / "r.duckdb"
    db = Database(path, MIGRATIONS[:13])
    before = [(f"ws\x00u\x00r{i}", "ws", f"r{i}", f"fp{i}", os.urandom(600), i) for i in range(50)]
    db.run_sync(
        lambda con: con.executemany("INSERT INTO receipts VALUES (?, ?, ?, ?, ?, ?)", before)
    )
    db.close()
    db = Database(path, MIGRATIONS)
    assert sorted(db.query("SELECT * FROM receipts")) == sorted(before)
    after = [(f"ws\x00u\x00n{i}", "ws", f"n{i}", "fp", os.urandom(600), i) for i in range(3000)]
    db.run_sync(
        lambda con: con.executemany("INSERT INTO receipts VALUES (?, ?, ?, ?, ?, ?)", after)
    )
    db.query("CHECKPOINT")
    kinds = db.query(
        "SELECT DISTINCT compression FROM pragma_storage_info('receipts') "
        "WHERE column_name = 'response' AND segment_type = 'BLOB'"
    )
    assert kinds == [("Uncompressed",)]
    assert db.query("SELECT count(*) FROM receipts") == [(3050,)]
    db.close()


def test_failed_migration_is_rolled_back_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "b.duckdb"
    with pytest.raises(StorageError, match="migration 1 failed"):
        Database(path, ["CREATE TABLE t (x INTEGER); SELECT * FROM no_such_table"])
    db = Database(path, ["CREATE TABLE t (x INTEGER)"])
    assert db.query("SELECT version FROM schema_migrations") == [(1,)]
    assert db.query("SELECT count(*) FROM t") == [(0,)]
    db.close()


@pytest.mark.anyio
async def test_duckdb_errors_become_storage_errors(tmp_path: Path) -> None:
    db = Database(tmp_path / "c.duckdb", [KV_SQL])
    with pytest.raises(StorageError) as info:
        db.query("SELECT * FROM missing_table")
    assert isinstance(info.value, OpenBotError) and info.value.code == "storage_error"
    with pytest.raises(StorageError):
        db.query("INSERT INTO kv VALUES (?, ?, ?)", ["k", "g", "not a number"])

    with pytest.raises(StorageError):
        await db.run(lambda con: con.execute("SELEC nonsense"))
    assert await db.run(lambda con: con.execute("SELECT 41 + 1").fetchall()) == [(42,)]
    db.close()


# --------------------------------------------------------------------------- group commit


@pytest.mark.anyio
async def test_writes_that_arrive_in_the_next_turn_of_the_loop_join_the_commit(
    tmp_path: Path,
) -> None:
    """An actor hands each call to its event loop on its own: the writer waits one turn of the
    loop before it takes a group, so writes staged by calls that arrived meanwhile share the
    commit (fewer syncs and event polls per write) instead of each starting the next one."""

    db = Database(tmp_path / "t.duckdb", [KV_SQL])
    gc = GroupCommitter(db, [KV], enabled=True)
    loop = asyncio.get_running_loop()
    futs = [gc.submit([Put("kv", ("first", "g", 0))])]  # wakes the writer

    def later(i: int) -> None:  # as a call handed over by another thread would
        futs.append(gc.submit([Put("kv", (f"k{i}", "g", i))]))

    for i in range(5):
        loop.call_soon(later, i)
    await asyncio.sleep(0)
    await asyncio.gather(*futs)
    await gc.close()
    assert _rows(db).keys() == {"first", *(f"k{i}" for i in range(5))}
    db.close()
    assert (gc.batches, gc.transactions) == (6, 1)


@pytest.mark.anyio
async def test_group_commit_merges_batches_into_few_transactions(tmp_path: Path) -> None:
    path = tmp_path / "g.duckdb"

    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV], enabled=True)
    futs = [gc.submit([Put("kv", (f"k{i}", "g", i))]) for i in range(200)]
    await asyncio.gather(*futs)
    await gc.close()
    db.close()
    assert gc.batches == 200
    assert gc.transactions < gc.batches
    assert gc.transactions <= 2  # all 200 were queued before the writer first ran
    db = Database(path, [KV_SQL])
    rows = _rows(db)
    db.close()
    assert rows == {f"k{i}": ("g", i) for i in range(200)}


@pytest.mark.anyio
async def test_group_commit_disabled_is_one_transaction_per_batch(tmp_path: Path) -> None:
    db = Database(tmp_path / "h.duckdb", [KV_SQL])
    gc = GroupCommitter(db, [KV], enabled=False)
    await asyncio.gather(*(gc.submit([Put("kv", (f"k{i}", "g", i))]) for i in range(30)))
    assert len(_rows(db)) == 30
    await gc.close()
    db.close()
    assert gc.transactions == gc.batches == 30


@pytest.mark.anyio
async def test_put_replaces_by_key_and_delete_removes(tmp_path: Path) -> None:
    db = Database(tmp_path / "p.duckdb", [KV_SQL])
    gc = GroupCommitter(db, [KV])
    await gc.submit([Put("kv", ("a", "g", 1)), Put("kv", ("b", "g", 1))])
    await gc.submit([Put("kv", ("a", "h", 2))])  # a later transaction
    assert _rows(db) == {"a": ("h", 2), "b": ("g", 1)}
    # Within one group: the last Put of a key wins, a Delete after a Put removes it.
    t = gc.transactions
    f1 = gc.submit([Put("kv", ("a", "x", 3))])
    f2 = gc.submit([Put("kv", ("a", "y", 4)), Put("kv", ("c", "y", 4))])
    f3 = gc.submit([Delete("kv", "b")])
    await asyncio.gather(f1, f2, f3)
    assert gc.transactions == t + 1
    assert _rows(db) == {"a": ("y", 4), "c": ("y", 4)}
    assert await gc.submit([]) is None  # an empty batch resolves at once
    await gc.close()
    db.close()


@pytest.mark.anyio
async def test_delete_where_then_put_in_one_group_keeps_the_later_row(tmp_path: Path) -> None:
    db = Database(tmp_path / "w.duckdb", [KV_SQL])
    gc = GroupCommitter(db, [KV])
    await gc.submit([Put("kv", (k, "doomed", 0)) for k in ("a", "b", "c")])
    t = gc.transactions
    futs = [
        gc.submit([Put("kv", ("early", "doomed", 1))]),  # before the delete: goes with it
        gc.submit([DeleteWhere("kv", "grp", ("doomed",))]),
        gc.submit([Put("kv", ("a", "doomed", 2)), Put("kv", ("late", "doomed", 3))]),
    ]
    await asyncio.gather(*futs)
    assert gc.transactions == t + 1  # one group
    assert _rows(db) == {"a": ("doomed", 2), "late": ("doomed", 3)}
    # An empty DeleteWhere deletes nothing.
    await gc.submit([DeleteWhere("kv", "grp", ())])
    assert len(_rows(db)) == 2
    await gc.close()
    db.close()


@pytest.mark.anyio
@pytest.mark.parametrize(
    "bad",
    [
        Put("kv", ("bad-arity", "g")),  # too few columns
        Put("kv", ("bad-type", "g", "not a number")),  # duckdb conversion error
        DeleteWhere("kv", "no_such_column", ("x",)),
    ],
    ids=["arity", "type", "column"],
)
async def test_a_bad_batch_fails_only_its_own_future(tmp_path: Path, bad) -> None:
    db = Database(tmp_path / "bad.duckdb", [KV_SQL])
    gc = GroupCommitter(db, [KV])
    futs = [gc.submit([Put("kv", (f"k{i}", "g", i))]) for i in range(3)]
    futs.append(gc.submit([bad, Put("kv", ("with-bad", "g", 9))]))
    futs += [gc.submit([Put("kv", (f"k{i}", "g", i))]) for i in range(3, 6)]
    results = await asyncio.gather(*futs, return_exceptions=True)
    assert all(r is None for i, r in enumerate(results) if i != 3), results
    assert isinstance(results[3], StorageError), results[3]
    assert _rows(db) == {f"k{i}": ("g", i) for i in range(6)}  # nothing of the bad batch
    assert gc.batches == 6  # only committed batches count
    # The writer keeps working afterwards, also for a lone bad batch.
    with pytest.raises(StorageError):
        await gc.submit([bad])
    await gc.submit([Put("kv", ("after", "g", 7))])
    assert "after" in _rows(db)
    await gc.close()
    db.close()


def _journal_records(db_path: Path) -> list[int]:
    from storage.journal_file import scan

    return [seq for seq, _ in scan(Path(str(db_path) + ".journal").read_bytes())[0]]


@pytest.mark.anyio
async def test_journaled_writes_are_read_at_once_and_survive_a_crash(tmp_path: Path) -> None:
    """A commit is one journal record; reads apply the journal first; a crash (the files copied
    as they are, never closed) loses nothing: the copy applies its journal when opened."""
    import shutil

    path = tmp_path / "j.duckdb"

    db = Database(path, [KV_SQL])
    gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
    for i in range(5):
        await gc.submit([Put("kv", (f"k{i}", "g", i)), Delete("kv", "k0")])
    await gc.submit([DeleteWhere("kv", "grp", ("nothing",))])
    assert gc.checkpoints == 0 and gc.transactions == 6
    assert _journal_records(path) == [1, 2, 3, 4, 5, 6]
    for f in tmp_path.iterdir():  # the crash: what is on disk now, the writer still open
        shutil.copy(f, tmp_path.parent / ("crashed-" + f.name))
    assert _rows(db) == {f"k{i}": ("g", i) for i in range(1, 5)}  # a read catches up
    assert gc.checkpoints == 1
    await gc.close()
    db.close()
    copy = Database(tmp_path.parent / "crashed-j.duckdb", [KV_SQL])
    GroupCommitter(copy, [KV])  # opening applies the journal the crash left
    assert _journal_records(tmp_path.parent / "crashed-j.duckdb") == []  # applied, emptied
    assert copy.query("SELECT applied FROM commit_journal_state") == [(6,)]
    assert _rows(copy) == {f"k{i}": ("g", i) for i in range(1, 5)}
    copy.close()


@pytest.mark.anyio
async def test_the_journal_is_applied_after_enough_rows_and_when_idle(tmp_path: Path) -> None:
    db = Database(tmp_path / "k.duckdb", [KV_SQL])
    gc = GroupCommitter(db, [KV], checkpoint_rows=3, checkpoint_idle=0.05)
    for i in range(3):
        await gc.submit([Put("kv", (f"k{i}", "g", i))])
    # The third row reached checkpoint_rows: applied once answered.
    await until(lambda: gc.checkpoints == 1, "a checkpoint after checkpoint_rows")
    await gc.submit([Put("kv", ("late", "g", 9))])
    await until(lambda: gc.checkpoints == 2, "a checkpoint once writes went quiet")
    assert _journal_records(tmp_path / "k.duckdb") == []  # applied and emptied
    await gc.close()
    db.close()


# --------------------------------------------------------------------------- crypto


def test_keyring_round_trip_and_binding() -> None:
    master = os.urandom(32)
    cipher, wrapped = Keyring(master).new_pool_key("bot:b1")
    blob = cipher.seal(b"secret text", aad("bot:b1", "mem_1"))
    assert b"secret text" not in blob and b"secret text" not in wrapped

    # A fresh keyring with the same master key unwraps the stored data key.
    again = Keyring(master).unwrap_pool_key("bot:b1", wrapped)
    assert again.open(blob, aad("bot:b1", "mem_1")) == b"secret text"
    # The wrapped key is bound to its pool, and to the master key.
    with pytest.raises(StorageError):
        Keyring(master).unwrap_pool_key("bot:b2", wrapped)
    with pytest.raises(StorageError):
        Keyring(os.urandom(32)).unwrap_pool_key("bot:b1", wrapped)
    # Two seals of the same text differ (fresh nonce).
    assert cipher.seal(b"x", b"a") != cipher.seal(b"x", b"a")


def test_cipher_rejects_wrong_aad_and_tampering() -> None:
    c = Cipher(os.urandom(32))
    blob = c.seal(b"hello", aad("bot:b1", "mem_1"))
    with pytest.raises(StorageError):
        c.open(blob, aad("bot:b1", "mem_2"))  # moved to another row
    with pytest.raises(StorageError):
        c.open(blob, aad("bot:b2", "mem_1"))  # moved to another pool
    for i in (0, 12, len(blob) - 1):  # nonce, ciphertext, tag
        flipped = bytearray(blob)
        flipped[i] ^= 0x01
        with pytest.raises(StorageError):
            c.open(bytes(flipped), aad("bot:b1", "mem_1"))
    with pytest.raises(StorageError):
        c.open(blob[:20], aad("bot:b1", "mem_1"))  # truncated
    with pytest.raises(StorageError):
        Cipher(os.urandom(32)).open(blob, aad("bot:b1", "mem_1"))  # another key


@pytest.mark.parametrize("blob", [b"", b"abc"])
def test_cipher_rejects_a_too_short_blob_as_storage_error(blob: bytes) -> None:
    with pytest.raises(StorageError):
        Cipher(os.urandom(32)).open(blob, b"aad")


def test_master_key_file_is_created_0600_and_reused(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OPENBOT_MASTER_KEY", raising=False)
    data = tmp_path / "data"
    key = load_master_key(data)
    assert len(key) == 32
    path = data / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert load_master_key(data) == key
    assert path.read_text() == text
    path.write_text("garbage")
    with pytest.raises(InvalidInput):
        load_master_key(data)


def test_master_key_from_env_takes_precedence(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("OPENBOT_MASTER_KEY", raising=False)
    file_key = load_master_key(tmp_path)
    env_key = os.urandom(32)
    monkeypatch.setenv("OPENBOT_MASTER_KEY", base64.urlsafe_b64encode(env_key).decode())
    assert load_master_key(tmp_path) == env_key != file_key
    fresh = tmp_path / "fresh"
    assert load_master_key(fresh) == env_key
    assert not (fresh / KEY_FILE).exists()  # no key file is written when the env has one


@pytest.mark.parametrize(
    "value",
    ["abc", base64.urlsafe_b64encode(b"short key").decode(), base64.b64encode(b"x" * 33).decode()],
)
def test_malformed_env_master_key_is_invalid_input(tmp_path, monkeypatch, value) -> None:
    monkeypatch.setenv("OPENBOT_MASTER_KEY", value)
    with pytest.raises(InvalidInput) as info:
        load_master_key(tmp_path)
    assert info.value.code == "bad_master_key"


# --------------------------------------------------------------------------- directory store


@pytest.mark.anyio
async def test_directory_stores_token_hashes_only(shards, directory, tmp_path: Path) -> None:
    org = await directory.create_org("Acme", id="o_acme")
    user, token = await directory.create_user("Zed Directoryname", [org.id])
    user_id = user.id
    shards.close_directory()
    raw = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert token.encode() not in raw
    assert token.split("_", 1)[1].encode() not in raw  # not even without its prefix
    # Positive controls: what *is* stored in the clear can be found by this scan.
    assert hash_token(token).encode() in raw
    assert user_id.encode() in raw
    assert b"Zed Directoryname" not in raw  # documents are sealed

    svc = shards.directory_service()  # opened again from its file
    principal = await svc.authenticate(hash_token(token))
    assert principal is not None and principal.user.id == user_id
    assert await svc.authenticate(token) is None  # the raw token is not a key


_VALUES = [
    None, "s", b"b", bytearray(b"b"), memoryview(b"m"), 0, 7, True, False, 1.5, [1], ("t",),
    InvalidInput("x"), Path("p"),
]  # fmt: skip


# What each column type takes (a bool is not taken as a number), written out here: the
# reference does not read the module's own table.
_TAKES: dict[str, tuple[type, ...]] = {
    "VARCHAR": (str,),
    "BIGINT": (int,),
    "INTEGER": (int,),
    "BLOB": (bytes, bytearray, memoryview),
    "DOUBLE": (int, float),
    "BOOLEAN": (bool,),
}


def _fits(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _old_check(tables: dict[str, Table], w) -> None:
    """What `GroupCommitter.check_writes` accepted before its one-pass fast path (the reference)."""
    from storage.group_commit import Insert

    table = tables.get(w.table)
    if table is None:
        raise StorageError("no table")
    if isinstance(w, Put | Insert):
        if len(w.row) != len(table.columns):
            raise StorageError("arity")
        for value, (_, kind) in zip(w.row, table.columns, strict=True):
            want = _TAKES.get(kind)
            if value is not None and want is not None and not _fits(value, want):
                raise StorageError("type")
    if isinstance(w, DeleteWhere):
        table.index(w.column)


def test_the_row_check_accepts_and_refuses_exactly_what_it_did(tmp_path: Path) -> None:
    """Every combination of value types (subclasses such as bool and str enums included) in a
    table of every column type the check knows, plus an unknown one: the one-pass check raises
    exactly when the old per-value `isinstance` check did."""
    import enum
    import itertools

    from storage.group_commit import Insert

    class Kind(enum.StrEnum):
        A = "a"

    cols = (("v", "VARCHAR"), ("i", "BIGINT"), ("b", "BLOB"), ("d", "DOUBLE"), ("f", "BOOLEAN"))
    tables = [Table(f"t_{name}", ((name, kind), ("x", "FLOAT[3]"))) for name, kind in cols]
    db = Database(tmp_path / "c.duckdb", [])
    gc = GroupCommitter(db, tables)
    by_name = {t.name: t for t in tables}
    values = [*_VALUES, Kind.A]
    checked = 0
    for table, first, second, op in itertools.product(tables, values, values, (Put, Insert)):
        w = op(table.name, (first, second))
        try:
            _old_check(by_name, w)
        except StorageError:
            with pytest.raises(StorageError):
                gc.check_writes([w])
        else:
            gc.check_writes([w])
        checked += 1
    for bad in (Put("t_v_missing", ("a", 1)), Put("t_v", ("a",)), DeleteWhere("t_v", "no", ())):
        with pytest.raises((StorageError, ValueError)):
            _old_check(by_name, bad)
        with pytest.raises((StorageError, ValueError)):
            gc.check_writes([bad])
    assert checked == len(tables) * len(values) ** 2 * 2
    db.close()
