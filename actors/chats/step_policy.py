"""What a bot's step may do and whose memory shapes it, decided from the step's input alone
(its chat's kind, its wake, its channel), never from what a model says: which tools write
outside the step's batch (and so wait for the send a delivery answers: actors/chats/sent_gate.py),
which are not recorded as chat items, and the reader a step's memory and enrichment are read as.
"""

from __future__ import annotations

from actors.contracts import StepInput
from engine.memory_entries import Reader

# Not app tools, so their results are not recorded as chat items: `confide` (kept as
# confessions), tools about the bot itself (its rules, its members: the owner's prompt is not
# the chat's to read), and collaboration sends (their receipts become the chain's records and
# the peer's reply a delivery item).
UNRECORDED_TOOLS = frozenset(
    {
        "confide",
        "workspace_get_self_rules",
        "workspace_update_self_rules",
        "workspace_create_agent",
        "workspace_send_to_agent",
        "workspace_post_to_group",
    }
)

# Tools that change something outside the step's batch at once (the directory, requests).
WRITING_TOOLS = frozenset(
    {
        "workspace_update_self_rules",
        "workspace_create_agent",
        "workspace_rename_agent",
        "workspace_archive_agent",
        "workspace_request_approval",
    }
)


NOT_HERE = '{"error":"not_here","message":"ask for approval in a person\'s chat"}'


def may_request(step: StepInput) -> bool:
    return step.chat.kind in ("direct", "group") and step.wake != "delivery"


def memory_reader(step: StepInput) -> Reader:
    """Whose view of the bot's memory its prompt carries: the step's reader; for a delivery
    between bots, only what is for everyone who uses the bot in the chat's org."""
    return reader_for(step) or Reader(user="\x00", org=step.chat.org, uses_bot=True)


def reader_for(step: StepInput) -> Reader | None:
    """Whose entries may shape this step: the person in a direct chat; in a group only the
    channel's and `for:bot` entries (ENR-2); nobody's for a delivery between bots."""
    if step.wake != "person":
        return None
    if step.chat.kind == "group" and step.channel:
        return Reader(
            user="\x00", org=step.chat.org, channels=frozenset({step.channel}), uses_bot=True
        )
    if step.chat.kind == "direct":
        return Reader(user=step.operator, org=step.chat.org, uses_bot=True)
    return None  # a review sees only what the bot proposed, never enrichment (ENR-3)
