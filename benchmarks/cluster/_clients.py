"""The load (a child process, `python -m benchmarks.cluster --load SPEC`): memory and turn
clients over raw HTTP/1.1 spread over every gateway, and websocket subscribers that must see every
acknowledged write exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._load import HttpConnection, build_request, summarize


class Gateways:
    """The gateways' addresses; a client that fails on one moves to the next."""

    def __init__(self, urls: list[str]) -> None:
        self.hosts = []
        for url in urls:
            host, _, port = url.removeprefix("http://").partition(":")
            self.hosts.append((host, int(port)))

    def pick(self, k: int) -> tuple[str, int]:
        return self.hosts[k % len(self.hosts)]


class Recorder:
    def __init__(self, window_start: float, window_end: float) -> None:
        self.window_start = window_start
        self.window_end = window_end
        self.latency: dict[str, list[float]] = {"read": [], "write": [], "turn": []}
        self.errors: dict[str, int] = {"read": 0, "write": 0, "turn": 0}
        self.samples: list[str] = []
        self.last_done = window_start
        # (wall time, ok) per shard: when a shard refused and when it answered (the drill).
        self.timeline: dict[int, list[tuple[float, bool]]] = {}
        self.acked: dict[str, list[str]] = {}  # bot -> entry ids acknowledged (201)

    def record(self, kind: str, t0: float, t1: float, ok: bool, shard: int | None, what: str):
        if shard is not None:
            self.timeline.setdefault(shard, []).append((round(time.time(), 3), ok))
        if t0 < self.window_start or t0 >= self.window_end:
            return
        if ok:
            self.latency[kind].append(t1 - t0)
        else:
            self.errors[kind] += 1
            if len(self.samples) < 8:
                self.samples.append(f"{kind}: {what}"[:200])
        self.last_done = max(self.last_done, t1)


async def memory_client(
    k: int, account: dict, gateways: Gateways, rec: Recorder, write_every: int, end: float
) -> None:
    host, port = gateways.pick(k)
    conn = HttpConnection(host, port)
    path = f"/v1/bots/{account['bot']}/memory"
    seq = 0
    try:
        while time.perf_counter() < end:
            seq += 1
            write = seq % write_every == 0
            if write:
                body = json.dumps(
                    {"command": {"_tag": "Remember", "content": f"note {k}.{seq}: ship small"}}
                ).encode()
                raw = build_request("POST", host, port, path, account["token"], body)
            else:
                raw = build_request("GET", host, port, path, account["token"])
            t0 = time.perf_counter()
            ok, what = False, ""
            try:
                status, reply = await conn.request(raw)
                ok = status == (201 if write else 200)
                what = f"HTTP {status} {reply[:120]!r}"
                if ok and write:
                    rec.acked.setdefault(account["bot"], []).append(json.loads(reply)["id"])
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                what = f"{type(e).__name__}: {e}"
                await conn.close()
                k += 1  # this gateway is gone or failing: the next one
                host, port = gateways.pick(k)
                conn = HttpConnection(host, port)
            rec.record(
                "write" if write else "read", t0, time.perf_counter(), ok, account["shard"], what
            )
            if not ok:
                await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def turn_client(k: int, group: dict, gateways: Gateways, rec: Recorder, end: float) -> None:
    host, port = gateways.pick(k)
    conn = HttpConnection(host, port)
    path = f"/v1/chats/{group['chat']}/turns?wait=true"
    body = json.dumps({"text": "Anything blocking the release?", "rounds": 1}).encode()
    try:
        while time.perf_counter() < end:
            raw = build_request("POST", host, port, path, group["token"], body)
            t0 = time.perf_counter()
            ok, what = False, ""
            try:
                status, reply = await conn.request(raw)
                ok = status == 200
                what = f"HTTP {status} {reply[:120]!r}"
            except (OSError, asyncio.IncompleteReadError, ValueError) as e:
                what = f"{type(e).__name__}: {e}"
                await conn.close()
                k += 1
                host, port = gateways.pick(k)
                conn = HttpConnection(host, port)
            rec.record("turn", t0, time.perf_counter(), ok, None, what)
            if not ok:
                await asyncio.sleep(0.1)
    finally:
        await conn.close()


class Subscriber:
    """One account on /v1/events: resumes by cursor, moving to the next gateway on failure."""

    def __init__(self, k: int, account: dict, urls: list[str]) -> None:
        self.k = k
        self.account = account
        self.urls = urls
        self.pool = f"bot:{account['bot']}"
        self.cursor: str | None = None
        self.entries: list[str] = []
        self.reconnects = 0
        self.ready = asyncio.Event()
        self.task = asyncio.create_task(self.run())

    async def run(self) -> None:
        from urllib.parse import quote

        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        k = self.k
        while True:
            url = self.urls[k % len(self.urls)].replace("http://", "ws://", 1) + "/v1/events"
            if self.cursor:
                url += f"?cursor={quote(self.cursor)}"
            try:
                async with connect(
                    url,
                    additional_headers={"Authorization": f"Bearer {self.account['token']}"},
                    open_timeout=10,
                    max_size=2**22,
                ) as ws:
                    async for raw in ws:
                        frame = json.loads(raw)
                        self.cursor = frame["cursor"]
                        data = frame.get("data") or {}
                        if frame["type"] == "memory.changed" and data.get("pool") == self.pool:
                            self.entries.append(data["entry"])
                        self.ready.set()
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError):
                pass
            self.reconnects += 1
            k += 1
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def run_load(spec: dict) -> dict:
    import resource

    urls = spec["gateways"]
    gateways = Gateways(urls)
    accounts = spec["accounts"]
    subs = [Subscriber(k, a, urls) for k, a in enumerate(accounts[: spec["subscribers"]])]
    await asyncio.wait_for(asyncio.gather(*(s.ready.wait() for s in subs)), 60)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    window_start = start + spec["warmup"]
    end = window_start + spec["seconds"]
    rec = Recorder(window_start, end)
    wall_start = time.time() + spec["warmup"]
    # The drill times its kill from here.
    sys.stdout.write(json.dumps({"window_start": wall_start}) + "\n")
    sys.stdout.flush()
    tasks = [
        memory_client(k, accounts[k % len(accounts)], gateways, rec, spec["write_every"], end)
        for k in range(spec["concurrency"])
    ]
    tasks += [turn_client(k, g, gateways, rec, end) for k, g in enumerate(spec["groups"])]
    await asyncio.gather(*tasks)
    elapsed = rec.last_done - window_start
    # Every subscriber must now hold every acknowledged write to its bot (lost otherwise).
    deadline = time.perf_counter() + spec.get("catch_up", 20)
    for s in subs:
        wanted = set(rec.acked.get(s.account["bot"], []))
        while not wanted <= set(s.entries) and time.perf_counter() < deadline:
            await asyncio.sleep(0.05)  # frames arrive on the subscriber's task
    await asyncio.sleep(0.3)  # room for duplicates to show
    events = {"delivered": 0, "lost": 0, "duplicated": 0, "reconnects": 0}
    for s in subs:
        acked = set(rec.acked.get(s.account["bot"], []))
        events["delivered"] += len(s.entries)
        events["lost"] += len(acked - set(s.entries))
        events["duplicated"] += len(s.entries) - len(set(s.entries))
        events["reconnects"] += s.reconnects
        await s.close()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {
        "wall_start": wall_start,
        "seconds": round(elapsed, 3),
        "kinds": {
            kind: summarize(lat, elapsed, rec.errors[kind]) for kind, lat in rec.latency.items()
        },
        "events": events,
        "error_samples": rec.samples,
        "acked": rec.acked,
        "load_cpu_s": round((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 2),
    }
    if spec.get("timeline"):
        out["timeline"] = rec.timeline
    return out


def load_main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    out = asyncio.run(run_load(spec))
    sys.stdout.write(json.dumps(out) + "\n")
    return 0
