"""Requests (approvals): something a bot proposes that a person must approve (ENR-3).

A bot proposes with its `workspace_request_approval` tool; the request keeps exactly what the
bot proposed and where (the chat, the turn, the person of that turn or the channel), never the
input the memory bot rewrote for it: a request and its review see only the proposal. A person
may open one too, in a chat where the bot's tool may (their own direct chat, a group of theirs),
for the same people to decide; it keeps the person's words as they wrote them. A person who may
see it decides once (approved or rejected), and may talk it over with the bot in a review chat,
which has no enrichment and no `confide`.

The decision wakes the bot in the chat the request came from: one step with the decision as
its input. `wake` is "due" from the decision's own commit until that step is stored, then
"done"; a request decided before wake-ups existed has none.

Pure: callers pass ids and times.
"""

from __future__ import annotations

import hashlib

import msgspec

from engine.errors import Conflict, InvalidInput

MAX_TITLE = 200
MAX_PROPOSAL = 8_000
MAX_NOTE = 4_000
STATUSES = ("pending", "approved", "rejected")


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A request as stored (the proposal's text is sealed apart)."""

    id: str
    bot: str
    org: str
    chat: str  # where the bot proposed it
    turn: str
    owner: str  # the person of that turn: they decide
    channel: str | None = None  # in a group chat, any person of the channel may decide
    title: str
    status: str = "pending"
    revision: int = 1
    createdAt: int
    updatedAt: int
    decidedBy: str | None = None
    note: str | None = None
    reviewChats: tuple[str, ...] = ()
    openedBy: str | None = None  # a person who opened it; None: the bot proposed it
    wake: str | None = None  # due | done (see the module's doc)


class RequestView(msgspec.Struct, frozen=True, kw_only=True):
    """A request as people see it: the stored fields and the proposal."""

    id: str
    bot: str
    org: str
    chat: str
    turn: str
    owner: str
    channel: str | None
    title: str
    proposal: str
    status: str
    revision: int
    createdAt: int
    updatedAt: int
    decidedBy: str | None
    note: str | None
    reviewChats: tuple[str, ...]
    openedBy: str | None = None
    wake: str | None = None


class Proposal(msgspec.Struct, frozen=True, kw_only=True):
    """The tool's arguments."""

    proposal: str
    title: str = ""


def parse_proposal(args: object) -> Proposal:
    try:
        proposal = msgspec.convert(args, Proposal)
    except msgspec.ValidationError as e:
        raise InvalidInput(f"invalid request: {e}", code="invalid_request") from e
    if not proposal.proposal.strip():
        raise InvalidInput("say what you propose", code="empty_proposal")
    if len(proposal.proposal) > MAX_PROPOSAL or len(proposal.title) > MAX_TITLE:
        raise InvalidInput(
            f"a proposal has at most {MAX_PROPOSAL} characters, a title {MAX_TITLE}",
            code="proposal_too_long",
        )
    return proposal


def new_request(
    *,
    request_id: str,
    bot: str,
    org: str,
    chat: str,
    turn: str,
    owner: str,
    channel: str | None,
    proposal: Proposal,
    now: int,
    opened_by: str | None = None,
) -> ApprovalRequest:
    title = proposal.title.strip() or proposal.proposal.strip().splitlines()[0][:80]
    return ApprovalRequest(
        id=request_id,
        bot=bot,
        org=org,
        chat=chat,
        turn=turn,
        owner=owner,
        channel=channel,
        title=title,
        createdAt=now,
        updatedAt=now,
        openedBy=opened_by,
    )


def may_see(request: ApprovalRequest, user: str, channels: frozenset[str]) -> bool:
    """The person of the turn; in a group, every person of the channel."""
    return request.owner == user or (request.channel is not None and request.channel in channels)


def decide(
    request: ApprovalRequest, *, user: str, approved: bool, note: str, now: int
) -> ApprovalRequest:
    """Approve or reject, once: a decided request is a conflict (nothing changes)."""
    if len(note) > MAX_NOTE:
        raise InvalidInput(f"note over {MAX_NOTE} characters", code="note_too_long")
    if request.status != "pending":
        raise Conflict(
            f"the request was already {request.status}",
            code="already_decided",
            details={"status": request.status, "revision": request.revision},
        )
    return msgspec.structs.replace(
        request,
        status="approved" if approved else "rejected",
        revision=request.revision + 1,
        updatedAt=now,
        decidedBy=user,
        note=note or None,
        wake="due",  # stored with the decision: the wake-up is never lost (`woken`)
    )


def woken(request: ApprovalRequest) -> ApprovalRequest:
    """The decision's step is stored in its chat: it is never run again."""
    return msgspec.structs.replace(request, wake="done")


def decision_notice(request: ApprovalRequest) -> str:
    """The notification the chat shows (never as the person's words)."""
    return f"Request “{request.title}” {request.status}" + (
        f": {request.note}" if request.note else "."
    )


def decision_input(request: ApprovalRequest, proposal: str) -> str:
    """What the woken bot's step gets as its input: the decision and the proposal as it was
    made (ENR-3: never an enrichment), since the bot's history does not hold its tool calls."""
    by = "you" if request.openedBy is None else request.openedBy
    return (
        f"[request {request.id} {request.status} by {request.decidedBy}] "
        f"{decision_notice(request)}\nProposed by {by}: {proposal}"
    )


def decision_turn(request_id: str) -> str:
    """The turn of a decision's step in its chat, named after the request: a second wake-up
    of the same decision (after a restart) finds it instead of stepping again."""
    return "turn_" + hashlib.sha256(f"decision\x00{request_id}".encode()).hexdigest()[:16]


def with_review_chat(request: ApprovalRequest, chat: str, now: int) -> ApprovalRequest:
    if chat in request.reviewChats:
        return request
    return msgspec.structs.replace(request, reviewChats=(*request.reviewChats, chat), updatedAt=now)


def view(request: ApprovalRequest, proposal: str) -> RequestView:
    fields = msgspec.structs.asdict(request)
    return RequestView(proposal=proposal, **fields)
