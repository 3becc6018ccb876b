"""The gateway's HTTP protocol (gateway/http_protocol.py) closes an idle keep-alive connection
when uvicorn's would (`timeout_keep_alive` after its last response, if no byte came since),
never one whose client keeps asking or whose request is still under way, with one timer per
connection; and its copy of uvicorn's `on_response_complete` stays in step with uvicorn's."""

from __future__ import annotations

import asyncio
import inspect
import textwrap
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.http_protocol import KeepAliveHttpProtocol

TIMEOUT = 0.2
REQUEST = b"GET /%s HTTP/1.1\r\nhost: t\r\n\r\n"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed_at: float | None = None
        self.answers = 0

    def write(self, data: Any) -> None:
        self.answers += bytes(data).startswith(b"HTTP/1.1 200")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed_at is not None

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = asyncio.get_running_loop().time()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: dict, receive: Any, send: Any) -> None:
    if scope["path"] == "/slow":
        await asyncio.sleep(TIMEOUT * 2)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def _connection() -> tuple[KeepAliveHttpProtocol, Transport]:
    config = Config(app, lifespan="off", timeout_keep_alive=TIMEOUT, log_level="warning")
    config.load()
    protocol = KeepAliveHttpProtocol(config=config, server_state=ServerState(), app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


async def _ask(protocol: KeepAliveHttpProtocol, transport: Transport, path: bytes) -> None:
    before = transport.answers
    protocol.data_received(REQUEST % path)
    while transport.answers == before:
        await asyncio.sleep(0.005)


def test_an_idle_connection_closes_a_timeout_after_its_last_answer():
    async def run() -> None:
        loop = asyncio.get_running_loop()
        protocol, transport = _connection()
        for _ in range(4):  # asking again within the timeout keeps it open, well past one
            await _ask(protocol, transport, b"a")
            await asyncio.sleep(TIMEOUT * 0.6)
        assert transport.closed_at is None
        await _ask(protocol, transport, b"a")
        last = loop.time()
        while transport.closed_at is None:
            await asyncio.sleep(0.01)
            assert loop.time() - last < TIMEOUT * 3
        assert transport.closed_at - last >= TIMEOUT * 0.9
        assert transport.answers == 5

    asyncio.run(run())


def test_a_request_under_way_is_not_cut_and_the_timer_counts_from_its_answer():
    async def run() -> None:
        loop = asyncio.get_running_loop()
        protocol, transport = _connection()
        await _ask(protocol, transport, b"a")
        await asyncio.sleep(TIMEOUT * 0.5)
        await _ask(protocol, transport, b"slow")  # under way when the first timer fires
        answered = loop.time()
        assert transport.closed_at is None
        await asyncio.sleep(TIMEOUT * 0.5)
        assert transport.closed_at is None
        while transport.closed_at is None:
            await asyncio.sleep(0.01)
            assert loop.time() - answered < TIMEOUT * 3
        assert transport.closed_at - answered >= TIMEOUT * 0.9

    asyncio.run(run())


def test_one_timer_per_connection_and_none_once_it_is_gone():
    async def run() -> None:
        protocol, transport = _connection()
        await _ask(protocol, transport, b"a")
        timer = protocol._idle_timer  # private: the one timer is what this module is for
        for _ in range(5):
            await _ask(protocol, transport, b"a")
        assert protocol._idle_timer is timer and timer is not None  # private: as above
        assert protocol.timeout_keep_alive_task is None  # (uvicorn's own: never armed)
        protocol.connection_lost(None)
        assert timer.cancelled() and protocol._idle_timer is None  # private: as above

    asyncio.run(run())


# uvicorn's `on_response_complete` as the gateway's protocol copies it: when uvicorn changes
# it, bring KeepAliveHttpProtocol.on_response_complete in step, then update this.
UVICORN_ON_RESPONSE_COMPLETE = """\
def on_response_complete(self) -> None:
    # Callback for pipelined HTTP requests to be started.
    self.server_state.total_requests += 1

    if self.transport.is_closing():
        return

    self._unset_keepalive_if_required()

    # Unpause data reads if needed.
    self.flow.resume_reading()

    # Unblock any pipelined events. If there are none, arm the
    # Keep-Alive timeout instead.
    if self.pipeline:
        cycle, app = self.pipeline.pop()
        self._start_asgi_task(cycle, app)
    else:
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )
"""


def test_the_copy_of_uvicorns_response_completion_is_in_step_with_uvicorn():
    source = textwrap.dedent(inspect.getsource(HttpToolsProtocol.on_response_complete))
    assert source == UVICORN_ON_RESPONSE_COMPLETE
