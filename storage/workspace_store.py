"""Workspace rows on a shard's DuckDB file: projects, scoped memory records, their
revisions and forget barriers.

Records keep their metadata (`WorkspaceEntry`: pool, contributor, tier, topics, evidence markers,
keyed content fingerprint, status, revision) in the clear so that access checks and barriers never
need a key; the content, and a revision's before/after, are sealed with the pool's data key
(the same per-pool key as storage/memory_store.py, SEC-1). Content fingerprints are keyed per
pool with a secret derived from the master key, so a stored fingerprint does not let anyone
confirm a guessed fact by hashing it.

A project's document (name, metadata, members) is sealed with its pool's key too.

This module only loads and builds rows; the shard's group commit writes them.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, ItemsView, Iterator, KeysView, MutableMapping, ValuesView
from dataclasses import dataclass, field

import msgspec

from engine.projects import Project
from engine.scoped_memory import ForgetBarrier, Revision, WorkspaceEntry
from storage.bulk import paused_gc
from storage.crypto import Cipher, Keyring, aad
from storage.database import Database, ReadScope
from storage.group_commit import Insert, Put, Write
from storage.sealed_doc import is_sealed, open_doc, seal_doc
from storage.shard_schema import (
    PROJECTS,
    WORKSPACE_BARRIERS,
    WORKSPACE_ENTRIES,
    WORKSPACE_REVISIONS,
)

_enc = msgspec.json.Encoder()
_entry_dec = msgspec.json.Decoder(WorkspaceEntry)
_barrier_dec = msgspec.json.Decoder(ForgetBarrier)
_project_dec = msgspec.json.Decoder(Project)


class _Sides(msgspec.Struct, frozen=True, array_like=True):
    before: str | None
    after: str | None


_sides_dec = msgspec.json.Decoder(_Sides)


class _Fp(msgspec.Struct):
    content_fp: str


_fp_dec = msgspec.json.Decoder(_Fp)


class LazyEntries(MutableMapping[str, WorkspaceEntry]):
    """A pool's records by id, each decoded from its stored JSON the first time it is read.

    Decoding every record's metadata would be a large part of a big pool's load (the first
    search after a shard opens), while a search reads the few hundred records its ranking reaches.
    One dict holds both kinds of value in load order (a decoded record replaces its JSON in
    place, so iteration order is that of a plain dict); `fp` reads a record's content
    fingerprint alone, for the walks that compare every record with derived data.

    `link`, when set, is applied to each record as it is decoded (a bot pool's records stored
    before migration 7 get the bot's `org:` tag: actors/workspace/pools.py), so that no walk
    of every record's JSON is needed to find the few such records."""

    __slots__ = ("_d", "_raw", "link")

    def __init__(self, raw: dict[str, str] | None = None) -> None:
        self._d: dict[str, WorkspaceEntry | str] = raw if raw is not None else {}
        self._raw = len(self._d)  # values still JSON (0: every one decoded)
        self.link: Callable[[WorkspaceEntry], WorkspaceEntry] | None = None

    def _decode(self, entry_id: str, raw: str) -> WorkspaceEntry:
        entry = _entry_dec.decode(raw)
        if self.link is not None:
            entry = self.link(entry)
        self._d[entry_id] = entry  # a value set: order kept
        self._raw -= 1
        return entry

    @property
    def undecoded(self) -> int:
        """How many records are still their stored JSON (0: every one decoded)."""
        return self._raw

    def set_link(self, link: Callable[[WorkspaceEntry], WorkspaceEntry]) -> None:
        """Apply `link` to every record: those decoded already now, the others as they are."""
        self.link = link
        if self._raw != len(self._d):
            for entry_id, v in self._d.items():
                if type(v) is not str:
                    self._d[entry_id] = link(v)  # type: ignore[arg-type]

    def __getitem__(self, entry_id: str) -> WorkspaceEntry:
        v = self._d[entry_id]
        return self._decode(entry_id, v) if type(v) is str else v  # type: ignore[return-value]

    def get(self, entry_id: str, default=None):  # type: ignore[override]
        v = self._d.get(entry_id, default)
        return self._decode(entry_id, v) if type(v) is str else v

    def fp(self, entry_id: str) -> str | None:
        """The record's content fingerprint (None: no such record), without decoding it."""
        v = self._d.get(entry_id)
        if v is None:
            return None
        return _fp_dec.decode(v).content_fp if type(v) is str else v.content_fp  # type: ignore[union-attr]

    def __setitem__(self, entry_id: str, entry: WorkspaceEntry) -> None:
        if type(self._d.get(entry_id)) is str:
            self._raw -= 1
        self._d[entry_id] = entry

    def __delitem__(self, entry_id: str) -> None:
        if type(self._d.pop(entry_id)) is str:
            self._raw -= 1

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._d

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def keys(self) -> KeysView[str]:  # type: ignore[override]
        return self._d.keys()  # the dict's own view: set operations at C speed

    def __len__(self) -> int:
        return len(self._d)

    def _decoded(self) -> dict[str, WorkspaceEntry]:
        if self._raw:
            for entry_id, v in self._d.items():
                if type(v) is str:
                    self._decode(entry_id, v)
        return self._d  # type: ignore[return-value]

    def values(self) -> ValuesView[WorkspaceEntry]:  # type: ignore[override]
        return self._decoded().values()

    def items(self) -> ItemsView[str, WorkspaceEntry]:  # type: ignore[override]
        return self._decoded().items()


def content_fp(entries: MutableMapping[str, WorkspaceEntry], entry_id: str) -> str | None:
    """A record's content fingerprint, decoding as little as the mapping allows."""
    if isinstance(entries, LazyEntries):
        return entries.fp(entry_id)
    e = entries.get(entry_id)
    return None if e is None else e.content_fp


@dataclass
class StoredWorkspacePool:
    """One pool's workspace records as loaded: metadata (decoded when first read) and sealed
    content, and its barriers."""

    pool: str
    entries: MutableMapping[str, WorkspaceEntry] = field(default_factory=LazyEntries)
    sealed: dict[str, bytes] = field(default_factory=dict)
    barriers: list[ForgetBarrier] = field(default_factory=list)


def entry_key(pool: str, entry_id: str) -> str:
    return f"{pool}\x00{entry_id}"


def pool_scope(pool: str) -> tuple[ReadScope, ...]:
    """The rows `read_pool` reads (keyed by pool, so no row leaves its pool): a pool's first
    load does not wait for the journal's writes of other pools and chats."""
    return (
        ReadScope(WORKSPACE_ENTRIES.name, "pool", (pool,)),
        ReadScope(WORKSPACE_BARRIERS.name, "pool", (pool,)),
    )


def _content_aad(pool: str, entry_id: str) -> bytes:
    # "ws" keeps a workspace record's ciphertext from opening as a memory entry of the same
    # pool (they share the pool's data key), and the other way round.
    return aad(pool, f"ws\x00{entry_id}")


def _revision_aad(pool: str, entry_id: str, revision: int) -> bytes:
    return aad(pool, f"ws-rev\x00{entry_id}\x00{revision}")


class WorkspaceStore:
    def __init__(self, db: Database, master_key: bytes) -> None:
        self.db = db
        self._fp_secret = hmac.new(master_key, b"openbot ws fingerprint", hashlib.sha256).digest()

    def fingerprint_key(self, pool: str) -> bytes:
        """The pool's secret for content fingerprints (records and barriers of one pool share
        it); derived, so nothing more has to be stored or backed up than the master key."""
        return hmac.new(self._fp_secret, pool.encode(), hashlib.sha256).digest()

    # --- loading ---

    async def load_pool(self, pool: str) -> StoredWorkspacePool:
        rows = await self.db.run(lambda con: self.read_pool(con, pool), pool_scope(pool))
        return self.stored_pool(pool, rows)

    @staticmethod
    def read_pool(con, pool: str) -> tuple[dict, list]:
        """A pool's rows as `stored_pool` takes them (on the database's thread; a caller may
        read more in the same call)."""
        # One scan; columns as numpy arrays (a tuple per row costs more than the scan).
        cols = con.execute(
            "SELECT id, meta, content FROM ws_entries WHERE pool = ?", [pool]
        ).fetchnumpy()
        barriers = con.execute(
            "SELECT doc FROM ws_barriers WHERE pool = ? ORDER BY at_ms, key", [pool]
        ).fetchall()
        return cols, barriers

    @staticmethod
    def stored_pool(pool: str, rows: tuple[dict, list]) -> StoredWorkspacePool:
        cols, barrier_rows = rows
        stored = StoredWorkspacePool(pool=pool)
        if len(cols["id"]):
            with paused_gc():  # 100,000 records: see storage/bulk.py
                ids = cols["id"].tolist()
                stored.entries = LazyEntries(dict(zip(ids, cols["meta"].tolist(), strict=True)))
                stored.sealed = dict(zip(ids, cols["content"].tolist(), strict=True))
        stored.barriers = [_barrier_dec.decode(doc) for (doc,) in barrier_rows]
        return stored

    async def load_projects(self, keyring: Keyring) -> tuple[dict[str, Project], list[str]]:
        """Every project here (documents opened with their project pool's key), and the ids of
        those still stored plain by an older version (to be sealed again)."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT p.id, p.doc, k.wrapped_key FROM projects p "
                "LEFT JOIN pools k ON k.pool = 'project:' || p.id"
            ).fetchall()
        )
        projects: dict[str, Project] = {}
        legacy: list[str] = []
        for pid, doc, wrapped in rows:
            pool = f"project:{pid}"
            cipher = None if wrapped is None else keyring.unwrap_pool_key(pool, wrapped)
            project = _project_dec.decode(open_doc(cipher, pool, PROJECTS.name, pid, doc))
            projects[project.id] = project
            if not is_sealed(doc):
                legacy.append(project.id)
        return projects, legacy

    async def entry_pool(self, entry_id: str) -> str | None:
        """The pool holding workspace record `entry_id` on this shard, if any (committed rows);
        a bot's learned entries count too (one memory per bot, engine/memory_union.py)."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT pool FROM ws_entries WHERE id = ? UNION ALL "
                "SELECT pool FROM memory_entries WHERE id = ? AND pool LIKE 'bot:%' LIMIT 1",
                [entry_id, entry_id],
            ).fetchall()
        )
        return rows[0][0] if rows else None

    async def contributed_pools(self, contributor: str) -> list[str]:
        """The user and project pools on this shard holding records of bot `contributor`
        (committed rows)."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT DISTINCT pool FROM ws_entries WHERE pool NOT LIKE 'bot:%' "
                "AND json_extract_string(meta, '$.contributor') = ?",
                [contributor],
            ).fetchall()
        )
        return [pool for (pool,) in rows]

    async def revision_log(self, pool: str) -> list[tuple[str, int, int, str]]:
        """(entry, revision, time, change) of every revision of the pool's records, oldest
        first; their contents stay sealed."""
        return await self.db.run(
            lambda con: con.execute(
                "SELECT entry, revision, at_ms, change FROM ws_revisions WHERE pool = ? "
                "ORDER BY at_ms, entry, revision",
                [pool],
            ).fetchall()
        )

    async def revisions(self, pool: str, entry_id: str, cipher: Cipher) -> list[Revision]:
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT revision, at_ms, operator, change, body FROM ws_revisions "
                "WHERE pool = ? AND entry = ? ORDER BY revision",
                [pool, entry_id],
            ).fetchall()
        )
        out = []
        for revision, at, operator, change, body in rows:
            sides = _sides_dec.decode(cipher.open(body, _revision_aad(pool, entry_id, revision)))
            out.append(
                Revision(
                    entry=entry_id,
                    revision=revision,
                    operator=operator,
                    at=at,
                    change=change,
                    before=sides.before,
                    after=sides.after,
                )
            )
        return out

    # --- content ---

    @staticmethod
    def seal(cipher: Cipher, pool: str, entry_id: str, content: str) -> bytes:
        return cipher.seal(content.encode(), _content_aad(pool, entry_id))

    @staticmethod
    def open(cipher: Cipher, pool: str, entry_id: str, sealed: bytes) -> str:
        return cipher.open(sealed, _content_aad(pool, entry_id)).decode()

    @staticmethod
    def open_revision(
        cipher: Cipher, pool: str, entry_id: str, revision: int, body: bytes
    ) -> tuple[str | None, str | None]:
        """A stored revision's (before, after) (for storage/file_export.py, which reads rows
        itself)."""
        sides = _sides_dec.decode(cipher.open(body, _revision_aad(pool, entry_id, revision)))
        return sides.before, sides.after

    # --- rows ---

    @staticmethod
    def entry_row(entry: WorkspaceEntry, sealed: bytes, *, new: bool) -> Write:
        row = (
            entry_key(entry.pool, entry.id),
            entry.pool,
            entry.id,
            _enc.encode(entry).decode(),
            sealed,
        )
        return Insert(WORKSPACE_ENTRIES.name, row) if new else Put(WORKSPACE_ENTRIES.name, row)

    @staticmethod
    def revision_row(pool: str, revision: Revision, cipher: Cipher) -> Write:
        body = cipher.seal(
            _enc.encode(_Sides(before=revision.before, after=revision.after)),
            _revision_aad(pool, revision.entry, revision.revision),
        )
        key = f"{pool}\x00{revision.entry}\x00{revision.revision}"
        return Insert(
            WORKSPACE_REVISIONS.name,
            (
                key,
                pool,
                revision.entry,
                revision.revision,
                revision.at,
                revision.operator,
                revision.change,
                body,
            ),
        )

    @staticmethod
    def barrier_row(barrier: ForgetBarrier, revision: int) -> Write:
        """One barrier per change that left one: keyed by the record and the revision it made."""
        key = f"{barrier.pool}\x00{barrier.entry}\x00{revision}"
        doc = _enc.encode(barrier).decode()
        return Insert(WORKSPACE_BARRIERS.name, (key, barrier.pool, barrier.entry, barrier.at, doc))

    @staticmethod
    def project_row(project: Project, cipher: Cipher) -> Write:
        """The project's row; its document (name, metadata, members) sealed with the key of
        its pool `project:<id>`."""
        pool = f"project:{project.id}"
        doc = seal_doc(cipher, pool, PROJECTS.name, project.id, _enc.encode(project))
        return Put(PROJECTS.name, (project.id, project.owner, doc))
