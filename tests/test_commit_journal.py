"""The group committer's journal file (storage/journal_file.py, storage/group_commit.py).

A shard killed mid-write (SIGKILL, several rounds on one data directory) keeps every
acknowledged write exactly once and request ids stay idempotent across crash + replay; a torn
tail is cut and writes after it survive; damage in the middle refuses to open; a checkpoint
interrupted before the file was emptied applies nothing twice; a restored copy never applies
the original's journal; offline backups and exports of a crashed data directory include what
only the journal held. Real DuckDB files and real processes, no Ray.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from actors.shard.service import ShardService
from engine.errors import StorageError
from storage.database import Database
from storage.event_log import backup_offline
from storage.group_commit import (
    FORGET_JOURNAL,
    GroupCommitter,
    Insert,
    Put,
    Table,
    encode_writes,
)
from storage.journal_file import HEADER, JournalFile, frame, scan
from tests.journal_kit import KV, KV_SQL, crash_copy, journal_of
from tests.journal_writer import POOL, READER, content

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.usefixtures("no_env_key")


def _kv(db: Database) -> list[tuple]:
    return sorted(db.query("SELECT k, grp, n FROM kv"))


def _written(path: Path, groups: list[list], **options) -> None:
    """Commit `groups` (one journal record each) and leave a crash copy in `<dir>-crash`."""

    async def main() -> None:
        db = Database(path, [KV_SQL])
        gc = GroupCommitter(db, [KV], **options)
        for writes in groups:
            await gc.submit(writes)
        crash_copy(path.parent, path.parent.with_name(path.parent.name + "-crash"))
        await gc.close()
        db.close()

    asyncio.run(main())


def _reopen(path: Path) -> tuple[Database, GroupCommitter]:
    db = Database(path, [KV_SQL])
    return db, GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)


def _close(db: Database, gc: GroupCommitter) -> None:
    asyncio.run(gc.close())
    db.close()


# --- a real process killed mid-write ----------------------------------------------------------


def _run_until_killed(data: Path, round_: int, acks: int, sent: set, acked: dict) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OPENBOT_MASTER_KEY"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.journal_writer", str(data), str(round_), "8"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen = 0

    def take(line: str) -> None:
        nonlocal seen
        kind, *rest = line.split()
        if kind == "sent":
            sent.add(rest[0])
        elif kind == "ack":
            acked[rest[0]] = rest[1]
            seen += 1

    try:
        for line in proc.stdout:
            take(line)
            if seen >= acks:
                break
    finally:
        proc.kill()  # SIGKILL: no close, no final checkpoint
        proc.wait(timeout=30)
    for line in proc.stdout.read().splitlines():  # acknowledged before it died
        take(line)
    assert seen >= acks, f"the writer died early ({proc.returncode})"


@pytest.mark.subprocess
def test_a_shard_killed_mid_write_keeps_every_acknowledged_write_exactly_once(tmp_path):
    data = tmp_path / "data"
    sent: set[str] = set()
    acked: dict[str, str] = {}
    for round_, acks in enumerate((30, 70, 45)):
        _run_until_killed(data, round_, acks, sent, acked)

    async def check() -> tuple[Counter, Counter, list[int]]:
        svc = ShardService(data, 0, models={})
        page = await svc.read_memory(POOL, READER)
        ids = {e.id for e in page.entries}
        missing = {r: i for r, i in acked.items() if i not in ids}
        assert not missing, f"acknowledged but lost: {missing}"
        before = Counter(e.content for e in page.entries)

        def duplicates(con) -> list[int]:
            return [
                con.execute(
                    f"SELECT count(*) FROM (SELECT {key} FROM {table} GROUP BY {key} "
                    "HAVING count(*) > 1)"
                ).fetchall()[0][0]
                for table, key in (
                    ("memory_entries", "key"),
                    ("memory_log", "key"),
                    ("receipts", "key"),
                    ("events", "seq"),
                    ("search_terms", "key"),
                )
            ]

        dups = await svc.db.run(duplicates)
        # Idempotent across crash + replay: an acknowledged request id gives its first answer.
        for request_id, entry_id in acked.items():
            again = await svc.remember(POOL, READER, content(request_id), (), request_id)
            assert again.id == entry_id, request_id
        for request_id in sent - acked.keys():  # in flight at the kill: stored at most once
            await svc.remember(POOL, READER, content(request_id), (), request_id)
        after = Counter(e.content for e in (await svc.read_memory(POOL, READER)).entries)
        await svc.close()
        return before, after, dups

    before, after, dups = asyncio.run(check())
    assert dups == [0, 0, 0, 0, 0]
    assert max(before.values()) == 1
    assert after == Counter(content(r) for r in sent)  # each request once, none twice


# --- crash images made by copying the files --------------------------------------------------


TORN = frame(6, encode_writes([Put("kv", ("torn", "g", 6))]))


@pytest.mark.parametrize(
    "tail",
    [TORN[:10], TORN[:-3], TORN[:-1] + bytes([TORN[-1] ^ 1]), b"\0" * 4096],
    ids=["half-a-frame-header", "half-a-payload", "bad-checksum", "zeros"],
)
def test_a_torn_tail_is_cut_and_writes_after_it_survive(tmp_path, tail, caplog):
    path = tmp_path / "a" / "t.duckdb"
    _written(path, [[Put("kv", (f"k{i}", "g", i))] for i in range(5)], checkpoint_rows=10_000)
    crashed = tmp_path / "a-crash" / "t.duckdb"
    with open(journal_of(crashed), "ab") as f:
        f.write(tail)
    with caplog.at_level("WARNING", logger="openbot.storage"):
        db, gc = _reopen(crashed)
    assert any("torn tail" in r.getMessage() for r in caplog.records)
    assert _kv(db) == [(f"k{i}", "g", i) for i in range(5)]
    assert journal_of(crashed).stat().st_size == HEADER  # cut, applied, emptied
    _close(db, gc)
    # Later records are not stranded behind the cut: they survive the next crash.
    _written(crashed, [[Put("kv", ("later", "g", 7))], [Put("kv", ("last", "g", 8))]])
    db, gc = _reopen(tmp_path / "a-crash-crash" / "t.duckdb")
    assert [r[0] for r in _kv(db)] == ["k0", "k1", "k2", "k3", "k4", "last", "later"]
    assert db.query("SELECT applied FROM commit_journal_state") == [(7,)]
    _close(db, gc)


def test_the_journal_file_cuts_a_torn_tail_before_it_appends(tmp_path):
    path, ident = tmp_path / "j.journal", b"i" * 16
    journal, records = JournalFile.open(path, ident)
    assert records == []
    journal.append(1, b"one")
    journal.close()
    with open(path, "ab") as f:
        f.write(frame(2, b"two, torn")[:-2])
    journal, records = JournalFile.open(path, ident)
    assert records == [(1, b"one")]
    journal.append(2, b"two")  # not behind the torn bytes, where it would be lost
    journal.close()
    assert JournalFile.open(path, ident)[1] == [(1, b"one"), (2, b"two")]


def test_damage_in_the_middle_refuses_to_open_and_changes_nothing(tmp_path):
    path = tmp_path / "a" / "t.duckdb"
    _written(path, [[Put("kv", (f"k{i}", "g", i))] for i in range(5)], checkpoint_rows=10_000)
    journal = journal_of(tmp_path / "a-crash" / "t.duckdb")
    raw = bytearray(journal.read_bytes())
    records, _ = scan(bytes(raw))
    second = HEADER + len(frame(1, records[0][1]))
    raw[second + 30] ^= 0xFF  # in record 2's payload; records 3-5 stay valid
    journal.write_bytes(bytes(raw))
    with pytest.raises(StorageError) as refused:
        _reopen(tmp_path / "a-crash" / "t.duckdb")
    assert refused.value.code == "journal_damaged"
    assert journal.read_bytes() == bytes(raw)  # nothing cut


def test_a_checkpoint_interrupted_before_the_file_is_emptied_applies_nothing_twice(
    tmp_path, monkeypatch
):
    """The checkpoint's transaction (rows + last applied seq) committed, the crash came before
    the file was emptied: on open the applied records are skipped. Inserts (no delete first)
    would show a second application as duplicated rows."""
    monkeypatch.setattr(JournalFile, "reset", lambda self: None)
    path = tmp_path / "a" / "t.duckdb"
    groups = [[Insert("kv", (f"k{i}", "g", i))] for i in range(4)]
    _written(path, groups, checkpoint_rows=2, checkpoint_idle=3600)
    crashed = tmp_path / "a-crash" / "t.duckdb"
    assert [seq for seq, _ in scan(journal_of(crashed).read_bytes())[0]] == [1, 2, 3, 4]
    monkeypatch.undo()
    db, gc = _reopen(crashed)
    assert db.query("SELECT applied FROM commit_journal_state") == [(4,)]
    assert db.query("SELECT k, count(*) FROM kv GROUP BY k ORDER BY k") == [
        (f"k{i}", 1) for i in range(4)
    ]
    assert journal_of(crashed).stat().st_size == HEADER
    _close(db, gc)


def test_a_failed_sync_while_emptying_the_journal_strands_no_later_record(
    tmp_path, monkeypatch, caplog
):
    """The checkpoint committed and the file was cut back, but its sync failed: records after
    it go right after the header (not behind a hole that would read as damage on open)."""
    path = tmp_path / "a" / "t.duckdb"
    real = os.fsync
    failures = iter([True])

    def flaky(fd: int) -> None:
        if next(failures, False):
            raise OSError(5, "EIO (simulated)")
        real(fd)

    async def main() -> None:
        db = Database(path, [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=2, checkpoint_idle=3600)
        monkeypatch.setattr(os, "fsync", flaky)
        for i in range(3):  # the checkpoint after record 2 empties the file; its sync fails
            await gc.submit([Put("kv", (f"k{i}", "g", i))])
        monkeypatch.undo()
        assert gc.checkpoints == 1
        crash_copy(path.parent, tmp_path / "a-crash")
        await gc.close()
        db.close()

    with caplog.at_level("WARNING", logger="openbot.storage"):
        asyncio.run(main())
    assert any("emptying the applied" in r.getMessage() for r in caplog.records)
    db, gc = _reopen(tmp_path / "a-crash" / "t.duckdb")
    assert [r[0] for r in _kv(db)] == ["k0", "k1", "k2"]
    _close(db, gc)


def test_a_record_appended_while_a_reads_checkpoint_runs_is_never_emptied_away(
    tmp_path, monkeypatch
):
    """Records are appended on the event loop while a read's catch-up checkpoint applies the
    journal on the database thread: the record that came in between is neither applied by
    that checkpoint nor cut from the file when it empties it (the file is emptied only once
    every record in it is applied); a crash right after keeps it, and so does the next
    checkpoint."""
    from storage import group_commit

    path = tmp_path / "a" / "t.duckdb"
    entered, release = threading.Event(), threading.Event()
    original = group_commit.MergedWrites.apply

    def slow_apply(self, con):
        entered.set()
        assert release.wait(10)
        return original(self, con)

    async def main() -> None:
        db = Database(path, [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
        loop = asyncio.get_running_loop()
        await gc.submit([Insert("kv", ("k0", "g", 0))])
        monkeypatch.setattr(group_commit.MergedWrites, "apply", slow_apply)
        read = asyncio.ensure_future(db.run(lambda con: con.execute("SELECT 1").fetchall()))
        assert await loop.run_in_executor(None, entered.wait, 10)  # k0 is being applied
        await gc.submit([Insert("kv", ("k1", "g", 1))])  # durable while that runs
        release.set()
        await read
        monkeypatch.undo()
        assert gc.checkpoints == 1
        assert [seq for seq, _ in scan(journal_of(path).read_bytes())[0]] == [1, 2]
        crash_copy(path.parent, tmp_path / "a-crash")
        assert _kv(db) == [("k0", "g", 0), ("k1", "g", 1)]  # the next read applies k1
        assert gc.checkpoints == 2
        assert journal_of(path).stat().st_size == HEADER  # now everything in it is applied
        await gc.close()
        db.close()

    asyncio.run(main())
    db, gc = _reopen(tmp_path / "a-crash" / "t.duckdb")
    assert db.query("SELECT applied FROM commit_journal_state") == [(2,)]
    assert db.query("SELECT k, count(*) FROM kv GROUP BY k ORDER BY k") == [("k0", 1), ("k1", 1)]
    _close(db, gc)


def test_30_writers_and_a_reader_applying_the_journal_lose_and_double_nothing(tmp_path):
    """30 concurrent writers append records on the event loop while a reader keeps applying
    the journal on the database thread (catch-up checkpoints) and the flush loop checkpoints
    every 5 records: a crash copy taken at the end holds every acknowledged write exactly once
    (inserts: a record applied twice would show as a duplicate row)."""
    path = tmp_path / "a" / "t.duckdb"

    async def main() -> int:
        db = Database(path, [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=5, checkpoint_idle=3600)
        done = asyncio.Event()
        reads = 0

        async def writer(w: int) -> None:
            for n in range(10):
                await gc.submit([Insert("kv", (f"w{w}-{n}", "g", n))])

        async def reader() -> None:
            nonlocal reads
            while not done.is_set():
                await db.run(lambda con: con.execute("SELECT count(*) FROM kv").fetchall())
                reads += 1

        read = asyncio.ensure_future(reader())
        await asyncio.gather(*(writer(w) for w in range(30)))
        done.set()
        await read
        # On the database thread: a checkpoint the flush loop started may still be running, and
        # files copied one by one beside it are no state a crash could leave (the tables from
        # before it, the journal from after it).
        await db.run_write(lambda con: crash_copy(path.parent, tmp_path / "a-crash"))
        assert len(_kv(db)) == 300
        await gc.close()
        db.close()
        return reads

    assert asyncio.run(main()) > 1
    db, gc = _reopen(tmp_path / "a-crash" / "t.duckdb")
    counts = db.query("SELECT k, count(*) FROM kv GROUP BY k")
    assert len(counts) == 300 and {n for _, n in counts} == {1}
    _close(db, gc)


def test_a_restored_copy_never_applies_the_journal_of_the_original(tmp_path, caplog):
    a, b = tmp_path / "a" / "t.duckdb", tmp_path / "b" / "t.duckdb"

    async def main() -> None:
        db = Database(a, [KV_SQL])
        gc = GroupCommitter(db, [KV], checkpoint_rows=10_000, checkpoint_idle=3600)
        await gc.submit([Put("kv", ("k1", "g", 1))])
        b.parent.mkdir()
        await db.snapshot(b, [FORGET_JOURNAL])  # a backup (applies the journal first)
        await gc.submit([Put("kv", ("k2", "g", 2))])  # only in a's journal
        shutil.copy(journal_of(a), journal_of(b))  # restored next to the old server's journal
        await gc.close()
        db.close()

    asyncio.run(main())
    with caplog.at_level("WARNING", logger="openbot.storage"):
        db, gc = _reopen(b)
    assert _kv(db) == [("k1", "g", 1)]
    assert any("belongs to another copy" in r.getMessage() for r in caplog.records)
    assert [p.name for p in b.parent.glob("t.duckdb.journal.orphan-*")]  # kept, not applied

    async def more() -> None:
        await gc.submit([Put("kv", ("k3", "g", 3))])
        crash_copy(b.parent, tmp_path / "b-crash")

    asyncio.run(more())
    _close(db, gc)
    db, gc = _reopen(tmp_path / "b-crash" / "t.duckdb")
    assert _kv(db) == [("k1", "g", 1), ("k3", "g", 3)]
    _close(db, gc)


def test_a_record_journaled_before_a_column_was_added_is_applied_with_it_empty(tmp_path):
    """A journal left by a crash of an earlier version, opened after a migration that added
    a column to its table: its rows are stored with the new column empty (as the migration
    left the table's stored rows), not refused with the checkpoint stuck."""
    path = tmp_path / "a" / "t.duckdb"
    groups = [[Put("kv", ("old", "g", 1))], [Insert("kv", ("older", "g", 2))]]
    _written(path, groups, checkpoint_rows=10_000, checkpoint_idle=3600)
    crashed = tmp_path / "a-crash" / "t.duckdb"
    wider = Table("kv", (*KV.columns, ("extra", "BLOB")))
    db = Database(crashed, [KV_SQL, "ALTER TABLE kv ADD COLUMN extra BLOB"])
    gc = GroupCommitter(db, [wider], checkpoint_rows=10_000, checkpoint_idle=3600)
    assert db.query("SELECT k, grp, n, extra FROM kv ORDER BY k") == [
        ("old", "g", 1, None),
        ("older", "g", 2, None),
    ]
    assert journal_of(crashed).stat().st_size == HEADER
    _close(db, gc)


def test_a_journal_table_left_by_an_earlier_version_is_applied_once_and_dropped(tmp_path):
    path = tmp_path / "old.duckdb"
    db = Database(path, [KV_SQL])
    blob = encode_writes([Put("kv", ("old", "g", 1)), Insert("kv", ("older", "g", 2))])
    db.run_sync(lambda con: con.execute("CREATE TABLE commit_journal (seq BIGINT, batch BLOB)"))
    db.run_sync(lambda con: con.execute("INSERT INTO commit_journal VALUES (1, ?)", [blob]))
    db.close()
    for _ in range(2):  # the second open finds no table and applies nothing again
        db, gc = _reopen(path)
        assert _kv(db) == [("old", "g", 1), ("older", "g", 2)]
        tables = db.query("SELECT table_name FROM information_schema.tables")
        assert ("commit_journal",) not in tables
        _close(db, gc)


# --- backups and exports of a crashed data directory -----------------------------------------


def test_offline_backup_and_export_of_a_crashed_data_dir_include_thejournal_of(tmp_path):
    from actors.directory import DirectoryService
    from engine.directory import OrgSettings
    from engine.memory_entries import Reader
    from storage.file_export import render_data_dir

    data = tmp_path / "data"
    ann = Reader(user="u_ann", org="o_1", uses_bot=True)
    texts = [f"kept only in the journal {n}" for n in range(3)]

    async def write() -> None:
        d = DirectoryService(data)
        org = await d.create_org("Org", "o_1", OrgSettings())
        await d.create_user("Ann", [org.id], "u_ann")
        await d.create_bot(name="helper", org=org.id, owner="u_ann", id="b_1")
        d.store.db.close()
        svc = ShardService(data, 0, models={})
        svc.committer.checkpoint_rows = 10_000
        svc.committer.checkpoint_idle = 3600
        for text in texts:
            await svc.remember("bot:b_1", ann, text)
        # At least the last write is in the journal only (a read between writes may apply the
        # ones before it): an export or backup that skipped the journal would lose it.
        assert svc.committer.unapplied >= 1
        crash_copy(data, tmp_path / "crashed")
        crash_copy(data, tmp_path / "crashed-too")
        await svc.close()

    asyncio.run(write())
    exported = b"".join(render_data_dir(tmp_path / "crashed", "u_ann").values())
    assert all(t.encode() in exported for t in texts)

    backup_offline(tmp_path / "crashed-too", tmp_path / "copy", with_key=True)
    assert not journal_of(tmp_path / "copy" / "shard-0.duckdb").exists()

    async def read() -> list[str]:
        svc = ShardService(tmp_path / "copy", 0, models={})
        page = await svc.read_memory("bot:b_1", ann)
        await svc.close()
        return sorted(e.content for e in page.entries)

    assert asyncio.run(read()) == texts


def test_a_backup_while_serving_holds_the_writes_only_the_journal_had(tmp_path):
    data, copy = tmp_path / "data", tmp_path / "copy"
    texts = [f"only in the journal {n}" for n in range(3)]

    async def write() -> None:
        svc = ShardService(data, 0, models={})
        svc.committer.checkpoint_rows = 10_000
        svc.committer.checkpoint_idle = 3600
        for text in texts:
            await svc.remember(POOL, READER, text)
        assert svc.committer.unapplied  # acknowledged, not in the tables yet
        copy.mkdir()
        await svc.kernel.backup(str(copy))
        await svc.close()

    asyncio.run(write())
    shutil.copy(data / "master.key", copy / "master.key")
    assert not journal_of(copy / "shard-0.duckdb").exists()

    async def read() -> list[str]:
        svc = ShardService(copy, 0, models={})
        page = await svc.read_memory(POOL, READER)
        await svc.close()
        return sorted(e.content for e in page.entries)

    assert asyncio.run(read()) == texts
