"""Chats in `openbot export` / `openbot import`: reading them from a stopped data
directory's files and writing them into a data directory (storage/file_export.py and
storage/file_import.py drive them).

A chat's items, turns and delivery records live on its home shard (`shard_of(home)`: the bot
owner for direct, review and agent chats of a direct root, the channel for a group), sealed with
the chat's data key (`chat:<id>` in `pools`, whose version is the last item number ever used).
Other shards may keep copies of a group's person items for their bots' learning; the export
reads the home shard only. An import seals everything again with a fresh chat key on the home
shard the target's shard count gives, so the plaintext exists only in the export directory.

How far each bot's learning has read a chat (`learn_positions`) belongs to the bot's memory and
goes with its pool (on the bot owner's shard).

A chat's confessions and enrichments are kept where each bot's memory is (a group's on several
shards, each sealed with that shard's key of the chat): the export gathers them from every
shard, the import writes them all on the home shard (the chat's routes read the home shard and
its bots' shards). Chains live on their root chat's home shard, texts sealed with its key;
requests on their bot's shard, proposals sealed with the bot's pool key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import msgspec

from engine import collaboration
from engine import file_tree as ft
from engine.chat_records import Confession, Enrichment, Turn
from engine.collaboration import Chain, ChainStatus
from engine.directory import Bot, Chat
from engine.errors import InvalidInput, StorageError
from engine.memory_bot_settings import MemoryBotSettings
from engine.requests import ApprovalRequest
from storage.crypto import Cipher, Keyring, aad, chain_fp_key
from storage.group_commit import DeleteWhere, Insert, Write
from storage.memory_store import MemoryStore, StoredPool
from storage.sealed_doc import open_doc, seal_doc
from storage.shard_schema import (
    CHAINS,
    CHAT_ITEMS,
    COMMUNICATIONS,
    CONFESSIONS,
    ENRICHMENTS,
    LEARN_POSITIONS,
    POOLS,
    REQUESTS,
    TURNS,
)

_turn_dec = msgspec.json.Decoder(Turn)
_conf_dec = msgspec.json.Decoder(Confession)
_enr_dec = msgspec.json.Decoder(Enrichment)
_request_dec = msgspec.json.Decoder(ApprovalRequest)
_texts_dec = msgspec.json.Decoder(dict[str, dict[str, str]])
_enc = msgspec.json.Encoder()


@dataclass
class ChatShardRows:
    """The chat rows of one shard file, by chat (positions by pool)."""

    versions: dict[str, int] = field(default_factory=dict)
    items: dict[str, list[tuple]] = field(default_factory=dict)
    turns: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    comms: dict[str, dict[int, tuple[str, str]]] = field(default_factory=dict)
    positions: dict[str, list[ft.ReadPosition]] = field(default_factory=dict)
    # table → chat → (key, payload) of its confessions or enrichments (sealed)
    records: dict[str, dict[str, list[tuple[str, bytes]]]] = field(default_factory=dict)
    chains: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)  # root chat → rows
    requests: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)  # chat → rows


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
    for table in (CONFESSIONS.name, ENRICHMENTS.name):
        mine = out.records.setdefault(table, {})
        for key, chat, payload in rows(f"SELECT key, chat, payload FROM {table} ORDER BY key"):
            mine.setdefault(chat, []).append((key, payload))
    for doc, texts in rows("SELECT doc, texts FROM chains ORDER BY id"):
        root = msgspec.json.decode(doc)["chain"]["root_chat"]
        out.chains.setdefault(root, []).append((doc, texts))
    for doc, proposal in rows("SELECT doc, proposal FROM requests ORDER BY id"):
        out.requests.setdefault(_request_dec.decode(doc).chat, []).append((doc, proposal))
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


def records(
    chat: Chat, shards: Iterable[tuple[ChatShardRows, dict[str, Cipher]]]
) -> dict[str, tuple]:
    """The chat's confessions, enrichments, chains and requests from every shard (`shards`:
    each shard's rows with its pool keys), as `ChatSnapshot` fields."""
    scope = f"chat:{chat.id}"
    out: dict[str, list] = {"confessions": [], "enrichments": [], "chains": [], "requests": []}
    for rows, keys in shards:
        for table, field_, dec in (
            (CONFESSIONS.name, "confessions", _conf_dec),
            (ENRICHMENTS.name, "enrichments", _enr_dec),
        ):
            for key, payload in rows.records.get(table, {}).get(chat.id, []):
                cipher = _need(keys, scope, table)
                raw = cipher.open(payload, aad(scope, f"{table}\x00{key}"))
                out[field_].append(dec.decode(raw))
        for doc, texts in rows.chains.get(chat.id, []):
            record = msgspec.json.decode(doc)
            chain = msgspec.convert(record["chain"], Chain)
            cipher = _need(keys, scope, CHAINS.name)
            opened = _texts_dec.decode(cipher.open(texts, aad(scope, f"chain\x00{chain.id}")))
            out["chains"].append(_chain_record(chain, record, opened))
        for doc, proposal in rows.requests.get(chat.id, []):
            request = _request_dec.decode(doc)
            pool = f"bot:{request.bot}"
            cipher = _need(keys, pool, REQUESTS.name)
            text = cipher.open(proposal, aad(pool, f"request\x00{request.id}")).decode()
            out["requests"].append(ft.RequestRecord(request=request, proposal=text))
    return {k: tuple(v) for k, v in out.items()}


def _need(keys: dict[str, Cipher], pool: str, table: str) -> Cipher:
    cipher = keys.get(pool)
    if cipher is None:
        raise StorageError(f"{table} rows of {pool} but no key on their shard")
    return cipher


def _chain_record(chain: Chain, record: dict, texts: dict[str, dict[str, str]]) -> ft.ChainRecord:
    """A stored chain as the tree keeps it: fingerprints unkeyed from the texts (the stored
    ones are keyed with the data directory's secret), waiting learning jobs by id (where
    they are stored depends on the shard count)."""
    links = []
    for link in chain.links:
        t = texts.get(link.id, {})
        request, result = t.get("request"), t.get("result")
        links.append(
            msgspec.structs.replace(
                link,
                fingerprint="" if request is None else collaboration.digest(request),
                result_fingerprint=None
                if link.result_fingerprint is None
                else ("" if result is None else collaboration.digest(result)),
            )
        )
    return ft.ChainRecord(
        chain=msgspec.structs.replace(chain, links=tuple(links)),
        channel=record.get("channel"),
        learn=tuple(job for _, job in record.get("learn") or ()),
        unregistered=tuple(record.get("unregistered") or ()),
        texts=tuple(
            ft.LinkTexts(
                link=link,
                request=t.get("request"),
                result=t.get("result"),
                pending=t.get("pending"),
            )
            for link, t in sorted(texts.items())
        ),
    )


# --- import ---------------------------------------------------------------------------------------


def chat_writes(
    c: ft.ChatSnapshot,
    keyring: Keyring,
    memory: MemoryStore,
    master: bytes,
    job_shards: dict[str, int],
) -> list[Write]:
    """The rows of one chat on its home shard, sealed with a new chat key: items, turns,
    confessions, enrichments and the chains rooted in it (fingerprints keyed with `master`'s
    key of the chain's org; `job_shards`: where each waiting learning job is now)."""
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
    for table, rows in ((CONFESSIONS.name, c.confessions), (ENRICHMENTS.name, c.enrichments)):
        per_turn: dict[str, int] = {}
        for r in rows:  # one key per record (a group's came from several shards)
            n = per_turn[r.turn] = per_turn.get(r.turn, -1) + 1
            key = f"{chat.id}\x00{r.turn}\x00{n}"
            sealed = cipher.seal(_enc.encode(r), aad(scope, f"{table}\x00{key}"))
            writes.append(Insert(table, (key, chat.id, r.turn, r.at, sealed)))
    for record in c.chains:
        writes.append(_chain_row(record, cipher, scope, master, job_shards))
    return writes


def _chain_row(
    record: ft.ChainRecord, cipher: Cipher, scope: str, master: bytes, job_shards: dict[str, int]
) -> Insert:
    chain = record.chain
    key = chain_fp_key(master, chain.org)

    def keyed(digest: str | None) -> str | None:
        return digest and collaboration.rekeyed(digest, key)

    links = tuple(
        msgspec.structs.replace(
            link,
            fingerprint=keyed(link.fingerprint) or "",
            result_fingerprint=keyed(link.result_fingerprint),
        )
        for link in chain.links
    )
    doc = {
        "chain": msgspec.structs.replace(chain, links=links),
        "channel": record.channel,
        "learn": [[job_shards[j], j] for j in record.learn if j in job_shards],
        "unregistered": list(record.unregistered),
    }
    texts = {
        t.link: {k: v for k, v in (("request", t.request), ("result", t.result),
                                   ("pending", t.pending)) if v is not None}
        for t in record.texts
    }  # fmt: skip
    sealed = cipher.seal(_enc.encode(texts), aad(scope, f"chain\x00{chain.id}"))
    # The columns a shard reads chains by without loading them all, set as a shard sets them
    # (actors/chats/chain_rows.py): `live` marks the rows a start has work for.
    live = (
        (chain.status == ChainStatus.RUNNING and bool(collaboration.open_links(chain)))
        or bool(doc["learn"])
        or bool(record.unregistered)
    )
    row = (chain.id, chain.org, _enc.encode(doc).decode(), sealed)
    row += (chain.status, chain.owner, record.channel, chain.topic, chain.created_at, live)
    return Insert(CHAINS.name, row)


def request_row(record: ft.RequestRecord, cipher: Cipher) -> Insert:
    """A request on its bot's shard, its proposal sealed with the bot's (new) pool key."""
    request = record.request
    pool = f"bot:{request.bot}"
    sealed = cipher.seal(record.proposal.encode(), aad(pool, f"request\x00{request.id}"))
    return Insert(REQUESTS.name, (request.id, request.bot, _enc.encode(request).decode(), sealed))


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


def stale_rows(
    pools: Iterable[str], chats: Iterable[str], snapshots: Iterable[ft.ChatSnapshot] = ()
) -> list[DeleteWhere]:
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
    snapshots = list(snapshots)
    chains = tuple(sorted(r.chain.id for c in snapshots for r in c.chains))
    requests = tuple(sorted(r.request.id for c in snapshots for r in c.requests))
    out += [DeleteWhere(CHAINS.name, "id", chains), DeleteWhere(REQUESTS.name, "id", requests)]
    return [d for d in out if d.values]
