"""A service's calls answered by its features, from one table built into methods once.

An actor's service (the shard's, the directory's) is a facade over features it builds in its
`__init__`: most of its calls hand their arguments to one feature's method as they are. Instead
of one hand-written method per call, the service names in a table which feature answers each
call; `answered_by` turns the table into methods on the class, once, at import:

    answered_by(ShardService, {"memory": "remember forget", "chains": "collaborations:listing"},
                port=ShardPort)

A word is a call, answered by the feature's method of the same name, or `call:method`. Ray
hosts the class as it is: the methods are real functions, and a call the port declares carries
the port's signature (what Ray checks a caller's arguments against).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Mapping
from typing import Any


def routes(table: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """{call: (feature, method)} from a table {feature: "call call:method ..."}."""
    out: dict[str, tuple[str, str]] = {}
    for feature, words in table.items():
        for word in words.split():
            call, _, method = word.partition(":")
            if call in out:
                raise TypeError(f"{call} is answered twice ({out[call][0]} and {feature})")
            out[call] = (feature, method or call)
    return out


def answered_by(
    cls: type,
    table: Mapping[str, str],
    *,
    port: type | None = None,
    before: Callable[[Any], None] | None = None,
    before_calls: Collection[str] = (),
) -> None:
    """Give `cls` a method for each call of `table` (see the module's docstring). `before(self)`
    runs first in the calls named in `before_calls`. `cls.answered_by` keeps the table as
    {call: (feature, method)}."""
    found = routes(table)
    if unknown := set(before_calls) - set(found):
        raise TypeError(f"before_calls not in the table: {sorted(unknown)}")
    cls.answered_by = {**getattr(cls, "answered_by", {}), **found}  # type: ignore[attr-defined]
    for call, (feature, method) in found.items():
        if call in vars(cls):
            raise TypeError(f"{cls.__name__}.{call} is defined and in the table")
        hook = before if call in before_calls else None
        setattr(cls, call, _handing_on(cls, call, feature, method, port, hook))


def _handing_on(
    cls: type,
    call: str,
    feature: str,
    method: str,
    port: type | None,
    before: Callable[[Any], None] | None,
) -> Callable[..., Any]:
    async def handed_on(self: Any, *args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(self)
        return await getattr(getattr(self, feature), method)(*args, **kwargs)

    handed_on.__name__ = call
    handed_on.__qualname__ = f"{cls.__name__}.{call}"
    handed_on.__module__ = cls.__module__
    handed_on.__doc__ = f"Answered by `self.{feature}.{method}`."
    declared = getattr(port, call, None) if port is not None else None
    if declared is not None:
        handed_on.__signature__ = inspect.signature(declared)  # type: ignore[attr-defined]
    return handed_on
