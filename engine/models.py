"""What the engine says to a model and what it gets back, independent of the wire
(docs/design.md §6).

The `openai` kind maps these to Chat Completions; the `scripted` kind answers from a file.
Prices and usage are integers: tokens, and micro-USD (MB-6).
"""

from __future__ import annotations

import msgspec


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str
    parameters: dict


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    arguments: str  # JSON text as the model produced it: validated by whoever acts on it


class Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    role: str  # system | user | assistant | tool
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    input_tokens: int
    output_tokens: int


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    text: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None  # None: the provider did not confirm usage (MB-6)
    model: str = ""


class Price(msgspec.Struct, frozen=True, kw_only=True):
    input_micros_per_mtok: int = 0
    output_micros_per_mtok: int = 0


def cost_micros(usage: Usage | None, price: Price) -> int | None:
    """Confirmed cost in micro-USD, rounded up; None when usage is unknown (recorded apart)."""
    if usage is None:
        return None
    total = usage.input_tokens * price.input_micros_per_mtok
    total += usage.output_tokens * price.output_micros_per_mtok
    return -(-total // 1_000_000)
