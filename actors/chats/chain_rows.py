"""A shard's stored chain rows (the `chains` table) and the reads that find them without loading
every chain: the chains a restart needs (`live`), one chain by id, one page of a person's
chains in listing order, and the chains of one turn. The columns beside `doc` repeat what those
reads filter and sort on, so no read decodes or decrypts a chain it does not return."""

from __future__ import annotations

from typing import Any

import msgspec

from engine.collaboration import Chain, ChainStatus, open_links
from engine.listing import chain_key
from storage.group_commit import Put
from storage.shard_schema import CHAINS

_enc = msgspec.json.Encoder()
_texts_dec = msgspec.json.Decoder(dict[str, dict[str, str]])


class Row(msgspec.Struct, frozen=True):
    """One decoded chain row (texts still sealed)."""

    chain: Chain
    channel: str | None
    learn: list[tuple[int, str]]
    unregistered: list[str]
    sealed: bytes


def under_way(chain: Chain) -> bool:
    """Running with a send not answered yet: a restart resumes it and a turn waits for it."""
    return chain.status == ChainStatus.RUNNING and bool(open_links(chain))


sort_key = chain_key  # the listing order (newest first), as a cursor names it


def row(
    chain: Chain,
    channel: str | None,
    learn: list[tuple[int, str]],
    unregistered: list[str],
    sealed: bytes,
) -> Put:
    doc = _enc.encode(
        {"chain": chain, "channel": channel, "learn": learn, "unregistered": unregistered}
    ).decode()
    # A restart reads only the rows it has work for: chains under way, and those that still
    # list learning jobs waiting for their turn or agent chats the directory may not have.
    live = under_way(chain) or bool(learn) or bool(unregistered)
    return Put(
        CHAINS.name,
        (
            chain.id,
            chain.org,
            doc,
            sealed,
            chain.status,
            chain.owner,
            channel,
            chain.topic,
            chain.created_at,
            live,
        ),
    )


def _decode(doc: str, sealed: bytes) -> Row:
    record = msgspec.json.decode(doc)
    return Row(
        chain=msgspec.convert(record["chain"], Chain),
        channel=record.get("channel"),
        learn=[(int(a), str(b)) for a, b in record.get("learn") or ()],
        unregistered=list(record.get("unregistered") or ()),
        sealed=sealed,
    )


def open_texts(opened: bytes) -> dict[str, dict[str, str]]:
    return _texts_dec.decode(opened)


async def live(db: Any) -> list[Row]:
    rows = await db.run(
        lambda con: con.execute("SELECT doc, texts FROM chains WHERE live").fetchall()
    )
    return [_decode(doc, sealed) for doc, sealed in rows]


async def one(db: Any, chain_id: str) -> Row | None:
    rows = await db.run(
        lambda con: con.execute("SELECT doc, texts FROM chains WHERE id = ?", [chain_id]).fetchall()
    )
    return _decode(*rows[0]) if rows else None


async def of_topic(db: Any, topic: str) -> list[str]:
    rows = await db.run(
        lambda con: con.execute("SELECT id FROM chains WHERE topic = ?", [topic]).fetchall()
    )
    return [r[0] for r in rows]


async def page(
    db: Any, user: str, channels: frozenset[str], after: str | None, limit: int
) -> list[Row]:
    """The first `limit` rows `user` may see (their own chains, their channels' chains) whose
    sort key is below `after`, in listing order (newest first)."""
    created, chain_id = (2**62, "") if after is None else _split(after)
    sql = (
        "SELECT doc, texts FROM chains WHERE (owner = ? OR list_contains(?::VARCHAR[], channel))"
        " AND (created_at < ? OR (created_at = ? AND id < ?))"
        " ORDER BY created_at DESC, id DESC LIMIT ?"
    )
    params = [user, sorted(channels), created, created, chain_id, limit]
    rows = await db.run(lambda con: con.execute(sql, params).fetchall())
    return [_decode(doc, sealed) for doc, sealed in rows]


def _split(key: str) -> tuple[int, str]:
    created, _, chain_id = key.partition("/")
    return (int(created) if created.isdigit() else 0), chain_id
