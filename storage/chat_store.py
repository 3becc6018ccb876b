"""Chats' items and turns, confessions, enrichments, learning jobs and the model call log on a
shard's file.

Item texts, confessions, enrichment records and model calls are sealed (SEC-1): items,
confessions and enrichments with the chat's data key (kept in `pools` under `chat:<id>`), model
calls with the memory pool's key; a turn's document (with a verdict's note) with the chat's key.
Jobs and read positions hold ids and numbers only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from engine.chat_records import AttemptRecord, Confession, Enrichment, LearningJob, Turn
from storage.crypto import Cipher, aad
from storage.database import ReadScope
from storage.group_commit import Delete, DeleteWhere, Insert, Put, Write
from storage.memory_store import MemoryStore, StoredPool, pool_scope
from storage.sealed_doc import is_sealed, open_doc, seal_doc
from storage.shard_schema import (
    CHAT_ITEMS,
    COMMUNICATIONS,
    CONFESSIONS,
    ENRICHMENTS,
    LEARN_OUTBOX,
    LEARN_POSITIONS,
    LEARNING_JOBS,
    MODEL_CALLS,
    MODEL_SPEND,
    TURNS,
)


class Item(msgspec.Struct, frozen=True, kw_only=True):
    """A chat item without its text. `id` is `i-<seq>`."""

    chat: str
    seq: int
    turn: str | None
    kind: str  # person | bot | notification | tool_result | delivery
    author: str
    at: int

    @property
    def id(self) -> str:
        return f"i-{self.seq}"


class ModelCall(msgspec.Struct, frozen=True, kw_only=True):
    """One recorded model step: what was asked and what came back (or the error)."""

    step: int
    attempt: int
    request: str
    response: str | None = None
    cost_micros: int | None = None
    error: str | None = None
    # The memory entries the request was given, each checked for the reader it answers.
    entries: tuple[str, ...] = ()


_enc = msgspec.json.Encoder()
_job_dec = msgspec.json.Decoder(LearningJob)
_turn_dec = msgspec.json.Decoder(Turn)
# A turn stored as running with no task to end it (read again from the file).
INTERRUPTED = "interrupted: the server restarted, or the turn's end could not be stored"
_conf_dec = msgspec.json.Decoder(Confession)
_enr_dec = msgspec.json.Decoder(Enrichment)
_call_dec = msgspec.json.Decoder(ModelCall)


def call_record(call: ModelCall) -> bytes:
    """A model call as stored (sealed): its JSON without the request, a newline, then the
    request as it is. Inside the JSON the request (thousands of characters, itself JSON) would
    be escaped character by character on every write; the JSON encoder never writes a raw
    newline, so the first one ends the record's JSON."""
    head = _enc.encode(msgspec.structs.replace(call, request=""))
    return b"\n".join((head, call.request.encode()))


def open_call(plain: bytes) -> ModelCall:
    """`call_record` read back; a record with the request inside its JSON (no newline) as
    well."""
    head, newline, request = plain.partition(b"\n")
    call = _call_dec.decode(head)
    return msgspec.structs.replace(call, request=request.decode()) if newline else call


@dataclass
class ChatLog:
    """A chat as its shard holds it: sealed item texts, in order."""

    chat: str
    key: StoredPool
    items: list[Item] = field(default_factory=list)
    sealed: dict[int, bytes] = field(default_factory=dict)
    turns: dict[str, Turn] = field(default_factory=dict)
    committed: int = 0  # items up to this seq are on disk; later ones belong to a running turn
    plain_turns: list[str] = field(default_factory=list)  # stored unsealed by an older version
    # seq → (direction, peer bot) of items that are real bot-to-bot deliveries (UI-1).
    comms: dict[int, tuple[str, str]] = field(default_factory=dict)

    @property
    def cipher(self) -> Cipher:
        return self.key.cipher

    @property
    def next_seq(self) -> int:
        return self.items[-1].seq + 1 if self.items else self._floor + 1

    _floor: int = 0  # the last seq ever used (items may have been deleted)


class ChatStore:
    def __init__(self, memory: MemoryStore) -> None:
        self.memory = memory
        self.db = memory.db

    def new(self, chat: str) -> ChatLog:
        """The log of a chat that has nothing stored yet (its caller knows: a delivery's new
        agent chat), with a new key and without reading the database."""
        cipher, wrapped = self.memory.keyring.new_pool_key(f"chat:{chat}")
        key = StoredPool(pool=f"chat:{chat}", cipher=cipher, wrapped_key=wrapped)
        return ChatLog(chat=chat, key=key)

    async def load(self, chat: str) -> ChatLog:
        pool = f"chat:{chat}"

        def read(con):
            # One trip to the database thread; a new chat (no key row yet) reads nothing more.
            rows = self.memory.read_rows(con, pool, only_if_keyed=True)
            if not rows[0]:
                return rows, [], [], []
            items = con.execute(
                "SELECT seq, turn, kind, author, payload, at_ms FROM chat_items WHERE chat = ? "
                "ORDER BY seq",
                [chat],
            ).fetchall()
            turns = con.execute("SELECT id, meta FROM turns WHERE chat = ?", [chat]).fetchall()
            comms = con.execute(
                "SELECT seq, direction, peer FROM communications WHERE chat = ?", [chat]
            ).fetchall()
            return rows, items, turns, comms

        rows, items, turns, comms = await self.db.run(
            read,
            (
                *pool_scope(pool),
                ReadScope(CHAT_ITEMS.name, "chat", (chat,)),
                ReadScope(TURNS.name, "chat", (chat,)),
                ReadScope(COMMUNICATIONS.name, "chat", (chat,)),
            ),
        )
        key = self.memory.from_rows(pool, *rows)
        log = ChatLog(chat=chat, key=key)
        log._floor = key.version  # the chat key row's version counts items ever written
        for seq, turn, kind, author, payload, at in items:
            log.items.append(Item(chat=chat, seq=seq, turn=turn, kind=kind, author=author, at=at))
            log.sealed[seq] = payload
        log.committed = log.items[-1].seq if log.items else 0
        log.comms = {seq: (direction, peer) for seq, direction, peer in comms}
        scope = f"chat:{chat}"
        for turn_id, meta in turns:
            t = _turn_dec.decode(open_doc(log.cipher, scope, TURNS.name, turn_id, meta))
            if not is_sealed(meta):
                log.plain_turns.append(t.id)
            if t.status == "running":  # the process ended during it, or its end failed to store
                t = msgspec.structs.replace(t, status="failed", error=INTERRUPTED)
            log.turns[t.id] = t
        return log

    def text(self, log: ChatLog, seq: int) -> str:
        return log.cipher.open(log.sealed[seq], aad(f"chat:{log.chat}", f"i-{seq}")).decode()

    def add_items(self, log: ChatLog, new: list[tuple[Item, str]]) -> list[Write]:
        writes: list[Write] = []
        for item, text in new:
            sealed = log.cipher.seal(text.encode(), aad(f"chat:{log.chat}", item.id))
            log.items.append(item)
            log.sealed[item.seq] = sealed
            key = f"{log.chat}\x00{item.seq}"
            row = (key, log.chat, item.seq, item.turn, item.kind, item.author, sealed, item.at)
            writes.append(Insert(CHAT_ITEMS.name, row))
        if new:
            log._floor = max(log._floor, new[-1][0].seq)
            writes.append(self.memory.pool_row(log.key, log._floor, log.key.settings))
        return writes

    @staticmethod
    def delete_items(log: ChatLog) -> list[Write]:
        """The rows that delete the history (API-5: what was learned from it stays); the log
        in memory is cleared by `clear_items` once they committed."""
        return [
            DeleteWhere(CHAT_ITEMS.name, "chat", (log.chat,)),
            DeleteWhere(COMMUNICATIONS.name, "chat", (log.chat,)),
        ]

    @staticmethod
    def clear_items(log: ChatLog) -> None:
        log.items.clear()
        log.sealed.clear()
        log.comms.clear()

    @staticmethod
    def communication_row(log: ChatLog, seq: int, direction: str, peer: str) -> Insert:
        """Mark item `seq` as a real delivery between bots (UI-1): only the chain runner, which
        made the delivery, writes these; an item's wording never does."""
        log.comms[seq] = (direction, peer)
        row = (f"{log.chat}\x00{seq}", log.chat, seq, direction, peer)
        return Insert(COMMUNICATIONS.name, row)

    def put_turn(self, log: ChatLog, turn: Turn) -> Put | Insert:
        op = Put if turn.id in log.turns else Insert  # a new row needs no delete first
        log.turns[turn.id] = turn
        # Sealed: a delivery verdict's note is the person's own words.
        meta = seal_doc(log.cipher, f"chat:{log.chat}", TURNS.name, turn.id, _enc.encode(turn))
        row = (turn.id, turn.chat, turn.operator, turn.status, meta, turn.at)
        return op(TURNS.name, row)

    def _record(self, table, log: ChatLog, turn: str, at: int, record, n: int) -> Insert:
        key = f"{log.chat}\x00{turn}\x00{n}"
        sealed = log.cipher.seal(_enc.encode(record), aad(f"chat:{log.chat}", f"{table}\x00{key}"))
        return Insert(table, (key, log.chat, turn, at, sealed))

    def confession_row(self, log: ChatLog, c: Confession, n: int) -> Insert:
        return self._record(CONFESSIONS.name, log, c.turn, c.at, c, n)

    def enrichment_row(self, log: ChatLog, e: Enrichment) -> Insert:
        return self._record(ENRICHMENTS.name, log, e.turn, e.at, e, 0)

    async def records(self, table: str, log: ChatLog) -> list:
        dec = _conf_dec if table == CONFESSIONS.name else _enr_dec
        rows = await self.db.run(
            lambda con: con.execute(
                f"SELECT key, payload FROM {table} WHERE chat = ? ORDER BY at_ms, key", [log.chat]
            ).fetchall()
        )
        return [
            dec.decode(log.cipher.open(p, aad(f"chat:{log.chat}", f"{table}\x00{k}")))
            for k, p in rows
        ]

    # --- learning jobs, positions, model calls, spend ---

    def job_row(self, job: LearningJob, *, new: bool = False) -> Put | Insert:
        op = Insert if new else Put
        if job.attemptRecords:
            job = msgspec.structs.replace(job, attemptRecords=[])
        return op(LEARNING_JOBS.name, (job.id, job.pool, job.chat, _enc.encode(job).decode()))

    async def open_jobs(self, *, deferred: bool = False) -> list[LearningJob]:
        """Jobs to run after a restart; `deferred` ones wait for a collaboration (CO-2) and are
        released by it, so they are listed only when asked for."""
        rows = await self.db.run(
            lambda con: con.execute("SELECT doc FROM learning_jobs").fetchall()
        )
        jobs = [_job_dec.decode(doc) for (doc,) in rows]
        wanted = ("deferred",) if deferred else ("pending", "running", "waiting")
        return [j for j in jobs if j.status in wanted]

    async def jobs(self, pool: str) -> list[LearningJob]:
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT doc FROM learning_jobs WHERE pool = ?", [pool]
            ).fetchall()
        )
        return sorted((_job_dec.decode(d) for (d,) in rows), key=lambda j: (j.created_at, j.id))

    async def position(self, pool: str, chat: str) -> int:
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT seq FROM learn_positions WHERE key = ?", [f"{pool}\x00{chat}"]
            ).fetchall()
        )
        return rows[0][0] if rows else 0

    @staticmethod
    def position_row(pool: str, chat: str, seq: int) -> Put:
        return Put(LEARN_POSITIONS.name, (f"{pool}\x00{chat}", pool, chat, seq))

    async def model_calls(self, stored: StoredPool, job: str) -> list[tuple[int, ModelCall]]:
        """Every recorded attempt of a job's model steps, oldest first, with when it was stored
        (LRN-4: a failed attempt keeps its record; a later one never overwrites it)."""
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT key, at_ms, payload FROM model_calls WHERE job = ?", [job]
            ).fetchall()
        )
        calls = [
            (at, open_call(stored.cipher.open(p, aad(stored.pool, f"call\x00{k}"))))
            for k, at, p in rows
        ]
        return sorted(calls, key=lambda c: (c[1].step, c[1].attempt, c[0]))

    async def attempt_records(self, stored: StoredPool, job: str) -> list[AttemptRecord]:
        return [
            AttemptRecord(
                step=c.step,
                attempt=c.attempt,
                at=at,
                outcome="failed" if c.response is None else "answered",
                error=c.error,
                costMicros=c.cost_micros,
            )
            for at, c in await self.model_calls(stored, job)
        ]

    async def model_call(self, stored: StoredPool, job: str, step: int) -> ModelCall | None:
        """The latest attempt of `step` that got an answer (recovery reuses it, LRN-4)."""
        answered = [
            c for _, c in await self.model_calls(stored, job) if c.step == step and c.response
        ]
        return answered[-1] if answered else None

    @staticmethod
    def model_call_row(stored: StoredPool, job: str, call: ModelCall, at: int) -> Put:
        # One row per attempt: rows written before attempts were kept apart (`job\x00step`)
        # still read back, since the record itself carries its step and attempt.
        key = f"{job}\x00{call.step}\x00{call.attempt}"
        sealed = stored.cipher.seal(call_record(call), aad(stored.pool, f"call\x00{key}"))
        return Put(MODEL_CALLS.name, (key, job, at, sealed))

    @staticmethod
    def outbox_row(stored: StoredPool, job: str, payload: bytes, at: int) -> Put:
        """Facts a learning step staged for other pools (LRN-5), sealed with the bot's pool key:
        stored in the commit that moves the read position, deleted once their pools hold them."""
        sealed = stored.cipher.seal(payload, aad(stored.pool, f"outbox\x00{job}"))
        return Put(LEARN_OUTBOX.name, (job, stored.pool, at, sealed))

    @staticmethod
    def outbox_done(job: str) -> Delete:
        return Delete(LEARN_OUTBOX.name, job)

    async def outbox(self) -> list[tuple[str, str, bytes]]:
        """Every staged fact set not yet applied: (job, bot pool, sealed payload)."""
        rows = await self.db.run(
            lambda con: con.execute("SELECT job, pool, payload FROM learn_outbox").fetchall()
        )
        return [(j, p, bytes(b)) for j, p, b in rows]

    @staticmethod
    def open_outbox(stored: StoredPool, job: str, sealed: bytes) -> bytes:
        return stored.cipher.open(sealed, aad(stored.pool, f"outbox\x00{job}"))

    async def spend(self, pool: str, period: str) -> tuple[int, int]:
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT micros, unknown FROM model_spend WHERE key = ?", [f"{pool}\x00{period}"]
            ).fetchall()
        )
        return (rows[0][0], rows[0][1]) if rows else (0, 0)

    @staticmethod
    def spend_row(pool: str, period: str, micros: int, unknown: int) -> Put:
        return Put(MODEL_SPEND.name, (f"{pool}\x00{period}", pool, period, micros, unknown))
