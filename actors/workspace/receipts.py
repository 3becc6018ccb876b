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
import contextlib
from collections.abc import Iterable

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
        self._request_locks: dict[str, list] = {}
        # Workspace receipt keys on disk (None: not read yet) and those queued before the read.
        self._known_receipts: set[str] | None = None
        self._known_loading: asyncio.Future[set[str]] | None = None
        self._queued_receipts: set[str] = set()

    def requests_in_flight(self) -> dict[str, tuple[bool, int]]:
        """Each receipt key a request holds or waits for: (whether it is held, how many hold
        or wait for it). A key nothing asks for is not listed (the table does not grow)."""
        return {key: (slot[0].locked(), slot[1]) for key, slot in self._request_locks.items()}

    @contextlib.asynccontextmanager
    async def request(self, key: str):
        """Requests with one receipt key run one at a time (whatever pool they touch), so two
        different bodies under one requestId cannot both pass the receipt check."""
        slot = self._request_locks.setdefault(key, [asyncio.Lock(), 0])
        slot[1] += 1
        try:
            async with slot[0]:
                yield
        finally:
            slot[1] -= 1
            if slot[1] == 0:
                del self._request_locks[key]

    @contextlib.asynccontextmanager
    async def requests(self, keys: Iterable[str]):
        """`request` for several keys at once (a coalesced call's), taken in sorted order as
        nested `request`s would take them, in one context (one per key cost a coalesced
        creation more than its receipt check)."""
        locks = self._request_locks
        slots = []
        for key in sorted(set(keys)):
            slot = locks.setdefault(key, [asyncio.Lock(), 0])
            slot[1] += 1
            slots.append((key, slot))
        taken = 0
        try:
            for _, slot in slots:
                await slot[0].acquire()
                taken += 1
            yield
        finally:
            for at, (key, slot) in enumerate(slots):
                if at < taken:
                    slot[0].release()
                slot[1] -= 1
                if slot[1] == 0:
                    del locks[key]

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
