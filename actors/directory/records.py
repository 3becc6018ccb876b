"""The directory's records as they are in memory: orgs, users and their tokens, bots, channels,
chats and project owners; the store they are written to; and the one write lock.

Held in memory, stored in `directory.duckdb`. The lock guards only the records and the store's
one DuckDB thread (where writes are serial anyway); no other actor is awaited while it is held.
Reads take no lock: a record changes in memory only after its write committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from actors.access_watch import AccessWatch
from actors.contracts import access_key
from actors.directory.index import AccessIndex
from engine.directory import Bot, Channel, Chat, Org, User, check_id
from engine.errors import Conflict, InvalidInput, NotFound, Unprocessable
from storage.crypto import Keyring, load_master_key
from storage.database import Database
from storage.directory_store import MIGRATIONS, DirectoryStore


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(8)


class DirectoryRecords:
    def __init__(
        self, data_dir: str | Path, *, clock: Callable[[], int], db_path: str | None = None
    ) -> None:
        self.store = DirectoryStore(
            Database(db_path or Path(data_dir) / "directory.duckdb", MIGRATIONS),
            Keyring(load_master_key(Path(data_dir))),
        )
        records, self.tokens = self.store.load()  # token hash -> user id
        self.orgs: dict[str, Org] = records["orgs"]
        self.users: dict[str, User] = records["users"]
        self.bots: dict[str, Bot] = records["bots"]
        self.channels: dict[str, Channel] = records["channels"]
        self.chats: dict[str, Chat] = records["chats"]
        self.group_chats = {c.channel: c.id for c in self.chats.values() if c.kind == "group"}
        self.project_owners: dict[str, str] = self.store.load_project_owners()
        self.clock = clock
        # One writer at a time: a change's checks and its write with nothing in between.
        self.lock = asyncio.Lock()
        self.access = AccessWatch()  # what gateways cache of who may do what (access_watch.py)
        self.index = AccessIndex(self.bots, self.channels)  # who reaches what (index.py)

    def get(self, table: dict, key: str, what: str) -> Any:
        record = table.get(key)
        if record is None:
            raise NotFound(f"no {what} {key!r}", code=f"{what}_not_found")
        return record

    def org(self, org_id: str) -> Org:
        return self.get(self.orgs, org_id, "org")

    def user(self, user_id: str) -> User:
        return self.get(self.users, user_id, "user")

    def bot(self, bot_id: str) -> Bot:
        return self.get(self.bots, bot_id, "bot")

    def channel(self, channel_id: str) -> Channel:
        return self.get(self.channels, channel_id, "channel")

    def chat(self, chat_id: str) -> Chat:
        return self.get(self.chats, chat_id, "chat")

    async def put(self, table: str, record, index: dict, **extra) -> None:
        """Store one record, then make it the current one (callers hold the write lock)."""
        await self.store.put(table, record, **extra)
        before = index.get(record.id)
        index[record.id] = record
        if table != "chats":  # chats change no one's access
            keys = self.index.changed(table, before, record)
            if (token := extra.get("token")) is not None:  # (a cached miss of it is stale)
                keys.append(access_key("token", token[0]))
            self.access.bump(keys)

    @contextlib.asynccontextmanager
    async def changing(self) -> AsyncIterator[None]:
        """The write lock for a change to a record gateways may hold (an org's settings, a
        bot's rules, model, archive or pause flag, a channel's mode): answered once every live
        gateway has applied it (access_watch.py `settled`), as a revocation is. Gateways cache
        turn contexts (gateway/auth.py), so no turn that starts after the change returned
        runs with the record as it was (WS-2, WS-3)."""
        async with self.lock:
            before = self.access.revision
            yield
            revision = self.access.revision
        if revision != before:
            await self.access.settled(revision)

    async def import_records(self, rows: list[tuple[str, list[tuple]]]) -> int:
        """The directory rows of an import into the running server (`POST /v1/admin/import`:
        records sealed with this directory's key, project owners, token hashes), stored in one
        transaction: the import's commit point. An id taken since the import was checked is
        `id_clash` and nothing is stored. Returns how many rows were stored."""
        tables: dict[str, dict[str, Any]] = {
            "orgs": self.orgs,
            "users": self.users,
            "bots": self.bots,
            "channels": self.channels,
            "chats": self.chats,
        }
        async with self.changing():
            clashes: list[str] = []
            records: list[tuple[str, Any]] = []
            for table, added in rows:
                for row in added:
                    if table in tables:
                        taken = row[0] in tables[table]
                        if not taken:
                            records.append((table, self.store.decode(table, row[0], row[1])))
                    else:
                        taken = table == "project_owners" and row[0] in self.project_owners
                    if taken:
                        clashes.append(f"{table} {row[0]}")
            if clashes:
                raise InvalidInput(
                    "the server already holds "
                    + ", ".join(clashes[:20])
                    + "; nothing was imported",
                    code="id_clash",
                    details={"clashes": clashes},
                )
            await self.store.insert_rows(rows)
            for table, record in records:
                tables[table][record.id] = record
                if table in ("bots", "channels"):  # who reaches them (index.py)
                    self.index.changed(table, None, record)
                if isinstance(record, Chat) and record.kind == "group":
                    self.group_chats[record.channel] = record.id
            for table, added in rows:
                if table == "project_owners":
                    self.project_owners.update((pid, owner) for pid, owner in added)
                elif table == "tokens":
                    self.tokens.update((digest, user) for digest, user, _ in added)
            self.access.bump()
        return sum(len(added) for _, added in rows)

    def fresh_id(self, table: dict, given: str | None, prefix: str, what: str) -> str:
        if given is None:
            return new_id(prefix)
        check_id(given, what)
        if given in table:
            raise Conflict(f"{what} {given!r} already exists", code="exists")
        return given

    def require_in_org(self, user_id: str, org: str, role: str) -> User:
        """A bot's owner or grantee, or a channel's person, is a person of that org."""
        user = self.user(user_id)
        if org not in user.orgs:
            raise Unprocessable(
                f"{role} {user_id!r} is not a member of org {org!r}",
                code="not_in_org",
                details={"user": user_id, "org": org},
            )
        return user
