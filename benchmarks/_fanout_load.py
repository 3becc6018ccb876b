"""The child processes of the fan-out benchmark (`benchmarks/fanout.py`): websocket clients and the
producer. Each runs in its own process so that none shares a GIL with the server it measures.

    python -m benchmarks._fanout_load clients CONFIG.json
    python -m benchmarks._fanout_load produce CONFIG.json

Both speak JSON lines: commands on stdin, replies on stdout (logs go to stderr). Times are
`time.monotonic_ns()`, which on Linux is one clock for every process of the machine, so a send
time taken by the producer and a receive time taken by a client compare directly.

Clients (`system` picks the client library):
  openbot     `gateway.client.EventClient` (the project's own reconnecting client; resumes by
              cursor), subclassed only to count connections and close codes
  websockets  a raw `websockets` client that reconnects with the same back-off (no resume);
              also against OpenBot with `"client": "raw"` in the config
  socketio    `socketio.AsyncClient`, websocket transport only, its own reconnection with the
              same base delay (no resume)
All three decode frames with the same msgspec decoder, so client-side cost is alike.

  {"cmd": "drops", "seconds": S, "percent": P, "every": E}
      for S seconds: every E s a fresh random P% of this process's clients, each dropped once
      at a random moment within that round (the client must reconnect by itself)
  {"cmd": "settle", "ids": {user: [entry ids]}, "quiet": Q, "deadline": D}
      wait until every client holds every id of its user (this phase's events: what an earlier
      phase lost does not keep a later one waiting), or until every client is connected and
      nothing arrived for Q s, or D s passed; replies {"event": "settled", ...}
  {"cmd": "report"}   close every client, write the records file, reply, exit

Producer: one POST per event, on a pool of keep-alive HTTP/1.1 connections (raw asyncio client
from `benchmarks._load`: httpx would be the bottleneck).
  {"cmd": "fixed", "phase": name, "rate": R, "seconds": S}   open loop: event i is due at i/R s
  {"cmd": "burst", "phase": name, "count": N, "concurrency": C}   closed loop, as fast as it can
  {"cmd": "report"}
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from benchmarks._load import HttpConnection, build_request

_dec = msgspec.json.Decoder()


def raise_nofile(want: int = 65536) -> int:
    """Raise this process's open-file limit towards `want` (1,000+ sockets); returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def waits() -> int:
    """How often this process went to sleep waiting (its event loop woke as often)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


async def stdin_lines() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


# --- clients -----------------------------------------------------------------------------------


class BenchClient:
    """What every client records: (entry id, receive time) per event frame, and its connection
    history."""

    def __init__(self, index: int, user: int) -> None:
        self.index = index
        self.user = user
        # (entry id, monotonic receive ns, wall-clock receive ms - the frame's `at` ms)
        self.received: list[tuple[str, int, int]] = []
        self.seen: set[str] = set()
        self.ready = asyncio.Event()
        self.drops = 0
        self.drop_times: list[int] = []
        self.connects = 0
        self.closes: collections.Counter[str] = collections.Counter()
        self.resets = 0
        self.errors: list[str] = []
        self.last_frame = 0
        self.task: asyncio.Task[None] | None = None

    def dropped(self) -> None:
        self.drops += 1
        self.drop_times.append(time.monotonic_ns())

    def got(self, entry: str, t: int, at: int) -> None:
        self.received.append((entry, t, time.time_ns() // 1_000_000 - at))
        self.seen.add(entry)
        self.last_frame = t

    def connected(self) -> bool:
        raise NotImplementedError

    async def start(self) -> None:
        raise NotImplementedError

    async def drop(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def record(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "user": self.user,
            "received": self.received,
            "drops": self.drops,
            "drop_times": self.drop_times,
            "connects": self.connects,
            "closes": dict(self.closes),  # a copy: later closes do not change it
            "resets": self.resets,
            "errors": self.errors[:5],
        }


def _openbot_client_class():
    from websockets.protocol import State

    from gateway.client import EventClient, EventStreamClosed

    class CountingEventClient(EventClient):
        """EventClient as shipped; this only counts connections and the close codes seen, and
        signals the first frame (the server's `hello`: the client is subscribed)."""

        def __init__(self, *args: Any, owner: BenchClient, **kwargs: Any) -> None:
            self.owner = owner
            self.hello = asyncio.Event()
            super().__init__(*args, **kwargs)

        @property
        def cursor(self) -> str | None:
            return self._cursor

        @cursor.setter
        def cursor(self, value: str | None) -> None:
            self._cursor = value
            if value is not None:
                self.hello.set()

        async def _connect(self):
            prev = self._ws
            if prev is not None:
                self.owner.closes[str(prev.close_code)] += 1
                self._ws = None
            ws = await super()._connect()
            self.owner.connects += 1
            return ws

        def is_open(self) -> bool:
            return self._ws is not None and self._ws.state is State.OPEN

    class OpenBotClient(BenchClient):
        def __init__(self, index: int, user: int, url: str, token: str) -> None:
            super().__init__(index, user)
            self.ec = CountingEventClient(url, token, owner=self)

        async def start(self) -> None:
            self.task = asyncio.create_task(self._run())
            await self.ec.hello.wait()
            self.ready.set()

        async def _run(self) -> None:
            try:
                async for frame in self.ec:
                    t = time.monotonic_ns()
                    if frame.type == "reset":
                        self.resets += 1
                        continue
                    entry = (frame.data or {}).get("entry")
                    if entry is not None:
                        self.got(entry, t, frame.at)
            except EventStreamClosed as e:
                self.errors.append(f"EventStreamClosed {e.code}: {e.reason}")
            except Exception as e:
                self.errors.append(f"{type(e).__name__}: {e}"[:300])

        def connected(self) -> bool:
            return self.ec.is_open()

        async def drop(self) -> None:
            if self.ec.is_open():
                self.dropped()
                await self.ec.drop()

        async def close(self) -> None:
            await self.ec.close()
            if self.task is not None:
                self.task.cancel()

    return OpenBotClient


class WebsocketsClient(BenchClient):
    """A raw `websockets` client against the broadcast reference: reconnects with EventClient's
    back-off, but there is nothing to resume (the reference keeps no log). With a `token` it
    subscribes to OpenBot's stream instead (`--openbot-client raw`: the same server with either
    client, to tell a client's cost from the server's)."""

    def __init__(self, index: int, user: int, url: str, token: str | None = None) -> None:
        super().__init__(index, user)
        base = url.replace("http://", "ws://", 1)
        self.url = f"{base}/events?user={user}" if token is None else f"{base}/v1/events"
        self.headers = None if token is None else {"Authorization": f"Bearer {token}"}
        self.ws: Any = None
        self.closed = False

    async def start(self) -> None:
        self.task = asyncio.create_task(self._run())
        await self.ready.wait()

    async def _run(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        from gateway.client import EventFrame

        frame_dec = msgspec.json.Decoder(EventFrame)  # as EventClient decodes

        delay = 0.05
        while not self.closed:
            try:
                self.ws = await connect(
                    self.url, additional_headers=self.headers, open_timeout=10, max_size=2**22
                )
                self.connects += 1
                async for raw in self.ws:
                    t = time.monotonic_ns()
                    frame = frame_dec.decode(raw)
                    delay = 0.05
                    if frame.type == "hello":
                        self.ready.set()
                        continue
                    self.got(frame.data["entry"], t, frame.at)
                self.closes[str(self.ws.close_code)] += 1
            except ConnectionClosed as e:
                self.closes[str(e.rcvd.code if e.rcvd else None)] += 1
            except (OSError, InvalidHandshake, TimeoutError):
                self.closes["connect_failed"] += 1
            except Exception as e:
                self.errors.append(f"{type(e).__name__}: {e}"[:300])
            if self.closed:
                return
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 5.0)

    def connected(self) -> bool:
        from websockets.protocol import State

        return self.ws is not None and self.ws.state is State.OPEN

    async def drop(self) -> None:
        if self.connected():
            self.dropped()
            await self.ws.close(code=4000, reason="client drop")

    async def close(self) -> None:
        self.closed = True
        if self.ws is not None:
            await self.ws.close()
        if self.task is not None:
            self.task.cancel()


class SocketioClient(BenchClient):
    """`socketio.AsyncClient` over the websocket transport, with its built-in reconnection at
    EventClient's base delay (0.05 s +- 50%). A drop closes the engine.io websocket under it, as
    a network failure would."""

    def __init__(self, index: int, user: int, url: str, session: Any) -> None:
        import socketio

        from gateway.client import EventFrame

        super().__init__(index, user)
        self.url = url
        self._to_frame = msgspec.convert
        self._frame_type = EventFrame
        self.sio = socketio.AsyncClient(
            reconnection=True,
            reconnection_delay=0.05,
            reconnection_delay_max=5,
            randomization_factor=0.025,
            handle_sigint=False,
            http_session=session,
        )
        self.sio.on("memory.changed", self._on_event)
        self.sio.on("connect", self._on_connect)
        self.sio.on("disconnect", self._on_disconnect)

    async def _on_event(self, data: Any) -> None:
        t = time.monotonic_ns()
        frame = self._to_frame(data, self._frame_type)
        self.got(frame.data["entry"], t, frame.at)

    async def _on_connect(self) -> None:
        self.connects += 1
        self.ready.set()

    async def _on_disconnect(self, reason: Any = None) -> None:
        self.closes[str(reason)] += 1

    async def start(self) -> None:
        await self.sio.connect(
            self.url,
            transports=["websocket"],
            auth={"user": self.user},
            wait_timeout=10,
        )
        await self.ready.wait()

    def connected(self) -> bool:
        return bool(self.sio.connected)

    async def drop(self) -> None:
        ws = getattr(self.sio.eio, "ws", None)
        if self.sio.connected and ws is not None and not ws.closed:
            self.dropped()
            await ws.close(code=4000)

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.sio.shutdown(), 5)
        except Exception as e:
            self.errors.append(f"shutdown: {type(e).__name__}: {e}"[:300])


async def run_clients(cfg: dict[str, Any]) -> None:
    system = cfg["system"]
    url = cfg["url"]
    rng = random.Random(cfg.get("seed", 0))
    session = None
    if system == "openbot" and cfg.get("client") == "raw":
        clients = [WebsocketsClient(c["index"], c["user"], url, c["token"]) for c in cfg["clients"]]
    elif system == "openbot":
        cls = _openbot_client_class()
        clients: list[BenchClient] = [
            cls(c["index"], c["user"], url, c["token"]) for c in cfg["clients"]
        ]
    elif system == "websockets":
        clients = [WebsocketsClient(c["index"], c["user"], url) for c in cfg["clients"]]
    elif system == "socketio":
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        clients = [SocketioClient(c["index"], c["user"], url, session) for c in cfg["clients"]]
    else:
        raise SystemExit(f"unknown system {system}")

    # Connect everyone (bounded concurrency), then report ready.
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(cfg.get("connect_concurrency", 50))
    failures: list[str] = []

    async def connect(c: BenchClient) -> None:
        async with sem:
            try:
                await asyncio.wait_for(c.start(), 30)
            except Exception as e:
                failures.append(f"{type(e).__name__}: {e}"[:200])

    await asyncio.gather(*(connect(c) for c in clients))
    emit(
        {
            "event": "ready",
            "clients": len(clients),
            "ready": sum(c.ready.is_set() for c in clients),
            "connect_s": round(time.perf_counter() - t0, 3),
            "failures": failures[:5],
            "failed": len(failures),
        }
    )

    cpu0, waits0 = cpu_s(), waits()
    lines = await stdin_lines()
    drop_task: asyncio.Task[None] | None = None
    pending_drops: set[asyncio.Task[None]] = set()

    async def drops(seconds: float, percent: float, every: float) -> None:
        start = time.monotonic()
        plan: list[tuple[float, BenchClient]] = []
        rounds = max(1, math.ceil(seconds / every))
        k = round(len(clients) * percent / 100)
        for r in range(rounds):
            lo, hi = r * every, min((r + 1) * every, seconds)
            for c in rng.sample(clients, k):
                plan.append((rng.uniform(lo, hi), c))
        plan.sort(key=lambda p: p[0])
        for at, c in plan:
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(c.drop())
            pending_drops.add(task)
            task.add_done_callback(pending_drops.discard)

    async def settle(ids: dict[str, list[str]], quiet: float, deadline: float) -> dict[str, Any]:
        t_start = time.monotonic()
        need = {int(u): set(v) for u, v in ids.items()}
        nothing: set[str] = set()
        while True:
            now = time.monotonic()
            missing = sum(len(need.get(c.user, nothing) - c.seen) for c in clients)
            if missing == 0:
                reason = "complete"
                break
            last = max((c.last_frame for c in clients), default=0) / 1e9
            if all(c.connected() for c in clients) and now - max(last, t_start) >= quiet:
                reason = "quiet"
                break
            if now - t_start >= deadline:
                reason = "deadline"
                break
            await asyncio.sleep(0.05)
        return {
            "event": "settled",
            "reason": reason,
            "missing": missing,
            "s": round(time.monotonic() - t_start, 3),
            "disconnected": sum(not c.connected() for c in clients),
        }

    while True:
        raw = await lines.readline()
        if not raw:
            break
        cmd = json.loads(raw)
        if cmd["cmd"] == "drops":
            drop_task = asyncio.create_task(drops(cmd["seconds"], cmd["percent"], cmd["every"]))
        elif cmd["cmd"] == "settle":
            if drop_task is not None:
                await drop_task
                drop_task = None
            if pending_drops:
                await asyncio.gather(*pending_drops, return_exceptions=True)
            emit(await settle(cmd["ids"], cmd["quiet"], cmd["deadline"]))
        elif cmd["cmd"] == "report":
            break
    cpu1, woke = cpu_s(), waits() - waits0
    if drop_task is not None:
        drop_task.cancel()
    records = [c.record() for c in clients]  # before closing: the closes below are not counted
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    if session is not None:
        await session.close()
    Path(cfg["out"]).write_bytes(
        msgspec.json.encode({"clients": records, "cpu_s": cpu1 - cpu0, "wakeups": woke})
    )
    emit({"event": "reported", "cpu_s": round(cpu1 - cpu0, 3), "wakeups": woke})


# --- producer ----------------------------------------------------------------------------------


class Producer:
    """POSTs events to the system under test; records (phase, id, user, send, response) each."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.system = cfg["system"]
        self.host = cfg["host"]
        self.port = cfg["port"]
        self.users: list[dict[str, Any]] = cfg["users"]
        self.records: list[tuple[str, str | None, int, int, int, int]] = []
        self.errors: list[str] = []
        self.retries = 0
        # LIFO: the fewest connections stay busy, the rest idle; an idle one the server closed
        # (uvicorn's 5 s keep-alive timeout) fails with nothing read and is retried once.
        self.pool: asyncio.LifoQueue[HttpConnection] = asyncio.LifoQueue()
        for _ in range(cfg.get("connections", 32)):
            self.pool.put_nowait(HttpConnection(self.host, self.port))

    def _request(self, phase: str, i: int) -> tuple[int, bytes]:
        user = self.users[i % len(self.users)]
        if self.system == "openbot":
            content = (
                f"fanout bench {phase} n{i}: the customer prefers short answers, metric units "
                "and a summary at the end"
            )
            body = msgspec.json.encode({"command": {"_tag": "Remember", "content": content}})
            path = f"/v1/bots/{self.cfg['bot']}/memory"
            raw = build_request("POST", self.host, self.port, path, user["token"], body)
        else:
            body = msgspec.json.encode({"user": user["index"], "id": f"{phase}-{i}"})
            raw = build_request("POST", self.host, self.port, "/publish", None, body)
        return user["index"], raw

    async def one(self, phase: str, i: int) -> None:
        user, raw = self._request(phase, i)
        conn = await self.pool.get()
        t_send = time.monotonic_ns()
        entry = None
        status = 0
        try:
            try:
                status, body = await asyncio.wait_for(conn.request(raw), 30)
            except (asyncio.IncompleteReadError, ConnectionResetError) as e:
                if isinstance(e, asyncio.IncompleteReadError) and e.partial:
                    raise
                # The server closed the idle connection before reading the request (nothing
                # came back, so nothing was done): send it again on a fresh connection.
                self.retries += 1
                await conn.close()
                status, body = await asyncio.wait_for(conn.request(raw), 30)
            if status in (200, 201):
                entry = _dec.decode(body)["id"]
            elif len(self.errors) < 5:
                self.errors.append(f"HTTP {status}: {body[:200]!r}")
        except Exception as e:
            if len(self.errors) < 5:
                self.errors.append(f"{type(e).__name__}: {e}"[:300])
            await conn.close()
            conn = HttpConnection(self.host, self.port)
        finally:
            self.pool.put_nowait(conn)
        self.records.append((phase, entry, user, t_send, time.monotonic_ns(), status))

    async def fixed(self, phase: str, rate: float, seconds: float) -> dict[str, Any]:
        total = round(rate * seconds)
        tasks = []
        lags: list[float] = []
        start = time.monotonic() + 0.02
        for i in range(total):
            due = start + i / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            lags.append(time.monotonic() - due)
            tasks.append(asyncio.create_task(self.one(phase, i)))
        sent_s = time.monotonic() - start
        await asyncio.gather(*tasks)
        lags.sort()
        return {
            "sent": total,
            "send_s": round(sent_s, 3),
            "schedule_lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))] * 1000, 2)
            if lags
            else 0,
        }

    async def burst(self, phase: str, count: int, concurrency: int) -> dict[str, Any]:
        it = iter(range(count))
        start = time.monotonic()

        async def worker() -> None:
            for i in it:
                await self.one(phase, i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"sent": count, "send_s": round(time.monotonic() - start, 3)}


async def run_producer(cfg: dict[str, Any]) -> None:
    prod = Producer(cfg)
    # Open the keep-alive connections up front (not measured).
    conns = [prod.pool.get_nowait() for _ in range(prod.pool.qsize())]
    for conn in conns:
        await conn._connect()
        prod.pool.put_nowait(conn)
    emit({"event": "ready"})
    lines = await stdin_lines()
    while True:
        raw = await lines.readline()
        if not raw:
            break
        cmd = json.loads(raw)
        if cmd["cmd"] == "report":
            break
        cpu0 = cpu_s()
        n0 = len(prod.records)
        e0 = len(prod.errors)
        if cmd["cmd"] == "fixed":
            out = await prod.fixed(cmd["phase"], cmd["rate"], cmd["seconds"])
        else:
            out = await prod.burst(cmd["phase"], cmd["count"], cmd["concurrency"])
        new = prod.records[n0:]
        out["ok"] = sum(1 for r in new if r[1] is not None)
        out["retries"] = prod.retries
        prod.retries = 0
        ids: dict[int, list[str]] = collections.defaultdict(list)
        for r in new:
            if r[1] is not None:
                ids[r[2]].append(r[1])
        out["per_user"] = {u: len(v) for u, v in ids.items()}
        out["ids"] = ids
        out["cpu_s"] = round(cpu_s() - cpu0, 3)
        out["errors"] = prod.errors[e0:]
        emit({"event": "done", **out})
    while not prod.pool.empty():
        await prod.pool.get_nowait().close()
    Path(cfg["out"]).write_bytes(msgspec.json.encode({"records": prod.records}))
    emit({"event": "reported"})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("clients", "produce"):
        print("usage: python -m benchmarks._fanout_load {clients|produce} CONFIG.json")
        return 2
    raise_nofile()
    cfg = json.loads(Path(argv[1]).read_text())
    if argv[0] == "clients":
        asyncio.run(run_clients(cfg))
    else:
        asyncio.run(run_producer(cfg))
    os._exit(0)  # skip slow interpreter teardown of 500 sockets' objects


if __name__ == "__main__":
    raise SystemExit(main())
