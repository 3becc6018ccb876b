"""Offline access to a stopped data directory's DuckDB files, for export and import
(storage/file_export.py, storage/file_import.py): read-only opening, row reads, the master key
and the directory's record key, what an import target already holds (the merge check), and
writing rows in one transaction."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import msgspec

from engine.directory import Org
from engine.errors import InvalidInput, StorageError
from storage.crypto import Cipher, Keyring, has_master_key, key_file, load_master_key
from storage.database import Database
from storage.directory_store import KEY_SCOPE as DIR_KEY
from storage.directory_store import open_record
from storage.group_commit import DeleteWhere, GroupCommitter, Write
from storage.journal_file import HEADER
from storage.shard_schema import MIGRATIONS as SHARD_MIGRATIONS
from storage.shard_schema import TABLES as SHARD_TABLES

DIRECTORY_FILE = "directory.duckdb"
RECEIPT_SCOPE = "ws"  # the workspace's receipts (actors/workspace/service.py RECEIPT_SCOPE)
TOKENS_PREFIX = "import-tokens-"  # one new file per import: import-tokens-<when>-<random>.json
_org_dec = msgspec.json.Decoder(Org)


def master_key(data_dir: Path) -> bytes:
    """The key the data directory was sealed with; never a new one (reading makes nothing)."""
    if not has_master_key(data_dir):
        raise InvalidInput(
            f"no master key: {key_file(data_dir)} is missing and OPENBOT_MASTER_KEY is unset",
            code="no_master_key",
        )
    return load_master_key(data_dir)


def journal_path(shard_file: Path) -> Path:
    return Path(str(shard_file) + ".journal")


def open_shard(path: Path) -> tuple[Database, GroupCommitter]:
    """A stopped shard's file opened for writing, with the commit journal a crash left applied
    to its tables first (storage/group_commit.py). Close with `committer.release()` then
    `db.close()`."""
    db = Database(path, SHARD_MIGRATIONS)
    try:
        return db, GroupCommitter(db, SHARD_TABLES)
    except BaseException:
        db.close()
        raise


def drain_journal(path: Path) -> None:
    """Apply what a shard's journal file still holds (a server stopped by a crash, before its
    last checkpoint), so that reading the file read-only sees every acknowledged write."""
    journal = journal_path(path)
    if not journal.exists() or journal.stat().st_size <= HEADER:
        return
    try:
        db, committer = open_shard(path)
    except StorageError as e:
        raise StorageError(
            f"cannot apply the commit journal of {path} (a running server holds it? export "
            f"with --url, or from a backup): {e}",
            code="store_locked",
        ) from e
    committer.release()
    db.close()


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as e:
        raise StorageError(
            f"cannot open {path} read-only (a running server holds it? export with --url, or "
            f"from a backup): {e}",
            code="store_locked",
        ) from e
    try:
        yield con
    finally:
        con.close()


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence = ()) -> list[tuple]:
    """Rows of a query; none when its table does not exist (a file from before migration 5)."""
    try:
        return con.execute(sql, list(params)).fetchall()
    except duckdb.CatalogException:
        return []
    except duckdb.Error as e:
        raise StorageError(f"cannot read the data directory ({sql}): {e}") from e


@dataclass
class Existing:
    """What a data directory already holds, for a merge import: every check is made before
    anything is written, so a refused import changes nothing."""

    shards: int
    ids: dict[str, set[str]]
    orgs: dict[str, Org]

    def check(self, accounts, orgs, users, bots, channels, projects, chats, join_orgs=()):
        """The orgs and users still to write (shared ones the target keeps); `id_clash` when
        an account, bot, channel, project, chat or org id is taken. An org the target holds is
        joined only when named in `join_orgs` (its record there stays as it is): ids alone
        never make an imported account a member of another tenant's org."""
        join = set(join_orgs)
        unknown = sorted(join - (set(orgs) & set(self.orgs)))
        if unknown:
            raise InvalidInput(
                f"--join-org {', '.join(unknown)}: not an org of both the tree and the data "
                "directory; nothing was imported",
                code="join_org",
                details={"orgs": unknown},
            )
        clashes = [f"user {a}" for a in sorted(set(accounts) & self.ids["user"])]
        for kind, new in (
            ("bot", bots),
            ("channel", channels),
            ("project", projects),
            ("chat", chats),
        ):
            clashes += [f"{kind} {i}" for i in sorted(set(new) & self.ids[kind])]
        clashes += [
            f"org {i} (give --join-org {i} to join it)"
            for i in sorted(set(orgs) & set(self.orgs) - join)
        ]
        if clashes:
            raise InvalidInput(
                "the data directory already holds "
                + ", ".join(clashes[:20])
                + "; nothing was imported",
                code="id_clash",
                details={"clashes": clashes},
            )
        new_orgs = {i: o for i, o in orgs.items() if i not in self.orgs}
        return new_orgs, {i: u for i, u in users.items() if i not in self.ids["user"]}


def dir_cipher(keyring: Keyring, directory: Path) -> Cipher | None:
    """The directory's record key, when it has one (None: records from before sealing)."""
    with read_only(directory) as con:
        wrapped = rows(con, "SELECT wrapped FROM dir_keys WHERE scope = ?", [DIR_KEY])
    return keyring.unwrap_pool_key(DIR_KEY, wrapped[0][0]) if wrapped else None


def existing(data_dir: Path) -> Existing | None:
    """None for a new data directory; else its ids, orgs and shard count (read-only)."""
    directory = data_dir / DIRECTORY_FILE
    shard_files = sorted(data_dir.glob("shard-*.duckdb"))
    if not directory.exists():
        if shard_files:
            raise InvalidInput(f"{data_dir} has shards but no directory", code="exists")
        return None
    ids: dict[str, set[str]] = {}
    with read_only(directory) as con:
        for kind, table in (
            ("user", "users"),
            ("bot", "bots"),
            ("channel", "channels"),
            ("project", "project_owners"),
            ("chat", "chats"),
        ):
            ids[kind] = {r[0] for r in rows(con, f"SELECT id FROM {table}")}
    cipher = dir_cipher(Keyring(master_key(data_dir)), directory)
    with read_only(directory) as con:
        orgs = {
            i: _org_dec.decode(open_record(cipher, "orgs", i, doc))
            for i, doc in rows(con, "SELECT id, doc FROM orgs")
        }
    return Existing(max(len(shard_files), 1), ids, orgs)


def write_new_tokens(data_dir: Path, tokens: dict[str, str]) -> Path:
    """This import's tokens, and only them, in a file of their own created for them (O_EXCL,
    0600 whatever the umask): an earlier import's file is never opened, so live tokens do not
    pile up in one place. Answers the file's path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = data_dir / f"{TOKENS_PREFIX}{stamp}-{secrets.token_hex(4)}.json"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(path, flags, 0o600), "w") as f:
        os.fchmod(f.fileno(), 0o600)
        json.dump(tokens, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    dir_fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the file's name is durable before the directory commits the import
    finally:
        os.close(dir_fd)
    return path


def insert_all(
    db: Database, rows: Sequence[tuple[str, tuple]], deletes: Sequence[DeleteWhere] = ()
) -> None:
    by_table: dict[str, list[tuple]] = {}
    for table, row in rows:
        by_table.setdefault(table, []).append(row)

    def write(con: duckdb.DuckDBPyConnection) -> None:
        con.begin()
        try:
            for d in deletes:  # what an interrupted import left (chat_export.stale_rows)
                marks = ", ".join("?" * len(d.values))
                con.execute(f"DELETE FROM {d.table} WHERE {d.column} IN ({marks})", d.values)
            for table, batch in by_table.items():
                # The appender, as group commit uses: executemany is ~100x slower.
                appender = con.appender(table)
                appender.append_rows(batch)
                appender.flush()
            con.commit()
        except BaseException:
            con.rollback()
            raise

    db.run_sync(write)


def write_shard(
    path: Path, writes: list[Write], deletes: Sequence[DeleteWhere], master_key: bytes
) -> str:
    from storage.key_upgrade import upgrade_keys  # (numpy: only where rows are written)

    db, committer = open_shard(path)  # a crash's journal goes in before the imported rows
    try:
        # The rows are made under the current key format (a chain's fingerprints keyed per
        # org): the file reaches it first (a new file is only marked), so a start does not
        # key them a second time.
        upgrade_keys(db, master_key)
        insert_all(db, [(w.table, w.row) for w in writes], deletes)  # type: ignore[union-attr]
    finally:
        committer.release()
        db.close()
    return str(path)


# The tables an import writes (storage/file_import.py), by file kind.
IMPORTED_SHARD_TABLES = (
    "pools",
    "memory_entries",
    "memory_log",
    "receipts",
    "chat_items",
    "turns",
    "confessions",
    "enrichments",
    "learning_jobs",
    "learn_positions",
    "chains",
    "projects",
    "ws_entries",
    "ws_revisions",
    "ws_barriers",
    "communications",
    "requests",
)
IMPORTED_DIRECTORY_TABLES = (
    "orgs",
    "users",
    "bots",
    "channels",
    "chats",
    "project_owners",
    "tokens",
)


def changed_rows(
    before: Path, after: Path, tables: Sequence[str]
) -> tuple[list[tuple[str, list[tuple]]], list[tuple[str, str, tuple]]]:
    """What an import merged into `after` (a copy of the DuckDB file `before`) changed there,
    to be applied elsewhere: the rows of `tables` it added, and the keys (first column) of
    the rows it deleted (what an interrupted import of the same ids left)."""
    added: list[tuple[str, list[tuple]]] = []
    removed: list[tuple[str, str, tuple]] = []
    con = duckdb.connect(":memory:")
    try:
        for name, path in (("a", before), ("b", after)):
            quoted = str(path).replace("'", "''")
            con.execute(f"ATTACH '{quoted}' AS {name} (READ_ONLY)")
        for table in tables:
            try:
                new = con.execute(
                    f"SELECT * FROM b.{table} EXCEPT ALL SELECT * FROM a.{table}"
                ).fetchall()
                gone = con.execute(
                    f"SELECT * FROM a.{table} EXCEPT ALL SELECT * FROM b.{table}"
                ).fetchall()
                column = con.execute(f"SELECT * FROM a.{table} LIMIT 0").description[0][0]
            except duckdb.CatalogException:
                continue
            if new:
                added.append((table, new))
            if gone:
                removed.append((table, column, tuple(sorted({row[0] for row in gone}))))
    except duckdb.Error as e:
        raise StorageError(f"cannot compare {before} with {after}: {e}") from e
    finally:
        con.close()
    return added, removed


def shard_of(key: str, shards: int) -> int:
    """As actors/runtime/placement.py (storage cannot import actors): crc32 mod the shard count."""
    import zlib

    return zlib.crc32(key.encode()) % shards
