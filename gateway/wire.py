"""Request bodies of the HTTP API (docs/design.md §9) as msgspec Structs, and their decoding.

Unknown fields are refused, so a typo is an error rather than a silently ignored option.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, TypeVar

import msgspec

from engine.casing import camel_keys, fit
from engine.directory import BotRules, OrgSettings, Permission
from engine.discussion import MAX_ROUNDS
from engine.errors import InvalidInput, OutOfRange, TooLarge
from engine.numbers import bound_error, check_numbers, field_of

MAX_BODY = 1024 * 1024
# JSON parsers and everything after them recurse per level: msgspec raises RecursionError near
# 1,000 levels (a 500 and a reset connection). No body of this API needs more than a
# handful, so anything deeper is refused before any parser sees it.
MAX_DEPTH = 32
T = TypeVar("T")

_SLICE = 16 * 1024  # cumulative sums in slices that stay in the CPU cache
_QUOTE, _BACKSLASH = 0x22, 0x5C


def check_json(body: bytes | str, *, limit: int = MAX_BODY, depth: int = MAX_DEPTH) -> None:
    """Refuse a JSON text over `limit` bytes (TooLarge) or nested deeper than `depth`
    (InvalidInput `too_deep`), without parsing it. Brackets inside strings do not count; an
    unbalanced text is measured by its deepest prefix, as a parser would descend.

    This runs before a request is authorized, so its cost is linear in the text whatever the
    text holds: a fixed number of vector passes, no backtracking and no per-string work."""
    raw = body.encode() if isinstance(body, str) else body
    if len(raw) > limit:
        raise TooLarge(f"JSON over {limit} bytes", code="body_too_large")
    if raw.count(b"[") + raw.count(b"{") <= depth:
        return  # cannot be deeper than the number of its openers
    if _deepest(raw) > depth:
        raise InvalidInput(f"JSON nested deeper than {depth} levels", code="too_deep")


def _deepest(raw: bytes) -> int:
    """The deepest nesting of brackets outside strings.

    A quote opens or closes a string unless an odd run of backslashes stands before it. Outside a
    string a backslash is not JSON, and a parser stops there before it descends any further, so
    the rule needs no knowledge of where strings are to be right up to the first error. The text
    is read in slices that stay in the CPU cache, carrying the level, whether a string is open
    and the backslashes that end a slice."""
    # numpy: imported here, on the rare body with more openers than the limit, so that a
    # gateway does not load it for nothing.
    import numpy as np

    table = _step_table()
    whole = np.frombuffer(raw, dtype=np.uint8)
    deepest = level = trail = 0
    inside = False
    for offset in range(0, whole.size, _SLICE):
        text = whole[offset : offset + _SLICE]
        steps = table[text]
        quotes = np.flatnonzero(text == _QUOTE)
        slashes = np.flatnonzero(text == _BACKSLASH)
        run_start = slashes
        if slashes.size:  # where the run of backslashes each backslash belongs to starts
            starts_run = np.ones(slashes.size, dtype=bool)
            starts_run[1:] = slashes[1:] != slashes[:-1] + 1
            run_start = np.maximum.accumulate(np.where(starts_run, slashes, 0))
        if quotes.size:
            run = np.zeros(quotes.size, dtype=np.int64)  # backslashes right before each quote
            if slashes.size:
                before = np.searchsorted(slashes, quotes) - 1
                at = np.maximum(before, 0)
                touching = (before >= 0) & (slashes[at] == quotes - 1)
                run = np.where(touching, quotes - run_start[at], 0)
            run += np.where(run == quotes, trail, 0)  # a run that began in the slice before
            toggles = np.zeros(text.size, dtype=np.uint8)
            toggles[quotes[(run & 1) == 0]] = 1
            parity = np.bitwise_xor.accumulate(toggles).view(bool)
            if inside:
                parity = ~parity
            steps[parity] = 0
            inside = bool(parity[-1])
        elif inside:
            steps[:] = 0
        if slashes.size and slashes[-1] == text.size - 1:
            first = int(run_start[-1])
            trail = text.size - first + (trail if first == 0 else 0)
        else:
            trail = 0
        levels = steps.cumsum(dtype=np.int32)
        deepest = max(deepest, level + int(levels.max()))
        level += int(levels[-1])
    return deepest


@functools.cache
def _step_table() -> Any:
    import numpy as np

    table = np.zeros(256, dtype=np.int8)
    table[list(b"[{")], table[list(b"]}")] = 1, -1
    return table


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class CreateOrg(_Body):
    name: str
    id: str | None = None
    settings: OrgSettings | None = None


class PatchOrg(_Body):
    settings: dict[str, Any]


class CreateUser(_Body):
    name: str
    orgs: list[str]
    id: str | None = None


class CreateBot(_Body):
    name: str
    org: str
    owner: str
    id: str | None = None
    kind: str = "persistent"
    linked: bool = False
    model: str | None = None
    rules: BotRules | None = None
    avatar: str | None = None


class PatchBot(_Body):
    """`PATCH /v1/admin/bots/{id}`: absent fields stay; `model` and `avatar` may be null."""

    name: str | msgspec.UnsetType = msgspec.UNSET
    model: str | msgspec.UnsetType | None = msgspec.UNSET
    avatar: str | msgspec.UnsetType | None = msgspec.UNSET


class CreateGrant(_Body):
    bot: str
    user: str
    permission: Permission


class ShareBot(_Body):
    org: str


class CreateChannel(_Body):
    org: str
    people: list[str]
    bots: list[str]
    id: str | None = None
    name: str = ""
    mode: str = "discussion"
    leader: str | None = None


class CreateChat(_Body):
    bot: str | None = None
    channel: str | None = None
    project: str | None = None
    kind: str | None = None


class PatchChat(_Body):
    """A chat's current project (WS-7): a project id, or null to clear it."""

    project: str | None


class Remember(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag="Remember",
    tag_field="_tag",
):
    content: str
    tags: list[str] = []


class Forget(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
    tag="Forget",
    tag_field="_tag",
):
    id: str


class MemoryCommand(_Body):
    command: Remember | Forget
    requestId: str | None = None  # optional: a retry with the same id is answered, not redone


class Widen(_Body):
    """`POST /v1/bots/:botId/memory/:id/widen` (ACL-4): one grant tag to add. A `reason` may be
    given and is kept out of the check."""

    to: str
    reason: str = ""


class Purge(_Body):
    tag: str


class TurnBody(_Body):
    text: str
    rounds: Annotated[int, msgspec.Meta(ge=1, le=MAX_ROUNDS)] | None = None
    mentions: list[str] | None = None
    requestId: str | None = None


class Verdict(_Body):
    accepted: bool
    note: str = ""


class GroupMode(_Body):
    mode: str
    leader: str | None = None


class Decision(_Body):
    approved: bool
    note: str = ""


class OpenRequest(_Body):
    """A person's own request in a chat (ENR-3): what they propose, for the people the bot's
    tool would ask; `bot`: the group's bot to wake with the decision (a group's only bot when
    left out; a direct chat's bot)."""

    proposal: str
    title: str = ""
    bot: str | None = None


class Archive(_Body):
    archived: bool = True


class Backup(_Body):
    dir: str
    withKey: bool = False  # copy the master key too (left out by default)


class TreeImport(_Body):
    files: dict[str, str]  # the tree, as `GET /v1/admin/export` answers it
    joinOrgs: list[str] = []  # orgs the server holds already that the tree joins (--join-org)


class UserCreated(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    orgs: tuple[str, ...]
    token: str


def decode_any(body: bytes) -> Any:
    """A JSON body whose shape the engine checks itself."""
    return decode(body, Any)  # type: ignore[arg-type]


def decode(body: bytes, kind: type[T]) -> T:
    check_json(body)
    if not body.strip():
        raise InvalidInput("a JSON body is required", code="invalid_json")
    try:
        raw = msgspec.json.decode(body)
    except msgspec.ValidationError as e:  # a number no float holds (1e400)
        raise OutOfRange.of(field_of(e), "must be a finite number") from e
    except msgspec.DecodeError as e:
        raise InvalidInput(f"malformed JSON: {e}", code="invalid_json") from e
    check_numbers(raw)
    # Old snake_case names (`request_id`) are still accepted: keys are normalised to camelCase.
    return convert(camel_keys(raw) if kind is Any else fit(raw, kind), kind)


_memory_command = msgspec.json.Decoder(MemoryCommand)


def decode_memory_command(body: bytes) -> MemoryCommand:
    """`decode(body, MemoryCommand)`, a well-formed command in one pass: no field of it holds
    a number (nothing for `check_numbers` to refuse) and unknown keys are refused, so a body
    this takes reads the same either way; anything else (old snake_case names, an error to
    name) goes the general way."""
    try:
        return _memory_command.decode(body)
    except msgspec.DecodeError:
        return decode(body, MemoryCommand)


def convert(raw: Any, kind: type[T]) -> T:
    """A decoded JSON value as `kind`: a number outside its field's bounds is `OutOfRange`
    (422, the field named), any other mismatch `invalid_body`."""
    try:
        return msgspec.convert(raw, type=kind)
    except msgspec.ValidationError as e:
        raise bound_error(e) or InvalidInput(str(e), code="invalid_body") from e
