"""One DuckDB file, owned by one thread, with versioned migrations.

DuckDB allows one read-write process per file and a connection is not shareable across threads,
so every statement of a store runs on the store's single worker thread (`run`). Async callers
never block their event loop on the database. One exception: a large read that need not queue
behind the others may run on another connection with a thread of its own (`run_aside`: a pool's
vectors and term keys, read beside its records when a shard's first search loads them). There
are three such (`ASIDE`): a pool's vectors (tens of MB), its records and its keyword snapshot are
read at once, and none of them holds up the small reads the same search needs beside them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import queue
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import duckdb

from engine.errors import StorageError

T = TypeVar("T")
ASIDE = 3  # connections (and threads) for reads aside


def _convert(e: duckdb.Error, what: str) -> StorageError:
    return StorageError(f"{what}: {type(e).__name__}: {e}")


def _memory_limit() -> str:
    """DuckDB's memory limit per file: `OPENBOT_DUCKDB_MEMORY` (e.g. "512MB"), default 1GB.

    A cap, not a reservation: 256MB made a pool's search vectors (100k x 384 floats, one block
    of ~160 MB) fail to load, and semantic search then answered with keywords only."""
    limit = os.environ.get("OPENBOT_DUCKDB_MEMORY", "1GB").strip()
    if not limit.replace(".", "").isalnum():  # a size like 256MB or 1.5GB, nothing else
        raise StorageError(f"OPENBOT_DUCKDB_MEMORY is not a size: {limit!r}")
    return limit


class ReadScope(NamedTuple):
    """What a read depends on: the rows of `table` whose `column` is one of `values`.

    A read that names its scopes (`run(fn, scope=...)`) reads only those rows, and the tables
    may be read without applying the group committer's journal first when no record still in
    the journal writes any of them (a new chat's first read need not wait for a checkpoint of
    every other chat's writes). Only for columns that no row changes under its key (a chat
    item's chat, a memory row's pool): a replaced row then stays in the same scope."""

    table: str
    column: str
    values: tuple


class Database:
    """A DuckDB file (or `:memory:`) opened by this process, its migrations applied."""

    def __init__(self, path: str | Path, migrations: Sequence[str]) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="duckdb")
        self._con: duckdb.DuckDBPyConnection | None = None
        # Called on the database thread before every read with the read's scopes (None: it may
        # read anything): the group committer's journal is applied to the tables first unless
        # no record in it touches what the read reads, so a read always sees every committed
        # write it depends on.
        self.before_read: (
            Callable[[duckdb.DuckDBPyConnection, Sequence[ReadScope] | None], None] | None
        ) = None
        # Whether the tables hold every committed write now (nothing for `before_read` to
        # apply): then a read may run aside (`run_aside`). None: always.
        self.caught_up: Callable[[], bool] | None = None
        # Whether a committed write the tables do not have yet is in one of these scopes (the
        # group committer's journal); None: never. A scoped read with nothing pending may run
        # aside while the database thread is busy (`run`).
        self.pending_in: Callable[[Sequence[ReadScope]], bool] | None = None
        self._queued = 0  # calls handed to the database thread from the event loop, not done
        # More connections to the same database for `run_aside`, each used by one thread at a
        # time (the threads are started when first used).
        self._aside: concurrent.futures.ThreadPoolExecutor | None = None
        self._aside_cons: list[duckdb.DuckDBPyConnection] = []
        self._aside_free: queue.SimpleQueue[duckdb.DuckDBPyConnection] = queue.SimpleQueue()
        self.call(self._open, migrations)

    def _open(self, migrations: Sequence[str]) -> None:
        try:
            self._con = duckdb.connect(self.path)
        except duckdb.Error as e:
            raise _convert(e, f"cannot open {self.path}") from e
        con = self._con
        # Writes here are many tiny transactions: DuckDB's worker threads only add coordination
        # (measured ~15% per transaction on 2 cores).
        con.execute("SET threads = 1")
        # DuckDB's buffer pool keeps every block it read (by default up to 80% of the machine's
        # memory); a shard scans its tables to load pools, so the pool would grow with the data.
        con.execute(f"SET memory_limit = '{_memory_limit()}'")
        con.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER, applied_at BIGINT)"
        )
        if self.path != ":memory:":  # (a cursor of an in-memory one is another database)
            self._aside_cons = [con.cursor() for _ in range(ASIDE)]  # the same buffer pool
            for aside in self._aside_cons:
                self._aside_free.put(aside)
        done = {r[0] for r in con.execute("SELECT version FROM schema_migrations").fetchall()}
        for number, sql in enumerate(migrations, start=1):
            if number in done:
                continue
            try:
                con.begin()
                con.execute(sql)
                con.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?)",
                    [number, int(time.time() * 1000)],
                )
                con.commit()
            except duckdb.Error as e:
                con.rollback()
                raise _convert(e, f"migration {number} failed") from e

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the database thread and wait (for start-up and tools)."""
        return self._executor.submit(fn, *args).result()

    async def run(
        self,
        fn: Callable[[duckdb.DuckDBPyConnection], T],
        scope: Sequence[ReadScope] | None = None,
    ) -> T:
        """Run `fn(connection)` on the database thread; duckdb errors become StorageError.
        `scope`: every row `fn` reads (see ReadScope); None when it may read anything."""
        loop = asyncio.get_running_loop()
        if scope is not None and self._queued and self._may_read_aside(scope):
            # The database thread is busy (a checkpoint can take tens of ms): a read that
            # needs nothing from the journal does not queue behind it (a person's turn's
            # first read of its chat, the check of a pool's term rows).
            return await loop.run_in_executor(self._aside_pool(), self._aside_run, fn)
        return await self._queue(loop, self._guarded, fn, True, scope)

    def _aside_pool(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._aside is None:
            self._aside = concurrent.futures.ThreadPoolExecutor(
                len(self._aside_cons), thread_name_prefix="duckdb-aside"
            )
        return self._aside

    def _may_read_aside(self, scope: Sequence[ReadScope]) -> bool:
        return bool(self._aside_cons) and self.pending_in is not None and not self.pending_in(scope)

    async def _queue(self, loop: asyncio.AbstractEventLoop, *args: Any) -> Any:
        self._queued += 1
        try:
            return await loop.run_in_executor(self._executor, *args)
        finally:
            self._queued -= 1

    async def run_write(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """`run` for the group committer's own writes (no journal catch-up first)."""
        loop = asyncio.get_running_loop()
        return await self._queue(loop, self._guarded, fn, False)

    async def run_aside(
        self,
        fn: Callable[[duckdb.DuckDBPyConnection], T],
        scope: Sequence[ReadScope] | None = None,
    ) -> T:
        """`run` on another connection and thread (`ASIDE`), beside whatever the database thread is
        doing (a large read that need not wait for another: a pool's vectors beside its
        records, when a shard's first search loads both). It sees the committed state when it
        starts; when the journal holds writes the tables do not have yet, it runs as `run`
        does instead (with `scope`, the rows it reads: those writes are applied first only if
        one of them is in it)."""
        if not self._aside_cons or (self.caught_up is not None and not self.caught_up()):
            return await self.run(fn, scope)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._aside_pool(), self._aside_run, fn)

    def _aside_run(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        con = self._aside_free.get_nowait()  # as many threads as connections: one is free
        try:
            # One transaction: a read of several statements (a pool's rows, then its log; term
            # rows, then their highest seq) sees one state, never half of a commit or
            # checkpoint the database thread made between two of them.
            con.begin()
            try:
                out = fn(con)
            except BaseException:
                con.rollback()
                raise
            con.commit()
            return out
        except duckdb.Error as e:
            raise _convert(e, "database error") from e
        finally:
            self._aside_free.put(con)

    def run_sync(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        return self._executor.submit(self._guarded, fn).result()

    def _guarded(
        self,
        fn: Callable[[duckdb.DuckDBPyConnection], T],
        read: bool = True,
        scope: Sequence[ReadScope] | None = None,
    ) -> T:
        assert self._con is not None
        try:
            if read and self.before_read is not None:
                self.before_read(self._con, scope)
            return fn(self._con)
        except duckdb.Error as e:
            raise _convert(e, "database error") from e

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """A read, synchronously (start-up, loading a pool)."""
        return self.run_sync(lambda con: con.execute(sql, list(params)).fetchall())

    async def snapshot(self, dest: str | Path, then: Sequence[str] = ()) -> None:
        """Copy the whole database, as of one transaction, to a new file at `dest`, then run
        `then` against the copy (its tables are named `snap.<table>`). Safe while serving: the
        copy runs on the database thread between writes (FS-4). The copy is left 0600."""
        dest = str(dest)
        if Path(dest).exists():
            raise StorageError(f"{dest} already exists")

        def copy(con: duckdb.DuckDBPyConnection) -> None:
            (name,) = con.execute("SELECT current_database()").fetchall()[0]
            con.execute("ATTACH ? AS snap", [dest])
            try:
                con.execute(f'COPY FROM DATABASE "{name}" TO snap')
                for sql in then:
                    con.execute(sql)
            finally:
                con.execute("DETACH snap")

        await self.run(copy)
        # Only its owner reads a copy, whatever the umask (DuckDB creates it with the
        # process's); `new_private_dir` keeps others out of the folder meanwhile.
        os.chmod(dest, 0o600)

    def close(self) -> None:
        if self._aside is not None:
            self._aside.shutdown(wait=True)  # what runs aside ends before the connections
            self._aside = None

        def _close() -> None:
            for aside in self._aside_cons:
                aside.close()
            self._aside_cons = []
            if self._con is not None:
                self._con.close()
                self._con = None

        try:
            self.call(_close)
        finally:
            self._executor.shutdown(wait=True)


def new_private_dir(path: str | Path) -> Path:
    """A new folder (FileExistsError if there is one) only its owner may enter, whatever the
    umask: where backups are written."""
    path = Path(path)
    path.mkdir(parents=True, mode=0o700)
    os.chmod(path, 0o700)
    return path
