"""`/v1/nodes`: external execution nodes connect here (ND-1 … ND-3).

A node authenticates with the admin token (nodes are the operator's infrastructure), says
hello with its capabilities, then answers model requests for bots of kind `node` models:

    → {"type": "hello", "node": "edge-1",
       "capabilities": {"memoryIsolation": false, "memoryExtraction": false}}
    ← {"type": "welcome", "node": "edge-1", "session": 1}
    ← {"type": "request", "id": "w1", "messages": [...], "tools": [...]}
    → {"type": "result", "id": "w1", "text": "...", "toolCalls": [...], "usage": {...}}
    → {"type": "error", "id": "w1", "message": "..."}

Keys are camelCase like every other frame; the old snake_case names are still accepted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import msgspec
from starlette.websockets import WebSocket, WebSocketDisconnect

from actors.ports import NodeHubPort
from engine.casing import fit, to_wire
from engine.errors import OpenBotError
from engine.models import Completion, ToolCall, Usage
from gateway.auth import Auth
from gateway.metrics import WS_CLIENTS
from gateway.wire import check_json

log = logging.getLogger("openbot.nodes")
_enc = msgspec.json.Encoder()
HELLO_WAIT = 10.0
MAX_FRAME = 4 * 1024 * 1024  # a model's answer with its tool calls; uvicorn's own cap is 16 MiB


class Capabilities(msgspec.Struct, frozen=True, kw_only=True):
    memory_isolation: bool = False
    memory_extraction: bool = False


class Hello(msgspec.Struct, frozen=True, kw_only=True, tag="hello", tag_field="type"):
    node: str
    capabilities: Capabilities = Capabilities()


class Result(msgspec.Struct, frozen=True, kw_only=True, tag="result", tag_field="type"):
    id: str
    text: str | None = None
    tool_calls: list[ToolCall] = []
    usage: Usage | None = None


class Failure(msgspec.Struct, frozen=True, kw_only=True, tag="error", tag_field="type"):
    id: str
    message: str = "the node failed"


def decode_frame(raw: bytes | str, kind: Any) -> Any:
    """Frames in either casing: camelCase (what the server sends) or the old snake_case."""
    return msgspec.convert(fit(msgspec.json.decode(raw), kind), kind)


class NodesEndpoint:
    def __init__(self, auth: Auth, hub: NodeHubPort) -> None:
        self.auth = auth
        self.hub = hub

    async def handle(self, ws: WebSocket) -> None:
        await ws.accept()
        try:
            await self.auth.admin(ws)
        except OpenBotError:
            await ws.close(4401, "nodes connect with the admin token")
            return
        try:
            hello = decode_frame(_checked(await asyncio.wait_for(_receive(ws), HELLO_WAIT)), Hello)
        except (
            TimeoutError,
            msgspec.DecodeError,
            msgspec.ValidationError,
            WebSocketDisconnect,
            OpenBotError,
        ):
            with contextlib.suppress(Exception):
                await ws.close(4400, "say hello with the node's name and capabilities")
            return
        hub = self.hub
        caps = hello.capabilities
        session = await hub.register(hello.node, caps.memory_isolation, caps.memory_extraction)
        await _send(ws, {"type": "welcome", "node": hello.node, "session": session})
        pull = asyncio.create_task(self._pull(ws, hub, hello.node, session))
        WS_CLIENTS.labels("nodes").inc()
        try:
            while True:
                raw = await _receive(ws)
                try:
                    answer = decode_frame(_checked(raw), Result | Failure)
                except (msgspec.DecodeError, msgspec.ValidationError, OpenBotError):
                    await ws.close(4400, "answers are result or error frames")
                    return
                if isinstance(answer, Result):
                    done = Completion(
                        text=answer.text,
                        tool_calls=tuple(answer.tool_calls),
                        usage=answer.usage,
                        model=hello.node,
                    )
                    await hub.complete(answer.id, done, None)
                else:
                    await hub.complete(answer.id, None, answer.message)
        except WebSocketDisconnect:
            pass
        finally:
            WS_CLIENTS.labels("nodes").dec()
            pull.cancel()
            with contextlib.suppress(Exception):
                await hub.unregister(hello.node, session)

    async def _pull(self, ws: WebSocket, hub: NodeHubPort, node: str, session: int) -> None:
        try:
            while True:
                work = await hub.next_work(node, session, 10.0)
                if work is not None:
                    frame = {"type": "request", "id": work.id, "messages": work.messages}
                    frame["tools"] = work.tools
                    await _send(ws, frame)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %s: pulling work failed", node)
            with contextlib.suppress(Exception):
                await ws.close(1011, "the hub failed")


async def _send(ws: WebSocket, frame: dict) -> None:
    # text frames, as on /v1/events; camelCase keys like every answer
    await ws.send_text(_enc.encode(to_wire(frame)).decode())


def _checked(raw: bytes | str) -> bytes | str:
    """A frame within the size and nesting limits (TooLarge / InvalidInput otherwise)."""
    check_json(raw, limit=MAX_FRAME)
    return raw


async def _receive(ws: WebSocket) -> bytes | str:
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    return message.get("bytes") or message.get("text") or b""
