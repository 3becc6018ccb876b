"""The directory's DuckDB file: orgs, users, hashed tokens, bots with grants, channels, chats.

The directory is small and read on every request, so it is loaded whole at start and kept in
memory by its actor; this module only stores and loads it. Tokens are stored as SHA-256 hashes:
the file never holds a usable credential.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from engine.directory import Bot, Channel, Chat, Org, User
from storage.database import Database

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE orgs (id VARCHAR, doc VARCHAR);
    CREATE TABLE users (id VARCHAR, doc VARCHAR);
    CREATE TABLE tokens (hash VARCHAR, user_id VARCHAR, created_at BIGINT);
    CREATE TABLE bots (id VARCHAR, doc VARCHAR);
    CREATE TABLE channels (id VARCHAR, doc VARCHAR);
    CREATE TABLE chats (id VARCHAR, doc VARCHAR);
    """,
    # 2: workspace projects (issue 5): which account owns a project id, so that the gateway
    # finds the shard that holds the project and its memory pool.
    """
    CREATE TABLE project_owners (id VARCHAR, owner VARCHAR);
    """,
)

KINDS: dict[str, type[msgspec.Struct]] = {
    "orgs": Org,
    "users": User,
    "bots": Bot,
    "channels": Channel,
    "chats": Chat,
}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class DirectoryStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._decoders = {t: msgspec.json.Decoder(k) for t, k in KINDS.items()}

    def load(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """All records by table and id, and token hash → user id."""
        out: dict[str, dict[str, Any]] = {}
        for table, dec in self._decoders.items():
            rows = self.db.query(f"SELECT id, doc FROM {table}")
            out[table] = {i: dec.decode(doc) for i, doc in rows}
        tokens = dict(self.db.query("SELECT hash, user_id FROM tokens"))
        return out, tokens

    async def put(
        self, table: str, record: msgspec.Struct, token: tuple[str, str, int] | None = None
    ):
        """Insert or replace one record (and optionally a token) in one transaction."""
        doc = msgspec.json.encode(record).decode()
        record_id = record.id  # type: ignore[attr-defined]

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

    # --- project owners (issue 5) ---

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
