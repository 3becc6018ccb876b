"""`openbot import`: account file trees into a new data directory (or merged into one).

Import parses a tree (storage/tree_files.py, engine/file_tree.py) and writes the directory
records, projects, workspace records (content sealed with fresh per-pool keys, fingerprints
keyed again with this directory's master key), revisions, forget barriers, extraction jobs and
idempotency receipts. Users get new tokens on import, in a new file of that import's own
(`import-tokens-<when>-<random>.json`, 0600): the tree never holds a credential. A running
server imports through storage/tree_merge.py.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import msgspec

from engine import file_tree as ft
from engine.chat_records import LearningJob
from engine.directory import Bot, Channel, Org, User
from engine.errors import InvalidInput
from engine.fingerprints import content_fingerprint
from engine.projects import Project
from engine.scoped_memory import ForgetBarrier, WorkspaceEntry
from storage import chat_export
from storage.crypto import KEY_FILE, Cipher, Keyring, aad, load_master_key
from storage.data_dir_io import DIRECTORY_FILE, RECEIPT_SCOPE, shard_of, write_new_tokens
from storage.data_dir_io import dir_cipher as _dir_cipher
from storage.data_dir_io import existing as _existing
from storage.data_dir_io import insert_all as _insert_all
from storage.data_dir_io import write_shard as _write_shard
from storage.database import Database
from storage.directory_store import KEY_SCOPE as DIR_KEY
from storage.directory_store import MIGRATIONS as DIRECTORY_MIGRATIONS
from storage.directory_store import hash_token, seal_record
from storage.group_commit import DeleteWhere, Insert, Write
from storage.memory_store import MemoryStore, StoredPool, entry_key
from storage.receipts import Receipts, receipt_key
from storage.shard_schema import LEARNING_JOBS, MEMORY_ENTRIES, MEMORY_LOG
from storage.tree_files import read_tree
from storage.workspace_store import WorkspaceStore

_enc = msgspec.json.Encoder()


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
