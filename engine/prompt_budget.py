"""Packing the three memory scopes into one prompt budget (SC-5).

One budget of 16,000 characters covers everything memory adds to a prompt: the instructions, a
heading per scope that contributes, and each entry's line with its source marker. Entries go in
whole or not at all:

1. `profile` entries first, taking one from each scope in turn (bot, user, project) — round
   robin, newest first inside a scope — so every scope with a profile gets a say early;
2. then `log` entries, scope by scope, the scope updated most recently first, newest first;
3. `note` entries are never packed: they are found by `workspace_memory_search`.

An entry that does not fit is left out and the next ones are still tried; what is left out stays
stored and searchable. When not everything fits, the entries the turn's input finds (`first`,
ranked by the one memory search) are offered before rules 1-2. Pure: the caller passes entries
with their content, already filtered to what the reader may see.
"""

from __future__ import annotations

import datetime
import functools
import operator
from collections.abc import Iterable, Sequence
from itertools import groupby

import msgspec

BUDGET = 16_000
SCOPES = ("bot", "user", "project")
HEADINGS = {"bot": "## Bot memory", "user": "## What the user told you", "project": "## Project"}


class ScopedEntry(msgspec.Struct, frozen=True, kw_only=True, dict=True):
    id: str
    scope: str  # bot | user | project
    tier: str  # profile | log | note
    content: str
    updated_at: int  # epoch ms
    source: str = ""  # the source marker, e.g. "bot:b_1" or "project:p_1 · b_2"

    @functools.cached_property
    def prompt_line(self) -> str:
        """Its prompt line (`line`), made once per entry: a reader keeps an entry's
        `ScopedEntry` while the entry is unchanged, and every turn packs it again."""
        return line(self)

    @functools.cached_property
    def prompt_cost(self) -> int:
        """Its line's length and a newline."""
        return len(self.prompt_line) + 1


class Packed(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    included: tuple[str, ...]
    omitted: tuple[str, ...]
    overflow: bool = False  # a profile or log entry did not fit


DAY_MS = 86_400_000
_ID = operator.attrgetter("id")
_LINE = operator.attrgetter("prompt_line")
_COST = operator.attrgetter("prompt_cost")
_SCOPE_TIER = operator.attrgetter("scope", "tier")
PACKED = ("profile", "log")  # the tiers a prompt packs
_UPDATED = operator.attrgetter("updated_at")


@functools.lru_cache(maxsize=1024)
def _day(day: int) -> str:
    """The UTC date of day number `day` since the epoch (a prompt's lines share a few)."""
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day)).isoformat()


def line(entry: ScopedEntry) -> str:
    """`- (YYYY-MM-DD) content [source]`, the memory line of FS-2 plus its source marker."""
    marker = f" [{entry.source}]" if entry.source else ""
    return f"- ({_day(entry.updated_at // DAY_MS)}) {entry.content}{marker}"


def _newest_first(entries: Iterable[ScopedEntry]) -> list[ScopedEntry]:
    # By (-updated_at, id) as two stable sorts on plain attributes (no key tuple per entry):
    # a prompt packs every turn.
    by_id = sorted(entries, key=_ID)
    return sorted(by_id, key=_UPDATED, reverse=True)


class Prepared:
    """Entries grouped by scope and tier, each group in its packing order, with what packing
    them all would cost: made once, then asked whether they overflow and packed."""

    def __init__(self, entries: Sequence[ScopedEntry]) -> None:
        self.entries = entries
        profiles: dict[str, list[ScopedEntry]] = {s: [] for s in SCOPES}
        logs: dict[str, list[ScopedEntry]] = {s: [] for s in SCOPES}
        # A scope's latest update among what can be packed (None: nothing).
        latest: dict[str, int | None] = dict.fromkeys(SCOPES)
        need = 0  # the lines of every profile and log entry, with their headings
        self.unpacked = False  # whether any entry is of a tier never packed
        # Grouped by sorting (stable: each group keeps the entries' order) and summed in C:
        # a prompt packs every turn.
        for (scope, tier), group in groupby(sorted(entries, key=_SCOPE_TIER), key=_SCOPE_TIER):
            if tier not in PACKED:
                self.unpacked = True
            if scope not in latest or tier == "note":
                continue  # (notes are never packed)
            members = list(group)
            newest, last = max(map(_UPDATED, members)), latest[scope]
            if last is None or newest > last:
                latest[scope] = newest
            if tier == "profile":
                profiles[scope] = _newest_first(members)
            elif tier == "log":
                logs[scope] = _newest_first(members)
            else:
                continue
            need += sum(map(_COST, members))
        for scope in SCOPES:
            if profiles[scope] or logs[scope]:
                need += len(HEADINGS[scope]) + 2  # the heading, a blank line before it
        self.profiles, self.logs, self.latest, self.need = profiles, logs, latest, need

    def order(self) -> list[ScopedEntry]:
        """The order in which entries are offered to the budget (rules 1-3)."""
        profiles, logs, latest = self.profiles, self.logs, self.latest
        order: list[ScopedEntry] = []
        rounds = max(len(v) for v in profiles.values())
        for k in range(rounds):  # round robin, one profile from each scope in turn
            order.extend(profiles[scope][k] for scope in SCOPES if k < len(profiles[scope]))
        for scope in sorted(SCOPES, key=lambda s: (-(latest[s] or 0), SCOPES.index(s))):
            order.extend(logs[scope])
        return order

    def overflows(self, *, instructions: str = "", budget: int = BUDGET) -> bool:
        """Whether `pack` leaves a profile or log entry out (`Packed.overflow`): exactly when
        all of them and their headings together exceed the budget (packing takes every entry
        that fits, so when all fit, all are taken)."""
        return len(instructions) + self.need > budget

    def pack(
        self, *, instructions: str = "", budget: int = BUDGET, first: Sequence[str] = ()
    ) -> Packed:
        """See `pack`."""
        entries = self.entries
        if not self.overflows(instructions=instructions, budget=budget):
            return self._whole(instructions)
        order = self.order()
        if first:
            ranked = {e.id: e for e in entries}
            head = [ranked[i] for i in dict.fromkeys(first) if i in ranked]
            seen = {e.id for e in head}
            order = head + [e for e in order if e.id not in seen]
        return _pack(entries, order, instructions, budget)

    def _whole(self, instructions: str) -> Packed:
        """Everything packed (it all fits): each scope's profiles, then its logs."""
        parts = [instructions] if instructions else []
        for scope in SCOPES:
            chosen = self.profiles[scope] + self.logs[scope]
            if chosen:
                lines = "\n".join(map(_LINE, chosen))
                parts.append(f"\n{HEADINGS[scope]}\n{lines}\n")
        omitted = [e.id for e in self.entries if e.tier not in PACKED] if self.unpacked else ()
        text = "".join(parts)
        included = tuple(map(_ID, self.order()))
        return Packed(text=text, included=included, omitted=tuple(omitted), overflow=False)


def candidate_order(entries: Sequence[ScopedEntry]) -> list[ScopedEntry]:
    """The order in which entries are offered to the budget (rules 1-3)."""
    return Prepared(entries).order()


def pack(
    entries: Sequence[ScopedEntry],
    *,
    instructions: str = "",
    budget: int = BUDGET,
    first: Sequence[str] = (),
) -> Packed:
    """The memory part of a prompt within `budget` characters, whole entries only; `first`
    (entry ids, best first) goes before the rest when not everything fits."""
    return Prepared(entries).pack(instructions=instructions, budget=budget, first=first)


def overflows(
    entries: Sequence[ScopedEntry], *, instructions: str = "", budget: int = BUDGET
) -> bool:
    """Whether `pack` leaves a profile or log entry out (`Packed.overflow`), without packing."""
    return Prepared(entries).overflows(instructions=instructions, budget=budget)


def _pack(
    entries: Sequence[ScopedEntry],
    order: Sequence[ScopedEntry],
    instructions: str,
    budget: int,
) -> Packed:
    used = len(instructions)
    chosen: dict[str, list[str]] = {s: [] for s in SCOPES}  # lines
    included: list[str] = []
    omitted: list[str] = [e.id for e in entries if e.tier not in ("profile", "log")]
    overflow = False
    for entry in order:
        if entry.tier not in ("profile", "log"):
            continue  # a note found by the input is still for `workspace_memory_search`
        if entry.scope not in chosen:
            omitted.append(entry.id)
            continue
        text = entry.prompt_line
        cost = len(text) + 1  # the line and its newline
        if not chosen[entry.scope]:
            cost += len(HEADINGS[entry.scope]) + 2  # the heading, a blank line before it
        if used + cost > budget:
            omitted.append(entry.id)
            overflow = True
            continue
        used += cost
        chosen[entry.scope].append(text)
        included.append(entry.id)
    parts = [instructions] if instructions else []
    for scope in SCOPES:
        if chosen[scope]:
            parts.append(
                "\n" + HEADINGS[scope] + "\n" + "".join(text + "\n" for text in chosen[scope])
            )
    text = "".join(parts)
    assert len(text) <= budget, "packing accounted for every character"
    return Packed(text=text, included=tuple(included), omitted=tuple(omitted), overflow=overflow)
