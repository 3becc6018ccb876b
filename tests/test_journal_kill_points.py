"""A real shard process killed (SIGKILL, by itself) at each step of the commit journal's path:
mid-append (a torn record), after the record's fdatasync before its callers are answered or it
is applied, mid-apply (rows in an uncommitted DuckDB transaction) and mid-checkpoint (rows and
the last applied seq committed, the journal file not emptied), and each again during the
recovery of the next start (tests/journal_crash_writer.py).

After every crash the data directory is reopened: every acknowledged write is there once,
nothing is applied twice (no duplicate log, receipt, event or term rows), every published event
is in the log under the seq it was published with, each stored entry has exactly one
`memory.changed` event and no event describes a write that was not stored, and request ids
stay idempotent across crash + replay. Real DuckDB files and real processes, no Ray.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from actors.shard.service import ShardService
from engine.events import MemoryChanged
from storage.journal_file import scan
from tests.journal_writer import POOL, READER, content

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.subprocess, pytest.mark.usefixtures("no_env_key")]

# (point, nth) per round on one data directory; the second round of each kills during or just
# after the recovery of what the first left.
SCENARIOS = {
    "mid-append": [("append", 8), ("append", 3)],
    "after-fsync-before-apply": [("synced", 8), ("apply", 1)],
    "mid-apply": [("apply", 4), ("apply", 1)],
    "mid-checkpoint": [("applied", 3), ("applied", 1)],
    # DuckDB checkpointing its own file at every commit, killed from outside at any moment.
    "duckdb-checkpoints": [("external", 40), ("external", 25)],
}
# What each kill leaves, checked on the files so a test cannot pass without reaching its step.
LEFT = {
    "append": "torn",  # bytes after the last whole record
    "synced": "unapplied",  # a record above the last applied seq
    "apply": "unapplied",
    "applied": "applied",  # a record at or below the last applied seq, still in the file
}


class Seen:
    """What the killed processes said: sent, acknowledged, published."""

    def __init__(self) -> None:
        self.sent: set[str] = set()
        self.acked: dict[str, str] = {}
        self.published: dict[int, str] = {}
        self.ready = False  # the last process finished its recovery

    def take(self, line: str) -> None:
        kind, *rest = line.split()
        if kind == "ready":
            self.ready = True
        elif kind == "sent":
            self.sent.add(rest[0])
        elif kind == "ack":
            self.acked[rest[0]] = rest[1]
        elif kind == "pub":
            seq = int(rest[0])
            # A seq published twice (two processes) must name the same entry.
            assert self.published.setdefault(seq, rest[1]) == rest[1], (seq, rest[1])


def _crash(data: Path, round_: int, point: str, nth: int, seen: Seen) -> None:
    """Run the writer until it dies at `point` #`nth` (`external`: killed from here after
    `nth` acknowledgments)."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBOT_MASTER_KEY"}
    args = [str(data), str(round_), "6", point, str(nth)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.journal_crash_writer", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    watchdog = threading.Timer(180, proc.kill)
    watchdog.start()
    seen.ready = False
    acks = 0
    try:
        for line in proc.stdout:
            if not line.endswith("\n"):
                break  # cut short by the kill: never acted on
            seen.take(line)
            acks += line.startswith("ack ")
            if point == "external" and acks >= nth:
                proc.kill()  # SIGKILL
                break
        for line in proc.stdout.read().splitlines(keepends=True):  # written before it died
            if line.endswith("\n"):  # a line the kill cut short was never acted on
                seen.take(line)
        proc.wait(timeout=30)
    finally:
        watchdog.cancel()
    assert proc.returncode == -signal.SIGKILL, (point, nth, proc.returncode)


def _left(db_file: Path) -> set[str]:
    """What a crash left in the journal: torn bytes, applied or unapplied records."""
    with duckdb.connect(str(db_file), read_only=True) as con:
        (applied,) = con.execute("SELECT applied FROM commit_journal_state").fetchall()[0]
    data = Path(f"{db_file}.journal").read_bytes()
    records, end = scan(data)
    found = {"torn"} if end < len(data) else set()
    found |= {"applied" if seq <= applied else "unapplied" for seq, _ in records}
    return found


def _duplicates(con) -> dict[str, int]:
    return {
        table: con.execute(
            f"SELECT count(*) FROM (SELECT {key} FROM {table} GROUP BY {key} HAVING count(*) > 1)"
        ).fetchall()[0][0]
        for table, key in (
            ("memory_entries", "key"),
            ("memory_log", "key"),
            ("receipts", "key"),
            ("events", "seq"),
            ("search_terms", "key"),
        )
    }


async def _check(data: Path, seen: Seen) -> None:
    svc = ShardService(data, 0, models={})
    entries = (await svc.read_memory(POOL, READER)).entries
    ids = {e.id for e in entries}
    lost = {r: i for r, i in seen.acked.items() if i not in ids}
    assert not lost, f"acknowledged but lost: {lost}"
    assert max(Counter(e.content for e in entries).values()) == 1
    assert not any((await svc.db.run(_duplicates)).values()), await svc.db.run(_duplicates)

    events = await svc.events.after(0, limit=1_000_000)
    changed = {e.seq: e.data.entry for e in events if isinstance(e.data, MemoryChanged)}
    moved = {s: e for s, e in seen.published.items() if changed.get(s) != e}
    assert not moved, f"published, then lost or renumbered: {moved}"
    per_entry = Counter(changed.values())
    assert set(per_entry) == ids, "an event for a write not stored, or a write without one"
    assert set(per_entry.values()) == {1}, "an entry's event stored twice"

    # Idempotent across crash + replay: an acknowledged request id gives its first answer, and
    # a request in flight at a kill is stored at most once.
    for request_id, entry_id in seen.acked.items():
        again = await svc.remember(POOL, READER, content(request_id), (), request_id)
        assert again.id == entry_id, request_id
    for request_id in seen.sent - seen.acked.keys():
        await svc.remember(POOL, READER, content(request_id), (), request_id)
    after = Counter(e.content for e in (await svc.read_memory(POOL, READER)).entries)
    await svc.close()
    assert after == Counter(content(r) for r in seen.sent)


@pytest.mark.parametrize("rounds", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_a_shard_killed_at_each_step_of_the_journal_loses_and_repeats_nothing(tmp_path, rounds):
    data = tmp_path / "data"
    seen = Seen()
    for round_, (point, nth) in enumerate(rounds):
        _crash(data, round_, point, nth, seen)
        # Checked on a copy: the next round starts from what the crash left.
        image = tmp_path / f"image-{round_}"
        shutil.copytree(data, image)
        if point in LEFT:
            assert LEFT[point] in _left(image / "shard-0.duckdb"), (point, nth)
        recovering = round_ > 0 and nth == 1 and point != "append"
        assert seen.ready != recovering, "killed too late" if recovering else "killed too early"
        asyncio.run(_check(image, seen))
    assert seen.acked, "nothing was acknowledged before the kills"
