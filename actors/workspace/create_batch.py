"""Many workspace memory creations from one coalesced call: each keeps its own answer,
a pool's share is one commit.

As for Remember (actors/shard/remember_batch.py): a gateway sends the creations its clients make
of one shard while its previous call is in flight as ONE call (actors/runtime/coalesce.py). Here
they are checked each on its own, then decided one pool at a time, in order, under ONE hold of
the pool's lock (and of their requestIds' locks, taken in sorted order before it, as a single
creation takes its own before the pool's), and the records, revisions, events and receipts of
every one that passes go into ONE batch: one commit.

Each request is answered as `Workspace.create_memory` would answer it alone: a malformed call,
no access, a bad requestId or a requestId reused for another body fails that request only (all
decided before anything of it is applied); a repeat, earlier in the same call included, gets
the first answer and writes nothing. A commit that fails fails exactly the requests whose rows
it carried (the pool is dropped and reloads from the file).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from actors.contracts import WORKSPACE_CREATE_CALL, WorkspaceAccess
from actors.shard.batch import Batch
from actors.shard.kernel import durable
from actors.shard.remember_batch import Answer, failed
from actors.workspace.pools import WorkspacePool
from actors.workspace.service import Workspace
from engine.errors import Conflict, InvalidInput, OpenBotError, Unavailable
from engine.scoped_memory import WorkspaceMemoryCreate
from storage.group_commit import Write
from storage.term_keys import in_context

_json = msgspec.json.Encoder()


class _Request:
    __slots__ = ("access", "answer", "at", "body", "key", "own", "print_")

    def __init__(
        self, at: int, access: WorkspaceAccess, body: WorkspaceMemoryCreate, key: str, print_: str
    ):
        self.at = at
        self.access = access
        self.body = body
        self.key = key
        self.print_ = print_
        self.answer: bytes | None = None  # the record as JSON: receipt and reply alike
        self.own = False  # answered by this call's commit (else a replay of a committed one)


async def create_all(ws: Workspace, calls: Sequence[bytes]) -> list[Answer]:
    """Answer each packed `WorkspaceCreateCall` (the record as JSON: the HTTP body) or say why
    not."""
    answers: list[Answer | None] = [None] * len(calls)
    by_pool: dict[str, list[_Request]] = {}
    # The last caller checked and the pool it may write to: a call's requests mostly come
    # from one caller to one pool, checked once (nothing is awaited between two requests).
    passed: tuple[WorkspaceAccess, tuple, str] | None = None
    for at, raw in enumerate(calls):
        try:
            call = WORKSPACE_CREATE_CALL.decode(raw)
            access, body = call.access, call.body
            target = (body.scope, body.bot, body.project)
            if passed is not None and passed[1] == target and passed[0] == access:
                key, print_ = ws.create_receipt(access, body)
                pool_id = passed[2]
            else:
                pool_id, key, print_ = await ws.create_check(access, body)
                passed = (access, target, pool_id)
        except msgspec.DecodeError as e:
            answers[at] = InvalidInput(f"bad workspace write: {e}", code="invalid_body")
        except Exception as e:
            answers[at] = failed(e)
        else:
            by_pool.setdefault(pool_id, []).append(
                _Request(at, call.access, call.body, key, print_)
            )
    for pool_id, requests in by_pool.items():
        for request, answer in await _create_in_pool(ws, pool_id, requests):
            answers[request.at] = answer
    return [a if a is not None else Unavailable("unanswered") for a in answers]


async def _create_in_pool(
    ws: Workspace, pool_id: str, requests: list[_Request]
) -> list[tuple[_Request, Answer]]:
    try:
        pool = await ws.pools.pool(pool_id)
    except Exception as e:
        error = failed(e)
        return [(r, error) for r in requests]
    refused: list[tuple[_Request, Answer]] = []
    decided: list[_Request] = []
    fut: asyncio.Future[None] | None = None
    async with ws.receipts.requests([r.key for r in requests]), pool.lock, _Gathering(pool):
        batch = Batch()
        mine: dict[str, _Request] = {}  # requestIds first answered by this call
        for request in requests:
            try:
                if not _decide_now(ws, pool, request, batch, mine):
                    await _decide(ws, pool, request, batch, mine)
            except Exception as e:
                refused.append((request, failed(e)))
                if not isinstance(e, OpenBotError):
                    # A bug may have left this request half applied: nothing of the call is
                    # staged, the pool reloads from the file, and the others fail with it.
                    ws.pools.drop(pool)
                    error = refused[-1][1]
                    gone = {id(r) for r, _ in refused}
                    return [*refused, *((r, error) for r in requests if id(r) not in gone)]
            else:
                decided.append(request)
        try:
            batch.extend(_gathered(ws, pool))
        except Exception as e:  # a bug: as in a request, nothing is staged and the pool reloads
            ws.pools.drop(pool)
            error = failed(e)
            return [*refused, *((r, error) for r in decided)]
        staged = [(r.key, r.print_, r.answer) for r in mine.values()]
        if staged:
            fut = ws.receipts.stage_all(batch, pool.keyed, staged)
            pool.pending = fut
            ws.pools.resident(pool)  # its size changed
    failure: OpenBotError | None = None
    if any(r.own for r in decided):  # one wait for the call's one commit, not one per request
        try:
            await durable(fut)
        except Exception as e:
            failure = failed(e)
    done: list[tuple[_Request, Answer]] = []
    for request in decided:
        answer = failure if request.own and failure is not None else request.answer
        assert answer is not None
        done.append((request, answer))
    return [*refused, *done]


def _decide_now(
    ws: Workspace, pool: WorkspacePool, request: _Request, batch: Batch, mine: dict[str, _Request]
) -> bool:
    """Decide a request that needs no wait: asked before in this call, or under a requestId
    no answer is queued or stored for (most). False: `_decide` it."""
    first = mine.get(request.key)
    if first is not None:  # asked twice in this call
        if first.print_ != request.print_:
            raise Conflict(
                "this requestId was already used for a different request",
                code="request_id_reused",
            )
        request.answer, request.own = first.answer, True
        return True
    if not ws.receipts.unseen(request.key):
        return False
    _create(ws, pool, request, batch, mine)
    return True


async def _decide(
    ws: Workspace, pool: WorkspacePool, request: _Request, batch: Batch, mine: dict[str, _Request]
) -> None:
    """A request whose requestId may have an answer: replayed, else created."""
    raw = await ws.receipts.replay(request.key, request.print_, pool.keyed)
    if raw is not None:  # answered by an earlier call, whose commit `replay` waited for
        request.answer = raw
        return
    _create(ws, pool, request, batch, mine)


def _create(
    ws: Workspace, pool: WorkspacePool, request: _Request, batch: Batch, mine: dict[str, _Request]
) -> None:
    edit, answer = ws.create_edit(pool, request.access, request.body)
    ws.change_batch(pool, edit, request.body.content, "created", new=True, into=batch)
    if not batch.on_failure:
        batch.fail(lambda: ws.pools.drop(pool))  # (the one hook for every request of the call)
    request.answer, request.own = _json.encode(answer), True
    mine[request.key] = request


class _Gathering:
    """Within, the keyword index and term rows of the pool's new records wait for `_gathered`
    (actors/workspace/pools.py `indexed`): each record of the call is indexed and stored once,
    with both its neighbours, instead of once alone and again when the next one comes. (A
    class: a generator-based context manager costs a call more.)"""

    __slots__ = ("pool",)

    def __init__(self, pool: WorkspacePool) -> None:
        self.pool = pool

    async def __aenter__(self) -> None:
        self.pool.gathering = {}

    async def __aexit__(self, *exc: object) -> None:
        self.pool.gathering = None


def _gathered(ws: Workspace, pool: WorkspacePool) -> list[Write]:
    """Index the call's new records (`_Gathering`); the rows that store their keys."""
    assert pool.gathering is not None
    terms = ws.pools.kernel.terms
    rows: list[Write] = []
    for entry_id, slot in pool.gathering.items():
        fp, own, before, after, further = slot[:5]
        if len(slot) > 5:  # a thread's record: its neighbours as the thread now orders them
            keys = ws.pools.thread_keys(pool, slot[5], entry_id, slot[6], own)
        else:
            keys = in_context(own, before, after, further)
        pool.index.put(entry_id, keys)
        rows.append(terms.row(pool.id, entry_id, fp, keys, pool.next_seq(), new=True))
    pool.gathering.clear()
    return rows
