"""Request bodies of the HTTP API (DESIGN §9) as msgspec Structs, and their decoding.

Unknown fields are refused, so a typo is an error rather than a silently ignored option.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec

from engine.casing import camel_keys, fit
from engine.directory import BotRules, OrgSettings, Permission
from engine.errors import InvalidInput, TooLarge

MAX_BODY = 1024 * 1024
# JSON parsers and everything after them recurse per level: msgspec raises RecursionError near
# 1,000 levels (issue 12: a 500 and a reset connection). No body of this API needs more than a
# handful, so anything deeper is refused before any parser sees it.
MAX_DEPTH = 32
T = TypeVar("T")

_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"')  # possessive: linear on any input
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # as int8: +1 opens, -1 closes


def check_json(body: bytes | str, *, limit: int = MAX_BODY, depth: int = MAX_DEPTH) -> None:
    """Refuse a JSON text over `limit` bytes (TooLarge) or nested deeper than `depth`
    (InvalidInput `too_deep`), without parsing it. Brackets inside strings do not count; an
    unbalanced text is measured by its deepest prefix, as a parser would descend."""
    raw = body.encode() if isinstance(body, str) else body
    if len(raw) > limit:
        raise TooLarge(f"JSON over {limit} bytes", code="body_too_large")
    if raw.count(b"[") + raw.count(b"{") <= depth:
        return  # cannot be deeper than the number of its openers
    steps = _STRING.sub(b"", raw).translate(_STEP, _NOT_BRACKET)
    # numpy: ~100x a Python loop on a body of brackets. Imported here, on the rare body with
    # more openers than the limit, so that a gateway does not load it for nothing.
    import numpy as np

    levels = np.frombuffer(steps, dtype=np.int8).cumsum(dtype=np.int64)
    if levels.size and int(levels.max()) > depth:
        raise InvalidInput(f"JSON nested deeper than {depth} levels", code="too_deep")


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
    rounds: int | None = None
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


class Archive(_Body):
    archived: bool = True


class Backup(_Body):
    dir: str
    withKey: bool = False  # copy the master key too (left out by default: issue 12)


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
    except msgspec.DecodeError as e:
        raise InvalidInput(f"malformed JSON: {e}", code="invalid_json") from e
    # Old snake_case names (`request_id`) are still accepted: keys are normalised to camelCase.
    try:
        raw = camel_keys(raw) if kind is Any else fit(raw, kind)
        return msgspec.convert(raw, type=kind)
    except msgspec.ValidationError as e:
        raise InvalidInput(str(e), code="invalid_body") from e
