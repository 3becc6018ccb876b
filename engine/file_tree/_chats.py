"""Chats in the tree: `chats/<chatId>/` in the tree of the chat's person.

    chats/<chatId>/chat.json     the chat record, its group's channel record (a group chat),
                                 its members (derived), and the last item number ever used
    chats/<chatId>/items.md      the transcript: `- (YYYY-MM-DD) i-<n> <author>: text`, in order
    chats/<chatId>/items.json    every item's kind, author, time, turn and, for a real delivery
                                 between bots (UI-1), its direction and peer; no text
    chats/<chatId>/turns.json    the turns: operator, status, rounds, error, delivery goal/verdict
    chats/<chatId>/confessions.json  what its bots confided and the answers (API-6), if any
    chats/<chatId>/enrichments.json  each rewrite of a person's input: text, original, entries
    chats/<chatId>/chains.json   the collaboration chains rooted in it (CO-1): structure, texts
    chats/<chatId>/requests.json the requests (approvals) its bots made in it, with proposals

A line's text is escaped as memory lines are (one item, one line) and is taken as the item's
text when edited; ids, dates and authors must match `items.json`. Item texts are sealed at rest:
they are plaintext only here, in the export directory. So are confessions, enrichments, chain
texts and proposals; the four last files exist only when the chat has some. A chain's message
fingerprints are unkeyed digests here (`collaboration.digest`), keyed again on import.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from engine.chat_records import Confession, Enrichment
from engine.directory import Channel, Chat
from engine.errors import InvalidInput
from engine.file_tree._docs import to_json, to_text
from engine.file_tree._model import (
    ChainRecord,
    ChatItem,
    ChatSnapshot,
    ChatTurn,
    RequestRecord,
    day,
    escape,
    segment,
    unescape,
)

ITEM_LINE = re.compile(r"^- \((\d{4}-\d{2}-\d{2})\) i-(\d+) (\S+):(?: (.*))?$")
_TOKEN = re.compile(r"[^\s:\\]{1,128}")


class Members(msgspec.Struct, frozen=True, kw_only=True):
    people: tuple[str, ...] = ()
    bots: tuple[str, ...] = ()


class ChatDoc(msgspec.Struct, frozen=True, kw_only=True):
    chat: Chat
    channel: Channel | None = None  # the group's channel (group chats)
    members: Members = Members()  # derived from the chat and its channel; ignored on parse
    last_seq: int = 0  # the last item number ever used (deleted items keep theirs)


class Delivery(msgspec.Struct, frozen=True, kw_only=True):
    direction: str  # received | sent
    peer: str


class ItemDoc(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    kind: str
    author: str
    at: int
    turn: str | None = None
    communication: Delivery | None = None


class ItemsDoc(msgspec.Struct, frozen=True, kw_only=True):
    chat: str
    items: tuple[ItemDoc, ...] = ()


class TurnsDoc(msgspec.Struct, frozen=True, kw_only=True):
    chat: str
    turns: tuple[ChatTurn, ...] = ()


class ConfessionsDoc(msgspec.Struct, frozen=True, kw_only=True):
    chat: str
    confessions: tuple[Confession, ...] = ()


class EnrichmentsDoc(msgspec.Struct, frozen=True, kw_only=True):
    chat: str
    enrichments: tuple[Enrichment, ...] = ()


class ChainsDoc(msgspec.Struct, frozen=True, kw_only=True):
    chat: str
    chains: tuple[ChainRecord, ...] = ()


class RequestsDoc(msgspec.Struct, frozen=True, kw_only=True):
    chat: str
    requests: tuple[RequestRecord, ...] = ()


# The optional files of a chat: name → (document, its list field).
RECORD_FILES: dict[str, tuple[type, str]] = {
    "confessions.json": (ConfessionsDoc, "confessions"),
    "enrichments.json": (EnrichmentsDoc, "enrichments"),
    "chains.json": (ChainsDoc, "chains"),
    "requests.json": (RequestsDoc, "requests"),
}
CHAT_FILES = frozenset({"chat.json", "items.md", "items.json", "turns.json", *RECORD_FILES})


def chat_root(chat_id: str) -> str:
    return f"chats/{segment(chat_id, 'chat id')}"


def author_token(author: str) -> str:
    """The author as the transcript shows it: its id, or `?` for a name that could not stand
    in the line (a tool's name a model made up); `items.json` has it exactly."""
    return author if _TOKEN.fullmatch(author) else "?"


def item_line(item: ChatItem) -> str:
    text = escape(item.text)
    head = f"- ({day(item.at)}) i-{item.seq} {author_token(item.author)}:"
    return head + (f" {text}" if text else "")


def members(chat: Chat, channel: Channel | None) -> Members:
    if channel is not None:
        return Members(people=channel.people, bots=channel.bots)
    return Members(people=(chat.owner,), bots=(chat.bot,) if chat.bot else ())


def render_chat(c: ChatSnapshot, channels: dict[str, Channel]) -> dict[str, bytes]:
    """The files of one chat, relative to its `chats/<chatId>` directory."""
    chat = c.chat
    channel = None
    if chat.channel is not None:
        channel = channels.get(chat.channel)
        if channel is None:
            raise InvalidInput(
                f"chat {chat.id}'s channel {chat.channel} is not in the tree", code="invalid_tree"
            )
    for item in c.items:
        if item.seq > c.last_seq:
            raise InvalidInput(
                f"item i-{item.seq} of {chat.id} is past its last number", code="invalid_tree"
            )
    doc = ChatDoc(chat=chat, channel=channel, members=members(chat, channel), last_seq=c.last_seq)
    title = f"# {chat.kind} chat {chat.id}" + (f" in {chat.channel}" if chat.channel else "")
    items = tuple(
        ItemDoc(
            id=f"i-{i.seq}",
            kind=i.kind,
            author=i.author,
            at=i.at,
            turn=i.turn,
            communication=None
            if i.direction is None
            else Delivery(direction=i.direction, peer=i.peer or ""),
        )
        for i in c.items
    )
    _check_records(chat.id, c, lambda why: InvalidInput(why, code="invalid_tree"))
    files = {
        "chat.json": to_json(doc),
        "items.md": to_text([title, "", *(item_line(i) for i in c.items)]),
        "items.json": to_json(ItemsDoc(chat=chat.id, items=items)),
        "turns.json": to_json(TurnsDoc(chat=chat.id, turns=c.turns)),
    }
    for name, (kind, field) in RECORD_FILES.items():
        rows = getattr(c, field)
        if rows:
            files[name] = to_json(kind(chat=chat.id, **{field: rows}))
    return files


def _check_records(chat_id: str, c: ChatSnapshot, bad: Any) -> None:
    """Chains and requests name the chat they belong to: this one."""
    for r in c.chains:
        if r.chain.root_chat != chat_id:
            raise bad(f"chain {r.chain.id} is rooted in {r.chain.root_chat}, not {chat_id}")
        segment(r.chain.id, "chain id")
    for q in c.requests:
        if q.request.chat != chat_id:
            raise bad(f"request {q.request.id} was made in {q.request.chat}, not {chat_id}")
        segment(q.request.id, "request id")


def parse_chat(
    where: str, chat_id: str, files: dict[str, bytes], decode: Any, bad: Any
) -> tuple[ChatSnapshot, Channel | None]:
    """One chat's files (`decode(path, data, kind)`, `bad(path, why)` from the parser) back
    into its snapshot and its channel record."""
    extra = sorted(set(files) - CHAT_FILES)
    if extra:
        raise bad(where, f"unexpected files: {', '.join(extra[:5])}")

    def take(name: str) -> bytes:
        if name not in files:
            raise bad(f"{where}/{name}", "missing")
        return files[name]

    doc: ChatDoc = decode(f"{where}/chat.json", take("chat.json"), ChatDoc)
    items: ItemsDoc = decode(f"{where}/items.json", take("items.json"), ItemsDoc)
    turns: TurnsDoc = decode(f"{where}/turns.json", take("turns.json"), TurnsDoc)
    if doc.chat.id != chat_id or items.chat != chat_id or turns.chat != chat_id:
        raise bad(where, "the files name another chat")
    if (doc.channel is None) != (doc.chat.channel is None) or (
        doc.channel is not None and doc.channel.id != doc.chat.channel
    ):
        raise bad(f"{where}/chat.json", "the channel record is not the chat's")
    texts = _parse_lines(f"{where}/items.md", take("items.md"), bad)
    if len(texts) != len(items.items):
        raise bad(f"{where}/items.md", f"{len(texts)} lines for {len(items.items)} items")
    out = []
    for (date, seq, author, text), meta in zip(texts, items.items, strict=True):
        if meta.id != f"i-{seq}" or author != author_token(meta.author) or date != day(meta.at):
            raise bad(f"{where}/items.md", f"the line of {meta.id} does not match items.json")
        if seq > doc.last_seq:
            raise bad(f"{where}/items.json", f"{meta.id} is past the last number {doc.last_seq}")
        comm = meta.communication
        out.append(
            ChatItem(
                seq=seq,
                kind=meta.kind,
                author=meta.author,
                at=meta.at,
                text=text,
                turn=meta.turn,
                direction=None if comm is None else comm.direction,
                peer=None if comm is None else comm.peer,
            )
        )
    if len({i.seq for i in out}) != len(out):
        raise bad(f"{where}/items.json", "an item number twice")
    records: dict[str, Any] = {}
    for name, (kind, field) in RECORD_FILES.items():
        if name in files:
            rdoc = decode(f"{where}/{name}", files[name], kind)
            if rdoc.chat != chat_id:
                raise bad(f"{where}/{name}", "the file names another chat")
            records[field] = getattr(rdoc, field)
    snap = ChatSnapshot(
        chat=doc.chat, last_seq=doc.last_seq, items=tuple(out), turns=turns.turns, **records
    )
    _check_records(chat_id, snap, lambda why: bad(where, why))
    return snap, doc.channel


def _parse_lines(path: str, data: bytes, bad: Any) -> list[tuple[str, int, str, str]]:
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise bad(path, "not UTF-8") from e
    rows = []
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip() or line.startswith("#"):
            continue
        m = ITEM_LINE.match(line)
        if m is None:
            raise bad(path, f"line {n} is not `- (YYYY-MM-DD) i-<n> <author>: text`")
        rows.append((m.group(1), int(m.group(2)), m.group(3), unescape(m.group(4) or "")))
    return rows
