"""`openbot export`: a stopped server's data directory as account file trees.

Export reads a *stopped* server's data directory (or a consistent copy of a running one: see
`Engine.backup`) straight from its DuckDB files, opened read-only, decrypts with the master key
(`OPENBOT_MASTER_KEY` or `master.key` there) and builds each account's `AccountSnapshot`;
engine/file_tree.py renders it (the layout: docs/design.md §7), storage/tree_files.py writes it,
and storage/file_import.py reads it back into a data directory.

What an account holds: its user record, the bots it owns (their memory pools: workspace records
and memory entries, with learning read positions), its user memory, the projects it owns
(their memory pools), its workspace receipts, and the chats it keeps with their items, turns,
confessions, enrichments, the chains rooted in them and the requests made in them
(storage/chat_export.py). Memory-bot settings stay out; imported pools start with the
defaults. The staged learned facts (`learn_outbox`) stay out too: transient, they reach their
user and project pools moments after the learning step that staged them (a stopped server's,
when it starts again), and the export holds those pools as they are then.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from engine import file_tree as ft
from engine import memory_union as bm
from engine.chat_records import LearningJob
from engine.directory import Bot, Channel, Chat, Org, User
from engine.errors import NotFound, StorageError
from engine.memory_bot_settings import MemoryBotSettings
from engine.memory_entries import Change, EntryMeta, LogRow, Reader, Who
from engine.projects import Project
from engine.scoped_memory import ForgetBarrier, Revision, WorkspaceEntry
from engine.visibility import Visibility
from storage import chat_export
from storage.crypto import Cipher, Keyring, aad
from storage.data_dir_io import DIRECTORY_FILE, RECEIPT_SCOPE, shard_of
from storage.data_dir_io import drain_journal as _drain_journal
from storage.data_dir_io import master_key as _master_key
from storage.data_dir_io import read_only as _read_only
from storage.data_dir_io import rows as _rows
from storage.directory_store import KEY_SCOPE as DIR_KEY
from storage.directory_store import open_record
from storage.sealed_doc import open_doc
from storage.shard_schema import PROJECTS
from storage.workspace_store import WorkspaceStore

_enc = msgspec.json.Encoder()
_dec: dict[type, msgspec.json.Decoder] = {
    k: msgspec.json.Decoder(k)
    for k in (Org, User, Bot, Channel, Chat, Project, WorkspaceEntry, LearningJob, EntryMeta)
}
_barrier_dec = msgspec.json.Decoder(ForgetBarrier)
_settings_dec = msgspec.json.Decoder(MemoryBotSettings)


@dataclass
class _ShardRows:
    index: int
    keys: dict[str, Cipher] = field(default_factory=dict)
    entries: dict[str, list[tuple[WorkspaceEntry, bytes]]] = field(default_factory=dict)
    # bot pools' learned and pinned entries
    memory_entries: dict[str, list[tuple[EntryMeta, bytes]]] = field(default_factory=dict)
    revisions: dict[str, list[tuple]] = field(default_factory=dict)
    barriers: dict[str, list[tuple[int, ForgetBarrier]]] = field(default_factory=dict)
    jobs: dict[str, list[LearningJob]] = field(default_factory=dict)
    # account -> (request id, fingerprint, sealed answer, time, receipt key)
    receipts: dict[str, list[tuple[str, str, bytes, int, str]]] = field(default_factory=dict)
    chats: chat_export.ChatShardRows = field(default_factory=chat_export.ChatShardRows)
    heads: dict[str, tuple[int, bytes | None]] = field(default_factory=dict)  # bot pools' rows
    logs: dict[str, list[tuple]] = field(default_factory=dict)  # entry change logs


class DataDirReader:
    """Everything an export needs from a data directory, read once (read-only)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        directory = self.data_dir / DIRECTORY_FILE
        if not directory.exists():
            raise NotFound(f"{directory} does not exist", code="no_data_dir")
        self.keyring = Keyring(_master_key(self.data_dir))
        with _read_only(directory) as con:
            wrapped = _rows(con, "SELECT wrapped FROM dir_keys WHERE scope = ?", [DIR_KEY])
            dir_cipher = self.keyring.unwrap_pool_key(DIR_KEY, wrapped[0][0]) if wrapped else None

            def table(name: str, kind: type) -> dict:
                rows = _rows(con, f"SELECT id, doc FROM {name}")
                return {
                    i: _dec[kind].decode(open_record(dir_cipher, name, i, doc))
                    for i, doc in sorted(rows)
                }

            self.orgs: dict[str, Org] = table("orgs", Org)
            self.users: dict[str, User] = table("users", User)
            self.bots: dict[str, Bot] = table("bots", Bot)
            self.channels: dict[str, Channel] = table("channels", Channel)
            self.chats: dict[str, Chat] = table("chats", Chat)
        paths = sorted(
            (int(p.stem.removeprefix("shard-")), p)
            for p in self.data_dir.glob("shard-*.duckdb")
            if p.stem.removeprefix("shard-").isdigit()
        )
        self.projects: dict[str, Project] = {}
        self._keepers: dict[str, dict[str, list[ft.MemoryRecord]]] | None = None
        self.shards = [self._read_shard(k, p) for k, p in paths]

    def _read_shard(self, index: int, path: Path) -> _ShardRows:
        out = _ShardRows(index)
        _drain_journal(path)  # writes a crash left in the commit journal, into the tables
        with _read_only(path) as con:
            for pool, wrapped in _rows(con, "SELECT pool, wrapped_key FROM pools"):
                out.keys[pool] = self.keyring.unwrap_pool_key(pool, wrapped)
            for pool, meta, content in _rows(con, "SELECT pool, meta, content FROM ws_entries"):
                out.entries.setdefault(pool, []).append(
                    (_dec[WorkspaceEntry].decode(meta), content)
                )
            for pool, meta, content in _rows(
                con, "SELECT pool, meta, content FROM memory_entries WHERE pool LIKE 'bot:%'"
            ):
                out.memory_entries.setdefault(pool, []).append(
                    (_dec[EntryMeta].decode(meta), content)
                )
            for row in _rows(
                con,
                "SELECT pool, entry, revision, at_ms, operator, change, body FROM ws_revisions",
            ):
                out.revisions.setdefault(row[0], []).append(row[1:])
            for key, pool, doc in _rows(con, "SELECT key, pool, doc FROM ws_barriers"):
                revision = int(key.rsplit("\x00", 1)[1])
                out.barriers.setdefault(pool, []).append((revision, _barrier_dec.decode(doc)))
            for (doc,) in _rows(con, "SELECT doc FROM learning_jobs"):
                job = _dec[LearningJob].decode(doc)
                out.jobs.setdefault(job.pool, []).append(job)
            for pid, doc in _rows(con, "SELECT id, doc FROM projects"):
                pool = f"project:{pid}"
                raw = open_doc(out.keys.get(pool), pool, PROJECTS.name, pid, doc)
                project = _dec[Project].decode(raw)
                self.projects[project.id] = project
            for key, print_, sealed, at in _rows(
                con,
                "SELECT key, fingerprint, response, at_ms FROM receipts WHERE scope = ?",
                [RECEIPT_SCOPE],
            ):
                _, account, request_id = key.split("\x00", 2)
                out.receipts.setdefault(account, []).append((request_id, print_, sealed, at, key))
            out.chats = chat_export.read_shard(lambda sql: _rows(con, sql))
            bot = "WHERE pool LIKE 'bot:%'"
            for pool, version, settings in _rows(
                con, f"SELECT pool, version, settings FROM pools {bot}"
            ):
                out.heads[pool] = (version, settings)
            for pool, *row in _rows(
                con, f"SELECT pool, version, at_ms, entry, payload FROM memory_log {bot}"
            ):
                out.logs.setdefault(pool, []).append(tuple(row))
        return out

    def accounts(self) -> list[str]:
        """Users with something in a tree: bots, projects, user memory or workspace receipts."""
        found = {b.owner for b in self.bots.values()}
        found |= {p.owner for p in self.projects.values()}
        for shard in self.shards:
            for pool in (*shard.entries, *shard.barriers):
                if pool.startswith("user:"):
                    found.add(pool.removeprefix("user:"))
            found |= set(shard.receipts)
        found |= {self._keeper(c) for c in self.chats.values()}
        self._kept_for("")
        found |= set(self._keepers or ())
        return sorted(u for u in found if u in self.users)

    def snapshot(self, account: str) -> ft.AccountSnapshot:
        user = self.users.get(account)
        if user is None:
            raise NotFound(f"no user {account!r} in {self.data_dir}", code="user_not_found")
        bots = [b for b in self.bots.values() if b.owner == account]
        bot_ids = {b.id for b in bots}
        projects = [p for p in self.projects.values() if p.owner == account]
        chats = [c for c in self.chats.values() if self._keeper(c) == account]
        linked = {c for p in projects for c in p.channels} | {c.channel for c in chats}
        channels = [
            c
            for c in self.channels.values()
            if account in c.people or bot_ids.intersection(c.bots) or c.id in linked
        ]
        named = {u for p in projects for u in p.members} | {c.owner for c in chats}
        named |= {u for c in channels for u in c.people}
        named |= {u for b in bots for u in b.grants}
        users = [self.users[u] for u in sorted(named - {account}) if u in self.users]
        org_ids = {*user.orgs, *(b.org for b in bots), *(c.org for c in channels)}
        org_ids |= {p.org for p in projects} | {o for u in users for o in u.orgs}
        org_ids |= {o for b in bots for o in b.sharedOrgs}  # where its memory was written
        pools = [f"bot:{b}" for b in sorted(bot_ids)] + [f"user:{account}"]
        pools += [f"project:{p.id}" for p in projects]
        kept = self._kept_for(account)
        return ft.canonical(
            ft.AccountSnapshot(
                account=user,
                orgs=tuple(self.orgs[o] for o in sorted(org_ids) if o in self.orgs),
                users=tuple(users),
                bots=tuple(bots),
                channels=tuple(channels),
                projects=tuple(projects),
                bot_projects={b: self._bot_projects(b) for b in bot_ids},
                pools=(*(self._pool(p, account) for p in pools), *kept),
                commands=tuple(self._commands(account)),
                chats=tuple(self._chat(c) for c in chats),
            )
        )

    def _keeper(self, chat: Chat) -> str:
        return chat_export.keeper(chat)

    def _chat(self, chat: Chat) -> ft.ChatSnapshot:
        home = shard_of(chat_export.home_of(chat, self.bots, chat.owner), len(self.shards))
        shard = next((s for s in self.shards if s.index == home), _ShardRows(home))
        snap = chat_export.snapshot(chat, shard.chats, shard.keys.get(f"chat:{chat.id}"))
        extra = chat_export.records(chat, [(s.chats, s.keys) for s in self.shards])
        return msgspec.structs.replace(snap, **extra)

    def _bot_projects(self, bot: str) -> tuple[ft.BotProject, ...]:
        out = []
        for p in self.projects.values():
            via = tuple(
                c for c in p.channels if c in self.channels and bot in self.channels[c].bots
            )
            if via:
                out.append(ft.BotProject(id=p.id, name=p.name, owner=p.owner, channels=via))
        return tuple(out)

    def _bot_memory(
        self,
        pool: str,
        account: str,
        records: list[WorkspaceEntry],
        memory_entries: list[tuple[EntryMeta, bytes]],
    ) -> tuple[list[WorkspaceEntry], list[tuple[EntryMeta, bytes]]]:
        """A bot pool's one memory as the account (its owner) sees it in the bot's org
        (engine/memory_union.py): records linked to the bot's org, learned entries under their
        own rule. What is for other people stays out of the owner's tree."""
        bot = self.bots.get(pool.removeprefix("bot:"))
        org = bot.org if bot is not None else None
        linked = [
            msgspec.structs.replace(
                r, tags=bm.link_tags(r.tags or (f"from:{account}", "for:bot"), org)
            )
            for r in records
        ]
        metas = {m.id: m for m, _ in memory_entries}
        metas.update((r.id, bm.as_meta(r)) for r in linked)
        channels = frozenset(c.id for c in self.channels.values() if account in c.people)
        reader = Reader(user=account, org=org or "", channels=channels, uses_bot=True)
        vis = Visibility(reader, metas)
        return (
            [r for r in linked if vis.visible(r.id)],
            [(m, sealed) for m, sealed in memory_entries if vis.visible(m.id)],
        )

    def _pool(self, pool: str, account: str) -> ft.PoolSnapshot:
        records, revisions, tombstones, jobs = [], [], [], []
        for shard in self.shards:
            cipher = shard.keys.get(pool)
            rows = shard.entries.get(pool, [])
            revs = shard.revisions.get(pool, [])
            memory_entries = shard.memory_entries.get(pool, [])
            if (rows or revs or memory_entries) and cipher is None:
                raise StorageError(f"{pool} has records on shard {shard.index} but no key")
            if pool.startswith("bot:"):
                kept, memory_entries = self._bot_memory(
                    pool, account, [e for e, _ in rows], memory_entries
                )
                sealed_of = {e.id: s for e, s in rows}
                rows = [(e, sealed_of[e.id]) for e in kept]
            for entry, sealed in rows:
                content = WorkspaceStore.open(cipher, pool, entry.id, sealed)
                fields = msgspec.structs.asdict(entry)
                del fields["content_fp"]
                records.append(ft.MemoryRecord(**fields, content=content))
            records += [
                _entry_record(pool, meta, sealed, cipher) for meta, sealed in memory_entries
            ]
            for entry_id, revision, at, operator, change, body in revs:
                before, after = WorkspaceStore.open_revision(cipher, pool, entry_id, revision, body)
                revisions.append(
                    Revision(
                        entry=entry_id,
                        revision=revision,
                        operator=operator,
                        at=at,
                        change=change,
                        before=before,
                        after=after,
                    )
                )
            for job in shard.jobs.get(pool, []):
                # The tree keeps the job's lasting fields; run-time ones (a budget wake-up time,
                # listing-only attempt records) are rebuilt by the server that imports it.
                fields = msgspec.structs.asdict(job)
                kept = {k: v for k, v in fields.items() if k in ft.MemoryJob.__struct_fields__}
                jobs.append(ft.MemoryJob(**kept))
        befores = {(r.entry, r.revision): r.before for r in revisions}
        for shard in self.shards:
            for revision, b in shard.barriers.get(pool, []):
                old = befores.get((b.entry, revision))
                tombstones.append(
                    ft.Tombstone(
                        entry=b.entry,
                        revision=revision,
                        reason=b.reason,
                        at=b.at,
                        evidence=b.evidence,
                        content=old,
                        fingerprint=b.fingerprint if old is None else "",
                    )
                )
        return ft.PoolSnapshot(
            pool=pool,
            records=tuple(records),
            revisions=tuple(revisions),
            tombstones=tuple(tombstones),
            jobs=tuple(jobs),
            positions=tuple(p for s in self.shards for p in s.chats.positions.get(pool, ())),
            seed=self._memory_bot_state(pool, {r.id for r in records if r.memory is not None}),
        )

    def _kept_for(self, account: str) -> list[ft.PoolSnapshot]:
        """Learned entries of other accounts' bots that their owners may not see, for the tree
        of the person they are for (`ft.entry_keeper`): nothing is left out of every tree."""
        if self._keepers is None:
            self._keepers = {}
            people = {c.id: c.people for c in self.channels.values()}
            for bot in self.bots.values():
                pool = f"bot:{bot.id}"
                for shard in self.shards:
                    memory_entries = shard.memory_entries.get(pool, [])
                    ws = [e for e, _ in shard.entries.get(pool, [])]
                    seen = {
                        m.id for m, _ in self._bot_memory(pool, bot.owner, ws, memory_entries)[1]
                    }
                    for meta, sealed in memory_entries:
                        keeper = ft.entry_keeper(meta.tags, people)
                        if meta.id not in seen and keeper not in (None, bot.owner):
                            mine = self._keepers.setdefault(keeper, {}).setdefault(pool, [])
                            mine.append(_entry_record(pool, meta, sealed, shard.keys[pool]))
        return [
            ft.PoolSnapshot(
                pool=pool,
                records=tuple(records),
                seed=self._memory_bot_state(pool, {r.id for r in records}, log_only=True),
            )
            for pool, records in sorted(self._keepers.get(account, {}).items())
        ]

    def _memory_bot_state(
        self, pool: str, kept: set[str], log_only: bool = False
    ) -> ft.MemoryBotState | None:
        """A bot pool's version, memory-bot settings and the log rows of the entries
        in the tree (the others are other people's); only the log rows with `log_only`."""
        for shard in self.shards:
            if pool not in shard.heads:
                continue
            cipher = shard.keys[pool]
            version, blob = shard.heads[pool]
            settings = MemoryBotSettings()
            if blob is not None:
                settings = _settings_dec.decode(cipher.open(blob, aad(pool, "settings")))
            log = []
            for v, at, entry, payload in shard.logs.get(pool, []):
                version = max(version, v)  # as MemoryStore.load
                if entry in kept:
                    raw = cipher.open(payload, aad(pool, f"log\x00{v}\x00{entry}"))
                    who, change = msgspec.json.decode(raw)
                    log.append(
                        LogRow(version=v, at=at, who=Who(who), entry=entry, change=Change(change))
                    )
            if log_only:
                return ft.MemoryBotState(log=tuple(log))
            return ft.MemoryBotState(version=version, settings=settings, log=tuple(log))
        return None

    def _commands(self, account: str) -> Iterator[ft.CommandReceipt]:
        """The account's workspace receipts. A receipt does not name the pool whose key sealed
        it, so each is opened with the keys of the pools the account may write on its shard
        first, then (a project it has left since) with the shard's other keys."""
        mine = [f"bot:{b.id}" for b in self.bots.values() if b.owner == account]
        mine += [f"bot:{b.id}" for b in self.bots.values() if account in b.grants]
        mine.append(f"user:{account}")
        mine += [f"project:{p.id}" for p in self.projects.values() if account in p.members]
        for shard in self.shards:
            rows = shard.receipts.get(account, [])
            if not rows:
                continue
            first = [p for p in mine if p in shard.keys]
            candidates = [*first, *sorted(set(shard.keys) - set(first))]
            for request_id, print_, sealed, at, key in rows:
                for pool in candidates:
                    try:
                        answer = shard.keys[pool].open(sealed, aad(pool, "receipt\x00" + key))
                    except StorageError:
                        continue
                    yield ft.CommandReceipt(
                        request_id=request_id,
                        pool=pool,
                        fingerprint=print_,
                        at=at,
                        response=msgspec.json.decode(answer),
                    )
                    break


def _entry_record(pool: str, meta: EntryMeta, sealed: bytes, cipher: Cipher) -> ft.MemoryRecord:
    """A learned entry of a bot's memory as a record of the tree."""
    content = cipher.open(sealed, aad(pool, meta.id)).decode()
    view = bm.as_record_view(meta, content, pool.removeprefix("bot:"))
    return ft.MemoryRecord(
        id=meta.id,
        scope=view.scope,
        pool=pool,
        contributor=view.contributor,
        tier=view.tier,
        content=content,
        created_at=meta.created_at,
        updated_at=meta.updated_at,
        topics=view.topics,
        evidence=view.evidence,
        protected=view.protected,
        status=view.status,
        origin=view.origin,
        revision=meta.revision,
        memory=meta,
    )


def render_data_dir(data_dir: Path, account: str | None = None) -> dict[str, bytes]:
    """The account file tree of one account, or of every account, of a stopped data directory."""
    reader = DataDirReader(Path(data_dir))
    files: dict[str, bytes] = {}
    for a in [account] if account else reader.accounts():
        files.update(ft.render(reader.snapshot(a)))
    return files
