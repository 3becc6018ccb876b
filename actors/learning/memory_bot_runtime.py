"""The memory bot's runtime on a shard: which model, how many tasks at once, how much it may
spend (MB-1 … MB-6), and the two quick answers it gives inside a turn — the confessor's reply to
`confide` and the input rewrite — each bounded by 15 s including the wait for a slot (MB-4).

Only usage the provider confirmed is charged; an answer without usage is counted apart as
unknown (MB-6). A shared bot's memory bot has one budget for every org it works in; each call is
counted in the pool's total (what the budget checks) and in the total of the chat's org
(`org_spend_key`), so what each org spent can be shown. Model calls never happen under a pool
lock (ACL-9).

A budget is reserved before a call and settled after it, so concurrent calls cannot all pass
one check and overshoot together: in its slot, a call takes a reservation in the same
synchronous stretch as it checks what was spent and what other calls of the pool hold, and
gives it back once its real cost is charged (or it failed). A reservation is the largest cost a
call of the pool has had, or the whole rest of the budget while no cost is known yet. A call
that does not fit beside the calls in flight waits for them (within its timeout) and checks
again; one that finds the budget spent is refused (`BudgetSpent`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import msgspec

from actors.models.registry import Model, ModelError, measured
from actors.runtime.lock_guard import assert_no_pool_lock
from engine.errors import OpenBotError
from engine.memory_bot_settings import MemoryBotSettings, current_periods, period_key
from engine.models import Completion, Message, ToolSpec, cost_micros
from engine.turns import ANSWER_WAIT, CALM_ANSWER, REWRITE, confessor_messages
from storage.chat_store import ChatStore, ModelCall
from storage.group_commit import GroupCommitter

_enc = msgspec.json.Encoder()


def org_spend_key(pool: str, org: str) -> str:
    """Where one org's part of a pool's spend is counted (never checked against a budget)."""
    return f"{pool}\x00org:{org}"


class BudgetSpent(OpenBotError):
    code = "budget_spent"


class _Held:
    """What the calls in flight of one pool have reserved of its budget period."""

    def __init__(self) -> None:
        self.micros = 0
        self.calls = 0
        self.settled = asyncio.Event()  # replaced after each settle: waiters check again


class MemoryBotRuntime:
    def __init__(
        self,
        *,
        models: Mapping[str, Model],
        chats: ChatStore,
        committer: GroupCommitter,
        clock: Callable[[], int],
        answer_wait: float = ANSWER_WAIT,
    ) -> None:
        self.answer_wait = answer_wait
        self.models = models
        self.chats = chats
        self.committer = committer
        self.clock = clock
        self._slots: dict[str, tuple[int, asyncio.Semaphore]] = {}
        # (pool, period) → spend, of the current periods only (`_keep_current`): earlier ones
        # are on disk and no budget asks about them again.
        self._spent: dict[tuple[str, str], tuple[int, int]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._current: frozenset[str] = frozenset()
        self._held: dict[tuple[str, str], _Held] = {}  # (pool, period) -> reservations
        self._largest: dict[str, int] = {}  # pool -> the largest cost one call had
        self.waiting = 0  # calls waiting for others' reservations to settle (tests, metrics)

    def model(self, name: str | None) -> Model | None:
        return self.models.get(name) if name else None

    @asynccontextmanager
    async def slot(self, pool: str, settings: MemoryBotSettings):
        """A concurrency slot of this pool's memory bot on this server (null: no limit)."""
        if settings.concurrency is None:
            yield
            return
        size, sem = self._slots.get(pool, (0, None))  # type: ignore[assignment]
        if sem is None or size != settings.concurrency:
            sem = asyncio.Semaphore(settings.concurrency)
            self._slots[pool] = (settings.concurrency, sem)
        async with sem:
            yield

    def _keep_current(self) -> None:
        """Forget the spend of periods that ended (unless not yet written: `spend_rows`)."""
        current = current_periods(self.clock())
        if current == self._current:
            return
        self._current = current
        for key in [k for k in self._spent if k[1] not in current and k not in self._dirty]:
            del self._spent[key]

    def stats(self) -> dict[str, int]:
        """How many (pool, period) spend totals memory holds (shard stats)."""
        return {"spend_entries": len(self._spent)}

    async def _spend(self, pool: str, period: str) -> tuple[int, int]:
        self._keep_current()
        key = (pool, period)
        if key not in self._spent:
            loaded = await self.chats.spend(pool, period)
            # Another call may have loaded and charged it meanwhile: its total stands.
            self._spent.setdefault(key, loaded)
        return self._spent[key]

    async def check_budget(self, pool: str, settings: MemoryBotSettings) -> None:
        if settings.budget is None:
            return
        period = period_key(settings.budget.period, self.clock())
        micros, _ = await self._spend(pool, period)
        if micros >= settings.budget.limitMicros:
            raise BudgetSpent("the memory bot's budget for this period is spent")

    async def _reserve(self, pool: str, settings: MemoryBotSettings) -> tuple[str, int] | None:
        """Reserve budget for one call (None: no budget); `BudgetSpent` once it is spent."""
        if settings.budget is None:
            return None
        limit = settings.budget.limitMicros
        while True:
            period = period_key(settings.budget.period, self.clock())
            # From the totals to the reservation nothing awaits: the check and the hold are one
            # step, whichever calls of the pool run at once.
            micros, _ = await self._spend(pool, period)
            if micros >= limit:
                raise BudgetSpent("the memory bot's budget for this period is spent")
            held = self._held.get((pool, period))
            largest = self._largest.get(pool)
            need = limit - micros if largest is None else largest
            if held is None or held.calls == 0 or micros + held.micros + need <= limit:
                if held is None:
                    held = self._held[(pool, period)] = _Held()
                held.micros += need
                held.calls += 1
                return period, need
            self.waiting += 1
            try:
                await held.settled.wait()
            finally:
                self.waiting -= 1

    def _settle(self, pool: str, reserved: tuple[str, int] | None) -> None:
        """Give back a reservation (after the call's cost was charged, or it failed)."""
        if reserved is None:
            return
        period, micros = reserved
        held = self._held.get((pool, period))
        if held is None:
            return
        held.micros -= micros
        held.calls -= 1
        held.settled.set()
        held.settled = asyncio.Event()
        if held.calls == 0:
            del self._held[(pool, period)]

    async def charge(
        self,
        pool: str,
        settings: MemoryBotSettings,
        model: Model,
        done: Completion,
        org: str | None = None,
    ) -> int | None:
        """Count the cost of a call in every period a budget may ask about, for the pool and
        for `org` (the chat's). The totals go to disk with the caller's next write
        (`spend_rows`), not in a transaction of their own."""
        cost = cost_micros(done.usage, model.price)
        if cost is not None and cost > self._largest.get(pool, -1):
            self._largest[pool] = cost
        counted = (pool,) if org is None else (pool, org_spend_key(pool, org))
        for period in ("day", "month"):
            key = period_key(period, self.clock())
            for where in counted:
                micros, unknown = await self._spend(where, key)
                if cost is None:
                    unknown += 1
                else:
                    micros += cost
                self._spent[(where, key)] = (micros, unknown)
                self._dirty.add((where, key))
        return cost

    async def totals(self, pool: str) -> list[tuple[str, int, int]]:
        """(period, confirmed micros, calls with unknown usage) of the current day and month,
        counting what was charged but not yet written (MB-6)."""
        out = []
        for period in ("day", "month"):
            key = period_key(period, self.clock())
            micros, unknown = await self._spend(pool, key)
            out.append((key, micros, unknown))
        return out

    async def org_totals(self, pool: str, orgs: Sequence[str]) -> list[dict[str, int]]:
        """Confirmed micros of each org in `orgs`, for the current day and month in the order
        of `totals`."""
        return [
            {o: (await self._spend(org_spend_key(pool, o), key))[0] for o in orgs}
            for key in (period_key(p, self.clock()) for p in ("day", "month"))
        ]

    def spend_rows(self) -> list:
        """Rows for the spend counted since the last call (include them in a batch)."""
        rows = [self.chats.spend_row(p, k, *self._spent[(p, k)]) for p, k in self._dirty]
        for written in [k for k in self._dirty if k[1] not in self._current]:
            del self._spent[written]  # (its period ended before it was written)
        self._dirty.clear()
        return rows

    async def call(
        self,
        pool: str,
        settings: MemoryBotSettings,
        model: Model,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        *,
        timeout: float,
        log: list[ModelCall] | None = None,
        entries: Sequence[str] = (),
        org: str | None = None,
    ) -> Completion:
        """One budgeted model call in a slot; `timeout` covers the wait for the slot too. With
        `log`, the request and its result or error are added to it (the encrypted call log),
        with the ids of the memory `entries` the request was given. `org`: the chat's, whose
        part of the spend it is."""
        assert_no_pool_lock("a memory-bot model call")
        await self.check_budget(pool, settings)
        # Only a logged call keeps its request: a learning step's request is recorded apart,
        # and encoding it again (thousands of characters of JSON, every quote escaped) is waste.
        request = (
            "" if log is None else _enc.encode([msgspec.to_builtins(m) for m in messages]).decode()
        )

        reserved: tuple[str, int] | None = None

        async def run() -> Completion:
            nonlocal reserved
            async with self.slot(pool, settings):
                reserved = await self._reserve(pool, settings)
                return await measured(model, messages, tools, timeout=timeout)

        step = len(log) + 1 if log is not None else 0
        try:
            try:
                done = await asyncio.wait_for(run(), timeout)
            except BudgetSpent:
                raise  # the model was not asked
            except (TimeoutError, OpenBotError) as e:
                if log is not None:
                    error = repr(e)[:200]
                    log.append(
                        ModelCall(
                            step=step,
                            attempt=1,
                            request=request,
                            error=error,
                            entries=tuple(entries),
                        )
                    )
                if isinstance(e, TimeoutError):
                    raise ModelError(
                        "the memory bot did not answer in time", code="model_timeout"
                    ) from e
                raise
            cost = await self.charge(pool, settings, model, done, org)
        finally:
            self._settle(pool, reserved)
        if log is not None:
            response = _enc.encode(done).decode()
            log.append(
                ModelCall(
                    step=step,
                    attempt=1,
                    request=request,
                    response=response,
                    cost_micros=cost,
                    entries=tuple(entries),
                )
            )
        return done

    async def confessor_answer(
        self,
        pool: str,
        settings: MemoryBotSettings,
        model_name: str | None,
        text: str,
        log: list[ModelCall] | None = None,
        memory: Sequence[tuple[str, str]] = (),
        org: str | None = None,
    ) -> tuple[str, bool]:
        """The answer to `confide` and whether it is the fixed calm answer (LRN-2, MB-1/3/4).
        `memory`: (id, text) of the bot's entries the confession's reader may see; their ids
        go into the call's record."""
        model = self.model(model_name)
        if model is None:
            return CALM_ANSWER, True
        try:
            done = await self.call(
                pool,
                settings,
                model,
                confessor_messages(text, settings.instructions, memory),
                timeout=self.answer_wait,
                log=log,
                entries=[i for i, _ in memory],
                org=org,
            )
        except OpenBotError:
            return CALM_ANSWER, True
        answer = (done.text or "").strip()
        return (answer, False) if answer else (CALM_ANSWER, True)

    async def rewrite(
        self,
        pool: str,
        settings: MemoryBotSettings,
        model_name: str | None,
        messages: Sequence[Message],
        log: list[ModelCall] | None = None,
        org: str | None = None,
    ) -> Completion | None:
        """The enrichment call; None (input unchanged) on any failure or timeout (ENR, MB-4)."""
        model = self.model(model_name)
        if model is None:
            return None
        try:
            return await self.call(
                pool,
                settings,
                model,
                messages,
                (REWRITE,),
                timeout=self.answer_wait,
                log=log,
                org=org,
            )
        except OpenBotError:
            return None
