"""Ready-made event frames (gateway/socket_frames.py): the bytes are the frame websockets itself
would write, the server offers the writer only on an open connection, frames written past ASGI and
through it arrive whole and in order, and a socket that cannot take more sends the rest through
ASGI, in order, once the client reads again. Real uvicorn (as the gateway runs it), real
websocket clients."""

from __future__ import annotations

import asyncio

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from gateway.live_server import LiveServer
from gateway.socket_frames import FRAMES, FrameWriter, text_frame
from gateway.subscriber import Outlet


@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_a_ready_made_frame_is_the_frame_websockets_writes(n):
    text = ("é" * n)[: max(0, n - 1)] + "x" * (n > 0)
    expected = Frame(Opcode.TEXT, text.encode()).serialize(mask=False, extensions=[])
    assert text_frame(text) == expected


class Room:
    """An app whose websocket endpoint hands each connection's outlet to the test."""

    def __init__(self) -> None:
        self.outlets: asyncio.Queue[tuple[Outlet, FrameWriter | None, WebSocket]] = asyncio.Queue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.app = Starlette(routes=[WebSocketRoute("/ws", self.endpoint)])

    async def endpoint(self, websocket: WebSocket) -> None:
        await websocket.accept()
        writer = websocket.scope.get("extensions", {}).get(FRAMES)
        outlet = Outlet(websocket.send, writer=writer)
        self.loop = asyncio.get_running_loop()
        self.outlets.put_nowait((outlet, writer, websocket))
        await outlet.ended.wait()  # the connection lives until the outlet gives up
        outlet.close()

    def call(self, fn):
        """Run `fn` on the server's loop (where the outlet lives) and return its result (awaited
        if it is a coroutine)."""

        async def run():
            out = fn()
            return await out if asyncio.iscoroutine(out) else out

        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)


@pytest.fixture
def room():
    room = Room()
    live = LiveServer(room.app)
    try:
        yield room, live.url.replace("http://", "ws://") + "/ws"
    finally:
        live.stop()


async def _next_outlet(room: Room) -> tuple[Outlet, FrameWriter | None, WebSocket]:
    for _ in range(500):
        if not room.outlets.empty():
            return room.outlets.get_nowait()
        await asyncio.sleep(0.01)
    raise AssertionError("the server never accepted the connection")


@pytest.mark.anyio
async def test_frames_written_past_asgi_and_through_it_arrive_whole_and_in_order(room):
    room, url = room

    async with connect(url) as ws:
        outlet, writer, websocket = await _next_outlet(room)
        assert writer is not None  # the gateway's uvicorn offers the extension
        texts = [f'{{"n":{i},"pad":"{"x" * (i * 37 % 300)}"}}' for i in range(200)]

        async def send_all():
            written = []
            for i, text in enumerate(texts):
                if i % 3 == 0:
                    # Through ASGI, as a hello or a replay frame may go: same stream.
                    await websocket.send_text(text)
                    written.append("asgi")
                else:
                    written.append(outlet.deliver(text, text_frame(text)))
            return written

        written = room.call(send_all)
        assert all(w is True for w in written if w != "asgi")
        got = [await asyncio.wait_for(ws.recv(), 10) for _ in texts]
        assert got == texts


@pytest.mark.anyio
async def test_a_full_socket_falls_back_to_asgi_sends_and_keeps_order(room):
    room, url = room

    async with connect(url, max_size=None, max_queue=None) as ws:
        outlet, writer, _ = await _next_outlet(room)
        assert writer is not None
        # The client stops reading (its transport is paused): the server's buffers fill.
        ws.transport.pause_reading()
        big = "y" * 60_000

        def fill():
            texts, direct = [], 0
            for i in range(2_000):
                text = f"{i:05d}{big}"
                texts.append(text)
                if not outlet.deliver(text):
                    break
                direct += 1
            # One more, queued behind the send that waits for room: order must hold.
            texts.append("last")
            outlet.deliver("last")
            return texts, direct, outlet.backlog

        texts, direct, backlog = room.call(fill)
        assert 0 < direct < 2_000 and backlog == 2  # the waiting send and "last"
        ws.transport.resume_reading()
        got = [await asyncio.wait_for(ws.recv(), 30) for _ in texts]
        assert got == texts
        assert room.call(lambda: outlet.backlog) == 0 and not outlet.ended.is_set()


@pytest.mark.anyio
async def test_the_writer_stops_at_a_closed_connection(room):
    room, url = room

    async with connect(url) as ws:
        outlet, writer, _ = await _next_outlet(room)
        await ws.close()
    assert writer is not None
    for _ in range(200):
        if room.call(lambda: writer.write(text_frame("late"))) is None:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the writer kept writing to a closed connection")
    assert room.call(lambda: outlet.deliver("late")) is False
    assert room.call(lambda: (outlet.ended.is_set(), outlet.code)) == (True, None)


def test_the_writer_sees_a_paused_transport_as_uvicorns_send_does():
    """`frames_paused` follows the transport's pause and resume as uvicorn's `writable` does:
    the writer declines (False) exactly while uvicorn's own send would wait."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from gateway.server import UVICORN_WS
    from gateway.socket_frames import FramingProtocol

    async def run() -> None:
        config = Config(Starlette(), **UVICORN_WS)
        config.load()
        protocol = FramingProtocol(config=config, server_state=ServerState(), app_state={})
        for step in ("pause_writing", "resume_writing", "pause_writing", "resume_writing"):
            getattr(protocol, step)()
            assert protocol.frames_paused is (not protocol.writable.is_set()), step

    asyncio.run(run())
