"""Memory pools on a shard's DuckDB file: loading a pool, and the row writes of a change.

Entry metadata (tags, sources, proofs, status) is stored in the clear so that visibility and
purge never need a key; content, change-log details and memory-bot settings are sealed with the
pool's data key (SEC-1). Changing tags or status rewrites only the metadata column and carries the
stored ciphertext over untouched (LRN-8).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import msgspec

from engine.commands import Outcome
from engine.memory_bot_settings import MemoryBotSettings
from engine.memory_entries import EntryMeta, LogRow
from storage.crypto import Cipher, Keyring, aad
from storage.database import Database, ReadScope
from storage.group_commit import DeleteWhere, Insert, Put, Write
from storage.shard_schema import MEMORY_ENTRIES, MEMORY_LOG, POOLS

_meta_enc = msgspec.json.Encoder()
_meta_dec = msgspec.json.Decoder(EntryMeta)
_settings_dec = msgspec.json.Decoder(MemoryBotSettings)


class _LogPayload(msgspec.Struct, frozen=True, array_like=True):
    who: str
    change: str


_log_dec = msgspec.json.Decoder(_LogPayload)


@dataclass
class StoredPool:
    """A pool as loaded: metadata and sealed content per entry, the log, settings, version."""

    pool: str
    cipher: Cipher
    wrapped_key: bytes
    version: int = 0
    entries: dict[str, EntryMeta] = field(default_factory=dict)
    sealed: dict[str, bytes] = field(default_factory=dict)
    log: list[LogRow] = field(default_factory=list)
    settings: MemoryBotSettings = field(default_factory=MemoryBotSettings)
    persisted: bool = False


class MemoryStore:
    def __init__(self, db: Database, keyring: Keyring) -> None:
        self.db = db
        self.keyring = keyring
        # Pools made here whose key row has not committed yet, by id (see `keys_in`). Weak: a
        # pool that leaves memory before its first commit is not kept alive by this.
        self._fresh: weakref.WeakValueDictionary[str, StoredPool] = weakref.WeakValueDictionary()

    async def load(self, pool: str) -> StoredPool:
        rows = await self.db.run(lambda con: self.read_rows(con, pool), pool_scope(pool))
        return self.from_rows(pool, *rows)

    @staticmethod
    def read_rows(con, pool: str, *, only_if_keyed: bool = False) -> tuple[list, list, list]:
        """A pool's row, entries and log (database thread). `only_if_keyed`: without the
        pool's row nothing else is read (a chat's key row goes with everything sealed with it,
        so a chat without one has nothing stored that could be opened)."""
        head = con.execute(
            "SELECT version, wrapped_key, settings FROM pools WHERE pool = ?", [pool]
        ).fetchall()
        if only_if_keyed and not head:
            return head, [], []
        entries = con.execute(
            "SELECT id, meta, content FROM memory_entries WHERE pool = ?", [pool]
        ).fetchall()
        log = con.execute(
            "SELECT version, at_ms, entry, payload FROM memory_log WHERE pool = ? "
            "ORDER BY version, entry",
            [pool],
        ).fetchall()
        return head, entries, log

    def from_rows(self, pool: str, head: list, entry_rows: list, log_rows: list) -> StoredPool:
        """The pool as `read_rows` read it; a new key when it has no row yet."""
        if not head:
            cipher, wrapped = self.keyring.new_pool_key(pool)
            fresh = StoredPool(pool=pool, cipher=cipher, wrapped_key=wrapped)
            self._fresh[pool] = fresh
            return fresh
        version, wrapped, settings_blob = head[0]
        cipher = self.keyring.unwrap_pool_key(pool, wrapped)
        stored = StoredPool(
            pool=pool, cipher=cipher, wrapped_key=wrapped, version=version, persisted=True
        )
        if settings_blob is not None:
            stored.settings = _settings_dec.decode(
                cipher.open(settings_blob, aad(pool, "settings"))
            )
        for entry_id, meta, content in entry_rows:
            stored.entries[entry_id] = _meta_dec.decode(meta)
            stored.sealed[entry_id] = content
        for v, at, entry_id, payload in log_rows:
            p = _log_dec.decode(cipher.open(payload, aad(pool, f"log\x00{v}\x00{entry_id}")))
            stored.log.append(LogRow(version=v, at=at, who=p.who, entry=entry_id, change=p.change))
        if stored.log:  # changes that wrote log rows did not rewrite the pool's row
            stored.version = max(stored.version, stored.log[-1].version)
        return stored

    # --- writes ---

    def seal_content(self, stored: StoredPool, entry_id: str, content: str) -> bytes:
        return stored.cipher.seal(content.encode(), aad(stored.pool, entry_id))

    def open_content(self, stored: StoredPool, entry_id: str) -> str:
        return stored.cipher.open(stored.sealed[entry_id], aad(stored.pool, entry_id)).decode()

    def pool_row(self, stored: StoredPool, version: int, settings: MemoryBotSettings) -> Put:
        return pool_row(stored, version, settings)

    def keys_in(self, writes: Iterable[Write]) -> list[StoredPool]:
        """Pools not yet stored whose key row (their own wrapped key) is among `writes`: the
        batch that carries them marks them stored when it commits (`stored`)."""
        if not self._fresh:
            return []
        found: list[StoredPool] = []
        for w in writes:
            if type(w) is Put and w.table == POOLS.name:
                fresh = self._fresh.get(w.row[0])
                if (
                    fresh is not None
                    and fresh.wrapped_key == w.row[2]
                    and all(f is not fresh for f in found)
                ):
                    found.append(fresh)
        return found

    def stored(self, keys: Iterable[StoredPool]) -> None:
        """The batch carrying these pools' key rows committed: later batches need not."""
        for stored in keys:
            stored.persisted = True
            if self._fresh.get(stored.pool) is stored:
                self._fresh.pop(stored.pool, None)

    def key_rows(self, stored: StoredPool) -> list[Write]:
        """The pool's row (its wrapped key) while none has committed: needed with anything sealed
        with the pool's key, or a restart could not open it again."""
        if stored.persisted:
            return []
        return [pool_row(stored, stored.version, stored.settings)]

    def outcome_writes(
        self,
        stored: StoredPool,
        outcome: Outcome,
        new_content: Mapping[str, bytes] | None = None,
    ) -> list[Write]:
        """Rows for an outcome: entries (new sealed content where given, else the stored
        ciphertext), deletes with their log rows, new log rows, and the pool's version."""
        new_content = new_content or {}
        pool = stored.pool
        writes: list[Write] = []
        for meta in outcome.upserts:
            sealed = new_content.get(meta.id)
            if sealed is None:
                sealed = stored.sealed[meta.id]
            row = (entry_key(pool, meta.id), pool, meta.id, _meta_enc.encode(meta).decode(), sealed)
            op = Put if meta.id in stored.sealed else Insert
            writes.append(op(MEMORY_ENTRIES.name, row))
        if outcome.deletes:
            keys = tuple(entry_key(pool, i) for i in outcome.deletes)
            writes.append(DeleteWhere(MEMORY_ENTRIES.name, "key", keys))
            writes.append(DeleteWhere(MEMORY_LOG.name, "entry_key", keys))
        for row in outcome.log:
            payload = stored.cipher.seal(
                msgspec.json.encode(_LogPayload(who=row.who, change=row.change)),
                aad(pool, f"log\x00{row.version}\x00{row.entry}"),
            )
            key = f"{pool}\x00{row.version}\x00{row.entry}"
            ek = entry_key(pool, row.entry)
            writes.append(
                Insert(MEMORY_LOG.name, (key, pool, row.version, row.at, ek, row.entry, payload))
            )
        # The pool's row holds its wrapped key, settings and version. A change that writes log
        # rows needs no update of it: on load the version is the newest of the row and the log.
        # (That is two of five row operations saved on every Remember.)
        version_only_in_row = outcome.version != stored.version and not any(
            r.version == outcome.version for r in outcome.log
        )
        if not stored.persisted or version_only_in_row or outcome.deletes:
            writes.append(pool_row(stored, outcome.version, stored.settings))
        return writes


def pool_scope(pool: str) -> tuple[ReadScope, ...]:
    """The rows `MemoryStore.read_rows` reads (storage/database.py `ReadScope`)."""
    return (
        ReadScope(POOLS.name, "pool", (pool,)),
        ReadScope(MEMORY_ENTRIES.name, "pool", (pool,)),
        ReadScope(MEMORY_LOG.name, "pool", (pool,)),
    )


def pool_row(stored: StoredPool, version: int, settings: MemoryBotSettings) -> Put:
    """The pool's row: version, wrapped key and sealed settings. Until one has committed,
    `persisted` stays False and every batch that seals something with the pool's key carries
    the row again (`MemoryStore.keys_in` finds it there)."""
    blob = stored.cipher.seal(_meta_enc.encode(settings), aad(stored.pool, "settings"))
    return Put(POOLS.name, (stored.pool, version, stored.wrapped_key, blob))


def sealed_fp(sealed: bytes) -> str:
    """Which sealing of an entry's content something derived was made from (a new seal, even
    of the same text, has a new nonce and so a new fingerprint); the shard's term rows use the
    same."""
    return hashlib.blake2b(sealed, digest_size=12).hexdigest()


def entry_key(pool: str, entry_id: str) -> str:
    """Rows are keyed by pool and id: ids are unique only inside their pool."""
    return f"{pool}\x00{entry_id}"


def log_without(log: Iterable[LogRow], deleted: Iterable[str]) -> list[LogRow]:
    gone = set(deleted)
    return [r for r in log if r.entry not in gone]
