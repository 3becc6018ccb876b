"""The node hub as Ray runs it: one named, detached actor per cluster (its name from the actors'
prefix), created by whoever needs it first, and a `NodeHubPort` over its handle so that
gateways and shards never name a Ray method or see a Ray error.

Errors: calls map Ray's failures as every actor call does (actors/runtime/proxy.py `remote`),
except `run`, whose failures (the node left, failed or timed out) the caller turns into a model
error of its own (actors/models/node_hub.py `NodeModel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from actors.ports import NodeHubPort
from actors.runtime.proxy import ActorProxy
from engine.models import Completion, Message, ToolSpec


def _hub_actor(prefix: str, namespace: str) -> Any:
    import ray

    from actors.models.node_hub import NodeHubService

    actor = ray.remote(num_cpus=0, max_restarts=-1)(NodeHubService)
    return actor.options(
        name=f"{prefix}-nodes", namespace=namespace, get_if_exists=True, lifetime="detached"
    ).remote()


class RayNodeHub(ActorProxy, NodeHubPort):
    """`NodeHubPort` over the cluster's hub actor, found (or created) on first use."""

    def __init__(self, prefix: str, namespace: str = "openbot") -> None:
        self.prefix = prefix
        self.namespace = namespace
        self._handle: Any = None

    def _actor(self) -> Any:
        if self._handle is None:
            self._handle = _hub_actor(self.prefix, self.namespace)
        return self._handle

    async def run(
        self, node: str, messages: Sequence[Message], tools: Sequence[ToolSpec], timeout: float
    ) -> Completion:
        return await self._actor().run.remote(node, list(messages), list(tools), timeout)
