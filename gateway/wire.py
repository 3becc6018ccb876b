"""Request bodies of the HTTP API (DESIGN §9) as msgspec Structs, and their decoding.

Unknown fields are refused, so a typo is an error rather than a silently ignored option.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from engine.casing import camel_keys, fit
from engine.directory import BotRules, OrgSettings, Permission
from engine.errors import InvalidInput, TooLarge

MAX_BODY = 1024 * 1024
T = TypeVar("T")


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


class Backup(_Body):
    dir: str


class UserCreated(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    orgs: tuple[str, ...]
    token: str


def decode_any(body: bytes) -> Any:
    """A JSON body whose shape the engine checks itself."""
    return decode(body, Any)  # type: ignore[arg-type]


def decode(body: bytes, kind: type[T]) -> T:
    if len(body) > MAX_BODY:
        raise TooLarge(f"request body over {MAX_BODY} bytes", code="body_too_large")
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
