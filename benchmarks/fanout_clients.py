"""The fan-out benchmark's client side alone: CPU per received frame of each client kind, fed by
one fixed-rate frame source, so that no server's speed enters the comparison.

    cd /work/main && .venv/bin/python -m benchmarks.fanout_clients [--rates 500,2000,8000]

The source (a child process) accepts websocket connections with `websockets` and, once every
client is connected, writes ready-made text frames straight to the sockets: event i goes to the
`--group` clients of user i mod (clients / group), at each of `--rates` events/s in turn, every
client's copy
the same bytes (as both servers of `benchmarks.fanout` send them). `--per-write K` puts K
consecutive frames of a user in one write, as a gateway that coalesces a stretch does.

Frame shapes (`--shapes`):
  openbot     the gateway's `memory.changed` frame, made by the gateway's own encoder
              (gateway/subscriber.py event_json) with a two-shard cursor
  reference   the raw websockets reference's frame (benchmarks/_fanout_refs.py frame)
Client kinds (`--kinds`): the fan-out benchmark's own client processes
(`python -m benchmarks._fanout_load clients`), `openbot` (EventClient) and `websockets` (the raw
client), each in one process holding every client. Runs alternate kind by kind and shape by
shape, `--repeat` times; the table gives each combination's median CPU per 1,000 frames (user +
system time of the client process from its first frame command to its last frame) and its
wakeups (voluntary context switches: the times its event loop slept and woke again), each run's
line also the source's CPU and the 1-minute load average.

Why the rates: a client process's CPU per frame depends far more on how frames come (a wakeup
and a socket read for each, or many frames per read) than on which client reads them, so two
kinds compare only at one pace, and a client behind a slower server pays more per frame.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks._fanout_load import cpu_s, emit, raise_nofile, stdin_lines
from benchmarks.fanout import Child

SHAPES = ("openbot", "reference")
KINDS = ("openbot", "websockets")


def frames_of(shape: str, count: int) -> tuple[bytes, list[bytes], list[str]]:
    """The hello frame's text, `count` event frames' texts and their entry ids."""
    from gateway.socket_frames import utf8_frame

    ids = [f"mem_{i:012x}{os.urandom(6).hex()}" for i in range(count)]  # as long as the real ones
    if shape == "reference":
        from benchmarks import _fanout_refs as refs

        texts = [refs._enc.encode(refs.frame(entry, i + 1)) for i, entry in enumerate(ids)]
        hello = refs.hello()
    else:
        from engine.events import Audience, Event, MemoryChanged, Position, encode_cursor
        from gateway.subscriber import event_json

        epochs = (os.urandom(8).hex(), os.urandom(8).hex())
        bot = "bot_" + os.urandom(8).hex()
        texts = []
        for i, entry in enumerate(ids):
            data = MemoryChanged(
                pool=f"bot:{bot}", entry=entry, version=1, change="created", bot=bot
            )
            event = Event(seq=i + 1, at=time.time_ns() // 1_000_000, data=data, audience=Audience())
            cursor = encode_cursor([Position(epochs[0], i + 1), Position(epochs[1], 0)])
            texts.append(event_json(event, cursor))
        cursor = encode_cursor([Position(epochs[0], 0), Position(epochs[1], 0)])
        hello = msgspec.json.encode({"type": "hello", "cursor": cursor, "at": 0})
    return utf8_frame(hello), [utf8_frame(t) for t in texts], ids


# --- the source (child process) ----------------------------------------------------------------


async def serve_source() -> None:
    from urllib.parse import parse_qs, urlsplit

    from websockets.asyncio.server import serve

    from benchmarks._fanout_refs import listening_socket

    by_user: dict[int, list[Any]] = {}
    hello = b""

    async def handler(ws: Any) -> None:
        # The raw client names its user in the query, EventClient in its token ("u<n>").
        query = parse_qs(urlsplit(ws.request.path).query)
        if "user" in query:
            user = int(query["user"][0])
        else:
            user = int(ws.request.headers["Authorization"].removeprefix("Bearer u"))
        by_user.setdefault(user, []).append(ws)
        ws.transport.write(hello)
        await ws.wait_closed()
        by_user[user].remove(ws)

    sock = listening_socket()
    async with serve(handler, sock=sock, backlog=2048, ping_interval=None, compression=None):
        emit({"event": "listening", "port": sock.getsockname()[1]})
        lines = await stdin_lines()
        while raw := await lines.readline():
            cmd = json.loads(raw)
            if cmd["cmd"] == "shape":
                hello, frames, ids = frames_of(cmd["shape"], cmd["frames"])
                by_user.clear()
                emit({"event": "shaped", "ids": ids, "bytes": len(frames[0])})
            elif cmd["cmd"] == "run":
                cpu0 = cpu_s()
                await send_all(by_user, frames, cmd["rate"], cmd["per_write"])
                emit({"event": "sent", "cpu_s": cpu_s() - cpu0})


async def send_all(
    by_user: dict[int, list[Any]], frames: list[bytes], rate: float, per_write: int
) -> None:
    """Event i to user i mod users, due at i / rate s: each write as soon as its events are
    due (`per_write` consecutive events of one user in one write), so that a client's process
    sees them as they come, not in ticks."""
    users = sorted(by_user)
    n = len(users)
    writes = []  # (due index, user, bytes): events base + k + j * n for j < per_write
    for base in range(0, len(frames), n * per_write):
        for k, user in enumerate(users):
            mine = frames[base + k : base + n * per_write : n]
            if mine:
                writes.append((base + k + (len(mine) - 1) * n, user, b"".join(mine)))
    writes.sort(key=lambda w: w[0])
    start = time.monotonic()
    for due, user, data in writes:
        delay = start + due / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        for ws in by_user[user]:
            ws.transport.write(data)


# --- the driver --------------------------------------------------------------------------------


def one_run(
    args: argparse.Namespace, source: Child, kind: str, shape: str, rate: float, logdir: Path
) -> dict[str, Any]:
    users = args.clients // args.group
    source.send({"cmd": "shape", "shape": shape, "frames": args.frames * users})
    shaped = source.recv(60)
    cfg = {
        "system": kind,
        "url": f"http://127.0.0.1:{args.port}",
        "clients": [
            {"index": i, "user": i // args.group, "token": f"u{i // args.group}"}
            for i in range(args.clients)
        ],
        "out": str(logdir / f"records-{kind}.json"),
    }
    cfg_path = logdir / f"clients-{kind}.json"
    cfg_path.write_text(json.dumps(cfg))
    args_ = ["clients", str(cfg_path)]
    clients = Child(f"clients-{kind}", "benchmarks._fanout_load", args_, logdir)
    try:
        ready = clients.recv(120)
        if ready["ready"] != args.clients:
            raise RuntimeError(f"{kind}: {ready}")
        load = os.getloadavg()[0]
        source.send({"cmd": "run", "rate": rate, "per_write": args.per_write})
        sent = source.recv(600)
        ids = shaped["ids"]
        per_user = {u: ids[u::users] for u in range(users)}
        clients.send({"cmd": "settle", "ids": per_user, "quiet": 2.0, "deadline": 60})
        settled = clients.recv(120)
        clients.send({"cmd": "report"})
        reported = clients.recv(60)
    finally:
        clients.stop()
    records = msgspec.json.decode(Path(cfg["out"]).read_bytes())["clients"]
    got = sum(len(c["received"]) for c in records)
    return {
        "kind": kind,
        "shape": shape,
        "rate": rate,
        "frame_bytes": shaped["bytes"],
        "frames": got,
        "missing": settled["missing"],
        "client_ms_per_1k": 1e6 * reported["cpu_s"] / max(got, 1),
        "wakeups_per_1k": 1000 * reported["wakeups"] / max(got, 1),
        "source_ms_per_1k": 1e6 * sent["cpu_s"] / max(got, 1),
        "load": load,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["source"]:
        raise_nofile()
        asyncio.run(serve_source())
        os._exit(0)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=500, help="clients, all in one process")
    p.add_argument("--group", type=int, default=10, help="clients per user (an event's audience)")
    p.add_argument("--frames", type=int, default=200, help="events per user")
    p.add_argument("--rates", default="1000", help="events per second, comma-separated")
    p.add_argument("--per-write", type=int, default=1, help="frames of one user per write")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--shapes", default=",".join(SHAPES))
    args = p.parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    raise_nofile()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fanout-clients-") as tmp:
        logdir = Path(tmp)
        source = Child("source", "benchmarks.fanout_clients", ["source"], logdir)
        try:
            args.port = source.recv(30)["port"]
            for _ in range(args.repeat):
                for rate, shape, kind in _combinations(rates, args):
                    row = one_run(args, source, kind, shape, rate, logdir)
                    rows.append(row)
                    print(
                        f"  {rate:>6g}/s {kind:<10} {shape:<9} {row['frames']} frames "
                        f"({row['frame_bytes']} B, {row['missing']} missing): client "
                        f"{row['client_ms_per_1k']:.1f} ms/1k, "
                        f"{row['wakeups_per_1k']:.0f} wakeups/1k, source "
                        f"{row['source_ms_per_1k']:.1f}, load {row['load']:.2f}",
                        flush=True,
                    )
        finally:
            source.stop()
    print(
        f"\nclient CPU per 1,000 frames, median of {args.repeat} ({args.clients} clients in one "
        f"process, {args.group} per event, {args.per_write} per write)"
    )
    for rate, shape, kind in _combinations(rates, args):
        mine = [r for r in rows if (r["rate"], r["shape"], r["kind"]) == (rate, shape, kind)]
        ms = statistics.median(r["client_ms_per_1k"] for r in mine)
        woke = statistics.median(r["wakeups_per_1k"] for r in mine)
        print(
            f"  {rate:>6g} events/s, {kind:<10} client, {shape:<9} frames: {ms:5.1f} ms CPU, "
            f"{woke:4.0f} wakeups"
        )
    return 0


def _combinations(rates: list[float], args: argparse.Namespace) -> list[tuple[float, str, str]]:
    return [
        (rate, shape, kind)
        for rate in rates
        for shape in args.shapes.split(",")
        for kind in args.kinds.split(",")
    ]


if __name__ == "__main__":
    raise SystemExit(main())
