"""Files → snapshots, checking that every file fits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from engine import tags as tagmod
from engine.casing import fit
from engine.directory import Channel
from engine.errors import InvalidInput
from engine.file_tree._chats import parse_chat
from engine.file_tree._docs import (
    AccountDoc,
    BotProjectsDoc,
    GroupsDoc,
    MarkerDoc,
    MemoryBotDoc,
    PositionsDoc,
    ProjectMeta,
    RecordDoc,
    RecordsDoc,
    RevisionsDoc,
    SourcesDoc,
    TombstoneDoc,
)
from engine.file_tree._model import (
    FORMAT,
    IGNORED,
    LINE,
    OTHER_AGENTS,
    ROOT,
    AccountSnapshot,
    BotProject,
    CommandReceipt,
    MemoryJob,
    MemoryRecord,
    PoolSnapshot,
    Tombstone,
    canonical,
    command_file,
    day,
    segment,
    unescape,
)
from engine.memory_entries import EntryMeta
from engine.projects import Project
from engine.scoped_memory import Origin, Revision


def _bad(path: str, why: str) -> InvalidInput:
    return InvalidInput(f"{path}: {why}", code="invalid_tree")


def _decode(path: str, data: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.convert(fit(msgspec.json.decode(data), kind), kind)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise _bad(path, str(e)) from e


def parse(files: Mapping[str, bytes]) -> list[AccountSnapshot]:
    """The snapshots of every account under `bot-workspace/` (paths as `render` makes them);
    InvalidInput `invalid_tree` naming the file when something does not fit."""
    accounts: dict[str, dict[str, bytes]] = {}
    for path, data in files.items():
        parts = path.split("/")
        if parts[-1] in IGNORED:
            continue
        if len(parts) < 3 or parts[0] != ROOT:
            raise _bad(path, f"not under {ROOT}/<accountId>/")
        accounts.setdefault(segment(parts[1], "account id"), {})["/".join(parts[2:])] = data
    return [_parse_account(a, accounts[a]) for a in sorted(accounts)]


def _parse_account(account: str, files: dict[str, bytes]) -> AccountSnapshot:
    where = f"{ROOT}/{account}"
    seen: set[str] = set()

    def take(path: str) -> bytes:
        if path not in files:
            raise _bad(f"{where}/{path}", "missing")
        seen.add(path)
        return files[path]

    doc: AccountDoc = _decode(f"{where}/account.json", take("account.json"), AccountDoc)
    if doc.format != FORMAT:
        raise _bad(f"{where}/account.json", f"format {doc.format!r} is not {FORMAT!r}")
    if doc.account.id != account:
        raise _bad(f"{where}/account.json", f"names account {doc.account.id!r}")
    channels: dict[str, Channel] = {c.id: c for c in doc.channels}
    bot_projects: dict[str, tuple[BotProject, ...]] = {}
    for bot in doc.bots:
        path = f"agents/{segment(bot.id, 'bot id')}/projects.json"
        bp: BotProjectsDoc = _decode(f"{where}/{path}", take(path), BotProjectsDoc)
        bot_projects[bot.id] = bp.projects
    projects = []
    for path in sorted(p for p in files if p.startswith("projects/") and p.count("/") == 2):
        if not path.endswith("/project.md"):
            continue
        pid = path.split("/")[1]
        project = _parse_project_md(f"{where}/{path}", take(path))
        gpath = f"projects/{pid}/groups.json"
        groups: GroupsDoc = _decode(f"{where}/{gpath}", take(gpath), GroupsDoc)
        if project.id != pid or groups.project != pid:
            raise _bad(f"{where}/projects/{pid}", "the files name another project")
        for g in groups.groups:
            if "org" not in g:
                continue
            try:
                channel = msgspec.convert(fit(g, Channel), Channel)
            except msgspec.ValidationError as e:
                raise _bad(f"{where}/{gpath}", str(e)) from e
            if channels.setdefault(channel.id, channel) != channel:
                raise _bad(f"{where}/{gpath}", f"channel {channel.id} differs from elsewhere")
        ids = tuple(str(g.get("id", "")) for g in groups.groups)
        projects.append(msgspec.structs.replace(project, channels=ids))
    pools = []
    roots = [(f"bot:{b.id}", f"agents/{b.id}/memory") for b in doc.bots]
    others = {p.split("/")[1] for p in files if p.startswith(f"{OTHER_AGENTS}/") and "/" in p[13:]}
    if others & {b.id for b in doc.bots}:
        raise _bad(f"{where}/{OTHER_AGENTS}", "names a bot of this account")
    roots += [(f"bot:{b}", f"{OTHER_AGENTS}/{segment(b, 'bot id')}/memory") for b in sorted(others)]
    roots.append((f"user:{account}", "user-memory"))
    roots += [(f"project:{p.id}", f"projects/{p.id}/memory") for p in projects]
    for pool_id, root in roots:
        mine = {p[len(root) + 1 :]: d for p, d in files.items() if p.startswith(root + "/")}
        if not mine:
            continue
        pools.append(_parse_pool(f"{where}/{root}", pool_id, mine))
        seen.update(f"{root}/{p}" for p in mine)
    commands = []
    for path in sorted(p for p in files if p.startswith(".commands/")):
        receipt = _decode(f"{where}/{path}", take(path), CommandReceipt)
        if command_file(receipt) != path:
            raise _bad(f"{where}/{path}", "the receipt belongs under another name")
        commands.append(receipt)
    chats = []
    by_chat: dict[str, dict[str, bytes]] = {}
    for path in files:
        parts = path.split("/")
        if parts[0] == "chats" and len(parts) == 3:
            by_chat.setdefault(segment(parts[1], "chat id"), {})[parts[2]] = files[path]
            seen.add(path)
    for chat_id, mine in sorted(by_chat.items()):
        chat, channel = parse_chat(f"{where}/chats/{chat_id}", chat_id, mine, _decode, _bad)
        if channel is not None and channels.setdefault(channel.id, channel) != channel:
            raise _bad(f"{where}/chats/{chat_id}", f"channel {channel.id} differs from elsewhere")
        chats.append(chat)
    extra = sorted(set(files) - seen)
    if extra:
        raise _bad(where, f"unexpected files: {', '.join(extra[:5])}")
    return canonical(
        AccountSnapshot(
            account=doc.account,
            orgs=doc.orgs,
            users=doc.users,
            bots=doc.bots,
            channels=tuple(channels.values()),
            projects=tuple(projects),
            bot_projects=bot_projects,
            pools=tuple(pools),
            commands=tuple(commands),
            chats=tuple(chats),
        )
    )


def _parse_project_md(path: str, data: bytes) -> Project:
    lines = data.decode().split("\n")
    if not lines or lines[0] != "---" or "---" not in lines[1:]:
        raise _bad(path, "no front matter (--- … ---)")
    end = lines.index("---", 1)
    meta: dict[str, Any] = {}
    for line in lines[1:end]:
        key, sep, value = line.partition(": ")
        if not sep:
            raise _bad(path, f"front matter line {line!r} is not `key: value`")
        try:
            meta[key] = msgspec.json.decode(value)
        except msgspec.DecodeError as e:
            raise _bad(path, f"{key}: {e}") from e
    try:
        m = msgspec.convert(fit(meta, ProjectMeta), ProjectMeta)
    except msgspec.ValidationError as e:
        raise _bad(path, str(e)) from e
    return Project(
        id=m.id,
        org=m.org,
        owner=m.owner,
        name=m.name,
        metadata=m.metadata,
        members=m.members,
        revision=m.revision,
        created_at=m.created_at,
        updated_at=m.updated_at,
    )


def _parse_lines(path: str, data: bytes) -> list[tuple[str, str]]:
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise _bad(path, "not UTF-8") from e
    rows = []
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip() or line.startswith("#"):
            continue
        m = LINE.match(line)
        if m is None:
            raise _bad(path, f"line {n} is not `- (YYYY-MM-DD) content`")
        rows.append((m.group(1), unescape(m.group(2) or "")))
    return rows


def _system_tags(where: str, tags: tuple[str, ...]) -> tuple[str, ...]:
    for tag in tags:
        if tagmod.system_kind(tag) is None:
            raise _bad(where, f"{tag!r} is not a system tag")
    return tags


def _memory(where: str, pool_id: str, r: RecordDoc) -> EntryMeta | None:
    """A learned entry's metadata must be of this record and pool, its tags well formed."""
    m = r.memory
    if m is None:
        return None
    if m.id != r.id or m.pool != pool_id:
        raise _bad(where, f"the entry of {r.id} is of another record or pool")
    for tag in m.tags:
        if tagmod.is_system(tag) and tagmod.system_kind(tag) is None:
            raise _bad(where, f"{tag!r} of {r.id} is not a system tag")
    return m


def _parse_pool(where: str, pool_id: str, files: dict[str, bytes]) -> PoolSnapshot:
    seen: set[str] = set()

    def take(path: str) -> bytes:
        if path not in files:
            raise _bad(f"{where}/{path}", "missing")
        seen.add(path)
        return files[path]

    doc: RecordsDoc = _decode(
        f"{where}/.dreaming/records.json", take(".dreaming/records.json"), RecordsDoc
    )
    if doc.pool != pool_id:
        raise _bad(f"{where}/.dreaming/records.json", f"is for {doc.pool}, not {pool_id}")
    tombs: dict[tuple[str, int], Tombstone] = {}
    for path in sorted(p for p in files if p.startswith(".dreaming/tombstones/")):
        t: TombstoneDoc = _decode(f"{where}/{path}", take(path), TombstoneDoc)
        if path != f".dreaming/tombstones/{t.entry}.{t.revision}.json":
            raise _bad(f"{where}/{path}", "the tombstone belongs under another name")
        tombs[(t.entry, t.revision)] = Tombstone(
            entry=t.entry,
            revision=t.revision,
            reason=t.reason,
            at=t.at,
            content=t.content,
            fingerprint=t.fingerprint if t.content is None else "",
        )
    spath = ".dreaming/forgotten-sources.json"
    sources: SourcesDoc = _decode(f"{where}/{spath}", take(spath), SourcesDoc)
    for row in sources.sources:
        key = (row.entry, row.revision)
        if key not in tombs:
            raise _bad(f"{where}/{spath}", f"no tombstone {row.entry}.{row.revision}")
        tombs[key] = msgspec.structs.replace(tombs[key], evidence=row.evidence)
    by_file: dict[str, list[RecordDoc]] = {}
    for r in doc.records:
        if r.file is not None:
            by_file.setdefault(r.file, []).append(r)
    texts: dict[str, str] = {}
    for file, rows in by_file.items():
        rows.sort(key=lambda r: (r.updated_at, r.id))
        lines = _parse_lines(f"{where}/{file}", take(file))
        if len(lines) != len(rows):
            raise _bad(f"{where}/{file}", f"{len(lines)} lines for {len(rows)} records")
        for (date, text), r in zip(lines, rows, strict=True):
            if date != day(r.updated_at):
                raise _bad(f"{where}/{file}", f"the line of {r.id} is not dated {date}")
            texts[r.id] = text
    records = []
    for r in doc.records:
        origin = None
        for o in Origin:
            marker = f".dreaming/{o.value}/{r.id}.json"
            if marker in files:
                _decode(f"{where}/{marker}", take(marker), MarkerDoc)
                origin = o
        if origin is None:
            raise _bad(f"{where}/.dreaming", f"no explicit/ or synthesized/ marker for {r.id}")
        if r.id in texts:
            content = texts[r.id]
        elif r.content is not None:
            content = r.content
        else:
            tomb = tombs.get((r.id, r.version))
            if tomb is None or tomb.content is None:
                raise _bad(f"{where}/.dreaming/records.json", f"no content for {r.id}")
            content = tomb.content
        records.append(
            MemoryRecord(
                id=r.id,
                scope=r.scope,
                pool=pool_id,
                contributor=r.contributor,
                tier=r.category,
                content=content,
                created_at=r.created_at,
                updated_at=r.updated_at,
                topics=r.topics,
                evidence=r.source,
                protected=r.protected,
                review=r.review,
                status=r.status,
                origin=origin,
                revision=r.version,
                tags=_system_tags(f"{where}/.dreaming/records.json", r.tags),
                memory=_memory(f"{where}/.dreaming/records.json", pool_id, r),
                thread=r.thread or "",
                position=r.position or 0,
            )
        )
    revisions: list[Revision] = []
    for path in sorted(p for p in files if p.startswith(".dreaming/revisions/")):
        rd: RevisionsDoc = _decode(f"{where}/{path}", take(path), RevisionsDoc)
        if path != f".dreaming/revisions/{rd.entry}.json" or any(
            r.entry != rd.entry for r in rd.revisions
        ):
            raise _bad(f"{where}/{path}", "revisions of another record")
        revisions += rd.revisions
    jobs = []
    for path in sorted(p for p in files if p.startswith(".dreaming/jobs/")):
        job: MemoryJob = _decode(f"{where}/{path}", take(path), MemoryJob)
        if path != f".dreaming/jobs/{job.id}.json" or job.pool != pool_id:
            raise _bad(f"{where}/{path}", "a job of another name or pool")
        jobs.append(job)
    positions: PositionsDoc | None = None
    ppath = ".dreaming/read-positions.json"
    if ppath in files:
        positions = _decode(f"{where}/{ppath}", take(ppath), PositionsDoc)
        if positions.pool != pool_id:
            raise _bad(f"{where}/{ppath}", f"is for {positions.pool}, not {pool_id}")
    seed: MemoryBotDoc | None = None
    spath = ".dreaming/memory-bot.json"
    if spath in files:
        seed = _decode(f"{where}/{spath}", take(spath), MemoryBotDoc)
        if seed.pool != pool_id or not pool_id.startswith("bot:"):
            raise _bad(f"{where}/{spath}", f"is for {seed.pool}, not {pool_id}")
    take(".dreaming/next-refresh-at")  # derived from the jobs
    extra = sorted(set(files) - seen)
    if extra:
        raise _bad(where, f"unexpected files: {', '.join(extra[:5])}")
    return PoolSnapshot(
        pool=pool_id,
        records=tuple(records),
        revisions=tuple(revisions),
        tombstones=tuple(tombs.values()),
        jobs=tuple(jobs),
        positions=() if positions is None else positions.positions,
        seed=None if seed is None else seed.seed,
    )
