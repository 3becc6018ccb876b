"""uvicorn serving an app from a thread of this process, on a loopback port (the OS's choice
unless one is given).

For tests and benchmarks that need a real HTTP and websocket server next to the Ray driver.
The socket is made with IPPROTO_TCP explicitly: asyncio turns Nagle's algorithm off only for
sockets that say so, and without that every response waits ~40 ms on delayed ACKs.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any


class LiveServer:
    def __init__(self, app: Any, *, port: int = 0, **config: Any) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._sock = sock
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, once it runs
        from gateway.server import UVICORN_HTTP, UVICORN_WS, proxy_options

        options = {"log_level": "warning", "lifespan": "auto", "timeout_graceful_shutdown": 1}
        options |= UVICORN_HTTP | UVICORN_WS | proxy_options()
        self.server = uvicorn.Server(uvicorn.Config(app, **(options | config)))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            self.thread.join(0.01)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self._sock])

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self._sock.close()
