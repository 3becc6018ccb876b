"""`openbot export` / `openbot import` on data directories (FS-1..FS-3, docs/design.md §7).

Export reads a *stopped* server's data directory (or a consistent copy of a running one: see
`Engine.backup`) straight from its DuckDB files, opened read-only, decrypts with the master key
(`OPENBOT_MASTER_KEY` or `master.key` there) and builds each account's `AccountSnapshot`;
engine/file_tree.py renders it. Import parses a tree back and writes a *new* data directory:
the directory records, projects, workspace records (content sealed with fresh per-pool keys,
fingerprints keyed again with this directory's master key), revisions, forget barriers,
extraction jobs and idempotency receipts.

What an account holds: its user record, the bots it owns (their memory pools: workspace records
and memory entries, with learning read positions), its user memory, the projects it owns
(their memory pools), its workspace receipts, and the chats it keeps with their items, turns,
confessions, enrichments, the chains rooted in them and the requests made in them
(storage/chat_export.py). A running server imports through storage/tree_merge.py.
Memory-bot settings stay out; imported pools start with the defaults. The staged learned facts
(`learn_outbox`) stay out too: transient, they reach their user and project pools moments after
the learning step that staged them (a stopped server's, when it starts again), and the export
holds those pools as they are then. Users get new tokens on import, in a new file of that
import's own (`import-tokens-<when>-<random>.json`, 0600): the tree never holds a credential.

Files are written through a recovery log (FS-3): `.transactions/<id>.json` lists what is about
to be written, each file is replaced atomically, then the log goes. A tree whose
`.transactions/` is not empty was interrupted, and import refuses it.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from engine import file_tree as ft
from engine import memory_union as bm
from engine.chat_records import LearningJob
from engine.directory import Bot, Channel, Chat, Org, User
from engine.errors import InvalidInput, NotFound, StorageError
from engine.memory_bot_settings import MemoryBotSettings
from engine.memory_entries import Change, EntryMeta, LogRow, Reader, Who
from engine.projects import Project
from engine.scoped_memory import ForgetBarrier, Revision, WorkspaceEntry, content_fingerprint
from engine.visibility import Visibility
from storage import chat_export
from storage.crypto import KEY_FILE, Cipher, Keyring, aad, load_master_key
from storage.data_dir_io import DIRECTORY_FILE, write_new_tokens
from storage.data_dir_io import dir_cipher as _dir_cipher
from storage.data_dir_io import drain_journal as _drain_journal
from storage.data_dir_io import existing as _existing
from storage.data_dir_io import insert_all as _insert_all
from storage.data_dir_io import master_key as _master_key
from storage.data_dir_io import read_only as _read_only
from storage.data_dir_io import rows as _rows
from storage.data_dir_io import write_shard as _write_shard
from storage.database import Database
from storage.directory_store import KEY_SCOPE as DIR_KEY
from storage.directory_store import MIGRATIONS as DIRECTORY_MIGRATIONS
from storage.directory_store import hash_token, open_record, seal_record
from storage.group_commit import DeleteWhere, Insert, Write
from storage.memory_store import MemoryStore, StoredPool, entry_key
from storage.receipts import Receipts, receipt_key
from storage.sealed_doc import open_doc
from storage.shard_schema import LEARNING_JOBS, MEMORY_ENTRIES, MEMORY_LOG, PROJECTS
from storage.workspace_store import WorkspaceStore

RECEIPT_SCOPE = "ws"  # the workspace's receipts (actors/workspace/service.py RECEIPT_SCOPE)
TRANSACTIONS = ".transactions"
_enc = msgspec.json.Encoder()
_dec: dict[type, msgspec.json.Decoder] = {
    k: msgspec.json.Decoder(k)
    for k in (Org, User, Bot, Channel, Chat, Project, WorkspaceEntry, LearningJob, EntryMeta)
}
_barrier_dec = msgspec.json.Decoder(ForgetBarrier)
_settings_dec = msgspec.json.Decoder(MemoryBotSettings)


def shard_of(key: str, shards: int) -> int:
    """As actors/runtime/placement.py (storage cannot import actors): crc32 mod the shard count."""
    import zlib

    return zlib.crc32(key.encode()) % shards


# --- reading a stopped data directory -------------------------------------------------------------


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


# --- files ----------------------------------------------------------------------------------------


def write_tree(out_dir: Path, files: dict[str, bytes]) -> int:
    """Write the tree into `out_dir` (new or empty), each account through a recovery log."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise InvalidInput(f"{out_dir} is not empty", code="export_exists")
    by_account: dict[str, list[str]] = {}
    for path in files:
        parts = path.split("/")
        if len(parts) < 3 or parts[0] != ft.ROOT or ".." in parts or "" in parts:
            raise InvalidInput(f"{path} is not a tree path", code="invalid_tree")
        by_account.setdefault(parts[1], []).append(path)
    for account, paths in sorted(by_account.items()):
        root = out_dir / ft.ROOT / account
        (root / ".commands").mkdir(parents=True, exist_ok=True)
        (root / TRANSACTIONS).mkdir(exist_ok=True)
        log = root / TRANSACTIONS / f"{secrets.token_hex(8)}.json"
        _atomic(log, _enc.encode({"write": sorted(paths)}), sync=True)
        for path in sorted(paths):
            _atomic(out_dir / path, files[path])
        os.sync()  # every body on disk before the log goes (one sync, not one per file)
        log.unlink()
    return len(files)


def _atomic(path: Path, data: bytes, *, sync: bool = False) -> None:
    """Replace `path` with `data` in one step (a reader sees the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_tree(tree_dir: Path) -> dict[str, bytes]:
    """The files under `tree_dir/bot-workspace`; refuses an interrupted write and symlinks."""
    base = Path(tree_dir) / ft.ROOT
    if not base.is_dir():
        raise NotFound(f"{base} does not exist", code="no_tree")
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        here = Path(dirpath)
        if here.name == TRANSACTIONS and here.parent.parent == base:
            if filenames or dirnames:
                raise InvalidInput(
                    f"{here} is not empty: writing this tree was interrupted; export again",
                    code="interrupted_tree",
                )
            continue
        for name in [*dirnames, *filenames]:
            if (here / name).is_symlink():
                raise InvalidInput(f"{here / name} is a symbolic link", code="invalid_tree")
        for name in filenames:
            rel = (here / name).relative_to(tree_dir).as_posix()
            files[rel] = (here / name).read_bytes()
    return files


# --- writing a new data directory -----------------------------------------------------------------


class ImportResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    accounts: list[str]
    records: int
    projects: int
    files: list[str]
    tokens_file: str | None = None
    skipped_receipts: int = 0
    skipped_entries: int = 0
    skipped_requests: int = 0


def _merge(kind: str, into: dict, items: Iterable) -> None:
    for item in items:
        if into.setdefault(item.id, item) != item and kind != "users":
            raise InvalidInput(f"{kind[:-1]} {item.id} differs between accounts", code="conflict")


def import_snapshots(
    snapshots: Sequence[ft.AccountSnapshot],
    data_dir: Path,
    *,
    shards: int = 2,
    join_orgs: Sequence[str] = (),
) -> ImportResult:
    """Write the snapshots into `data_dir` as `shards` shards (the count `openbot serve
     --shards` will use). A data directory that already holds accounts gets them merged in
    , with its own master key and shard count; any id the tree shares with it (a
     user, bot, channel, project, chat or org) refuses the whole import before anything is
     written, except the orgs named in `join_orgs` (`--join-org`), whose record there is kept.
     The server must be stopped (its files are opened for writing). Shards are written first,
     each in one transaction that first drops what an interrupted import of the same ids left;
     the directory last: importing again after a crash is safe."""
    data_dir = Path(data_dir)
    if shards < 1:
        raise InvalidInput("shards must be at least 1", code="shard_count")
    existing = _existing(data_dir)
    if existing is None and join_orgs:
        raise InvalidInput(
            f"--join-org {', '.join(join_orgs)}: {data_dir} holds no org to join",
            code="join_org",
        )
    if existing is not None:
        shards = existing.shards  # a merge writes where the running engine will look
    orgs: dict[str, Org] = {}
    users: dict[str, User] = {}
    bots: dict[str, Bot] = {}
    channels: dict[str, Channel] = {}
    projects: dict[str, Project] = {}
    _merge("users", users, [s.account for s in snapshots])  # an account's own record first
    for s in snapshots:
        _merge("orgs", orgs, s.orgs)
        _merge("users", users, s.users)
        _merge("channels", channels, s.channels)
        for bot in s.bots:
            if bot.id in bots or bot.owner != s.account.id:
                raise InvalidInput(f"bot {bot.id} twice, or not its owner's", code="conflict")
            bots[bot.id] = bot
        for project in s.projects:
            if project.id in projects or project.owner != s.account.id:
                raise InvalidInput(
                    f"project {project.id} twice, or not its owner's", code="conflict"
                )
            projects[project.id] = project
    chats = chat_export.collect(snapshots)

    if existing is not None:
        accounts = [s.account.id for s in snapshots]
        orgs, users = existing.check(
            accounts, orgs, users, bots, channels, projects, chats, join_orgs
        )

    def host(pool: str) -> str | None:
        kind, _, owner = pool.partition(":")
        if kind == "bot":
            return bots[owner].owner if owner in bots else None
        if kind == "user":
            return owner if owner in users else None
        return projects[owner].owner if owner in projects else None

    data_dir.mkdir(parents=True, exist_ok=True)
    master = load_master_key(data_dir)
    keyring = Keyring(master)
    memory = MemoryStore(None, keyring)  # type: ignore[arg-type]  (row builders only)
    ws = WorkspaceStore(None, master)  # type: ignore[arg-type]
    writes: list[list[Write]] = [[] for _ in range(shards)]
    keys: dict[str, Cipher] = {}

    # The pool's own state comes from its owner's tree; other trees add entries kept for them.
    states = {p.pool: p.seed for s in snapshots for p in s.pools if p.seed and _own(s, p.pool)}

    def key(pool: str) -> Cipher | None:
        if pool not in keys:
            owner = host(pool)
            if owner is None:
                return None
            cipher, wrapped = keyring.new_pool_key(pool)
            stored = StoredPool(pool=pool, cipher=cipher, wrapped_key=wrapped)
            state = states.get(pool) or ft.MemoryBotState()
            row = memory.pool_row(stored, state.version, state.settings)
            writes[shard_of(owner, shards)].append(row)
            keys[pool] = cipher
        return keys[pool]

    records = skipped = skipped_entries = 0
    stale: list[str] = []  # receipt keys
    for project in projects.values():
        cipher = key(f"project:{project.id}")
        assert cipher is not None
        writes[shard_of(project.owner, shards)].append(ws.project_row(project, cipher))
    for s in snapshots:
        for pool in s.pools:
            cipher = key(pool.pool)
            if cipher is None and not _own(s, pool.pool):
                # Entries kept for this account by a bot outside the import (a merge into a
                # directory that has the bot): reported, never mixed into a live pool.
                skipped_entries += len(pool.records)
                continue
            if cipher is None:
                raise InvalidInput(f"{pool.pool} has no owner in the tree", code="invalid_tree")
            owner = host(pool.pool)
            assert owner is not None
            records += len(pool.records)
            writes[shard_of(owner, shards)].extend(_pool_rows(ws, pool, cipher))
        for receipt in s.commands:
            cipher = key(receipt.pool)
            if cipher is None:
                skipped += 1  # its pool is not in this import: nobody could replay it
                continue
            row = Receipts.row(
                receipt_key(RECEIPT_SCOPE, s.account.id, receipt.request_id),
                receipt.fingerprint,
                _enc.encode(receipt.response),
                cipher,
                receipt.pool,
                receipt.at,
            )
            owner = host(receipt.pool)
            assert owner is not None
            writes[shard_of(owner, shards)].append(row)
            stale.append(row.row[0])
    job_shards = {
        j.id: shard_of(owner, shards)
        for s in snapshots
        for p in s.pools
        if (owner := host(p.pool)) is not None
        for j in p.jobs
    }
    skipped_requests = 0
    for account, c in chats.values():  # sealed again at its home shard, with a new key
        home = chat_export.home_of(c.chat, bots, account)
        rows = chat_export.chat_writes(c, keyring, memory, master, job_shards)
        writes[shard_of(home, shards)].extend(rows)
        for r in c.requests:  # on the bot's shard, under its new pool key
            cipher = key(f"bot:{r.request.bot}")
            if cipher is None:  # its bot is not in this import: no key to seal it with
                skipped_requests += 1
                continue
            writes[shard_of(bots[r.request.bot].owner, shards)].append(
                chat_export.request_row(r, cipher)
            )
    deletes = chat_export.stale_rows(keys, chats, [c for _, c in chats.values()])
    deletes.append(DeleteWhere("receipts", "key", tuple(stale)))
    files = [
        _write_shard(data_dir / f"shard-{k}.duckdb", writes[k], deletes, master)
        for k in range(shards)
    ]
    tokens = {u: "obt_" + secrets.token_urlsafe(32) for u in sorted(users)}
    # The tokens file before the directory (the import's commit point): a crash in between
    # leaves tokens nobody holds yet, and importing again writes new ones to a new file.
    tokens_file = write_new_tokens(data_dir, tokens)
    records_by_table = {"orgs": orgs, "users": users, "bots": bots, "channels": channels}
    records_by_table["chats"] = {i: c.chat for i, (_, c) in chats.items()}
    files.append(_write_directory(keyring, data_dir, records_by_table, projects, tokens))
    return ImportResult(
        accounts=[s.account.id for s in snapshots],
        records=records,
        projects=len(projects),
        files=[*files, str(data_dir / KEY_FILE)],
        tokens_file=str(tokens_file),
        skipped_receipts=skipped,
        skipped_entries=skipped_entries,
        skipped_requests=skipped_requests,
    )


def _own(s: ft.AccountSnapshot, pool: str) -> bool:
    """Whether `pool` is the tree's account's own (not another account's bot)."""
    return not pool.startswith("bot:") or any(f"bot:{b.id}" == pool for b in s.bots)


def _pool_rows(ws: WorkspaceStore, pool: ft.PoolSnapshot, cipher: Cipher) -> Iterator[Write]:
    fp_key = ws.fingerprint_key(pool.pool)
    for r in pool.records:
        if r.pool != pool.pool:
            raise InvalidInput(f"record {r.id} is not of {pool.pool}", code="invalid_tree")
        fields = msgspec.structs.asdict(r)
        content = fields.pop("content")
        memory = fields.pop("memory")
        if memory is not None:  # a learned entry of the bot's one memory: back to a memory entry
            if not pool.pool.startswith("bot:"):
                raise InvalidInput(f"entry {r.id} is not of a bot pool", code="invalid_tree")
            sealed = cipher.seal(content.encode(), aad(pool.pool, r.id))
            row = (entry_key(pool.pool, r.id), pool.pool, r.id, _enc.encode(memory).decode())
            yield Insert(MEMORY_ENTRIES.name, (*row, sealed))
            continue
        entry = WorkspaceEntry(**fields, content_fp=content_fingerprint(content, fp_key))
        yield ws.entry_row(entry, ws.seal(cipher, pool.pool, r.id, content), new=True)
    for rev in pool.revisions:
        yield ws.revision_row(pool.pool, rev, cipher)
    for t in pool.tombstones:
        barrier = ForgetBarrier(
            pool=pool.pool,
            fingerprint=t.fingerprint
            if t.content is None
            else content_fingerprint(t.content, fp_key),
            evidence=t.evidence,
            at=t.at,
            entry=t.entry,
            reason=t.reason,
        )
        yield ws.barrier_row(barrier, t.revision)
    for job in pool.jobs:
        stored = LearningJob(**msgspec.structs.asdict(job))
        # The row ChatStore.job_row writes (its builder needs a store instance).
        doc = _enc.encode(stored).decode()
        yield Insert(LEARNING_JOBS.name, (stored.id, stored.pool, stored.chat, doc))
    yield from chat_export.position_writes(pool.pool, pool.positions)
    for row in () if pool.seed is None else pool.seed.log:
        log_key = f"{pool.pool}\x00{row.version}\x00{row.entry}"
        payload = cipher.seal(
            _enc.encode([row.who, row.change]),
            aad(pool.pool, "log\x00" + log_key.split("\x00", 1)[1]),
        )
        ek = entry_key(pool.pool, row.entry)
        yield Insert(
            MEMORY_LOG.name, (log_key, pool.pool, row.version, row.at, ek, row.entry, payload)
        )


def _write_directory(
    keyring: Keyring,
    data_dir: Path,
    records: dict[str, dict[str, msgspec.Struct]],
    projects: dict[str, Project],
    tokens: dict[str, str],
) -> str:
    path = data_dir / DIRECTORY_FILE
    rows: list[tuple[str, tuple]] = []
    known = _dir_cipher(keyring, path) if path.exists() else None
    if known is not None:  # a merge: the directory's records stay under its one key
        cipher = known
    else:
        cipher, wrapped = keyring.new_pool_key(DIR_KEY)
        rows.append(("dir_keys", (DIR_KEY, wrapped)))
    for table, by_id in records.items():
        rows += [
            (table, (i, seal_record(cipher, table, i, _enc.encode(r))))
            for i, r in sorted(by_id.items())
        ]
    rows += [("project_owners", (p.id, p.owner)) for p in projects.values()]
    rows += [("tokens", (hash_token(t), u, 0)) for u, t in tokens.items()]
    db = Database(path, DIRECTORY_MIGRATIONS)
    try:
        _insert_all(db, rows)
    finally:
        db.close()
    return str(path)


def import_tree(
    tree_dir: Path, data_dir: Path, *, shards: int = 2, join_orgs: Sequence[str] = ()
) -> ImportResult:
    """`openbot import`: parse the tree under `tree_dir` and write a new data directory (or
    merge into one, joining only the orgs named in `join_orgs`)."""
    snapshots = ft.parse(read_tree(tree_dir))
    return import_snapshots(snapshots, data_dir, shards=shards, join_orgs=join_orgs)
