"""The snapshot an account's tree is made of, its canonical order, and the names and lines
of the tree (see the package docstring)."""

from __future__ import annotations

import datetime
import hashlib
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

import msgspec

from engine.chat_records import Confession, Enrichment
from engine.collaboration import Chain
from engine.directory import ID_RE, Bot, Channel, Chat, Org, User
from engine.errors import InvalidInput
from engine.memory_bot_settings import MemoryBotSettings
from engine.memory_entries import EntryMeta, LogRow, Scope, Tier
from engine.projects import Project
from engine.requests import ApprovalRequest
from engine.scoped_memory import Origin, Revision, WorkspaceStatus

FORMAT = "openbot-file-tree/1"
ROOT = "bot-workspace"
OPEN_JOBS = ("pending", "running", "waiting", "deferred")
IGNORED = frozenset({".DS_Store", "Thumbs.db"})


# --- the snapshot ---------------------------------------------------------------------------------


class MemoryRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A workspace record with its plaintext content (`WorkspaceEntry` without the keyed
    fingerprint)."""

    id: str
    scope: Scope
    pool: str
    contributor: str
    tier: Tier
    content: str
    created_at: int
    updated_at: int
    topics: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    protected: bool = False
    review: bool = False
    status: WorkspaceStatus = WorkspaceStatus.ACTIVE
    origin: Origin = Origin.SYNTHESIZED
    revision: int = 1
    tags: tuple[str, ...] = ()  # a bot record's system tags (engine/memory_union.py)
    thread: str = ""  # the conversation it is a turn of, and its place there
    position: int = 0
    # A learned entry of the bot's one memory: its whole metadata (layer, tags,
    # sources, access proofs), so an import restores exactly who may see it (never wider).
    memory: EntryMeta | None = None


class Tombstone(msgspec.Struct, frozen=True, kw_only=True):
    """A forget barrier (`ForgetBarrier`) with the record revision its change made and the old
    content. `fingerprint` is kept only when the content is unknown (None)."""

    entry: str
    revision: int
    reason: str
    at: int
    evidence: tuple[str, ...] = ()
    content: str | None = None
    fingerprint: str = ""


class MemoryJob(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A background extraction job of a bot's memory (FS-2 `jobs/`: source turn, attempts,
    status, error); the fields of the stored job."""

    id: str
    pool: str
    chat: str
    turn: str
    upto: int
    org: str
    grant: str
    channel: str | None = None
    model: str | None = None
    status: str = "pending"
    attempts: int = 0
    error: str | None = None
    created_at: int = 0
    updated_at: int = 0


class ReadPosition(msgspec.Struct, frozen=True, kw_only=True):
    """How far a bot's learning has read a chat (items up to `seq`), so that an import never
    learns from the same items twice."""

    chat: str
    seq: int


class MemoryBotState(msgspec.Struct, frozen=True, kw_only=True):
    """The entry side of a bot's memory: the pool's version (API-3), its memory-bot
    settings and the change log of the entries in the tree."""

    version: int = 0
    settings: MemoryBotSettings = MemoryBotSettings()
    log: tuple[LogRow, ...] = ()


class PoolSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    pool: str
    records: tuple[MemoryRecord, ...] = ()
    revisions: tuple[Revision, ...] = ()
    tombstones: tuple[Tombstone, ...] = ()
    jobs: tuple[MemoryJob, ...] = ()
    positions: tuple[ReadPosition, ...] = ()
    seed: MemoryBotState | None = None  # bot pools; None is the default state


class ChatItem(msgspec.Struct, frozen=True, kw_only=True):
    """An item of a chat with its plaintext (`i-<seq>`); `direction`/`peer` mark a real
    delivery between bots (UI-1)."""

    seq: int
    kind: str  # person | bot | notification | tool_result | delivery
    author: str
    at: int
    text: str
    turn: str | None = None
    direction: str | None = None
    peer: str | None = None


class ChatTurn(msgspec.Struct, frozen=True, kw_only=True):
    """A turn of a chat: the person it acts for (LRN-6), status, rounds, a delivery goal."""

    id: str
    operator: str
    status: str
    at: int
    rounds: int = 1
    error: str | None = None
    goal: str | None = None
    verdict_by: str | None = None
    verdict_note: str | None = None


class LinkTexts(msgspec.Struct, frozen=True, kw_only=True):
    """The texts of one link of a chain: the request sent, the result that came back, and an
    answer waiting to go up (sealed with the root chat's key where they are stored)."""

    link: str
    request: str | None = None
    result: str | None = None
    pending: str | None = None


class ChainRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A collaboration chain rooted in the chat (engine/collaboration.py), with its links'
    message fingerprints unkeyed (`collaboration.digest`; "" when the text is unknown), the
    group channel it answers to, the learning jobs waiting for it (job ids) and the links whose
    agent chat the directory may not have yet."""

    chain: Chain
    channel: str | None = None
    learn: tuple[str, ...] = ()
    unregistered: tuple[str, ...] = ()
    texts: tuple[LinkTexts, ...] = ()


class RequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A request (approval) a bot made in the chat, with its proposal (ENR-3)."""

    request: ApprovalRequest
    proposal: str


class ChatSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A chat, its items in order and its turns. `last_seq` is the last item number ever used
    (numbers are never reused, even after the history was deleted). Confessions and
    enrichments of its turns, the chains rooted in it and the requests its bots made in it go
    with it."""

    chat: Chat
    last_seq: int = 0
    items: tuple[ChatItem, ...] = ()
    turns: tuple[ChatTurn, ...] = ()
    confessions: tuple[Confession, ...] = ()
    enrichments: tuple[Enrichment, ...] = ()
    chains: tuple[ChainRecord, ...] = ()
    requests: tuple[RequestRecord, ...] = ()


class CommandReceipt(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """An idempotency receipt of the account (FS-3 `.commands/`): the request's fingerprint and
    the first answer (decoded JSON), kept for the pool whose key seals it."""

    request_id: str
    pool: str
    fingerprint: str
    at: int
    response: Any


class BotProject(msgspec.Struct, frozen=True, kw_only=True):
    """A project a bot takes part in: its linked channels that have the bot."""

    id: str
    name: str
    owner: str
    channels: tuple[str, ...] = ()


class AccountSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """What one account's tree holds. Pools are the account's own: its bots' (`bot:<id>`), its
    user memory (`user:<id>`) and its projects' (`project:<id>`). `users` are the other people
    its bots, channels and projects name; `channels` those it or its bots are in or its projects
    link. `bot_projects` is derived (from every project, the account's or not)."""

    account: User
    orgs: tuple[Org, ...] = ()
    users: tuple[User, ...] = ()
    bots: tuple[Bot, ...] = ()
    channels: tuple[Channel, ...] = ()
    projects: tuple[Project, ...] = ()
    bot_projects: dict[str, tuple[BotProject, ...]] = {}
    pools: tuple[PoolSnapshot, ...] = ()
    commands: tuple[CommandReceipt, ...] = ()
    chats: tuple[ChatSnapshot, ...] = ()


def canonical(snapshot: AccountSnapshot) -> AccountSnapshot:
    """The snapshot in the one order its files have; empty pools and foreign bots' project
    lists dropped. `parse(render(s)) == canonical(s)`."""

    def by_id(items):
        return tuple(sorted(items, key=lambda x: x.id))

    pools = []
    for p in sorted(snapshot.pools, key=lambda p: p.pool):
        pool = PoolSnapshot(
            pool=p.pool,
            records=by_id(p.records),
            revisions=tuple(sorted(p.revisions, key=lambda r: (r.entry, r.revision))),
            tombstones=tuple(
                sorted(
                    (
                        t if t.content is None else msgspec.structs.replace(t, fingerprint="")
                        for t in p.tombstones
                    ),
                    key=lambda t: (t.entry, t.revision),
                )
            ),
            jobs=by_id(p.jobs),
            positions=tuple(sorted(p.positions, key=lambda x: x.chat)),
            seed=None
            if p.seed is None or p.seed == MemoryBotState()
            else msgspec.structs.replace(
                p.seed, log=tuple(sorted(p.seed.log, key=lambda r: (r.version, r.entry)))
            ),
        )
        if pool.records or pool.revisions or pool.tombstones or pool.jobs or pool.positions:
            pools.append(pool)
    return AccountSnapshot(
        account=snapshot.account,
        orgs=by_id(snapshot.orgs),
        users=by_id(snapshot.users),
        bots=by_id(snapshot.bots),
        channels=by_id(snapshot.channels),
        projects=by_id(snapshot.projects),
        bot_projects={
            b.id: by_id(snapshot.bot_projects.get(b.id, ())) for b in by_id(snapshot.bots)
        },
        pools=tuple(pools),
        commands=tuple(sorted(snapshot.commands, key=lambda c: (c.pool, c.request_id))),
        chats=tuple(
            msgspec.structs.replace(
                c,
                items=tuple(sorted(c.items, key=lambda i: i.seq)),
                turns=tuple(sorted(c.turns, key=lambda t: (t.at, t.id))),
                confessions=tuple(
                    sorted(c.confessions, key=lambda r: (r.at, r.turn, r.text, r.answer))
                ),
                enrichments=tuple(
                    sorted(c.enrichments, key=lambda r: (r.at, r.turn, r.text, r.original))
                ),
                chains=tuple(
                    msgspec.structs.replace(r, texts=tuple(sorted(r.texts, key=lambda t: t.link)))
                    for r in sorted(c.chains, key=lambda r: r.chain.id)
                ),
                requests=tuple(sorted(c.requests, key=lambda r: r.request.id)),
            )
            for c in sorted(snapshot.chats, key=lambda c: c.chat.id)
        ),
    )


# --- lines, dates, names --------------------------------------------------------------------------

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
LINE = re.compile(r"^- \((\d{4}-\d{2}-\d{2})\)(?: (.*))?$")
_UNESCAPE = re.compile(r"\\(\\|n|r|u[0-9a-fA-F]{4})")
_EDGE_SPACE = " \t"


def _utc(ms: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(milliseconds=ms)


def day(ms: int) -> str:
    """The UTC date of epoch milliseconds, `YYYY-MM-DD`."""
    return _utc(ms).date().isoformat()


def iso(ms: int) -> str:
    return _utc(ms).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def escape(text: str) -> str:
    """One line that `unescape` turns back into `text` exactly (see the module docstring)."""
    out = []
    for c in text:
        if c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c != "\t" and unicodedata.category(c) in ("Cc", "Zl", "Zp"):
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    body = "".join(out)
    rest = body.lstrip(_EDGE_SPACE)
    core = rest.rstrip(_EDGE_SPACE)
    return _u(body[: len(body) - len(rest)]) + core + _u(rest[len(core) :])


def _u(spaces: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in spaces)


def unescape(line: str) -> str:
    def one(m: re.Match[str]) -> str:
        code = m.group(1)
        if code == "\\":
            return "\\"
        if code == "n":
            return "\n"
        if code == "r":
            return "\r"
        return chr(int(code[1:], 16))

    return _UNESCAPE.sub(one, line)


def memory_line(content: str, updated_at: int) -> str:
    """`- (YYYY-MM-DD) content` (FS-2), escaped to one line."""
    return f"- ({day(updated_at)}) {escape(content)}"


def segment(value: str, what: str) -> str:
    """An id used as a path segment: the directory's id rules, and never `.` or `..`."""
    if not isinstance(value, str) or not ID_RE.match(value) or value in (".", ".."):
        raise InvalidInput(f"{what} {value!r} cannot name a file", code="invalid_tree")
    return value


OTHER_AGENTS = "other-agents"


def entry_keeper(tags: tuple[str, ...], people: Mapping[str, tuple[str, ...]]) -> str | None:
    """Whose tree keeps a learned entry of a bot's memory that the bot's owner may not see: the
    person it is for (the first, by id), else the first person of a channel it is for
    (`people`: channel → its people); None when nobody is named."""
    persons = sorted(t.removeprefix("for:person:") for t in tags if t.startswith("for:person:"))
    if persons:
        return persons[0]
    channels = sorted(t.removeprefix("for:channel:") for t in tags if t.startswith("for:channel:"))
    members = sorted(p for c in channels for p in people.get(c, ()))
    return members[0] if members else None


def memory_root(pool: str, own: bool = True) -> str:
    """The directory of a pool's memory inside the account's tree; another account's bot's
    entries kept for this account (`own` False) go under `other-agents/<botId>/memory`."""
    kind, _, owner = pool.partition(":")
    if kind == "bot":
        return f"{'agents' if own else OTHER_AGENTS}/{segment(owner, 'bot id')}/memory"
    if kind == "user":
        return "user-memory"
    if kind == "project":
        return f"projects/{segment(owner, 'project id')}/memory"
    raise InvalidInput(f"{pool!r} is not a workspace pool", code="invalid_tree")


def record_file(record: MemoryRecord) -> str:
    """Where an active record's line goes, relative to its memory root."""
    month = _utc(record.updated_at).strftime("%Y-%m")
    name = "profile.md" if record.tier == Tier.PROFILE else f"log/{month}.md"
    if record.pool.startswith("bot:"):
        return name
    return f"agents/{segment(record.contributor, 'contributor')}/{name}"


def command_file(receipt: CommandReceipt) -> str:
    digest = hashlib.sha256(f"{receipt.pool}\x00{receipt.request_id}".encode()).hexdigest()
    return f".commands/{digest[:32]}.json"
