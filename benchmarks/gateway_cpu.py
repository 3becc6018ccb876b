"""CPU per HTTP request in the gateway's own code, without Ray or sockets: uvicorn's HTTP
protocol (httptools) over a transport that keeps what is written, handing `GET /healthz` to the
gateway's app with its whole middleware stack (request log, errors, token check, body limits,
router), one request after another.

    .venv/bin/python -m benchmarks.gateway_cpu [--requests 5000] [--rounds 3] [--profile]

Prints the CPU microseconds per request of each round. On a busy machine count instructions
instead: run it under `valgrind --tool=callgrind` with `--rounds 1` at two `--requests` and
divide the difference of the totals by the difference of the counts. /healthz answers with no
actor call, so this is the floor every route of the gateway pays.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
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


async def serve(app: Any, requests: int, prof: cProfile.Profile | None) -> float:
    """CPU seconds per request for `requests` requests on one connection."""
    config = Config(app, lifespan="off", log_level="warning", access_log=False)
    config.load()
    state = ServerState()
    protocol = HttpToolsProtocol(config=config, server_state=state, app_state={})
    protocol.connection_made(Kept())
    cpu0 = time.process_time()
    if prof is not None:
        prof.enable()
    for n in range(requests):
        protocol.data_received(REQUEST)
        while state.total_requests <= n:
            await asyncio.sleep(0)
    if prof is not None:
        prof.disable()
    cpu = time.process_time() - cpu0
    protocol.connection_lost(None)
    return cpu / requests


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
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
