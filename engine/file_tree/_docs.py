"""The JSON and Markdown documents of the tree, as msgspec Structs (field names are the
files' keys)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from engine.casing import camel_keys
from engine.directory import Bot, Channel, Org, User
from engine.file_tree._model import BotProject, MemoryBotState, ReadPosition
from engine.memory_entries import EntryMeta, Scope, Tier
from engine.scoped_memory import Revision, WorkspaceStatus

# --- file documents -------------------------------------------------------------------------------


class AccountDoc(msgspec.Struct, frozen=True, kw_only=True):
    format: str
    account: User
    orgs: tuple[Org, ...] = ()
    users: tuple[User, ...] = ()
    bots: tuple[Bot, ...] = ()
    channels: tuple[Channel, ...] = ()


class BotProjectsDoc(msgspec.Struct, frozen=True, kw_only=True):
    bot: str
    projects: tuple[BotProject, ...] = ()


class GroupsDoc(msgspec.Struct, frozen=True, kw_only=True):
    project: str
    groups: tuple[dict[str, Any], ...] = ()


class RecordDoc(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    scope: Scope
    contributor: str
    category: Tier
    version: int
    created_at: int = msgspec.field(name="createdAt")
    updated_at: int = msgspec.field(name="updatedAt")
    status: WorkspaceStatus = WorkspaceStatus.ACTIVE
    topics: tuple[str, ...] = ()
    source: tuple[str, ...] = ()
    protected: bool = False
    review: bool = False
    fingerprint: str = ""
    file: str | None = None
    content: str | None = None
    tags: tuple[str, ...] = ()
    memory: EntryMeta | None = None
    thread: str | None = None  # None: in no thread
    position: int | None = None


class RecordsDoc(msgspec.Struct, frozen=True, kw_only=True):
    pool: str
    records: tuple[RecordDoc, ...] = ()


class MarkerDoc(msgspec.Struct, frozen=True, kw_only=True):
    entry: str


class TombstoneDoc(msgspec.Struct, frozen=True, kw_only=True):
    entry: str
    revision: int
    reason: str
    at: int
    content: str | None = None
    fingerprint: str = ""


class SourcesRow(msgspec.Struct, frozen=True, kw_only=True):
    entry: str
    revision: int
    evidence: tuple[str, ...]


class SourcesDoc(msgspec.Struct, frozen=True, kw_only=True):
    sources: tuple[SourcesRow, ...] = ()


class RevisionsDoc(msgspec.Struct, frozen=True, kw_only=True):
    entry: str
    revisions: tuple[Revision, ...] = ()


class PositionsDoc(msgspec.Struct, frozen=True, kw_only=True):
    pool: str
    positions: tuple[ReadPosition, ...] = ()


class MemoryBotDoc(msgspec.Struct, frozen=True, kw_only=True):
    pool: str
    seed: MemoryBotState


class ProjectMeta(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    org: str
    owner: str
    members: tuple[str, ...] = ()
    metadata: dict[str, str] = {}
    revision: int = 1
    created_at: int = msgspec.field(default=0, name="createdAt")
    updated_at: int = msgspec.field(default=0, name="updatedAt")


ENC = msgspec.json.Encoder()


def to_json(doc: object) -> bytes:
    """A file of the tree: camelCase keys like the API; parsing takes either."""
    return msgspec.json.format(ENC.encode(camel_keys(msgspec.to_builtins(doc))), indent=2) + b"\n"


def to_text(lines: Iterable[str]) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode()
