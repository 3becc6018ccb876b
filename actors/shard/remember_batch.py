"""Many Remembers from one coalesced call: each keeps its own answer, a pool's share
is one commit.

A gateway sends the Remembers its clients make of one shard while its previous call is in flight
as ONE call (actors/runtime/coalesce.py). Here they are decided in order, one pool at a time,
under ONE hold of the pool's exclusive lock, and the rows and events of every one that passes go
into ONE `Batch`, staged once: one group commit, one wake-up of the event pumps, instead of one
of each per Remember.

Each request is answered on its own, as `MemoryOps.remember` would answer it alone: a
malformed call, bad content or a reused requestId fails that request only (it is decided before
anything of it is applied, so it leaves nothing behind); a requestId seen before, earlier in the
same call included, gets the first answer and writes nothing. A commit that fails fails exactly
the requests whose rows it carried (the pool is dropped and reloads from the file, as for one
Remember); a replay of an earlier, committed request is still answered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import msgspec

from actors.contracts import RememberCall
from actors.shard.batch import Batch
from actors.shard.memory_ops import MemoryOps
from actors.shard.pool import Pool
from engine import commands
from engine.errors import InvalidInput, OpenBotError, Unavailable
from engine.memory_entries import EntryView, view
from storage.receipts import fingerprint, receipt_key

log = logging.getLogger("openbot")
_call_dec = msgspec.msgpack.Decoder(RememberCall)
_json = msgspec.json.Encoder()

Answer = bytes | OpenBotError


def failed(e: Exception) -> OpenBotError:
    """What a request's caller gets for an exception: the engine's own errors as themselves,
    anything else (a bug) as the `engine_error` a failed actor call gives."""
    if isinstance(e, OpenBotError):
        return e
    log.error("a coalesced request failed: %r", e, exc_info=e)
    return Unavailable("the engine failed to handle the request", code="engine_error")


class _Request:
    __slots__ = ("answer", "at", "call", "key", "own", "pending", "print_", "reply")

    def __init__(self, at: int, call: RememberCall) -> None:
        self.at = at
        self.call = call
        self.key = (
            None
            if call.request_id is None
            else receipt_key(call.pool, call.reader.user, call.request_id)
        )
        # Only a request with an id is ever compared with another (a receipt).
        self.print_ = (
            ""
            if self.key is None
            else fingerprint(("remember", call.reader.org, call.content, call.topics))
        )
        self.answer: EntryView | None = None
        self.reply: bytes | None = None  # the answer as JSON, once encoded
        # The commit the answer depends on: this call's own, or (a replay of a request
        # answered by an earlier call) the pool's pending one when it was read.
        self.own = False
        self.pending: asyncio.Future[None] | None = None


async def remember_all(memory: MemoryOps, calls: Sequence[bytes]) -> list[Answer]:
    """Answer each packed `RememberCall` (the entry as JSON, the HTTP body) or say why not."""
    answers: list[Answer | None] = [None] * len(calls)
    by_pool: dict[str, list[_Request]] = {}
    for at, raw in enumerate(calls):
        try:
            call = _call_dec.decode(raw)
            commands.validate_content(call.content)
            request = _Request(at, call)
        except msgspec.DecodeError as e:
            answers[at] = InvalidInput(f"not a packed Remember: {e}")
        except Exception as e:
            answers[at] = failed(e)
        else:
            by_pool.setdefault(call.pool, []).append(request)
    for requests in by_pool.values():
        # One pool after another: a pool's share is one commit (mostly one pool per call).
        for request, answer in await _remember_in_pool(memory, requests):
            answers[request.at] = answer
    return [a if a is not None else Unavailable("unanswered") for a in answers]


async def _remember_in_pool(
    memory: MemoryOps, requests: list[_Request]
) -> list[tuple[_Request, Answer]]:
    kernel = memory.kernel
    try:
        pool = await kernel.pool(requests[0].call.pool)
    except Exception as e:
        error = failed(e)
        return [(r, error) for r in requests]
    refused: list[tuple[_Request, Answer]] = []
    decided: list[_Request] = []
    batch = Batch()
    mine: set[str] = set()  # requestIds first answered by this call
    fut: asyncio.Future[None] | None = None
    async with pool.lock.exclusive():
        for request in requests:
            try:
                await _decide(memory, pool, request, batch, mine)
            except Exception as e:
                refused.append((request, failed(e)))
                if not isinstance(e, OpenBotError):
                    # A bug may have left this request half applied: nothing of the call is
                    # staged, the pool reloads from the file, and the others fail with it.
                    kernel.poison(pool)
                    error = refused[-1][1]
                    gone = {id(r) for r, _ in refused}
                    return [*refused, *((r, error) for r in requests if id(r) not in gone)]
            else:
                decided.append(request)
        if batch.writes:
            fut = kernel.stage(batch, pool)
    done: list[tuple[_Request, Answer]] = []
    # Each commit waited for once (the call's own, mostly all of them), however many depend on it.
    settled: dict[int, Exception | None] = {}
    for request in decided:
        wait = fut if request.own else request.pending
        if id(wait) not in settled:
            try:
                await kernel.settle(pool, wait, reads_state=False)
            except Exception as e:
                settled[id(wait)] = e
            else:
                settled[id(wait)] = None
        error = settled[id(wait)]
        if error is not None:
            done.append((request, failed(error)))
        elif request.reply is not None:
            done.append((request, request.reply))
        else:
            assert request.answer is not None
            done.append((request, _json.encode(request.answer)))
    return [*refused, *done]


async def _decide(
    memory: MemoryOps, pool: Pool, request: _Request, batch: Batch, mine: set[str]
) -> None:
    """`MemoryOps.remember` under the lock, with the rows and events going into `batch`.
    Everything that can refuse runs before anything is applied."""
    call, kernel = request.call, memory.kernel
    done = await memory.receipt(pool, request.key, request.print_)
    if done is not None:
        request.answer = done
        # Asked twice in this call: the first one's rows are in `batch`.
        request.own = request.key in mine
        request.pending = pool.pending
        return
    entry_id = kernel.new_id()
    outcome = commands.remember(
        pool=call.pool,
        entry_id=entry_id,
        reader=call.reader,
        topics=call.topics,
        now=kernel.clock(),
        version=pool.version,
    )
    sealed = {entry_id: kernel.store.seal_content(pool.stored, entry_id, call.content)}
    request.answer = view(outcome.upserts[0], call.content)
    request.reply = _json.encode(request.answer)  # the receipt's and the reply's bytes
    extra = memory.receipt_rows(pool, request.key, request.print_, request.answer, request.reply)
    kernel.stage_outcome(pool, outcome, sealed, extra, into=batch, texts={entry_id: call.content})
    request.own = True
    if request.key is not None:
        mine.add(request.key)
