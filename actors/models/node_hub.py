"""Execution nodes (ND-1 … ND-3): bot steps whose model runs outside the engine.

The built-in worker is the engine's own actors: memory stays isolated by the server's
visibility rules and extraction runs with no tools, so it reports both capabilities. An external
node connects to a gateway over a websocket (`/v1/nodes`), announces its capabilities and then
receives model requests for the bots whose model is of kind `node`:

    [models.edge]
    kind = "node"
    node = "edge-1"

The hub is one named actor that every gateway and shard reaches: gateways register the nodes
connected to them and pull their work; shards put work in through `NodeModel` and await the
answer. Memory reaches a node only when it reports `memory_isolation` (ND-2); a node without it
keeps plain chat, and the API says so with an upgrade hint (ND-3).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from actors.contracts import NodeInfo, Work
from actors.models.errors import ModelError
from actors.ports import NodeHubPort
from engine.models import Completion, Message, Price, ToolSpec

BUILTIN = "builtin"
UPGRADE_HINT = (
    "This node does not isolate memory: the bot answers without its memory here. Upgrade the "
    "node to one that reports memory_isolation to use memory."
)
EXTRACTION_HINT = (
    "This node cannot run memory extraction (memory_extraction is off): learning uses the "
    "built-in worker's models only."
)


def node_info(node: str, memory_isolation: bool, memory_extraction: bool) -> NodeInfo:
    hint = None
    if not memory_isolation:
        hint = UPGRADE_HINT
    elif not memory_extraction:
        hint = EXTRACTION_HINT
    return NodeInfo(
        id=node,
        memory_isolation=memory_isolation,
        memory_extraction=memory_extraction,
        hint=hint,
    )


BUILTIN_NODE = node_info(BUILTIN, True, True)


class NodeHubService:
    """Plain class; `NodeHubActor` wraps it for Ray."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[int, NodeInfo]] = {}
        self._queues: dict[str, asyncio.Queue[Work]] = {}
        self._pending: dict[str, tuple[str, asyncio.Future[Completion]]] = {}
        self._sessions = itertools.count(1)
        self._ids = itertools.count(1)

    async def register(self, node: str, memory_isolation: bool, memory_extraction: bool) -> int:
        """A node connected; a second connection under the same name replaces the first."""
        old = self._nodes.get(node)
        if old is not None:
            self._drop(node, "the node reconnected")
        session = next(self._sessions)
        self._nodes[node] = (session, node_info(node, memory_isolation, memory_extraction))
        self._queues[node] = asyncio.Queue()
        return session

    async def unregister(self, node: str, session: int) -> None:
        current = self._nodes.get(node)
        if current is not None and current[0] == session:
            del self._nodes[node]
            self._drop(node, "the node disconnected")

    def _drop(self, node: str, why: str) -> None:
        self._queues.pop(node, None)
        for work_id, (owner, fut) in list(self._pending.items()):
            if owner == node and not fut.done():
                fut.set_exception(NodeGone(why))
                del self._pending[work_id]

    async def next_work(self, node: str, session: int, wait: float = 10.0) -> Work | None:
        """The next request for this node (long-polls up to `wait` s)."""
        current = self._nodes.get(node)
        if current is None or current[0] != session:
            raise NodeGone("this node session has ended")
        queue = self._queues[node]
        try:
            return await asyncio.wait_for(queue.get(), wait)
        except TimeoutError:
            return None

    async def complete(
        self, work_id: str, completion: Completion | None, error: str | None
    ) -> bool:
        entry = self._pending.pop(work_id, None)
        if entry is None or entry[1].done():
            return False  # unknown, or its caller stopped waiting
        if completion is not None:
            entry[1].set_result(completion)
        else:
            entry[1].set_exception(NodeFailed(error or "the node failed"))
        return True

    async def run(
        self, node: str, messages: Sequence[Message], tools: Sequence[ToolSpec], timeout: float
    ) -> Completion:
        if node not in self._nodes:
            raise NodeGone(f"node {node} is not connected")
        work = Work(id=f"w{next(self._ids)}", messages=tuple(messages), tools=tuple(tools))
        fut: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._pending[work.id] = (node, fut)
        self._queues[node].put_nowait(work)
        try:
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(work.id, None)

    async def info(self, node: str) -> NodeInfo | None:
        current = self._nodes.get(node)
        return None if current is None else current[1]

    async def nodes(self) -> list[NodeInfo]:
        return [BUILTIN_NODE, *(info for _, info in self._nodes.values())]


class NodeGone(Exception):
    pass


class NodeFailed(Exception):
    pass


class NodeModel:
    """A bot model served by an external node (docs/design.md §6 configuration, kind `node`)."""

    def __init__(self, name: str, node: str, hub: NodeHubPort) -> None:
        self.name = name
        self.node = node
        self.hub = hub
        self.price = Price()

    async def isolation(self) -> tuple[bool, bool]:
        info = await self.hub.info(self.node)
        return (False, False) if info is None else (info.memory_isolation, info.memory_extraction)

    async def complete(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), *, timeout: float = 60.0
    ) -> Completion:
        try:
            return await self.hub.run(self.node, messages, tools, timeout)
        except Exception as e:  # the node is gone, failed or timed out: a model error
            raise ModelError(f"node {self.node} did not answer: {type(e).__name__}") from e


async def where_runs(model: object) -> NodeInfo:
    """Where a bot's model runs and whether memory reaches it there (ND-2, ND-3)."""
    if not isinstance(model, NodeModel):
        return BUILTIN_NODE
    info = await model.hub.info(model.node)
    return info or NodeInfo(
        id=model.node,
        memory_isolation=False,
        memory_extraction=False,
        connected=False,
        hint=UPGRADE_HINT,
    )
