"""A shard that Remembers until it kills itself (SIGKILL) at a named point of the journal's path
(tests/test_journal_kill_points.py).

    python -m tests.journal_crash_writer <data_dir> <round> <callers> <point> <nth>

Points, each the `nth` time it is reached in this process (a kill is the process's own SIGKILL:
no close, no final checkpoint, no flush of anything but what was written):
  append    mid-append: half of the next record's frame is on disk (synced), then the kill
  synced    the record is appended and fdatasynced, its callers not answered yet
  apply     mid-apply: a checkpoint's rows are in its DuckDB transaction, not committed
  applied   mid-checkpoint: the rows and the last applied seq committed, the journal file not
            emptied yet (it still holds the applied records)
  external  none: DuckDB checkpoints its own file at every commit, and the test kills the
            process whenever it likes

The recovery at start applies the journal too, so `apply` / `applied` with nth 1 on a data
directory a crash left records in kill the process during its own recovery.

Prints `ready`, then `sent <requestId>` before each Remember, `ack <requestId> <entry id>` once
it is acknowledged and `pub <seq> <entry id>` for each `memory.changed` event published, each
line flushed, so the killer sees everything this process acknowledged or published.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import sys
import threading

from actors.shard.service import ShardService
from engine.events import MemoryChanged
from storage.event_log import EventLog
from storage.group_commit import MergedWrites
from storage.journal_file import HEADER, JournalFile, frame
from tests.journal_writer import POOL, READER, content

POINTS = ("append", "synced", "apply", "applied", "external")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(point: str, nth: int) -> None:
    """Make this process kill itself the `nth` time it reaches `point`."""
    reached = itertools.count(1)

    def due() -> bool:
        return next(reached) == nth

    if point == "append":
        append = JournalFile.append

        def torn_append(self: JournalFile, seq: int, payload: bytes) -> None:
            if due():
                data = frame(seq, payload)
                fd = os.open(self.path, os.O_WRONLY)
                os.pwrite(fd, data[: len(data) // 2], self.size)
                os.fdatasync(fd)
                die()
            append(self, seq, payload)

        JournalFile.append = torn_append  # type: ignore[method-assign]
    elif point == "synced":
        append = JournalFile.append

        def synced_append(self: JournalFile, seq: int, payload: bytes) -> None:
            append(self, seq, payload)
            if due():
                die()

        JournalFile.append = synced_append  # type: ignore[method-assign]
    elif point == "apply":
        apply = MergedWrites.apply

        def half_applied(self: MergedWrites, con) -> None:
            apply(self, con)
            if due():
                die()

        MergedWrites.apply = half_applied  # type: ignore[method-assign]
    elif point == "applied":
        reset = JournalFile.reset

        def applied_not_emptied(self: JournalFile) -> None:
            if self.size > HEADER and due():
                die()
            reset(self)

        JournalFile.reset = applied_not_emptied  # type: ignore[method-assign]
    elif point != "external":
        raise SystemExit(f"unknown point {point!r} (one of {', '.join(POINTS)})")


_SAYING = threading.Lock()


def say(*parts: object) -> None:
    """One whole line per write: `print` writes its parts one by one, and a line of another
    thread flushed in between would leave a torn one where the kill lands."""
    line = " ".join(map(str, parts)) + "\n"
    with _SAYING:
        sys.stdout.write(line)
        sys.stdout.flush()


def report_published() -> None:
    publish = EventLog.publish

    def printed(self: EventLog, events) -> None:
        for event in events:
            if isinstance(event.data, MemoryChanged):
                say("pub", event.seq, event.data.entry)
        publish(self, events)

    EventLog.publish = printed  # type: ignore[method-assign]


async def main(data_dir: str, round_: str, callers: int, point: str) -> None:
    svc = ShardService(data_dir, 0, models={})
    if point == "external":
        await svc.db.run_write(lambda con: con.execute("SET checkpoint_threshold = '1KB'"))
    # Frequent checkpoints, so apply and emptying points come soon and beside appends.
    svc.committer.checkpoint_rows = 3
    svc.committer.checkpoint_idle = 0.005
    counter = itertools.count()

    async def caller(w: int) -> None:
        while True:
            request_id = f"r{round_}-{w}-{next(counter)}"
            say("sent", request_id)
            entry = await svc.remember(POOL, READER, content(request_id), (), request_id)
            say("ack", request_id, entry.id)

    say("ready")
    await asyncio.gather(*(caller(w) for w in range(callers)))


if __name__ == "__main__":
    data, round_, callers, point, nth = sys.argv[1:6]
    arm(point, int(nth))
    report_published()
    asyncio.run(main(data, round_, int(callers), point))
