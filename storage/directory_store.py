"""The directory's DuckDB file: orgs, users, hashed tokens, bots with grants, channels, chats.

The directory is small and read on every request, so it is loaded whole at start and kept in
memory by its actor; this module only stores and loads it. Tokens are stored as SHA-256 hashes:
the file never holds a usable credential. Every record's document (names, bot rules and prompts,
settings) is sealed with the directory's data key, wrapped by the master key and kept in
`dir_keys` (storage/sealed_doc.py); ids stay in the clear. Plain documents left by an older
version are sealed when the file is opened.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from engine.directory import Bot, Channel, Chat, Org, User
from engine.errors import StorageError
from storage.crypto import Cipher, Keyring
from storage.database import Database
from storage.sealed_doc import is_sealed, open_doc, seal_doc

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE orgs (id VARCHAR, doc VARCHAR);
    CREATE TABLE users (id VARCHAR, doc VARCHAR);
    CREATE TABLE tokens (hash VARCHAR, user_id VARCHAR, created_at BIGINT);
    CREATE TABLE bots (id VARCHAR, doc VARCHAR);
    CREATE TABLE channels (id VARCHAR, doc VARCHAR);
    CREATE TABLE chats (id VARCHAR, doc VARCHAR);
    """,
    # 2: workspace projects: which account owns a project id, so that the gateway
    # finds the shard that holds the project and its memory pool.
    """
    CREATE TABLE project_owners (id VARCHAR, owner VARCHAR);
    """,
    # 3: the data key that seals the records' documents, wrapped by the master key.
    """
    CREATE TABLE dir_keys (scope VARCHAR, wrapped BLOB);
    """,
)
KEY_SCOPE = "directory"

KINDS: dict[str, type[msgspec.Struct]] = {
    "orgs": Org,
    "users": User,
    "bots": Bot,
    "channels": Channel,
    "chats": Chat,
}


# The tables an import writes, with their column counts.
IMPORT_TABLES = {t: 2 for t in KINDS} | {"project_owners": 2, "tokens": 3}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def directory_key(db: Database, keyring: Keyring, *, create: bool = True) -> Cipher | None:
    """The directory's data key (made and stored on first use when `create`)."""
    rows = db.query("SELECT wrapped FROM dir_keys WHERE scope = ?", [KEY_SCOPE])
    if rows:
        return keyring.unwrap_pool_key(KEY_SCOPE, rows[0][0])
    if not create:
        return None
    cipher, wrapped = keyring.new_pool_key(KEY_SCOPE)
    db.run_sync(lambda con: con.execute("INSERT INTO dir_keys VALUES (?, ?)", [KEY_SCOPE, wrapped]))
    return cipher


def seal_record(cipher: Cipher, table: str, record_id: str, doc: bytes) -> str:
    return seal_doc(cipher, KEY_SCOPE, table, record_id, doc)


def open_record(cipher: Cipher | None, table: str, record_id: str, doc: str) -> bytes:
    return open_doc(cipher, KEY_SCOPE, table, record_id, doc)


class DirectoryStore:
    def __init__(self, db: Database, keyring: Keyring) -> None:
        self.db = db
        self._decoders = {t: msgspec.json.Decoder(k) for t, k in KINDS.items()}
        self.cipher = directory_key(db, keyring)

    def load(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """All records by table and id, and token hash → user id. Plain documents written by an
        older version are sealed now, in one transaction."""
        out: dict[str, dict[str, Any]] = {}
        legacy: list[tuple[str, str, str]] = []
        for table, dec in self._decoders.items():
            rows = self.db.query(f"SELECT id, doc FROM {table}")
            records = out[table] = {}
            for i, doc in rows:
                raw = open_record(self.cipher, table, i, doc)
                records[i] = dec.decode(raw)
                if not is_sealed(doc):
                    legacy.append((table, i, seal_record(self.cipher, table, i, raw)))
        if legacy:
            self.db.run_sync(lambda con: _reseal(con, legacy))
        tokens = dict(self.db.query("SELECT hash, user_id FROM tokens"))
        return out, tokens

    async def put(
        self, table: str, record: msgspec.Struct, token: tuple[str, str, int] | None = None
    ):
        """Insert or replace one record (and optionally a token) in one transaction."""
        record_id = record.id  # type: ignore[attr-defined]
        doc = seal_record(self.cipher, table, record_id, msgspec.json.encode(record))

        def write(con):
            con.begin()
            try:
                con.execute(f"DELETE FROM {table} WHERE id = ?", [record_id])
                con.execute(f"INSERT INTO {table} VALUES (?, ?)", [record_id, doc])
                if token is not None:
                    con.execute("INSERT INTO tokens VALUES (?, ?, ?)", list(token))
                con.commit()
            except BaseException:
                con.rollback()
                raise

        await self.db.run(write)

    async def put_many(self, table: str, records: list[msgspec.Struct]) -> None:
        """Insert or replace several records of one table in one transaction."""
        rows = [
            (r.id, seal_record(self.cipher, table, r.id, msgspec.json.encode(r)))  # type: ignore[attr-defined]
            for r in records
        ]

        ids = [i for i, _ in rows]
        docs = [d for _, d in rows]

        def write(con):
            # Two statements for any number of records (a chain's agent chats come 8-32 at a
            # time): statement overhead, not rows, is what DuckDB costs from Python.
            con.begin()
            try:
                con.execute(f"DELETE FROM {table} WHERE id IN (SELECT unnest($1))", [ids])
                con.execute(f"INSERT INTO {table} SELECT unnest($1), unnest($2)", [ids, docs])
                con.commit()
            except BaseException:
                con.rollback()
                raise

        await self.db.run(write)

    async def replace_tokens(self, user_id: str, token: tuple[str, str, int]) -> None:
        """The user's only token from now on (the others are deleted), in one transaction."""

        def write(con):
            con.begin()
            try:
                con.execute("DELETE FROM tokens WHERE user_id = ?", [user_id])
                con.execute("INSERT INTO tokens VALUES (?, ?, ?)", list(token))
                con.commit()
            except BaseException:
                con.rollback()
                raise

        await self.db.run(write)

    def decode(self, table: str, record_id: str, doc: str) -> Any:
        """A stored record's document (sealed with this directory's key) as its Struct."""
        return self._decoders[table].decode(open_record(self.cipher, table, record_id, doc))

    async def insert_rows(self, rows: list[tuple[str, list[tuple]]]) -> None:
        """Rows an import made, as stored (`IMPORT_TABLES`), in one transaction."""
        for table, _ in rows:
            if table not in IMPORT_TABLES:
                raise StorageError(f"an import does not write {table}")

        def write(con):
            con.begin()
            try:
                for table, added in rows:
                    marks = ", ".join("?" * IMPORT_TABLES[table])
                    con.executemany(
                        f"INSERT INTO {table} VALUES ({marks})", [list(r) for r in added]
                    )
                con.commit()
            except BaseException:
                con.rollback()
                raise

        await self.db.run(write)

    # --- project owners ---

    def load_project_owners(self) -> dict[str, str]:
        return dict(self.db.query("SELECT id, owner FROM project_owners"))

    async def put_project_owner(self, project_id: str, owner: str) -> None:
        def write(con):
            con.begin()
            try:
                con.execute("DELETE FROM project_owners WHERE id = ?", [project_id])
                con.execute("INSERT INTO project_owners VALUES (?, ?)", [project_id, owner])
                con.commit()
            except BaseException:
                con.rollback()
                raise

        await self.db.run(write)


def _reseal(con, rows: list[tuple[str, str, str]]) -> None:
    con.begin()
    try:
        for table, record_id, doc in rows:
            con.execute(f"UPDATE {table} SET doc = ? WHERE id = ?", [doc, record_id])
        con.commit()
    except BaseException:
        con.rollback()
        raise
