"""Chats in `openbot export` / `openbot import`: reading them from a stopped data
directory's files and writing them into a data directory (storage/file_export.py drives both).

A chat's items, turns and delivery records live on its home shard (`shard_of(home)`: the bot
owner for direct, review and agent chats of a direct root, the channel for a group), sealed with
the chat's data key (`chat:<id>` in `pools`, whose version is the last item number ever used).
Other shards may keep copies of a group's person items for their bots' learning; the export
reads the home shard only. An import seals everything again with a fresh chat key on the home
shard the target's shard count gives, so the plaintext exists only in the export directory.

How far each bot's learning has read a chat (`learn_positions`) belongs to the bot's memory and
goes with its pool (on the bot owner's shard).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import msgspec

from engine import file_tree as ft
from engine.chat_records import Turn
from engine.directory import Bot, Chat
from engine.errors import InvalidInput, StorageError
from engine.memory_bot_settings import MemoryBotSettings
from storage.crypto import Cipher, Keyring, aad
from storage.group_commit import DeleteWhere, Insert, Write
from storage.memory_store import MemoryStore, StoredPool
from storage.sealed_doc import open_doc, seal_doc
from storage.shard_schema import (
    CHAT_ITEMS,
    COMMUNICATIONS,
    LEARN_POSITIONS,
    POOLS,
    TURNS,
)

_turn_dec = msgspec.json.Decoder(Turn)
_enc = msgspec.json.Encoder()


@dataclass
class ChatShardRows:
    """The chat rows of one shard file, by chat (positions by pool)."""

    versions: dict[str, int] = field(default_factory=dict)
    items: dict[str, list[tuple]] = field(default_factory=dict)
    turns: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    comms: dict[str, dict[int, tuple[str, str]]] = field(default_factory=dict)
    positions: dict[str, list[ft.ReadPosition]] = field(default_factory=dict)


def read_shard(rows: Callable[[str], list[tuple]]) -> ChatShardRows:
    """Every chat row of a shard file (`rows(sql)` runs a query on it, read-only)."""
    out = ChatShardRows()
    for pool, version in rows("SELECT pool, version FROM pools WHERE pool LIKE 'chat:%'"):
        out.versions[pool.removeprefix("chat:")] = version
    for chat, *row in rows(
        "SELECT chat, seq, turn, kind, author, payload, at_ms FROM chat_items ORDER BY chat, seq"
    ):
        out.items.setdefault(chat, []).append(tuple(row))
    for chat, turn_id, meta in rows("SELECT chat, id, meta FROM turns"):
        out.turns.setdefault(chat, []).append((turn_id, meta))
    for chat, seq, direction, peer in rows("SELECT chat, seq, direction, peer FROM communications"):
        out.comms.setdefault(chat, {})[seq] = (direction, peer)
    for pool, chat, seq in rows("SELECT pool, chat, seq FROM learn_positions"):
        out.positions.setdefault(pool, []).append(ft.ReadPosition(chat=chat, seq=seq))
    return out


def home_of(chat: Chat, bots: dict[str, Bot], fallback: str = "") -> str:
    """The key whose shard stores the chat (engine/directory.py `chat_home`); rows written
    before `home` existed are direct chats, kept by their bot's owner."""
    if chat.home:
        return chat.home
    bot = bots.get(chat.bot or "")
    return bot.owner if bot is not None else fallback


def keeper(chat: Chat) -> str:
    """The account whose tree holds the chat: its person (who talks with the bot, started the
    group, or whose chat a collaboration's agent chat serves). Where it is stored (its home)
    does not decide: a person's talk with someone else's bot is theirs, not the bot owner's."""
    return chat.owner


def snapshot(
    chat: Chat,
    rows: ChatShardRows,
    cipher: Cipher | None,
) -> ft.ChatSnapshot:
    """A chat from its home shard's rows, opened with the chat's key."""
    items = rows.items.get(chat.id, [])
    turns = rows.turns.get(chat.id, [])
    if (items or turns) and cipher is None:
        raise StorageError(f"chat {chat.id} has items but no key on its home shard")
    scope = f"chat:{chat.id}"
    comms = rows.comms.get(chat.id, {})
    out_items = []
    for seq, turn, kind, author, payload, at in items:
        assert cipher is not None
        direction, peer = comms.get(seq, (None, None))
        out_items.append(
            ft.ChatItem(
                seq=seq,
                kind=kind,
                author=author,
                at=at,
                text=cipher.open(payload, aad(scope, f"i-{seq}")).decode(),
                turn=turn,
                direction=direction,
                peer=peer,
            )
        )
    out_turns = []
    for turn_id, meta in turns:
        t = _turn_dec.decode(open_doc(cipher, scope, TURNS.name, turn_id, meta))
        fields = msgspec.structs.asdict(t)
        del fields["chat"]
        out_turns.append(ft.ChatTurn(**fields))
    last = max([rows.versions.get(chat.id, 0), *(i.seq for i in out_items)])
    return ft.ChatSnapshot(chat=chat, last_seq=last, items=tuple(out_items), turns=tuple(out_turns))


# --- import ---------------------------------------------------------------------------------------


def chat_writes(c: ft.ChatSnapshot, keyring: Keyring, memory: MemoryStore) -> list[Write]:
    """The rows of one chat on its home shard, sealed with a new chat key."""
    chat = c.chat
    scope = f"chat:{chat.id}"
    cipher, wrapped = keyring.new_pool_key(scope)
    key = StoredPool(pool=scope, cipher=cipher, wrapped_key=wrapped)
    writes: list[Write] = [memory.pool_row(key, c.last_seq, MemoryBotSettings())]
    for i in c.items:
        sealed = cipher.seal(i.text.encode(), aad(scope, f"i-{i.seq}"))
        row = (f"{chat.id}\x00{i.seq}", chat.id, i.seq, i.turn, i.kind, i.author, sealed, i.at)
        writes.append(Insert(CHAT_ITEMS.name, row))
        if i.direction is not None:
            comm = (f"{chat.id}\x00{i.seq}", chat.id, i.seq, i.direction, i.peer or "")
            writes.append(Insert(COMMUNICATIONS.name, comm))
    for t in c.turns:
        turn = Turn(chat=chat.id, **msgspec.structs.asdict(t))
        meta = seal_doc(cipher, scope, TURNS.name, t.id, _enc.encode(turn))
        writes.append(Insert(TURNS.name, (t.id, chat.id, t.operator, t.status, meta, t.at)))
    return writes


def position_writes(pool: str, positions: Iterable[ft.ReadPosition]) -> Iterator[Write]:
    for p in positions:
        yield Insert(LEARN_POSITIONS.name, (f"{pool}\x00{p.chat}", pool, p.chat, p.seq))


def collect(snapshots: Iterable[ft.AccountSnapshot]) -> dict[str, tuple[str, ft.ChatSnapshot]]:
    """Every chat of the trees with the account whose tree holds it; a chat in two trees is
    refused (`conflict`)."""
    out: dict[str, tuple[str, ft.ChatSnapshot]] = {}
    for s in snapshots:
        for c in s.chats:
            if c.chat.id in out:
                raise InvalidInput(f"chat {c.chat.id} is in two trees", code="conflict")
            out[c.chat.id] = (s.account.id, c)
    return out


def stale_rows(pools: Iterable[str], chats: Iterable[str]) -> list[DeleteWhere]:
    """Deletes of rows an interrupted import of the same ids may have left on a shard (none of
    these ids is in the target's directory, so no row of them belongs to anything there): run
    before the inserts, in the same transaction, they make importing again after a crash
    write each row once."""
    pools = tuple(sorted(set(pools)))
    chats = tuple(sorted(set(chats)))
    out = [
        DeleteWhere(table, "pool", pools)
        for table in (
            "pools",
            "memory_entries",
            "memory_log",
            "ws_entries",
            "ws_revisions",
            "ws_barriers",
            "learning_jobs",
            "learn_positions",
            "search_terms",
            "search_snapshots",
            "ws_vectors",
            "ws_vector_blocks",
        )
    ]
    out.append(DeleteWhere(POOLS.name, "pool", tuple(f"chat:{c}" for c in chats)))
    out += [
        DeleteWhere(t, "chat", chats)
        for t in ("chat_items", "turns", "communications", "confessions", "enrichments")
    ]
    projects = tuple(p.removeprefix("project:") for p in pools if p.startswith("project:"))
    out.append(DeleteWhere("projects", "id", projects))
    return [d for d in out if d.values]
