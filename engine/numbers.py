"""Bounds on the numbers a client sends, in bodies and in query strings.

Every integer a request carries is bounded before it reaches a store, a Ray call or a loop: a
JSON number has no size limit of its own, and a Python int has none either, so an unbounded one
fails late (a 64-bit column, a msgpack frame) instead of being refused with its field named.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import msgspec

from engine.errors import OutOfRange

# Integers a JavaScript client can hold exactly; no count, revision or time of this API is larger.
MAX_SAFE = 2**53 - 1
_MAX_DIGITS = len(str(MAX_SAFE))

RevisionNumber = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE)]
WholeNumber = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE)]


def query_number(raw: str | None, *, field: str, low: int, high: int, default: int) -> int:
    """A whole number from a query string, `default` when absent, `low..high` inclusive."""
    if raw is None or raw == "":
        return default
    # isdigit alone admits other scripts' digits ("²") that int() refuses.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS):
        raise OutOfRange.of(field, f"must be a whole number {low}-{high}")
    value = int(raw)
    if not low <= value <= high:
        raise OutOfRange.of(field, f"must be a whole number {low}-{high}")
    return value


def check_numbers(value: Any, path: str = "$") -> None:
    """Refuse any integer beyond +/-MAX_SAFE or any non-finite float anywhere in a decoded
    JSON value (a body whose shape is checked later, field by field)."""
    stack = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, bool) or item is None or isinstance(item, str):
            continue
        if isinstance(item, int):
            if not -MAX_SAFE <= item <= MAX_SAFE:
                raise OutOfRange.of(_field(at), f"must be within +/-{MAX_SAFE}")
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise OutOfRange.of(_field(at), "must be a finite number")
        elif isinstance(item, dict):
            stack.extend((v, f"{at}.{k}") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))


def _field(path: str) -> str:
    return path.removeprefix("$.").removeprefix("$") or "body"


# msgspec's message for a value outside a `Meta(ge=..., le=...)` bound, and where it was.
_BOUND = re.compile(r"Expected `(?:int|float)` [<>]=? ")
_AT = re.compile(r" - at `\$\.?([^`]*)`$")


def field_of(error: msgspec.ValidationError) -> str:
    """The field a msgspec validation error names (`rounds`, `items[2].at`), or "body"."""
    found = _AT.search(str(error))
    return (found.group(1) if found else "") or "body"


def bound_error(error: msgspec.ValidationError) -> OutOfRange | None:
    """The `OutOfRange` a bound violation stands for; None for any other mismatch."""
    message = str(error)
    if not _BOUND.match(message):
        return None
    return OutOfRange.of(field_of(error), message.split(" - at ")[0])
