"""Projects (WS-7, docs/design.md §4): who belongs, which groups are linked, and how a project
changes.

A project exists on its own, with members (user ids) and linked channels. Its id never changes,
whatever happens to its name. Two rules keep project memory from leaking to outsiders:

- every person of a linked channel must already be a project member: linking a channel with
  people outside the project is refused, and so is removing a member who is a person of a channel
  that stays linked;
- the owner is always a member.

Leaving a group does not leave the project: channel membership never changes project membership.

Only members read a project (and its memory pool `project:<id>`) and only members change it.
Changes carry `expectedRevision` (WA-2): a stale one changes nothing and reports the current
revision. `requestId` receipts (idempotency) are kept by the caller, not here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

import msgspec

from engine.casing import camel_keys
from engine.directory import check_id
from engine.errors import Conflict, Forbidden, InvalidInput, NotFound
from engine.numbers import RevisionNumber

MAX_NAME_CHARS = 200
MAX_MEMBERS = 500
MAX_CHANNELS = 100
MAX_METADATA_KEYS = 64
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 2_000
# A client's idempotency key: any printable ASCII without spaces (UUIDs, ULIDs, counters).
REQUEST_ID_RE = re.compile(r"^[\x21-\x7e]{1,128}$")


class Project(msgspec.Struct, frozen=True, kw_only=True):
    """The stored project. New fields get defaults so stored rows stay readable."""

    id: str
    org: str
    owner: str
    name: str
    metadata: dict[str, str] = {}
    members: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    revision: int = 1
    created_at: int = 0
    updated_at: int = 0


class ProjectCreate(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /api/app/workspace/projects` without `expectedRevision` (docs/design.md §9).

    `id`, when given, is the account's own key for the project: the project's id is derived
    from it and the account (the answer carries it), so no create reveals another account's
    project ids."""

    requestId: str
    name: str
    id: str | None = None
    members: list[str] = []
    channels: list[str] = []
    metadata: dict[str, str] = {}


class ProjectChange(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /api/app/workspace/projects` with `id` and `expectedRevision`; absent fields stay.

    `members`, `channels` and `metadata` replace the whole value when given.
    """

    requestId: str
    id: str
    expectedRevision: RevisionNumber
    name: str | None = None
    members: list[str] | None = None
    channels: list[str] | None = None
    metadata: dict[str, str] | None = None


class ProjectView(msgspec.Struct, frozen=True, kw_only=True):
    """The public project format; times in epoch milliseconds."""

    id: str
    org: str
    owner: str
    name: str
    metadata: dict[str, str]
    members: tuple[str, ...]
    channels: tuple[str, ...]
    revision: int
    createdAt: int
    updatedAt: int


def view(project: Project) -> ProjectView:
    return ProjectView(
        id=project.id,
        org=project.org,
        owner=project.owner,
        name=project.name,
        metadata=dict(project.metadata),
        members=project.members,
        channels=project.channels,
        revision=project.revision,
        createdAt=project.created_at,
        updatedAt=project.updated_at,
    )


def decode_request(body: bytes) -> ProjectCreate | ProjectChange:
    """One route takes both shapes; `expectedRevision` is what makes a body a change.

    msgspec cannot tell untagged object unions apart, so the body is read once as a dict and then
    converted to the one shape it claims to be.
    """
    try:
        raw = camel_keys(msgspec.json.decode(body))  # old snake_case names accepted
    except msgspec.DecodeError as e:
        raise InvalidInput(f"body is not JSON: {e}", code="invalid_json") from e
    if not isinstance(raw, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_body")
    kind: type[ProjectCreate | ProjectChange] = (
        ProjectChange if "expectedRevision" in raw else ProjectCreate
    )
    try:
        return msgspec.convert(raw, type=kind)
    except msgspec.ValidationError as e:
        raise InvalidInput(str(e), code="invalid_body") from e


# --- reading --------------------------------------------------------------------------------------


def can_read(project: Project, user: str) -> bool:
    """Members read the project and its memory; nobody else, whatever their org or channels."""
    return user in project.members


def require_read(project: Project | None, user: str) -> Project:
    """The project if `user` may read it; otherwise not found, so outsiders learn nothing of it."""
    if project is None or not can_read(project, user):
        raise NotFound("no such project", code="project_not_found")
    return project


def pool(project_id: str) -> str:
    return f"project:{project_id}"


def missing_members(project_members: Iterable[str], people: Iterable[str]) -> tuple[str, ...]:
    """People of a channel who are not project members, sorted; empty when the channel may link.

    Also for the caller adding a person to a channel that is linked to projects.
    """
    members = set(project_members)
    return tuple(sorted({p for p in people if p not in members}))


# --- validation -----------------------------------------------------------------------------------


def check_request_id(value: str) -> str:
    if not isinstance(value, str) or not REQUEST_ID_RE.match(value):
        raise InvalidInput(
            "requestId must be 1-128 printable characters without spaces", code="invalid_request_id"
        )
    return value


def _name(value: str) -> str:
    name = value.strip()
    if not 1 <= len(name) <= MAX_NAME_CHARS:
        raise InvalidInput(
            f"name must be 1-{MAX_NAME_CHARS} characters (surrounding spaces do not count)",
            code="invalid_name",
        )
    return name


def _ids(values: Iterable[str], what: str, limit: int) -> tuple[str, ...]:
    out = tuple(dict.fromkeys(check_id(v, what) for v in values))
    if len(out) > limit:
        raise InvalidInput(f"at most {limit} {what}s", code=f"too_many_{what}s")
    return out


def _metadata(values: Mapping[str, str]) -> dict[str, str]:
    if len(values) > MAX_METADATA_KEYS:
        raise InvalidInput(f"at most {MAX_METADATA_KEYS} metadata keys", code="invalid_metadata")
    for key, value in values.items():
        if not 1 <= len(key) <= MAX_METADATA_KEY_CHARS or len(value) > MAX_METADATA_VALUE_CHARS:
            raise InvalidInput(
                f"metadata keys are 1-{MAX_METADATA_KEY_CHARS} characters and values at most "
                f"{MAX_METADATA_VALUE_CHARS}",
                code="invalid_metadata",
            )
    # Sorted so that equal metadata compares and exports the same however the client ordered it.
    return dict(sorted(values.items()))


def _check_links(
    members: Sequence[str],
    channels: Sequence[str],
    *,
    newly_linked: Iterable[str],
    removed_members: Iterable[str],
    channel_people: Mapping[str, Sequence[str]],
) -> None:
    for channel in newly_linked:
        people = channel_people.get(channel)
        if people is None:
            raise NotFound(f"no such channel {channel!r}", code="channel_not_found")
        missing = missing_members(members, people)
        if missing:
            raise Conflict(
                f"channel {channel!r} has people who are not project members: "
                f"{', '.join(missing)}; add them to the project first",
                code="channel_members_not_in_project",
                details={"channel": channel, "people": list(missing)},
            )
    removed = set(removed_members)
    if not removed:
        return
    for channel in channels:
        # A channel the caller no longer knows (deleted) has nobody left to protect.
        stuck = sorted(removed.intersection(channel_people.get(channel, ())))
        if stuck:
            raise Conflict(
                f"{', '.join(stuck)} cannot leave the project while in linked channel "
                f"{channel!r}; unlink the channel or remove them from it first",
                code="member_in_linked_channel",
                details={"channel": channel, "people": stuck},
            )


# --- creating and changing ------------------------------------------------------------------------


def create_project(
    request: ProjectCreate,
    *,
    new_id: str,
    org: str,
    owner: str,
    channel_people: Mapping[str, Sequence[str]],
    now: int,
) -> Project:
    """A new project owned by `owner`, who is made a member whether listed or not.

    `new_id` is used unless the request names an id. `channel_people` maps each channel of the
    caller's org that the request may link to the people in it; a channel missing from it is not
    found. The caller checks that the members exist and belong to the org.
    """
    check_request_id(request.requestId)
    project_id = check_id(request.id if request.id is not None else new_id, "project id")
    members = _ids([owner, *request.members], "member", MAX_MEMBERS)
    channels = _ids(request.channels, "channel", MAX_CHANNELS)
    name = _name(request.name)
    metadata = _metadata(request.metadata)
    _check_links(
        members,
        channels,
        newly_linked=channels,
        removed_members=(),
        channel_people=channel_people,
    )
    return Project(
        id=project_id,
        org=org,
        owner=owner,
        name=name,
        metadata=metadata,
        members=members,
        channels=channels,
        created_at=now,
        updated_at=now,
    )


def change_project(
    project: Project,
    change: ProjectChange,
    *,
    actor: str,
    channel_people: Mapping[str, Sequence[str]],
    now: int,
) -> Project:
    """The project after `actor`'s change, revision + 1; the same object if nothing changed.

    Checked in this order, so that outsiders learn nothing and a stale client keeps its draft:
    the actor is a member (else Forbidden), the revision is current (else Conflict
    `stale_revision` with `currentRevision`), the fields are valid, the link rules hold.
    `channel_people` must cover the channels newly linked and, when members are removed, the
    channels that stay linked. The id never changes, whatever the name becomes.
    """
    check_request_id(change.requestId)
    if change.id != project.id:
        raise InvalidInput("the change names another project", code="wrong_project")
    if not can_read(project, actor):
        raise Forbidden("only project members may change a project", code="not_a_member")
    if change.expectedRevision != project.revision:
        raise Conflict(
            f"the project is at revision {project.revision}, not {change.expectedRevision}",
            code="stale_revision",
            details={"currentRevision": project.revision},
        )
    name = project.name if change.name is None else _name(change.name)
    metadata = project.metadata if change.metadata is None else _metadata(change.metadata)
    members = (
        project.members if change.members is None else _ids(change.members, "member", MAX_MEMBERS)
    )
    if project.owner not in members:
        raise InvalidInput("the owner is always a member", code="owner_is_member")
    channels = (
        project.channels
        if change.channels is None
        else _ids(change.channels, "channel", MAX_CHANNELS)
    )
    _check_links(
        members,
        channels,
        newly_linked=[c for c in channels if c not in project.channels],
        removed_members=[m for m in project.members if m not in members],
        channel_people=channel_people,
    )
    if (name, metadata, members, channels) == (
        project.name,
        project.metadata,
        project.members,
        project.channels,
    ):
        # Nothing to store and no event to send; a retried request sees the same revision.
        return project
    return msgspec.structs.replace(
        project,
        name=name,
        metadata=metadata,
        members=members,
        channels=channels,
        revision=project.revision + 1,
        updated_at=now,
    )
