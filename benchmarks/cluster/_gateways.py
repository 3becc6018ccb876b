"""The gateways of a cluster run: the real app under uvicorn in a Ray actor, one per node."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class GatewayService:
    """The real app (gateway.app) under uvicorn, in a Ray actor on one node: a gateway per node
    as `openbot serve --ray-address` would run there. One per node for the whole run: it imports
    the gateway while the stage's engine starts, then `attach` serves a stage's engine (on a
    fresh port) and `detach` stops serving it."""

    def __init__(self) -> None:
        import uvicorn  # noqa: F401  (imported now, while the engine starts elsewhere)

        import gateway.app  # noqa: F401

        self.server = None
        self.thread = None

    def attach(self, prefix: str, shards: int, admin_token: str) -> tuple[str, str]:
        import socket

        import ray
        import uvicorn

        from actors.runtime.engine import NAMESPACE, Engine
        from gateway.app import create_app
        from gateway.server import tune_gc

        self.detach()
        directory = ray.get_actor(f"{prefix}-directory", namespace=NAMESPACE)
        handles = [ray.get_actor(f"{prefix}-shard-{k}", namespace=NAMESPACE) for k in range(shards)]
        app = create_app(Engine(directory, handles, None, prefix), admin_token)
        host = ray.util.get_node_ip_address()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind((host, 0))
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            ws_ping_interval=15.0,
            ws_ping_timeout=15.0,
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True
        )
        thread.start()
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            thread.join(0.01)
        self.server, self.thread = server, thread
        tune_gc()
        return f"http://{host}:{sock.getsockname()[1]}", ray.get_runtime_context().get_node_id()

    def detach(self) -> None:
        if self.server is not None and self.thread is not None:
            self.server.should_exit = True
            self.thread.join(15)
        self.server = self.thread = None


class GatewayPool:
    """One gateway actor per node (hard node affinity: it dies with its node)."""

    def __init__(self) -> None:
        self.actors: dict[str, Any] = {}

    def ensure(self) -> None:
        """Start a gateway on every alive node that has none (without waiting for it)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        actor = ray.remote(num_cpus=0, max_restarts=0)(GatewayService)
        for n in ray.nodes():
            if n.get("Alive") and n["NodeID"] not in self.actors:
                strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                self.actors[n["NodeID"]] = actor.options(scheduling_strategy=strategy).remote()

    def kill(self) -> None:
        import ray

        for a in self.actors.values():
            ray.kill(a, no_restart=True)
        self.actors.clear()
