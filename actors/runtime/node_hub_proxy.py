"""The node hub as Ray runs it: one named, detached actor per cluster (its name from the actors'
prefix), created by whoever needs it first, and a `NodeHubPort` over its handle so that
gateways and shards never name a Ray method or see a Ray error.

Errors: calls map Ray's failures as every actor call does (actors/runtime/shard_proxy.py `remote`),
except `run`, whose failures (the node left, failed or timed out) the caller turns into a model
error of its own (actors/models/node_hub.py `NodeModel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.contracts import NodeInfo, Work
from actors.runtime.shard_proxy import remote
from engine.models import Completion, Message, ToolSpec


def _hub_actor(prefix: str, namespace: str) -> Any:
    import ray

    from actors.models.node_hub import NodeHubService

    actor = ray.remote(num_cpus=0, max_restarts=-1)(NodeHubService)
    return actor.options(
        name=f"{prefix}-nodes", namespace=namespace, get_if_exists=True, lifetime="detached"
    ).remote()


class RayNodeHub:
    """`NodeHubPort` over the cluster's hub actor, found (or created) on first use."""

    def __init__(self, prefix: str, namespace: str = "openbot") -> None:
        self.prefix = prefix
        self.namespace = namespace
        self._handle: Any = None

    def _hub(self) -> Any:
        if self._handle is None:
            self._handle = _hub_actor(self.prefix, self.namespace)
        return self._handle

    async def register(self, node: str, memory_isolation: bool, memory_extraction: bool) -> int:
        return await remote(self._hub().register, node, memory_isolation, memory_extraction)

    async def unregister(self, node: str, session: int) -> None:
        await remote(self._hub().unregister, node, session)

    async def next_work(self, node: str, session: int, wait: float = 10.0) -> Work | None:
        return await remote(self._hub().next_work, node, session, wait)

    async def complete(
        self, work_id: str, completion: Completion | None, error: str | None
    ) -> bool:
        return await remote(self._hub().complete, work_id, completion, error)

    async def run(
        self, node: str, messages: Sequence[Message], tools: Sequence[ToolSpec], timeout: float
    ) -> Completion:
        return await self._hub().run.remote(node, list(messages), list(tools), timeout)

    async def info(self, node: str) -> NodeInfo | None:
        return await remote(self._hub().info, node)

    async def nodes(self) -> list[NodeInfo]:
        return await remote(self._hub().nodes)
