"""Group commit: many small writes, one short transaction.

Callers `submit` a batch of row changes and await its future. While one transaction runs on the
database thread, new batches queue up; the next transaction takes all of them at once. Order is
kept: batches commit in the order they were submitted, so a caller that submits under a lock
gets the lock's order on disk. With `enabled=False` every batch is its own transaction (the
baseline the memory benchmark compares against).

If a merged transaction fails, each of its batches is retried alone so one bad batch fails only
its own caller. A batch submitted `after` an earlier one (a collaboration hop's rows after the
send that made the hop) is never stored without it: it commits in the same record or a later
one, and fails if that one failed. So its caller need not wait for the earlier commit first.

The journal: a DuckDB transaction costs about one appender per table touched (measured here:
~10 ms for a turn's eight tables against ~1.2 ms for one row), and even one row costs ~1.5 ms of
CPU and ~4.5 ms of wall time, so a group commit is one framed record appended to a journal file
next to the database and synced (storage/journal_file.py: ~0.07 ms of CPU, ~0.2 ms) and is
durable there. The journal is applied to the real tables later, many commits at once (after
`checkpoint_rows` records, after `checkpoint_idle` seconds without writes, before a read that
depends on a row they write — `Database.before_read` — and at close); applying them and storing
the last applied seq is one transaction, then the file is emptied. A crash at any point leaves
each write either in the file above the stored seq or in its table, never both or neither: on
open, records above the stored seq are applied before anything is read, records at or below it
are skipped, and a torn last record (never acknowledged) is cut. An in-memory database keeps
its journal in memory.

A checkpoint that fails is logged and retried (at the next idle moment, read or threshold, with
a short pause after each failure); it never fails the writes whose journal record is durable:
they are durable, their callers are answered and their events published.

Earlier versions kept the journal as rows of a `commit_journal` table; a file that still has
some is applied (and the table dropped) when opened.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import duckdb
import msgspec

from engine.errors import OpenBotError, StorageError
from storage.database import Database, ReadScope
from storage.journal_file import HEADER, ID_BYTES, JournalFile
from storage.journal_thread import JournalThread, resolve
from storage.stats import SIZES, STATS


class Table(NamedTuple):
    """A table written by row: its columns and their DuckDB types; the first column is the key."""

    name: str
    columns: tuple[tuple[str, str], ...]

    def index(self, column: str) -> int:
        return [c for c, _ in self.columns].index(column)


class Put(NamedTuple):
    """Store `row` (all columns, key first), replacing any row with the same key."""

    table: str
    row: tuple


class Insert(NamedTuple):
    """Store `row` under a key that is new to the table (log rows, fresh entries): no delete
    is needed first, which saves a statement per table and transaction."""

    table: str
    row: tuple


class Delete(NamedTuple):
    table: str
    key: str


class DeleteWhere(NamedTuple):
    """Delete every row of `table` whose `column` is one of `values`."""

    table: str
    column: str
    values: tuple


class DeleteBelow(NamedTuple):
    """Delete every row of `table` whose `column` is below `value` (log retention)."""

    table: str
    column: str
    value: int


Write = Put | Insert | Delete | DeleteWhere | DeleteBelow

log = logging.getLogger("openbot.storage")
JOURNAL = "commit_journal"  # the journal table of earlier versions (applied when found)
# The journal file's id and the last seq applied to the tables (one row).
JOURNAL_STATE = "commit_journal_state"
# For a copy of the database (backup, snapshot): its own journal starts afresh, and a journal
# file found next to it (the original's) is never applied to it.
FORGET_JOURNAL = f"UPDATE snap.{JOURNAL_STATE} SET id = NULL"
CLOSING = "the database is closing: the write was not stored"
CHECKPOINT_PAUSE = 1.0  # seconds without threshold checkpoints after one failed
# Applied records the file may keep before the flush loop empties it (see `_checkpoint`).
APPLIED_BYTES = 1 << 20
# With `background` checkpoints, commits go on while one runs; past this many times the
# threshold (records or applied bytes) the flush loop waits for one instead (backpressure: the
# file is emptied and the list applied even when commits never pause).
BACKGROUND_SLACK = 4
# What each column type takes, checked when a write is journaled (a checkpoint must not fail).
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "VARCHAR": (str,),
    "BIGINT": (int,),
    "INTEGER": (int,),
    "BLOB": (bytes, bytearray, memoryview),
    "DOUBLE": (int, float),
    "BOOLEAN": (bool,),
}


class _AnyType(frozenset):
    """Every type (a column of a type `_PY_TYPES` does not list)."""

    def __contains__(self, item: object) -> bool:
        return True


_ANY: frozenset[type] = _AnyType()
_COMMIT_SECONDS = STATS.histogram(
    "openbot_shard_commit_seconds", help="One group commit (a transaction of queued batches)"
)
_COMMIT_BATCHES = STATS.histogram(
    "openbot_shard_commit_batches", buckets=SIZES, help="Batches merged into one group commit"
)
PASSED_SHAPES = 1024  # row shapes `check_writes` remembers as passed
_EXACT: dict[str, frozenset[type]] = {k: frozenset(v) for k, v in _PY_TYPES.items()}


def _fits(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


_KINDS: tuple[type, ...] = (Put, Insert, Delete, DeleteWhere, DeleteBelow)
_KIND_OF = {k: n for n, k in enumerate(_KINDS)}
_jenc = msgspec.msgpack.Encoder()
_jdec = msgspec.msgpack.Decoder(list[list])


def encode_writes(writes: Sequence[Write]) -> bytes:
    return _jenc.encode([[_KIND_OF[type(w)], *w] for w in writes])


def decode_writes(blob: bytes) -> list[Write]:
    out: list[Write] = []
    for kind, *fields in _jdec.decode(blob):
        cls = _KINDS[kind]
        if cls in (Put, Insert):
            out.append(cls(fields[0], tuple(fields[1])))
        elif cls is DeleteWhere:
            out.append(DeleteWhere(fields[0], fields[1], tuple(fields[2])))
        else:
            out.append(cls(*fields))
    return out


class MergedWrites:
    """The journal's writes folded into the last row per key, applied in one pass (a
    checkpoint); tests hold `apply` to run a checkpoint slowly."""

    def __init__(self, tables: Mapping[str, Table]) -> None:
        self.tables = tables
        self.rows: dict[str, dict[object, tuple | None]] = {}
        self.fresh: dict[str, set[object]] = {}  # keys no stored row can have
        self.wheres: list[DeleteWhere | DeleteBelow] = []

    def add(self, writes: Sequence[Write]) -> None:
        # Runs on the database thread for every row of a checkpoint, holding the GIL the event
        # loop waits for: the two common kinds by their exact type first, in a few steps.
        rows_by, fresh_by = self.rows, self.fresh
        for w in writes:
            kind = type(w)
            if kind is Insert or kind is Put:
                table, row = w
                rows = rows_by.get(table)
                if rows is None:
                    rows = rows_by[table] = {}
                key = row[0]
                if kind is Insert and key not in rows:
                    fresh = fresh_by.get(table)
                    if fresh is None:
                        fresh = fresh_by[table] = set()
                    fresh.add(key)
                rows[key] = row
            else:
                self._add_other(w)

    def _add_other(self, w: Write) -> None:
        """One write of another kind than `add` takes itself (deletes, or a subclass)."""
        if isinstance(w, Put):
            self.rows.setdefault(w.table, {})[w.row[0]] = w.row
        elif isinstance(w, Insert):
            rows = self.rows.setdefault(w.table, {})
            if w.row[0] not in rows:
                self.fresh.setdefault(w.table, set()).add(w.row[0])
            rows[w.row[0]] = w.row
        elif isinstance(w, Delete):
            self.rows.setdefault(w.table, {})[w.key] = None
        else:
            self.wheres.append(w)
            col = self.tables[w.table].index(w.column)
            if isinstance(w, DeleteWhere):
                values = set(w.values)
                hit = lambda v, values=values: v in values  # noqa: E731
            else:
                hit = lambda v, below=w.value: v < below  # noqa: E731
            pending = self.rows.get(w.table, {})
            for key, row in pending.items():
                if row is not None and hit(row[col]):
                    pending[key] = None

    def apply(self, con: duckdb.DuckDBPyConnection) -> None:
        # DuckDB's appender inserts, and deletes by key, at a fraction of a statement's cost
        # (measured: ~2x cheaper than INSERT … SELECT unnest(…) for a handful of rows).
        # Deletes by column first: rows put later in this group survive them (see `add`).
        for w in self.wheres:
            if isinstance(w, DeleteBelow):
                con.execute(f"DELETE FROM {w.table} WHERE {w.column} < ?", [w.value])
            elif w.values:
                _append(con, w.table, [(v,) for v in w.values], action="delete", key=[w.column])
        for name, rows in self.rows.items():
            key_col = self.tables[name].columns[0][0]
            fresh = self.fresh.get(name, set())
            stale = [(k,) for k in rows if k not in fresh]
            if stale:
                _append(con, name, stale, action="delete", key=[key_col])
            live = [r for r in rows.values() if r is not None]
            if live:
                _append(con, name, live)


def _append(con: duckdb.DuckDBPyConnection, table: str, rows: list[tuple], **options) -> None:
    appender = con.appender(table, **options)
    appender.append_rows(rows)
    appender.flush()


class GroupCommitter:
    def __init__(
        self,
        db: Database,
        tables: Sequence[Table],
        *,
        enabled: bool = True,
        max_batches: int = 256,
        journal: bool = True,
        checkpoint_rows: int = 256,
        checkpoint_idle: float = 0.5,
        background: bool = False,
        sync_aside: bool = False,
    ) -> None:
        self.db = db
        self.tables = {t.name: t for t in tables}
        # Per table, the exact types each column takes without a closer look (`_check`).
        self._exact = {
            t.name: tuple(_EXACT.get(kind, _ANY) for _, kind in t.columns) for t in tables
        }
        # (table, type of each value) of rows that passed `check_writes`: a few per table
        # (a column that may be None doubles them), bounded all the same.
        self._passed: set[tuple] = set()
        self.enabled = enabled
        self.max_batches = max_batches if enabled else 1
        self.journal = journal
        self.checkpoint_rows = checkpoint_rows
        self.checkpoint_idle = checkpoint_idle
        # The flush loop's own checkpoints (threshold, idle) run beside its commits instead of
        # holding them: a checkpoint takes tens of ms on a busy machine (seen 65-80 ms), and a
        # collaboration hop or a person's turn whose commit queued behind it waited as long.
        self.background = background
        self._checkpointing: asyncio.Task[None] | None = None
        # The journal's append and fdatasync on a thread of their own (a file journal only):
        # the event loop serves other calls while the disk syncs (seen up to 31 ms under load;
        # a hop's step on the same shard waited behind it). Callers are still answered only
        # once their record is synced.
        self.sync_aside = sync_aside
        self._syncer: JournalThread | None = None
        self.checkpoints = 0
        self.checkpoint_failures = 0
        self.reads_without_catch_up = 0  # scoped reads no journal record touched
        self._paused_until = 0.0  # monotonic time before which the threshold does not checkpoint
        # Journal records not yet applied, with their writes: appended (with the file) on the
        # event loop, taken and dropped by checkpoints on the database thread, under `_lock`.
        # Invariant: the file holds no unapplied record that is not in this list.
        self._journaled: list[tuple[int, list[Write]]] = []
        self._lock = threading.Lock()
        self._journal_seq = 0
        self._file: JournalFile | None = None
        db.call(self._open_journal)
        db.before_read = self._catch_up
        db.caught_up = self.caught_up
        db.pending_in = self._pending_in
        # (writes, future, the earlier batch's future it depends on or None)
        self._queue: list[tuple[Sequence[Write], asyncio.Future[None], asyncio.Future | None]] = []
        # What the idle flush loop awaits: True when `checkpoint_idle` passed without writes,
        # False when a batch came. A bare future and one timer per idle stretch, not a task and
        # a timer per commit: the idle wait is on every commit's path.
        self._wake: asyncio.Future[bool] | None = None
        self._idle_due: float | None = None  # loop time of the idle checkpoint, if one is due
        self._idle_timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._last: asyncio.Future[None] | None = None
        # Set by `close`: later writes are refused (their journal is closing), never queued
        # behind a flush loop that is stopping or acknowledged without a file to hold them.
        self._closing = False
        self.transactions = 0  # counters for benchmarks and tests
        self.batches = 0

    def submit(
        self, writes: Sequence[Write], after: asyncio.Future | None = None
    ) -> asyncio.Future[None]:
        """Queue a batch; the future resolves once it is durable (or fails with StorageError).
        `after`: a future this committer returned earlier; the batch is stored only with or
        after that batch, and fails if it failed (without writes: the batch is `after`)."""
        loop = asyncio.get_running_loop()
        if not writes and after is not None:
            return after
        fut: asyncio.Future[None] = loop.create_future()
        if not writes:
            fut.set_result(None)
            return fut
        if self._closing:
            fut.set_exception(StorageError(CLOSING, code="closing"))
            return fut
        self._queue.append((writes, fut, after))
        self._last = fut
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._flush_loop())
        else:
            self._kick(loop)
        return fut

    def _kick(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the idle flush loop a turn from now, not at once: writes whose calls arrive
        in the meantime (an actor hands each call to the loop on its own) join its commit."""
        wake = self._wake
        if wake is not None and not wake.done():
            self._wake = None
            loop.call_soon(resolve, wake, False)

    def _idle_check(self) -> None:
        """The idle timer: wake the waiting flush loop for its idle checkpoint, or wait on if
        a write came since the timer was set (one timer per idle stretch)."""
        self._idle_timer = None
        wake = self._wake
        if wake is None or wake.done():
            return  # busy: the next idle wait sets the timer again
        due = self._idle_due
        if due is None:
            return  # nothing journaled when it went idle: it waits for a batch only
        loop = asyncio.get_running_loop()
        if loop.time() >= due:
            self._wake = None
            wake.set_result(True)
        else:
            self._idle_timer = loop.call_at(due, self._idle_check)

    async def _idle(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Wait for a batch (False), or until `checkpoint_idle` passed without one (True; only
        while some journal record is not applied, else no timer)."""
        wake = self._wake = loop.create_future()
        self._idle_due = None
        if self._journaled:
            due = self._idle_due = loop.time() + self.checkpoint_idle
            timer = self._idle_timer
            if timer is not None and timer.when() > due:  # (`checkpoint_idle` was shortened)
                timer.cancel()
                timer = self._idle_timer = None
            if timer is None:
                self._idle_timer = loop.call_at(due, self._idle_check)
        return await wake

    async def _flush_loop(self) -> None:
        loop = asyncio.get_running_loop()
        woken = False
        while True:
            if self._checkpoint_due(BACKGROUND_SLACK if self.background else 1):
                # The loop appends nothing meanwhile, so this checkpoint empties the file.
                await self._checkpoint_alone("after a commit")
            elif self.background and self._checkpoint_due(rows_only=True):
                # Applied records stay in the file until a checkpoint finds no append came in
                # meanwhile (the idle one, or the one above past the slack).
                self._checkpoint_beside("after a commit")
            if not self._queue:
                if await self._idle(loop):
                    if self.background:
                        self._checkpoint_beside("when idle")
                    else:
                        await self._checkpoint_quietly("when idle")
                    continue
                woken = True  # (a turn after the batch came: `_kick`)
            if not woken and self.enabled and len(self._queue) < self.max_batches:
                # One more turn of the event loop: writes whose calls arrived meanwhile (an actor
                # hands each call to the loop on its own) join this commit instead of the next.
                await asyncio.sleep(0)
            woken = False
            group = self._queue[: self.max_batches]
            del self._queue[: len(group)]
            group = self._orphans_failed(group)
            if not group:
                continue
            started = time.perf_counter()
            try:
                await self.commit_group([w for w, _, _ in group])
                _COMMIT_SECONDS.observe(time.perf_counter() - started)
                _COMMIT_BATCHES.observe(len(group))
            except Exception:  # a bad row is a bug, but must not stop the writer
                if len(group) == 1:
                    self._settle(group, StorageError("the write could not be stored"))
                    continue
                for one in group:
                    if not self._orphans_failed([one]):
                        continue
                    try:
                        await self.commit_group([one[0]])
                    except Exception as e:
                        err = e if isinstance(e, OpenBotError) else StorageError(repr(e))
                        self._settle([one], err)
                    else:
                        self._settle([one], None)
                continue
            self._settle(group, None)

    async def commit_group(self, batches: Sequence[Sequence[Write]]) -> None:
        """Makes one group of batches durable together: one journal record, or one transaction
        without a journal. The one place every commit passes (tests hold or fail it here)."""
        if self.journal and self.sync_aside and self._file is not None:
            if self._syncer is None:
                self._syncer = JournalThread()
            # (the flush loop waits for it: one append at a time, in order)
            await self._syncer.run(self.append_record, batches)
        elif self.journal:
            # On this thread: an append + fdatasync (~0.07 ms of CPU) costs less than the two
            # thread hand-offs of running it on the database thread.
            self.append_record(batches)
        else:
            await self.db.run_write(lambda con: self._commit(batches, con))

    def _checkpoint_due(self, times: int = 1, *, rows_only: bool = False) -> bool:
        if time.monotonic() < self._paused_until:
            return False
        if len(self._journaled) >= self.checkpoint_rows * times:
            return True
        if rows_only:
            return False
        # Checkpoints run by reads (or beside commits) may leave applied records in the file
        # (appends came after they took theirs); the flush loop's own checkpoint empties it.
        return self._file is not None and self._file.size > HEADER + APPLIED_BYTES * times

    def _checkpoint_beside(self, when: str) -> None:
        """Start a checkpoint on the database thread and go on committing (one at a time).
        Records appended meanwhile stay in the list and the file (`_checkpoint`)."""
        if self._checkpointing is None or self._checkpointing.done():
            task = asyncio.get_running_loop().create_task(self._checkpoint_quietly(when))
            self._checkpointing = task

    async def _checkpoint_alone(self, when: str) -> None:
        running = self._checkpointing
        if running is not None and not running.done():
            await asyncio.wait([running])
        await self._checkpoint_quietly(when)

    @staticmethod
    def _orphans_failed(group: list) -> list:
        """Fail the batches whose earlier batch failed (in order, so theirs fail too); the
        rest. A pending earlier batch is in this group: groups settle before the next is
        taken (a pending one from elsewhere is refused rather than stored before it)."""
        for _, _, after in group:
            if after is not None:
                break
        else:
            return group  # (the common case: nothing depends on another batch)
        kept = []
        taken = {id(fut) for _, fut, _ in group}
        for entry in group:
            _, fut, after = entry
            if after is not None and (
                (after.done() and (after.cancelled() or after.exception() is not None))
                or (not after.done() and id(after) not in taken)
            ):
                if not fut.done():  # (its waiter may have cancelled it: still not stored)
                    fut.set_exception(StorageError("a write it depends on could not be stored"))
                continue
            kept.append(entry)
        return kept

    @staticmethod
    def _settle(group, error: BaseException | None) -> None:
        for _, fut, _ in group:
            if fut.done():
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    def _commit(self, batches: Sequence[Sequence[Write]], con: duckdb.DuckDBPyConnection) -> None:
        """Without the journal: the batches in one transaction (database thread)."""
        merged = MergedWrites(self.tables)
        for writes in batches:
            merged.add(writes)
        self._transaction(con, merged.apply)
        self.transactions += 1
        self.batches += len(batches)

    def append_record(self, batches: Sequence[Sequence[Write]]) -> None:
        """One journal record for the batches, durable when this returns (event loop, or the
        journal thread with `sync_aside`)."""
        writes = [w for batch in batches for w in batch]
        self.check_writes(writes)  # a malformed row fails its caller now, not a later checkpoint
        blob = encode_writes(writes)  # in memory too: a file and `:memory:` fail alike
        with self._lock:
            seq = self._journal_seq + 1
            if self._file is not None:
                self._file.append(seq, blob)
            self._journal_seq = seq
            self._journaled.append((seq, writes))
        self.transactions += 1
        self.batches += len(batches)

    @staticmethod
    def _transaction(con: duckdb.DuckDBPyConnection, body) -> None:
        con.begin()
        try:
            body(con)
            con.commit()
        except BaseException:
            con.rollback()
            raise

    def check_writes(self, writes: Sequence[Write]) -> None:
        exact = self._exact
        passed = self._passed
        for w in writes:
            kind = type(w)
            if kind is Put or kind is Insert:
                # Whether a row passes depends on its table and its values' types alone: a
                # row shaped like one that passed before passes (its table exists, its length
                # and every value's type fit), without a look at each value.
                shape = (w.table, *map(type, w.row))
                if shape in passed:
                    continue
            table = self.tables.get(w.table)
            if table is None:
                raise StorageError(f"no table {w.table!r}")
            if kind is Put or kind is Insert:
                row = w.row
                types = exact[w.table]
                if len(row) != len(types):
                    raise StorageError(f"a row of {w.table} needs {len(types)} values")
                # The common case in one pass: each value of a type its column takes as is.
                for value, ok in zip(row, types):  # noqa: B905 (lengths checked above)
                    if value is not None and type(value) not in ok:
                        self._check_row(table, row)
                        break
                if len(passed) < PASSED_SHAPES:
                    passed.add(shape)
            elif kind is DeleteWhere or kind is DeleteBelow:
                table.index(w.column)  # type: ignore[union-attr]

    @staticmethod
    def _check_row(table: Table, row: tuple) -> None:
        """A row with a value of another type than its column's own (a subclass, or wrong)."""
        for value, (column, kind) in zip(row, table.columns, strict=True):
            want = _PY_TYPES.get(kind)
            if value is not None and want is not None and not _fits(value, want):
                raise StorageError(f"{table.name}.{column} takes {kind}, not {value!r:.40}")

    # --- the journal (database thread) ---

    def _open_journal(self) -> None:
        con = self.db._con
        assert con is not None
        self._apply_legacy_journal(con)
        con.execute(f"CREATE TABLE IF NOT EXISTS {JOURNAL_STATE} (id VARCHAR, applied BIGINT)")
        state = con.execute(f"SELECT id, applied FROM {JOURNAL_STATE}").fetchall()
        ident, applied = state[0] if state else (None, 0)
        if ident is None:  # a new database, or a copy (FORGET_JOURNAL): a journal of its own
            ident = secrets.token_hex(ID_BYTES)
            sql = (
                f"UPDATE {JOURNAL_STATE} SET id = ?"
                if state
                else (f"INSERT INTO {JOURNAL_STATE} VALUES (?, 0)")
            )
            con.execute(sql, [ident])
        self._journal_seq = applied
        if self.db.path == ":memory:":
            return  # nothing survives the process: the journal is the list in memory
        self._file, records = JournalFile.open(self.db.path + ".journal", bytes.fromhex(ident))
        pending = [(seq, blob) for seq, blob in records if seq > applied]
        if pending and pending[0][0] != applied + 1:
            raise StorageError(
                f"the commit journal starts at seq {pending[0][0]} but the database has applied "
                f"only up to {applied}: records are missing",
                code="journal_damaged",
            )
        self._journaled = [(seq, self._fitted(decode_writes(blob))) for seq, blob in pending]
        if pending:
            self._journal_seq = pending[-1][0]
        self.apply_journal(con)  # what a crash left is applied before anything reads
        self._file.reset()  # records a crash left after their checkpoint committed

    def _fitted(self, writes: list[Write]) -> list[Write]:
        """A found record's rows as the tables are now: a row journaled before a migration
        added columns to its table gets them empty (as the migration left its stored rows)."""
        for at, w in enumerate(writes):
            if type(w) is Put or type(w) is Insert:
                table = self.tables.get(w.table)
                if table is not None and len(w.row) < len(table.columns):
                    pad = (None,) * (len(table.columns) - len(w.row))
                    writes[at] = type(w)(w.table, (*w.row, *pad))
        return writes

    def _apply_legacy_journal(self, con: duckdb.DuckDBPyConnection) -> None:
        """Rows of the journal table of earlier versions: applied, and the table dropped."""
        found = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [JOURNAL]
        ).fetchall()
        if not found[0][0]:
            return
        merged = MergedWrites(self.tables)
        for _, blob in con.execute(f"SELECT seq, batch FROM {JOURNAL} ORDER BY seq").fetchall():
            merged.add(self._fitted(decode_writes(blob)))

        def apply(con: duckdb.DuckDBPyConnection) -> None:
            merged.apply(con)
            con.execute(f"DROP TABLE {JOURNAL}")

        self._transaction(con, apply)

    @property
    def unapplied(self) -> int:
        """Journal records not applied to their tables yet."""
        return len(self._journaled)

    def caught_up(self) -> bool:
        """Whether every committed write is in the tables (no journal record to apply)."""
        # No lock: the journal thread holds it through a sync, and this is asked on the event
        # loop; the list changes in single steps (append, a slice deleted).
        return not self._journaled

    def _catch_up(
        self, con: duckdb.DuckDBPyConnection, scope: Sequence[ReadScope] | None = None
    ) -> None:
        # A read must see every committed write it depends on: one retry, then the read fails
        # (and the journal stays for the next attempt).
        if not self._journaled:
            return
        if scope is not None and not self._pending_in(scope):
            self.reads_without_catch_up += 1
            return
        if self._try_checkpoint(con, "before a read"):
            return
        if not self._try_checkpoint(con, "before a read, again"):
            raise StorageError("committed writes could not be applied yet; try again")

    def _pending_in(self, scopes: Sequence[ReadScope]) -> bool:
        """Whether a journal record not yet applied writes a row in `scopes` (any thread).
        Records appended meanwhile came after the read was asked for: a read need not see
        them, as before. Deletes by anything but the scope's column may hit any row."""
        wanted: dict[str, list[tuple[str, int, frozenset, str]]] = {}
        for s in scopes:
            table = self.tables.get(s.table)
            if table is not None:  # (a table not written by row has no journal records)
                key = table.columns[0][0]
                wanted.setdefault(s.table, []).append(
                    (s.column, table.index(s.column), frozenset(s.values), key)
                )
        if not wanted:
            return False
        taken = list(self._journaled)  # (one step, no lock: see `caught_up`)
        for _, writes in taken:
            for w in writes:
                for column, at, values, key in wanted.get(w.table, ()):
                    if isinstance(w, Put | Insert):
                        hit = w.row[at] in values
                    elif isinstance(w, Delete):
                        hit = key != column or w.key in values
                    elif isinstance(w, DeleteWhere):
                        hit = w.column != column or not values.isdisjoint(w.values)
                    else:
                        hit = True
                    if hit:
                        return True
        return False

    def _try_checkpoint(self, con: duckdb.DuckDBPyConnection, when: str) -> bool:
        """Checkpoint; on failure log it, keep the journal for a later retry, return False."""
        try:
            self.apply_journal(con)
        except Exception as e:
            self.checkpoint_failures += 1
            self._paused_until = time.monotonic() + CHECKPOINT_PAUSE
            log.warning(
                "applying %d journal rows %s failed (kept in the journal, retried): %r",
                len(self._journaled),
                when,
                e,
            )
            return False
        return True

    def apply_journal(self, con: duckdb.DuckDBPyConnection) -> None:
        """Apply the journal's records to their tables (one transaction, with the last applied
        seq), then drop them; empty the file if no record came in meanwhile (database thread).

        Records may be appended on the event loop while the transaction runs (a read's
        catch-up is not ordered with the flush loop): those stay in the list and the file, and
        the file is emptied only when the list is, under the lock, so no unapplied record is
        ever cut. The flush loop's own checkpoints run while it appends nothing."""
        with self._lock:
            taken = list(self._journaled)
        if taken:
            merged = MergedWrites(self.tables)
            for _, writes in taken:
                merged.add(writes)
            last = taken[-1][0]

            def apply(con: duckdb.DuckDBPyConnection) -> None:
                merged.apply(con)
                con.execute(f"UPDATE {JOURNAL_STATE} SET applied = ?", [last])

            self._transaction(con, apply)
            self.checkpoints += 1
        with self._lock:
            del self._journaled[: len(taken)]
            if self._file is not None and not self._journaled and self._file.size > HEADER:
                try:
                    self._file.reset()
                except OSError as e:  # harmless: applied records are skipped on open
                    self._paused_until = time.monotonic() + CHECKPOINT_PAUSE
                    log.warning("emptying the applied commit journal failed: %r", e)

    async def _checkpoint_quietly(self, when: str) -> None:
        # On failure the rows stay in the journal: the next read or checkpoint tries again.
        # (The flush loop comes back here after another idle wait.)
        try:
            await self.db.run_write(lambda con: self._try_checkpoint(con, when))
        except Exception as e:  # the database thread itself failed
            log.warning("applying the journal %s failed: %r", when, e)

    async def drain(self) -> None:
        """Wait until everything submitted so far is settled (batches settle in order)."""
        last = self._last
        if last is not None and not last.done():
            await asyncio.wait([last])

    async def close(self) -> None:
        # Every write submitted before this is settled before the flush loop stops (a write
        # that came in while an earlier one committed was left waiting forever, or once the
        # loop had stopped acknowledged with no journal file to hold it); later ones fail.
        self._closing = True
        loop = asyncio.get_running_loop()
        while self._queue or (self._last is not None and not self._last.done()):
            if self._task is None or self._task.done():  # (a loop that died restarts)
                self._task = loop.create_task(self._flush_loop())
            else:
                self._kick(loop)
            await self.drain()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._checkpointing is not None and not self._checkpointing.done():
            await asyncio.wait([self._checkpointing])
        if self._journaled:  # a stopped data directory needs no journal to be read
            # If this fails the records stay in the journal and are applied on the next open.
            await self.db.run_write(lambda con: self._try_checkpoint(con, "at close"))
        await self.db.run_write(lambda con: self.release())
        if self._syncer is not None:
            self._syncer.stop()
            self._syncer = None

    def release(self) -> None:
        """Close the journal file (nothing queued; offline tools that only opened the database
        to have its journal applied call this, then close the database)."""
        if self._file is not None:
            self._file.close()
            self._file = None
