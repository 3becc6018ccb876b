"""CPU per HTTP request in the gateway's own code, without Ray or sockets: uvicorn's HTTP
protocol (httptools) over a transport that keeps what is written, handing `GET /healthz` to the
gateway's app with its whole middleware stack (request log, errors, token check, body limits,
router), one request after another.

    .venv/bin/python -m benchmarks.gateway_cpu [--requests 5000] [--rounds 3] [--profile]

Prints the CPU microseconds per request of each round. On a busy machine count instructions
instead: run it under `valgrind --tool=callgrind` with `--rounds 1` at two `--requests` and
divide the difference of the totals by the difference of the counts. /healthz answers with no
actor call, so this is the floor every route of the gateway pays.

`--read`: also `GET /v1/bots/:botId/memory` as `benchmarks.memory_ops` reads it (a reader's page
of a 10,000-entry pool, 1% visible, served from the gateway's cache after the first read),
alternating with /healthz under the same token, on a real engine (Ray, two shards, in a temp
dir); and the same read by a second app on the same engine without the shortcut for cached
pages (gateway/cached_reads.py), down the whole middleware stack and router. The requests run on
the server's own event loop, so the figure is that thread's CPU: the Ray driver's threads and
the load generator are left out (neither works for a cached read).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import time
import types
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.app import create_app

REQUEST = b"GET /healthz HTTP/1.1\r\nhost: bench\r\n\r\n"


class Kept(asyncio.Transport):
    """A transport that keeps the sizes of what is written (no socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def serve(
    app: Any,
    requests: int,
    prof: cProfile.Profile | None,
    request: bytes = REQUEST,
    clock: Any = time.process_time,
    warmup: int = 0,
) -> float:
    """CPU seconds (`clock`) per request for `requests` requests on one connection, after
    `warmup` ones."""
    config = Config(app, lifespan="off", log_level="warning", access_log=False)
    config.load()
    state = ServerState()
    protocol = HttpToolsProtocol(config=config, server_state=state, app_state={})
    protocol.connection_made(Kept())
    for n in range(warmup):
        protocol.data_received(request)
        while state.total_requests <= n:
            await asyncio.sleep(0)
    cpu0 = clock()
    if prof is not None:
        prof.enable()
    for n in range(warmup, warmup + requests):
        protocol.data_received(request)
        while state.total_requests <= n:
            await asyncio.sleep(0)
    if prof is not None:
        prof.disable()
    cpu = clock() - cpu0
    protocol.connection_lost(None)
    return cpu / requests


def read_rounds(args: argparse.Namespace) -> None:
    """`--read`: GET memory against /healthz, alternating, on the server's loop thread."""
    import secrets
    import shutil
    import tempfile
    from pathlib import Path

    from actors.runtime.engine import Engine, start_ray
    from benchmarks.memory_ops import Admin, seed_pool
    from gateway.live_server import LiveServer

    ray_tmp = tempfile.mkdtemp(prefix="obg", dir="/tmp")  # short: Ray's socket paths
    start_ray(tmp_dir=ray_tmp)
    data = tempfile.mkdtemp(prefix="obg-data-")
    engine = Engine.start(Path(data), shards=2, group_commit=True, prefix="gwcpu")
    token = "bench-admin-" + secrets.token_hex(8)
    app = create_app(engine, token)
    server = LiveServer(app, lifespan="auto")
    admin = Admin(server.port, token)
    try:
        org = admin.post("/v1/admin/orgs", {"name": "bench org"})["id"]
        owner = admin.post("/v1/admin/users", {"name": "owner", "orgs": [org]})
        reader = admin.post("/v1/admin/users", {"name": "reader", "orgs": [org]})
        bot = admin.post("/v1/admin/bots", {"name": "bench bot", "org": org, "owner": owner["id"]})
        grant = {"bot": bot["id"], "user": reader["id"], "permission": "read"}
        admin.post("/v1/admin/grants", grant)
        pool = f"bot:{bot['id']}"
        seed_pool(engine.shard_for(owner["id"]), pool, org, reader["id"], 10_000, 100)
        auth = f"authorization: Bearer {reader['token']}\r\n"
        read = f"GET /v1/bots/{bot['id']}/memory HTTP/1.1\r\nhost: b\r\n{auth}\r\n"
        whole = create_app(engine, token, cached_reads=False)
        requests = {
            "GET memory": (app, read),
            "GET memory, whole stack": (whole, read),
            "GET /healthz": (app, f"GET /healthz HTTP/1.1\r\nhost: b\r\n{auth}\r\n"),
        }
        assert server.loop is not None
        for _ in range(args.rounds):
            for name, (served, request) in requests.items():
                run = serve(served, args.requests, None, request.encode(), time.thread_time, 20)
                per = asyncio.run_coroutine_threadsafe(run, server.loop).result()
                load = os.getloadavg()[0]
                print(f"{name}: {per * 1e6:.1f} us of the server thread's CPU per request "
                      f"(load {load:.1f})", flush=True)  # fmt: skip
    finally:
        admin.close()
        server.stop()
        engine.stop()
        import ray

        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--read", action="store_true", help="GET memory against /healthz (Ray)")
    args = p.parse_args()
    if args.read:
        read_rounds(args)
        return
    engine = types.SimpleNamespace(shard_ports=[], node_hub=None)  # /healthz calls no actor
    app = create_app(engine, "bench-admin-token")  # type: ignore[arg-type]
    for _ in range(args.rounds):
        per = asyncio.run(serve(app, args.requests, None))
        print(f"GET /healthz: {per * 1e6:.1f} us of CPU per request", flush=True)
    if args.profile:
        prof = cProfile.Profile()
        asyncio.run(serve(app, args.requests, prof))
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(30)
        print(out.getvalue())


if __name__ == "__main__":
    main()
