"""Model clients: the `openai` kind (any OpenAI-compatible Chat Completions server, over httpx),
the `scripted` kind (deterministic answers from a TOML file, for demos and tests) and the `local`
kind (a small deterministic model built in, so a server started without a config can chat).

Configured by name in the server config (docs/design.md §6):

    [models.local]
    kind = "openai"
    base_url = "http://127.0.0.1:8000/v1"
    model = "qwen3-8b"
    api_key_env = "OPENAI_API_KEY"
    input_micros_per_mtok = 150000
    output_micros_per_mtok = 600000

    [models.demo]
    kind = "scripted"
    script = "examples/demo-script.toml"

    [models.local]                     # built in; `openbot serve` without a config has it
    kind = "local"

    [models.edge]                      # served by an external node (actors/models/node_hub.py)
    kind = "node"
    node = "edge-1"

Errors become `ModelError` (an `Unavailable`): the caller decides on the calm answer or a retry.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import httpx
import msgspec

from actors.models.errors import ModelError
from actors.models.node_hub import NodeModel
from actors.ports import NodeHubPort
from engine.errors import InvalidInput, OpenBotError
from engine.models import (
    Completion,
    Message,
    Price,
    ToolCall,
    ToolSpec,
    Usage,
    cost_micros,
)
from storage.stats import STATS


class Model(Protocol):
    name: str
    price: Price

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, timeout: float = 60.0
    ) -> Completion: ...


# --- openai --------------------------------------------------------------------------------------


class _Function(msgspec.Struct, frozen=True):
    name: str
    arguments: str = "{}"


class _WireToolCall(msgspec.Struct, frozen=True):
    function: _Function
    id: str = ""
    type: str = "function"


class _WireMessage(msgspec.Struct, frozen=True):
    content: str | None = None
    tool_calls: list[_WireToolCall] | None = None


class _Choice(msgspec.Struct, frozen=True):
    message: _WireMessage


class _WireUsage(msgspec.Struct, frozen=True):
    prompt_tokens: int
    completion_tokens: int


class _Response(msgspec.Struct, frozen=True):
    choices: list[_Choice]
    usage: _WireUsage | None = None
    model: str = ""


_response_dec = msgspec.json.Decoder(_Response)
RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}


def _wire_message(m: Message) -> dict:
    out: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in m.tool_calls
        ]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


class OpenAIModel:
    def __init__(
        self,
        name: str,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        price: Price | None = None,
        retries: int = 2,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.price = price or Price()
        self.retries = retries
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers)

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, timeout: float = 60.0
    ) -> Completion:
        body: dict = {"model": self.model, "messages": [_wire_message(m) for m in messages]}
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
        delay = 0.2
        for attempt in range(self.retries + 1):
            try:
                resp = await self._client.post("/chat/completions", json=body, timeout=timeout)
            except httpx.TimeoutException as e:
                raise ModelError(f"model {self.name} timed out", code="model_timeout") from e
            except httpx.TransportError as e:
                if attempt == self.retries:
                    raise ModelError(f"model {self.name} unreachable: {e}") from e
            else:
                if resp.status_code < 300:
                    return self._parse(resp.content)
                if resp.status_code not in RETRY_STATUS or attempt == self.retries:
                    raise ModelError(f"model {self.name} answered HTTP {resp.status_code}")
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    def _parse(self, raw: bytes) -> Completion:
        try:
            data = _response_dec.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ModelError(
                f"model {self.name} sent an unreadable answer: {e}", code="model_garbage"
            ) from e
        if not data.choices:
            raise ModelError(f"model {self.name} sent no choices", code="model_garbage")
        msg = data.choices[0].message
        calls = tuple(
            ToolCall(id=c.id or f"call_{k}", name=c.function.name, arguments=c.function.arguments)
            for k, c in enumerate(msg.tool_calls or ())
        )
        usage = (
            Usage(input_tokens=data.usage.prompt_tokens, output_tokens=data.usage.completion_tokens)
            if data.usage is not None
            else None
        )
        return Completion(text=msg.content, tool_calls=calls, usage=usage, model=data.model)

    async def close(self) -> None:
        await self._client.aclose()


# --- scripted ------------------------------------------------------------------------------------


class _Rule(msgspec.Struct, frozen=True, kw_only=True):
    match: str = ""  # a regular expression searched in the last user message
    text: str | None = None
    tool_calls: list[dict] = []


class _BotScript(msgspec.Struct, frozen=True, kw_only=True):
    """Rules for one bot, found by the name its system prompt starts with ("You are Ada.")."""

    rules: list[_Rule] = []
    default: str | None = None
    after_tool: str | None = None


class _Script(msgspec.Struct, frozen=True, kw_only=True):
    rules: list[_Rule] = []
    default: str = "OK."
    after_tool: str = "Done."  # the answer once tool results came back (ends a tool loop)
    bots: dict[str, _BotScript] = {}


_SPEAKER = re.compile(r"You are (.+?)\.(?:\n|$)")


_ZERO = Usage(input_tokens=0, output_tokens=0)
_PLACE = re.compile(r"\{(\w+)\}")


def _fill(value, groups: Mapping[str, str]):
    """`{name}` in a rule's strings becomes what the match's group `name` caught, so a script
    can cite what it was given (a memory bot citing the item a person said)."""
    if isinstance(value, str):
        return _PLACE.sub(lambda m: groups.get(m.group(1), m.group(0)), value)
    if isinstance(value, list):
        return [_fill(v, groups) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, groups) for k, v in value.items()}
    return value


def _unescape(text: str) -> str:
    """A group caught inside a JSON string, as the string's value."""
    try:
        return msgspec.json.decode(f'"{text}"')
    except msgspec.DecodeError:
        return text


class ScriptedModel:
    """First rule whose `match` is found in the last user message wins; its tool calls carry
    `arguments` as a table (encoded to JSON) or a string (passed as is, for invalid-JSON tests)."""

    def __init__(self, name: str, script: _Script) -> None:
        self.name = name
        self.price = Price()
        self.script = script
        # Compiled up front, so a bad expression is a configuration error at start.
        self._patterns = {
            r.match: re.compile(r.match)
            for r in [*script.rules, *(x for b in script.bots.values() for x in b.rules)]
        }
        self.calls = 0

    @classmethod
    def from_file(cls, name: str, path: str | Path) -> ScriptedModel:
        try:
            data = tomllib.loads(Path(path).read_text())
            return cls(name, msgspec.convert(data, _Script))
        except (OSError, tomllib.TOMLDecodeError, msgspec.ValidationError, re.error) as e:
            raise InvalidInput(f"script for model {name}: {e}", code="bad_config") from e

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, timeout: float = 60.0
    ) -> Completion:
        self.calls += 1
        speaker = None
        if messages and messages[0].role == "system":
            found = _SPEAKER.match(messages[0].content or "")
            speaker = self.script.bots.get(found.group(1)) if found else None
        if messages and messages[-1].role == "tool":
            text = (speaker.after_tool if speaker else None) or self.script.after_tool
            return Completion(text=text, usage=_ZERO, model=self.name)
        last = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
        rules = [*(speaker.rules if speaker else ()), *self.script.rules]
        for rule in rules:
            found = self._pattern(rule.match).search(last)
            if found:
                groups = {k: _unescape(v) for k, v in found.groupdict().items() if v is not None}
                calls = tuple(
                    ToolCall(
                        id=f"call_{k}",
                        name=c["name"],
                        arguments=c["arguments"]
                        if isinstance(c.get("arguments"), str)
                        else msgspec.json.encode(_fill(c.get("arguments", {}), groups)).decode(),
                    )
                    for k, c in enumerate(rule.tool_calls)
                )
                return Completion(
                    text=_fill(rule.text, groups),
                    tool_calls=calls,
                    usage=Usage(input_tokens=0, output_tokens=0),
                    model=self.name,
                )
        text = (speaker.default if speaker else None) or self.script.default
        return Completion(text=text, usage=_ZERO, model=self.name)

    def _pattern(self, source: str) -> re.Pattern[str]:
        pattern = self._patterns.get(source)
        if pattern is None:
            pattern = self._patterns[source] = re.compile(source)
        return pattern


# The `local` kind: no network and no files, so the first chat on a fresh server works. As a bot
# it repeats what it is told and confides what a person says about a move or a preference; as
# the memory bot it answers a confession and learns such a sentence as a fact citing its item.
_CONFIDED = "I want to get this person's situation right."
LOCAL_SCRIPT = _Script(
    rules=[
        _Rule(
            match=r'(?i)\{"chat":"(?P<chat>[^"]+)","item":"(?P<item>[^"]+)","kind":"person",'
            r'"author":"[^"]*","text":"(?P<text>[^"]*(?:moved|prefer)[^"]*)"\}',
            tool_calls=[
                {
                    "name": "learn_fact",
                    "arguments": {
                        "content": "{text}",
                        "items": [{"chat": "{chat}", "item": "{item}"}],
                        "topics": ["about-me"],
                    },
                }
            ],
        ),
        _Rule(
            match=r"(?i)\b(moved|prefer|always|never)\b",
            tool_calls=[{"name": "confide", "arguments": {"text": _CONFIDED}}],
        ),
        _Rule(
            match=f"^{re.escape(_CONFIDED)}$",
            text="That is worth caring about. Tell them what you understood; ask if it is right.",
        ),
        _Rule(match=r"(?s)\A(?P<text>[^{].{0,499})", text="You said: {text}"),
    ],
    default="I am listening.",
    after_tool="Thank you. I will keep that in mind.",
)


# --- measured calls ------------------------------------------------------------------------------


async def measured(
    model: Model, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), **options
) -> Completion:
    """`model.complete`, counted for `GET /metrics`: calls and errors by model, latency, tokens
    and confirmed cost. Every model call of a bot step or the memory bot goes through here."""
    started = time.perf_counter()
    try:
        done = await model.complete(messages, tools, **options)
    except BaseException as e:
        outcome = e.code if isinstance(e, OpenBotError) else type(e).__name__
        STATS.inc(CALLS, help=CALLS_HELP, model=model.name, outcome=outcome)
        raise
    finally:
        STATS.observe(LATENCY, time.perf_counter() - started, help=LATENCY_HELP, model=model.name)
    STATS.inc(CALLS, help=CALLS_HELP, model=model.name, outcome="ok")
    cost = cost_micros(done.usage, model.price)
    if cost is not None:
        STATS.inc(COST, cost, help="Confirmed model cost in micro-USD", model=model.name)
    if done.usage is not None:
        for kind, n in (("input", done.usage.input_tokens), ("output", done.usage.output_tokens)):
            STATS.inc(TOKENS, n, help="Model tokens by kind", model=model.name, kind=kind)
    return done


CALLS, CALLS_HELP = "openbot_model_calls", "Model calls by model and outcome (ok or error code)"
LATENCY, LATENCY_HELP = "openbot_model_call_seconds", "Model call latency by model"
COST, TOKENS = "openbot_model_cost_micros", "openbot_model_tokens"


# --- configuration -------------------------------------------------------------------------------


def load_models(
    config: Mapping[str, Mapping], *, base_dir: Path = Path("."), hub: NodeHubPort | None = None
) -> dict[str, Model]:
    """Models from a config's `[models.*]` tables, by name. `hub` serves the models of kind
    `node` (a config with one needs it)."""
    models: dict[str, Model] = {}
    for name, spec in config.items():
        kind = spec.get("kind")
        if kind == "openai":
            if "base_url" not in spec or "model" not in spec:
                raise InvalidInput(
                    f"model {name}: openai needs base_url and model", code="bad_config"
                )
            key_env = spec.get("api_key_env")
            models[name] = OpenAIModel(
                name,
                base_url=spec["base_url"],
                model=spec["model"],
                api_key=os.environ.get(key_env) if key_env else None,
                price=Price(
                    input_micros_per_mtok=int(spec.get("input_micros_per_mtok", 0)),
                    output_micros_per_mtok=int(spec.get("output_micros_per_mtok", 0)),
                ),
            )
        elif kind == "scripted":
            models[name] = ScriptedModel.from_file(name, base_dir / spec["script"])
        elif kind == "local":
            models[name] = ScriptedModel(name, LOCAL_SCRIPT)
        elif kind in ("sentence-transformers", "onnx"):
            continue  # an embedding model only (actors/models/embeddings.py, [search])
        elif kind == "node":
            if not isinstance(spec.get("node"), str):
                raise InvalidInput(f"model {name}: node needs a node name", code="bad_config")
            if hub is None:
                raise InvalidInput(f"model {name}: no node hub here", code="bad_config")
            models[name] = NodeModel(name, spec["node"], hub)
        else:
            raise InvalidInput(f"model {name}: unknown kind {kind!r}", code="bad_config")
    return models
