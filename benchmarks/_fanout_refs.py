"""The two reference servers of the fan-out benchmark (`benchmarks/fanout.py`), each run in its own
child process on 127.0.0.1:

    python -m benchmarks._fanout_refs websockets   # the ceiling
    python -m benchmarks._fanout_refs socketio     # what a Python team would otherwise pick

Both take the same publish path as OpenBot's producer: an HTTP/1.1 `POST /publish
{"user": n, "id": "..."}` on a keep-alive connection, answered 201 once the message has been handed
to every subscribed connection of that user. The message is a frame of OpenBot's shape and about
its size: {"type": "memory.changed", "cursor", "at", "data": {"pool", "entry", "version", "change",
"bot"}}.

websockets  `websockets.asyncio.server` on one port (clients connect to /events?user=n and get a
            `hello` frame once registered); the publish endpoint is a minimal asyncio HTTP/1.1
            server on a second port (the `websockets` server answers GET only). Each message is
            encoded once and sent with `websockets.broadcast` to the user's connections. No log,
            no resume: what a client misses while disconnected is lost.
socketio    `socketio.AsyncServer(async_mode="asgi")` under uvicorn (configured as `openbot
            serve` runs the gateway), a room per user (joined in `connect` from the client's
            auth), `POST /publish` a Starlette route in the same app that awaits
            `sio.emit(..., room=user)`. Also no resume.

Each prints {"port": P, "publish_port": Q} on stdout when listening and stops when stdin closes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import socket
import sys
import time
from typing import Any

import msgspec

from benchmarks._fanout_load import raise_nofile

_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder()
EPOCHS = (secrets.token_hex(8), secrets.token_hex(8))
BOT = "bot_" + secrets.token_hex(8)


def listening_socket() -> socket.socket:
    # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only then (see
    # tests/conftest.py); every server in the benchmark is bound the same way.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    return sock


def frame(entry: str, seq: int) -> dict[str, Any]:
    """A frame shaped and sized like OpenBot's memory.changed (cursor: two shard positions)."""
    cursor = base64.urlsafe_b64encode(_enc.encode([[EPOCHS[0], seq], [EPOCHS[1], 0]])).decode()
    return {
        "type": "memory.changed",
        "cursor": cursor.rstrip("="),
        "at": time.time_ns() // 1_000_000,
        "data": {
            "pool": f"bot:{BOT}",
            "entry": entry,
            "version": seq,
            "change": "created",
            "bot": BOT,
        },
    }


def hello() -> bytes:
    return _enc.encode({"type": "hello", "cursor": "", "at": time.time_ns() // 1_000_000})


async def wait_stdin_closed() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while await reader.readline():
        pass


# --- websockets: the ceiling -------------------------------------------------------------------


async def serve_websockets() -> None:
    from urllib.parse import parse_qs, urlsplit

    from websockets.asyncio.server import broadcast, serve

    subs: dict[int, set[Any]] = {}
    seq = 0

    async def handler(ws: Any) -> None:
        query = parse_qs(urlsplit(ws.request.path).query)
        user = int(query["user"][0])
        conns = subs.setdefault(user, set())
        conns.add(ws)
        try:
            await ws.send(hello(), text=True)
            await ws.wait_closed()
        finally:
            conns.discard(ws)

    async def publish_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seq
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                msg = _dec.decode(await reader.readexactly(length))
                seq += 1
                raw = _enc.encode(frame(msg["id"], seq))
                broadcast(subs.get(msg["user"], ()), raw, text=True)
                body = _enc.encode({"id": msg["id"]})
                writer.write(
                    b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            return  # shutting down (re-raising makes asyncio's stream callback log it)
        finally:
            writer.close()

    ws_sock, http_sock = listening_socket(), listening_socket()
    # No permessage-deflate, as the gateway serves websockets (gateway/server.py UVICORN_WS).
    async with serve(
        handler,
        sock=ws_sock,
        backlog=2048,
        max_size=2**16,
        ping_interval=15,
        ping_timeout=15,
        compression=None,
    ):
        http = await asyncio.start_server(publish_conn, sock=http_sock, backlog=2048)
        print(
            json.dumps(
                {"port": ws_sock.getsockname()[1], "publish_port": http_sock.getsockname()[1]}
            ),
            flush=True,
        )
        async with http:
            await wait_stdin_closed()


# --- python-socketio ---------------------------------------------------------------------------


async def serve_socketio() -> None:
    import socketio
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    sio = socketio.AsyncServer(
        async_mode="asgi", cors_allowed_origins="*", logger=False, engineio_logger=False
    )
    seq = 0

    @sio.event
    async def connect(sid: str, environ: dict, auth: dict | None) -> None:
        await sio.enter_room(sid, f"user-{int((auth or {})['user'])}")

    async def publish(request: Request) -> Response:
        nonlocal seq
        msg = _dec.decode(await request.body())
        seq += 1
        await sio.emit("memory.changed", frame(msg["id"], seq), room=f"user-{msg['user']}")
        return Response(_enc.encode({"id": msg["id"]}), 201, media_type="application/json")

    app = socketio.ASGIApp(
        sio, other_asgi_app=Starlette(routes=[Route("/publish", publish, methods=["POST"])])
    )
    sock = listening_socket()
    from gateway.server import UVICORN_WS

    # As `openbot serve` runs uvicorn (gateway/server.py): same defaults, same websocket options,
    # on uvicorn's own websockets-sansio protocol (the gateway's subclass only adds its ready-made
    # frame writer, which python-socketio would not use).
    options = UVICORN_WS | {"ws": "websockets-sansio"}
    config = uvicorn.Config(app, log_level="warning", lifespan="off", **options)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.01)
    port = sock.getsockname()[1]
    print(json.dumps({"port": port, "publish_port": port}), flush=True)
    await wait_stdin_closed()
    server.should_exit = True
    await asyncio.wait_for(task, 10)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv not in (["websockets"], ["socketio"]):
        print("usage: python -m benchmarks._fanout_refs {websockets|socketio}")
        return 2
    raise_nofile()
    asyncio.run(serve_websockets() if argv[0] == "websockets" else serve_socketio())
    os._exit(0)


if __name__ == "__main__":
    raise SystemExit(main())
