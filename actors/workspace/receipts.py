"""Workspace writes' requestId receipts on a shard.

Every workspace write takes a `requestId`: its receipt (the request's fingerprint and the
sealed answer) goes into the same group-commit batch as the change, so a repeat returns the
first answer and changes nothing, and the same id with another body is a conflict. Receipts are
kept per shard, keyed by the account and the requestId; writes queued but not yet committed are
remembered in memory so that a repeat arriving meanwhile waits for the first instead of doing it
again.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable, Sequence

from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel
from engine.errors import Conflict
from storage.memory_store import StoredPool
from storage.receipts import Receipts, receipt_key

RECEIPT_SCOPE = "ws"  # receipts of workspace writes: one requestId space per account and shard


class WorkspaceReceipts:
    def __init__(self, kernel: ShardKernel) -> None:
        self.kernel = kernel
        # Receipts queued but not yet committed: key -> (fingerprint, answer, commit).
        self._inflight: dict[str, tuple[str, bytes, asyncio.Future[None]]] = {}
        self._request_locks: dict[str, _Turn] = {}
        # Workspace receipt keys on disk (None: not read yet) and those queued before the read.
        self._known_receipts: set[str] | None = None
        self._known_loading: asyncio.Future[set[str]] | None = None
        self._queued_receipts: set[str] = set()

    def requests_in_flight(self) -> dict[str, tuple[bool, int]]:
        """Each receipt key a request holds or waits for: (whether it is held, how many hold
        or wait for it). A key nothing asks for is not listed (the table does not grow)."""
        return {key: (turn.held, turn.users) for key, turn in self._request_locks.items()}

    def request(self, key: str) -> _Held:
        """Requests with one receipt key run one at a time (whatever pool they touch), so two
        different bodies under one requestId cannot both pass the receipt check."""
        return _Held(self._request_locks, (key,))

    def requests(self, keys: Iterable[str]) -> _Held:
        """`request` for several keys at once (a coalesced call's), taken in sorted order as
        nested `request`s would take them, in one context."""
        return _Held(self._request_locks, sorted(set(keys)))

    def unseen(self, key: str) -> bool:
        """Whether no answer is queued or stored for this key, known without a read (what
        `replay` returns None for at once: the caller may skip it)."""
        known = self._known_receipts
        return known is not None and key not in known  # (queued keys are added to it)

    async def replay(self, key: str, print_: str, keyed: StoredPool) -> bytes | None:
        """The first answer to this request, or None when it is new (call under `request`)."""
        hit = self._inflight.get(key)
        if hit is not None:
            if hit[0] != print_:
                raise Conflict(
                    "this requestId was already used for a different request",
                    code="request_id_reused",
                )
            await asyncio.shield(hit[2])
            return hit[1]
        known = self._known_receipts  # (read once: no coroutine per write after that)
        if known is None:
            known = await self._receipt_keys()
        if key not in known:
            return None  # a new request id, the common case: no read of the receipts
        return await self.kernel.receipts.find(key, print_, keyed.cipher, keyed.pool)

    async def _receipt_keys(self) -> set[str]:
        """Every workspace receipt key stored on this shard, read once; keys of answers
        queued since are added as they are queued (`stage`)."""
        if self._known_receipts is None:
            if self._known_loading is None:
                self._known_loading = asyncio.ensure_future(
                    self.kernel.receipts.keys_with_prefix(receipt_key(RECEIPT_SCOPE, "", "x")[:3])
                )
            try:
                found = await asyncio.shield(self._known_loading)
            except BaseException:
                self._known_loading = None
                raise
            if self._known_receipts is None:
                self._known_receipts = found | self._queued_receipts
        return self._known_receipts

    def stage(
        self, batch: Batch, receipt: tuple[str, str, bytes, StoredPool]
    ) -> asyncio.Future[None]:
        """Stage a change with its receipt (and the pool's key while none is stored): a repeat
        arriving before the commit waits for it instead of doing the change again."""
        key, print_, answer, keyed = receipt
        return self.stage_all(batch, keyed, [(key, print_, answer)])

    def stage_all(
        self, batch: Batch, keyed: StoredPool, receipts: list[tuple[str, str, bytes]]
    ) -> asyncio.Future[None]:
        """`stage` for the changes of several requests to one pool in one batch (a coalesced
        call's, actors/workspace/create_batch.py): one commit, a receipt each."""
        batch.key(keyed)
        now = self.kernel.clock()
        for key, print_, answer in receipts:
            batch.add(Receipts.row(key, print_, answer, keyed.cipher, keyed.pool, now))
        fut = self.kernel.stage(batch)
        assert fut is not None  # the receipt rows are always there
        known = self._known_receipts if self._known_receipts is not None else self._queued_receipts
        for key, print_, answer in receipts:
            self._inflight[key] = (print_, answer, fut)
            known.add(key)

        def done(f: asyncio.Future[None]) -> None:
            for key, _, _ in receipts:
                if self._inflight.get(key, (None, None, None))[2] is f:
                    del self._inflight[key]

        fut.add_done_callback(done)
        return fut


class _Turn:
    """One receipt key's turn: held by one request at a time, the others queued in order. (Not
    an `asyncio.Lock` per key: a write takes a new key each time, and making, taking and
    dropping a lock for it cost more than its receipt check; a key nobody waits for needs no
    future.) Made held, by the request that asks for it first."""

    __slots__ = ("held", "users", "waiters")

    def __init__(self) -> None:
        self.held = True
        self.users = 1  # requests holding or waiting for it
        self.waiters: deque[asyncio.Future[None]] | None = None

    async def take(self) -> None:
        if not self.held:
            self.held = True
            return
        fut = asyncio.get_running_loop().create_future()
        if self.waiters is None:
            self.waiters = deque()
        self.waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.give()  # handed the turn as it was cancelled: hand it on
            else:
                self.waiters.remove(fut)
            raise

    def give(self) -> None:
        """Hand the turn to the first request still waiting (it stays held), else free it."""
        waiters = self.waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.held = False


class _Held:
    """`WorkspaceReceipts.request(s)`: the keys' turns taken in order on entry (each waited
    for while another request holds it), given back on exit, and a key's entry dropped once
    no request holds or waits for it. Cancelled while waiting: the turns taken so far are
    given back."""

    __slots__ = ("keys", "table", "taken")

    def __init__(self, table: dict[str, _Turn], keys: Sequence[str]) -> None:
        self.table = table
        self.keys = keys
        self.taken = 0

    async def __aenter__(self) -> None:
        table, keys = self.table, self.keys
        for at, key in enumerate(keys):
            turn = table.get(key)
            if turn is None:  # nobody's: taken at once (the common case, no await)
                table[key] = _Turn()
                self.taken = at + 1
                continue
            # Held by another request: this and every later key asked for (so each stays in
            # the table), then taken in order.
            turn.users += 1
            turns = [turn]
            for later in keys[at + 1 :]:
                other = table.get(later)
                if other is None:
                    other = table[later] = _Turn()
                    other.held = False
                else:
                    other.users += 1
                turns.append(other)
            try:
                for turn in turns:
                    await turn.take()
                    self.taken += 1
            except BaseException:
                self._leave()
                raise
            return

    async def __aexit__(self, *exc: object) -> None:
        self._leave()

    def _leave(self) -> None:
        table, taken = self.table, self.taken
        for at, key in enumerate(self.keys):
            turn = table[key]
            if at < taken:
                turn.give()
            turn.users -= 1
            if not turn.users:
                del table[key]
        self.taken = 0
