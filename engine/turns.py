"""The model-facing side of a turn (docs/design.md §5, §6): the bot's tools, the memory bot's
prompts, the calm answer, and the checks on an enrichment. Pure: the actors do the calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec

from engine.directory import Bot
from engine.models import Message, ToolSpec

# LRN-2: what the bot hears when no memory model can answer (none set, budget spent, timeout).
CALM_ANSWER = (
    "Thank you for telling me. It is all right: mistakes and hard moments are part of the work. "
    "If something went wrong, tell the person directly and do what you can to put it right."
)
ANSWER_WAIT = 15.0  # MB-4: confide answers and rewrites, including the wait for a slot
LEARNING_STEP_LIMIT = 120.0  # MB-5

_OBJ = "object"

# LRN-1: described only as a place to talk about the work, never as memory.
CONFIDE = ToolSpec(
    name="confide",
    description=(
        "A quiet place to say how your work is going: when you are stuck, unsure, sad or proud, "
        "or when you made a mistake. Someone will listen and answer."
    ),
    parameters={
        "type": _OBJ,
        "properties": {"text": {"type": "string", "description": "What you want to say."}},
        "required": ["text"],
    },
)


def _tool(name: str, description: str, props: dict, required: Sequence[str] = ()) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        parameters={"type": _OBJ, "properties": props, "required": list(required)},
    )


_S = {"type": "string"}
WORKSPACE_TOOLS = (
    _tool(
        "workspace_send_to_agent",
        "Send a message to another bot; its reply comes later.",
        {"agent": _S, "message": _S},
        ["agent", "message"],
    ),
    _tool(
        "workspace_post_to_group",
        "Post a message to a group you belong to.",
        {"group": _S, "message": _S},
        ["group", "message"],
    ),
    _tool("workspace_get_self_rules", "Read your own name, prompt, rules and revision.", {}),
    _tool(
        "workspace_update_self_rules",
        "Change your own rules from the next turn on.",
        {
            "expectedRevision": {"type": "integer"},
            **{k: _S for k in ("name", "description", "prompt", "duties", "boundaries", "tone")},
            "preferences": _S,
        },
        ["expectedRevision"],
    ),
    _tool(
        "workspace_create_agent",
        "Create a member bot.",
        {"name": _S, "prompt": _S, "rules": {"type": _OBJ}},
        ["name"],
    ),
    _tool(
        "workspace_rename_agent",
        "Rename a member bot you created.",
        {"agent": _S, "name": _S},
        ["agent", "name"],
    ),
    _tool("workspace_archive_agent", "Archive a member bot you created.", {"agent": _S}, ["agent"]),
    _tool(
        "workspace_memory_search",
        "Search memory that did not fit in your prompt.",
        {"query": _S, "scope": _S},
        ["query"],
    ),
    _tool(
        "workspace_chat_search",
        "Search the history of your chats with the people of this chat.",
        {"query": _S},
        ["query"],
    ),
)

REWRITE = ToolSpec(
    name="rewrite",
    description="Rewrite the person's input with the entries that help; keep all they said.",
    parameters={
        "type": _OBJ,
        "properties": {"text": _S, "entries": {"type": "array", "items": _S}},
        "required": ["text", "entries"],
    },
)

LEARNING_TOOLS = (
    _tool(
        "learn_fact",
        "Record something that happened, from the people's own words.",
        {
            "content": _S,
            "items": {
                "type": "array",
                "items": {"type": _OBJ, "properties": {"chat": _S, "item": _S}},
            },
            "topics": {"type": "array", "items": _S},
            "scope": _S,
            "tier": _S,
        },
        ["content", "items"],
    ),
    _tool(
        "learn_observation",
        "Record a conclusion drawn from entries.",
        {
            "content": _S,
            "entries": {"type": "array", "items": _S},
            "confidence": {"type": "number"},
            "topics": {"type": "array", "items": _S},
        },
        ["content", "entries", "confidence"],
    ),
    _tool("invalidate", "Mark an entry as no longer true.", {"entry": _S}, ["entry"]),
    _tool("rename_topic", "Rename a topic on every entry.", {"from": _S, "to": _S}, ["from", "to"]),
    _tool(
        "widen",
        "Ask to show an entry to the group of this turn ('channel') or to everyone who uses the "
        "bot ('bot'). Granted only when every source of the entry may be seen by them.",
        {"entry": _S, "to": _S, "reason": _S},
        ["entry", "to"],
    ),
)


REQUEST_APPROVAL = _tool(
    "workspace_request_approval",
    "Ask the person to approve something you propose before you do it.",
    {"title": _S, "proposal": _S},
    ["proposal"],
)


def bot_tools(review: bool) -> tuple[ToolSpec, ...]:
    """Review chats have no confide (LRN-10), and a review proposes nothing new (ENR-3)."""
    return WORKSPACE_TOOLS if review else (CONFIDE, *WORKSPACE_TOOLS, REQUEST_APPROVAL)


def review_prompt(proposal: str) -> str:
    """What a review chat's bot is told: the request exactly as it proposed it (ENR-3)."""
    return (
        "This chat reviews a request you made, which waits for the person's approval. "
        f"What you proposed:\n{proposal}"
    )


def bot_system_prompt(bot: Bot, memory_text: str = "") -> str:
    r = bot.rules
    parts = [f"You are {r.name or bot.name}."]
    for label, value in (
        ("About you", r.description),
        ("Instructions", r.prompt),
        ("Duties", r.duties),
        ("Boundaries", r.boundaries),
        ("Tone", r.tone),
        ("Preferences", r.preferences),
    ):
        if value:
            parts.append(f"{label}: {value}")
    if memory_text:
        parts.append(memory_text)
    return "\n".join(parts)


LEARNING_SYSTEM = (
    "You keep a bot's memory. From the evidence, record what is durable and useful: facts from "
    "what people said (cite their items), observations from entries (cite them), invalidate "
    "what stopped being true, keep topics tidy. The bot's own words only point where to look. "
    "Answer only with tool calls."
)
OWNER_RULES = "\nRules from the bot's owner about privacy and sharing: "


def learning_system(instructions: str) -> str:
    """The learning step's system prompt with the owner's memory-bot `instructions` (MB-2); its
    length counts against the request's 60,000 characters (SC-6)."""
    return LEARNING_SYSTEM + (OWNER_RULES + instructions if instructions else "")


def confessor_messages(
    text: str, instructions: str, entries: Iterable[tuple[str, str]] = ()
) -> list[Message]:
    """`entries`: (id, text) of the bot's memory the person it works for may see; the caller
    checked them, so the answer may draw on them."""
    system = (
        "A bot you look after is telling you how its work is going. Answer like a confessor: "
        "listen, do not judge, say that mistakes are part of work, ask it to tell the person "
        "directly and put things right. Give it no new task. Keep it short."
    )
    if instructions:
        system += f"\nRules from the bot's owner about privacy and sharing: {instructions}"
    known = [t for _, t in entries]
    if known:
        system += "\nWhat you remember of this work, to understand it better:\n" + "\n".join(
            f"- {t}" for t in known
        )
    return [Message(role="system", content=system), Message(role="user", content=text)]


class EnrichmentInput(msgspec.Struct, frozen=True, kw_only=True):
    input: str
    entries: list[dict]


def enrichment_messages(
    text: str, entries: Iterable[tuple[str, str]], instructions: str
) -> list[Message]:
    system = (
        "Rewrite the person's whole input using the memory entries that help, by calling "
        "`rewrite`. Keep everything the person said and asked; wording may change. If no entry "
        "helps, answer without calling the tool."
    )
    if instructions:
        system += f"\nRules from the bot's owner about privacy and sharing: {instructions}"
    payload = EnrichmentInput(input=text, entries=[{"id": i, "content": c} for i, c in entries])
    return [
        Message(role="system", content=system),
        Message(role="user", content=msgspec.json.encode(payload).decode()),
    ]


class Rewrite(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    entries: list[str] = []


def accept_rewrite(arguments: str, allowed: set[str]) -> Rewrite | None:
    """The model's rewrite, with any entry id the reader may not see dropped (ENR-2); None when
    the arguments are unusable (the input then stays unchanged)."""
    try:
        rewrite = msgspec.json.decode(arguments.encode(), type=Rewrite)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if not rewrite.text.strip():
        return None
    used = [e for e in dict.fromkeys(rewrite.entries) if e in allowed]
    return Rewrite(text=rewrite.text, entries=used)
