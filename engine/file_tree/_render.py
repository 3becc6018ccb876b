"""Snapshot → files."""

from __future__ import annotations

import msgspec

from engine.casing import camel, camel_keys
from engine.errors import InvalidInput
from engine.file_tree._chats import chat_root, render_chat
from engine.file_tree._docs import (
    ENC,
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
    SourcesRow,
    TombstoneDoc,
    to_json,
    to_text,
)
from engine.file_tree._model import (
    FORMAT,
    OPEN_JOBS,
    ROOT,
    AccountSnapshot,
    MemoryRecord,
    PoolSnapshot,
    canonical,
    command_file,
    iso,
    memory_line,
    memory_root,
    record_file,
    segment,
)
from engine.fingerprints import content_fingerprint
from engine.memory_bot_settings import MemoryBotSettings
from engine.projects import Project
from engine.scoped_memory import Revision, WorkspaceStatus


def render(snapshot: AccountSnapshot) -> dict[str, bytes]:
    """The account's files, by path relative to the export directory (`bot-workspace/…`)."""
    s = canonical(snapshot)
    base = f"{ROOT}/{segment(s.account.id, 'account id')}"
    files: dict[str, bytes] = {}

    def put(path: str, data: bytes) -> None:
        path = f"{base}/{path}"
        if path in files:
            raise InvalidInput(f"two things want {path}", code="invalid_tree")
        files[path] = data

    project_ids = {p.id for p in s.projects}
    linked = {c for p in s.projects for c in p.channels}
    channels = {c.id: c for c in s.channels}
    put(
        "account.json",
        to_json(
            AccountDoc(
                format=FORMAT,
                account=s.account,
                orgs=s.orgs,
                users=s.users,
                bots=s.bots,
                channels=tuple(c for c in s.channels if c.id not in linked),
            )
        ),
    )
    for bot in s.bots:
        doc = BotProjectsDoc(bot=bot.id, projects=s.bot_projects.get(bot.id, ()))
        put(f"agents/{segment(bot.id, 'bot id')}/projects.json", to_json(doc))
    for project in s.projects:
        root = f"projects/{segment(project.id, 'project id')}"
        put(f"{root}/project.md", _project_md(project))
        groups = tuple(
            camel_keys(msgspec.to_builtins(channels[c])) if c in channels else {"id": c}
            for c in project.channels
        )
        put(f"{root}/groups.json", to_json(GroupsDoc(project=project.id, groups=groups)))
    own_bots = {b.id for b in s.bots}
    for pool in s.pools:
        kind, _, owner = pool.pool.partition(":")
        own = kind != "bot" or owner in own_bots
        if kind == "bot" and not own:
            _check_kept(pool)  # another account's bot: learned entries kept for this one
        elif (kind, owner) not in (
            *(("bot", b) for b in own_bots),
            ("user", s.account.id),
            *(("project", p) for p in project_ids),
        ):
            raise InvalidInput(f"{pool.pool} is not {s.account.id}'s", code="invalid_tree")
        for path, data in _render_pool(pool).items():
            put(f"{memory_root(pool.pool, own)}/{path}", data)
    for receipt in s.commands:
        put(command_file(receipt), to_json(receipt))
    for chat in s.chats:
        for path, data in render_chat(chat, channels).items():
            put(f"{chat_root(chat.chat.id)}/{path}", data)
    return files


def _check_kept(pool: PoolSnapshot) -> None:
    """What a tree may hold of another account's bot: learned entries and their log rows."""
    seed = pool.seed
    if (
        any(r.memory is None for r in pool.records)
        or pool.revisions
        or pool.tombstones
        or pool.jobs
        or pool.positions
        or (seed is not None and (seed.version or seed.settings != MemoryBotSettings()))
    ):
        raise InvalidInput(f"{pool.pool} holds more than entries kept for you", code="invalid_tree")


def _project_md(project: Project) -> bytes:
    meta = ProjectMeta(
        id=project.id,
        name=project.name,
        org=project.org,
        owner=project.owner,
        members=project.members,
        metadata=project.metadata,
        revision=project.revision,
        created_at=project.created_at,
        updated_at=project.updated_at,
    )
    fields = msgspec.to_builtins(meta)
    lines = ["---", *(f"{camel(k)}: {ENC.encode(v).decode()}" for k, v in fields.items())]
    lines += ["---", ""]
    lines.append(f"# {_one_line(project.name)}")
    lines.append("")
    lines.append(f"Project `{project.id}`, revision {project.revision}; see `groups.json`.")
    if project.metadata:
        lines.append("")
        lines += [f"- {_one_line(k)}: {_one_line(v)}" for k, v in project.metadata.items()]
    return to_text(lines)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _render_pool(pool: PoolSnapshot) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    lines: dict[str, list[MemoryRecord]] = {}
    tombs = {(t.entry, t.revision): t for t in pool.tombstones}
    docs = []
    for r in pool.records:
        if r.pool != pool.pool:
            raise InvalidInput(f"record {r.id} is not of {pool.pool}", code="invalid_tree")
        segment(r.id, "memory id")
        file = content = None
        if r.status == WorkspaceStatus.ACTIVE:
            file = record_file(r)
            lines.setdefault(file, []).append(r)
        else:
            tomb = tombs.get((r.id, r.revision))
            if tomb is None or tomb.content != r.content:
                content = r.content
        docs.append(
            RecordDoc(
                id=r.id,
                scope=r.scope,
                contributor=r.contributor,
                category=r.tier,
                version=r.revision,
                created_at=r.created_at,
                updated_at=r.updated_at,
                status=r.status,
                topics=r.topics,
                source=r.evidence,
                protected=r.protected,
                review=r.review,
                fingerprint=content_fingerprint(r.content),
                file=file,
                content=content,
                tags=r.tags,
                memory=r.memory,
                thread=r.thread or None,
                position=r.position if r.thread else None,
            )
        )
        files[f".dreaming/{r.origin.value}/{r.id}.json"] = to_json(MarkerDoc(entry=r.id))
    for file, rows in lines.items():
        rows.sort(key=lambda r: (r.updated_at, r.id))
        files[file] = to_text(memory_line(r.content, r.updated_at) for r in rows)
    files[".dreaming/records.json"] = to_json(RecordsDoc(pool=pool.pool, records=tuple(docs)))
    for t in pool.tombstones:
        doc = TombstoneDoc(
            entry=t.entry,
            revision=t.revision,
            reason=t.reason,
            at=t.at,
            content=t.content,
            fingerprint=t.fingerprint if t.content is None else content_fingerprint(t.content),
        )
        name = f"{segment(t.entry, 'memory id')}.{t.revision}.json"
        files[f".dreaming/tombstones/{name}"] = to_json(doc)
    sources = tuple(
        SourcesRow(entry=t.entry, revision=t.revision, evidence=t.evidence)
        for t in pool.tombstones
        if t.evidence
    )
    files[".dreaming/forgotten-sources.json"] = to_json(SourcesDoc(sources=sources))
    by_entry: dict[str, list[Revision]] = {}
    for rev in pool.revisions:
        by_entry.setdefault(rev.entry, []).append(rev)
    for entry, revs in by_entry.items():
        doc = RevisionsDoc(entry=entry, revisions=tuple(revs))
        files[f".dreaming/revisions/{segment(entry, 'memory id')}.json"] = to_json(doc)
    for job in pool.jobs:
        if job.pool != pool.pool:
            raise InvalidInput(f"job {job.id} is not of {pool.pool}", code="invalid_tree")
        files[f".dreaming/jobs/{segment(job.id, 'job id')}.json"] = to_json(job)
    if pool.positions:
        doc = PositionsDoc(pool=pool.pool, positions=pool.positions)
        files[".dreaming/read-positions.json"] = to_json(doc)
    if pool.seed is not None:
        if not pool.pool.startswith("bot:"):
            raise InvalidInput(f"{pool.pool} has no memory-bot state", code="invalid_tree")
        files[".dreaming/memory-bot.json"] = to_json(MemoryBotDoc(pool=pool.pool, seed=pool.seed))
    waiting = [j.updated_at for j in pool.jobs if j.status in OPEN_JOBS]
    files[".dreaming/next-refresh-at"] = to_text([iso(min(waiting)) if waiting else "none"])
    return files
