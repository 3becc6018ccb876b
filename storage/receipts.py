"""Idempotency receipts: a write that carries a `requestId` is done once.

A receipt stores a fingerprint of the request and the (sealed) answer. The same request again
gets the stored answer; a different request under the same id is a conflict. Receipts are written
in the same group-commit batch as the change they answer for, so a crash leaves either both or
neither.
"""

from __future__ import annotations

import asyncio
import hashlib

import msgspec

from engine.errors import Conflict, InvalidInput, StorageError
from storage.crypto import Cipher, aad
from storage.database import Database
from storage.group_commit import Insert
from storage.shard_schema import RECEIPTS

MAX_REQUEST_ID = 128


def receipt_key(scope: str, actor: str, request_id: str) -> str:
    if not isinstance(request_id, str) or not 1 <= len(request_id) <= MAX_REQUEST_ID:
        raise InvalidInput(f"requestId must be 1-{MAX_REQUEST_ID} characters", code="invalid_id")
    return f"{scope}\x00{actor}\x00{request_id}"


def fingerprint(request: object) -> str:
    return hashlib.sha256(msgspec.json.encode(request)).hexdigest()


class Receipts:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def keys(self, scope: str) -> set[str]:
        """The keys of the answers stored for `scope` (read once per pool, so that a new
        request id needs no database read)."""
        rows = await self.db.run(
            lambda con: con.execute("SELECT key FROM receipts WHERE scope = ?", [scope]).fetchall()
        )
        return {k for (k,) in rows}

    async def keys_with_prefix(self, prefix: str) -> set[str]:
        """The keys of every stored answer whose key starts with `prefix` (one receipt scope
        of `receipt_key`, all pools): read once, so a new request id needs no database read."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT key FROM receipts WHERE starts_with(key, ?)", [prefix]
            ).fetchall()
        )
        return {k for (k,) in rows}

    async def sealed_with(self, scope: str, cipher: Cipher, pool: str) -> list[str]:
        """The keys of receipt scope `scope`'s stored answers sealed with pool `pool`'s key (a
        receipt does not name its pool: each is tried, off the event loop)."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT key, response FROM receipts WHERE scope = ?", [scope]
            ).fetchall()
        )

        def opens(key: str, sealed: bytes) -> bool:
            try:
                cipher.open(sealed, aad(pool, "receipt\x00" + key))
            except StorageError:
                return False
            return True

        return await asyncio.to_thread(lambda: [k for k, sealed in rows if opens(k, sealed)])

    async def find(self, key: str, print_: str, cipher: Cipher, scope: str) -> bytes | None:
        """The stored answer for `key`, None if there is none; a different request → Conflict."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT fingerprint, response FROM receipts WHERE key = ?", [key]
            ).fetchall()
        )
        if not rows:
            return None
        stored_print, sealed = rows[0]
        if stored_print != print_:
            raise Conflict(
                "this requestId was already used for a different request", code="request_id_reused"
            )
        return cipher.open(sealed, aad(scope, "receipt\x00" + key))

    @staticmethod
    def row(key: str, print_: str, answer: bytes, cipher: Cipher, scope: str, now: int) -> Insert:
        scope_id, _, rest = key.partition("\x00")
        request_id = rest.partition("\x00")[2]
        sealed = cipher.seal(answer, aad(scope, "receipt\x00" + key))
        return Insert(RECEIPTS.name, (key, scope_id, request_id, print_, sealed, now))
