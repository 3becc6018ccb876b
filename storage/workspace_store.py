"""Workspace rows on a shard's DuckDB file (issue 5): projects, scoped memory records, their
revisions and forget barriers.

Records keep their metadata (`WsEntry`: pool, contributor, tier, topics, evidence markers, keyed
content fingerprint, status, revision) in the clear so that access checks and barriers never
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
from dataclasses import dataclass, field

import msgspec

from engine.projects import Project
from engine.scoped_memory import ForgetBarrier, Revision, WsEntry
from storage.bulk import paused_gc
from storage.crypto import Cipher, Keyring, aad
from storage.database import Database
from storage.group_commit import Insert, Put, Write
from storage.sealed_doc import is_sealed, open_doc, seal_doc
from storage.shard_schema import PROJECTS, WS_BARRIERS, WS_ENTRIES, WS_REVISIONS

_enc = msgspec.json.Encoder()
_entry_dec = msgspec.json.Decoder(WsEntry)
_barrier_dec = msgspec.json.Decoder(ForgetBarrier)
_project_dec = msgspec.json.Decoder(Project)


class _Sides(msgspec.Struct, frozen=True, array_like=True):
    before: str | None
    after: str | None


_sides_dec = msgspec.json.Decoder(_Sides)


@dataclass
class StoredWsPool:
    """One pool's workspace records as loaded: metadata and sealed content, and its barriers."""

    pool: str
    entries: dict[str, WsEntry] = field(default_factory=dict)
    sealed: dict[str, bytes] = field(default_factory=dict)
    barriers: list[ForgetBarrier] = field(default_factory=list)
    # Records whose stored system tags have no `org:` one (stored before migration 7): the
    # only ones a bot pool's load has to link (engine/bot_memory.py `link_tags`).
    unlinked: list[str] = field(default_factory=list)


# `tags` is the last field of a stored record's JSON (msgspec writes fields in their order, and
# a quote inside a string value is escaped), so everything after `"tags":[` is its tags.
assert WsEntry.__struct_fields__[-1] == "tags"
_UNLINKED = """meta NOT LIKE '%"tags":[%"org:%'"""


def entry_key(pool: str, entry_id: str) -> str:
    return f"{pool}\x00{entry_id}"


def _content_aad(pool: str, entry_id: str) -> bytes:
    # "ws" keeps a workspace record's ciphertext from opening as a seed-000 entry of the same
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

    async def load_pool(self, pool: str) -> StoredWsPool:
        def read(con):
            entries = con.execute(
                "SELECT id, meta, content FROM ws_entries WHERE pool = ?", [pool]
            ).fetchall()
            barriers = con.execute(
                "SELECT doc FROM ws_barriers WHERE pool = ? ORDER BY at_ms, key", [pool]
            ).fetchall()
            unlinked = con.execute(
                f"SELECT id FROM ws_entries WHERE pool = ? AND {_UNLINKED}", [pool]
            ).fetchall()
            return entries, barriers, [i for (i,) in unlinked]

        entry_rows, barrier_rows, unlinked = await self.db.run(read)
        stored = StoredWsPool(pool=pool, unlinked=unlinked)
        if entry_rows:
            with paused_gc():  # 100,000 records: see storage/bulk.py
                ids, metas, contents = zip(*entry_rows, strict=True)
                stored.entries = dict(zip(ids, map(_entry_dec.decode, metas), strict=True))
                stored.sealed = dict(zip(ids, contents, strict=True))
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
        a bot's learned entries count too (one memory per bot, engine/bot_memory.py)."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT pool FROM ws_entries WHERE id = ? UNION ALL "
                "SELECT pool FROM memory_entries WHERE id = ? AND pool LIKE 'bot:%' LIMIT 1",
                [entry_id, entry_id],
            ).fetchall()
        )
        return rows[0][0] if rows else None

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
    def entry_row(entry: WsEntry, sealed: bytes, *, new: bool) -> Write:
        row = (
            entry_key(entry.pool, entry.id),
            entry.pool,
            entry.id,
            _enc.encode(entry).decode(),
            sealed,
        )
        return Insert(WS_ENTRIES.name, row) if new else Put(WS_ENTRIES.name, row)

    @staticmethod
    def revision_row(pool: str, revision: Revision, cipher: Cipher) -> Write:
        body = cipher.seal(
            _enc.encode(_Sides(before=revision.before, after=revision.after)),
            _revision_aad(pool, revision.entry, revision.revision),
        )
        key = f"{pool}\x00{revision.entry}\x00{revision.revision}"
        return Insert(
            WS_REVISIONS.name,
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
        return Insert(WS_BARRIERS.name, (key, barrier.pool, barrier.entry, barrier.at, doc))

    @staticmethod
    def project_row(project: Project, cipher: Cipher) -> Write:
        """The project's row; its document (name, metadata, members) sealed with the key of
        its pool `project:<id>` (issue 12)."""
        pool = f"project:{project.id}"
        doc = seal_doc(cipher, pool, PROJECTS.name, project.id, _enc.encode(project))
        return Put(PROJECTS.name, (project.id, project.owner, doc))
