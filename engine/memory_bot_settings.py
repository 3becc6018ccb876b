"""Settings of a bot's memory bot (MB-2) and how a PATCH changes them."""

from __future__ import annotations

import datetime

import msgspec

from engine.errors import Conflict, InvalidInput

MAX_INSTRUCTIONS_CHARS = 8_000


class Budget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    period: str
    limitMicros: int


class MemoryBotSettings(msgspec.Struct, frozen=True, kw_only=True):
    version: int = 0
    instructions: str = ""
    concurrency: int | None = None
    budget: Budget | None = None


class SpendView(msgspec.Struct, frozen=True, kw_only=True):
    """What the memory bot's calls cost in one budget period (MB-6): `micros` is the cost the
    provider confirmed with its usage; a call answered without usage is not guessed at but
    counted in `unknownCalls`."""

    period: str  # day:YYYY-MM-DD | month:YYYY-MM (UTC)
    micros: int
    unknownCalls: int
    # Confirmed micros by the org of the chat each call served (a shared bot works in several;
    # `micros`, their sum, is what the one budget checks).
    orgs: dict[str, int] = {}


class MemoryBotView(msgspec.Struct, frozen=True, kw_only=True):
    """The settings as `GET /v1/bots/:botId/memory/bot` shows them, with the current day's and
    month's spend (read only; a PATCH never carries it)."""

    version: int = 0
    instructions: str = ""
    concurrency: int | None = None
    budget: Budget | None = None
    spend: tuple[SpendView, ...] = ()


def view(settings: MemoryBotSettings, spend: tuple[SpendView, ...]) -> MemoryBotView:
    return MemoryBotView(**msgspec.structs.asdict(settings), spend=spend)


_UNSET = msgspec.UNSET


class SettingsPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    expected: int
    instructions: str | msgspec.UnsetType = _UNSET
    concurrency: int | msgspec.UnsetType | None = _UNSET
    budget: Budget | msgspec.UnsetType | None = _UNSET


def apply_patch(current: MemoryBotSettings, patch: SettingsPatch) -> MemoryBotSettings:
    """The new settings, version + 1; a stale `expected` is a conflict (nothing changes)."""
    if patch.expected != current.version:
        raise Conflict(
            f"settings are at version {current.version}, not {patch.expected}",
            code="version_mismatch",
        )
    changes: dict[str, object] = {"version": current.version + 1}
    if patch.instructions is not _UNSET:
        if len(patch.instructions) > MAX_INSTRUCTIONS_CHARS:
            raise InvalidInput("instructions are too long", code="invalid_settings")
        changes["instructions"] = patch.instructions
    if patch.concurrency is not _UNSET:
        if patch.concurrency is not None and not 1 <= patch.concurrency <= 1024:
            raise InvalidInput("concurrency must be 1-1024 or null", code="invalid_settings")
        changes["concurrency"] = patch.concurrency
    if patch.budget is not _UNSET:
        budget = patch.budget
        if budget is not None and (budget.period not in ("day", "month") or budget.limitMicros < 0):
            raise InvalidInput(
                "budget needs period day|month and limitMicros >= 0", code="invalid_settings"
            )
        changes["budget"] = budget
    return msgspec.structs.replace(current, **changes)


# --- budget periods (MB-2, MB-3): UTC days and months, computed from a time the caller passes ---


def _utc(now_ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(now_ms / 1000, datetime.UTC)


def period_key(period: str, now_ms: int) -> str:
    """The spend bucket `now_ms` falls in: `day:YYYY-MM-DD` or `month:YYYY-MM` (UTC)."""
    day = _utc(now_ms)
    return f"day:{day:%Y-%m-%d}" if period == "day" else f"month:{day:%Y-%m}"


def current_periods(now_ms: int) -> frozenset[str]:
    """Every spend bucket a budget may ask about at `now_ms` (the day's and the month's): a
    runtime keeps only these in memory, so its map does not grow with the days it has run."""
    return frozenset(period_key(p, now_ms) for p in ("day", "month"))


def next_period_start(period: str, now_ms: int) -> int:
    """When the budget period after the one holding `now_ms` begins, in epoch ms (MB-3: a job
    stopped by the budget runs again then)."""
    t = _utc(now_ms)
    if period == "day":
        start = datetime.datetime(t.year, t.month, t.day, tzinfo=datetime.UTC)
        start += datetime.timedelta(days=1)
    else:
        year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
        start = datetime.datetime(year, month, 1, tzinfo=datetime.UTC)
    return int(start.timestamp() * 1000)
