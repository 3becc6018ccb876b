"""Load generation for the benchmarks: a closed-loop driver and a raw HTTP/1.1 keep-alive client.

httpx costs more CPU per request than the server it measures (docs/design.md §14), so HTTP load
comes from a minimal client on `asyncio.open_connection`: one persistent connection per simulated
client, requests written as prebuilt bytes, responses read by Content-Length (chunked is handled
too).

HTTP load is generated in a child process (`python -m benchmarks._load http ...`) so that the
client does not share the server's GIL; it prints one JSON summary on stdout. `closed_loop` is also
used in-process for direct actor calls.

Measurement: `concurrency` workers each issue one request at a time. Requests that start during
the warm-up are not recorded; after warm-up, requests that start before the end of the window are
recorded; throughput is recorded requests over the time from the window's start until the last
of them finished.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

# An operation: called with its sequence number within the worker; raises on failure.
Op = Callable[[int], Awaitable[Any]]
# Makes a worker's operation (e.g. opens its connection); given the worker's index.
OpFactory = Callable[[int], Awaitable[tuple[Op, Callable[[], Awaitable[None]]]]]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (q in 0..1)."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def machine(load_start: tuple[float, float, float], **extra: Any) -> dict[str, Any]:
    """Where a run ran, for its report: CPUs, versions, anything the benchmark adds, and the load
    average at its start and end (figures from a loaded machine are noise)."""
    import platform

    import ray

    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "ray": ray.__version__,
        **extra,
        "loadavg_at_start": [round(x, 2) for x in load_start],
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def summarize(latencies: list[float], elapsed: float, errors: int) -> dict[str, Any]:
    lat = sorted(latencies)
    n = len(lat)
    ms = 1000.0
    return {
        "count": n,
        "errors": errors,
        "seconds": round(elapsed, 3),
        "throughput_per_s": round(n / elapsed, 1) if elapsed > 0 else 0.0,
        "p50_ms": round(percentile(lat, 0.50) * ms, 3),
        "p90_ms": round(percentile(lat, 0.90) * ms, 3),
        "p99_ms": round(percentile(lat, 0.99) * ms, 3),
        "mean_ms": round(sum(lat) / n * ms, 3) if n else math.nan,
        "max_ms": round(lat[-1] * ms, 3) if n else math.nan,
    }


async def closed_loop(
    make_op: OpFactory, *, concurrency: int, warmup: float, seconds: float
) -> dict[str, Any]:
    """Run `concurrency` workers back to back for `warmup + seconds`; summarize the window."""
    start = time.perf_counter()
    window_start = start + warmup
    window_end = window_start + seconds
    latencies: list[float] = []
    errors = 0
    error_samples: list[str] = []
    last_done = window_start
    total_ops = 0

    async def worker(index: int) -> None:
        nonlocal errors, last_done, total_ops
        op, close = await make_op(index)
        i = 0
        try:
            while True:
                t0 = time.perf_counter()
                if t0 >= window_end:
                    break
                ok = True
                try:
                    await op(i)
                except Exception as e:
                    ok = False
                    if len(error_samples) < 5:
                        error_samples.append(f"{type(e).__name__}: {e}"[:300])
                t1 = time.perf_counter()
                if t0 >= window_start:
                    if ok:
                        latencies.append(t1 - t0)
                    else:
                        errors += 1
                    last_done = max(last_done, t1)
                i += 1
                total_ops += 1
        finally:
            await close()

    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    out = summarize(latencies, last_done - window_start, errors)
    out["ops_incl_warmup"] = total_ops
    out["error_samples"] = error_samples
    return out


# --- a raw HTTP/1.1 keep-alive client ----------------------------------------------------------


class HttpError(Exception):
    pass


class HttpConnection:
    """One keep-alive connection; reconnects if the server closes it."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        # asyncio sets TCP_NODELAY on its TCP transports.
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, limit=1 << 20
        )

    async def request(self, raw: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            await self._connect()
        assert self.reader is not None and self.writer is not None
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = -1
        chunked = False
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                close = value.strip().lower() == b"close"
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            body = b"".join(parts)
        elif length >= 0:
            body = await self.reader.readexactly(length)
        else:
            body = await self.reader.read()
            close = True
        if close:
            await self.close()
        return status, body

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


def build_request(
    method: str, host: str, port: int, path: str, token: str | None, body: bytes | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    if body is not None:
        lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def remember_body(worker: int, seq: int, request_id: str | None = None) -> bytes:
    content = (
        f"bench remember w{worker} n{seq}: the customer prefers short answers, "
        "metric units and a summary at the end"
    )
    body: dict[str, Any] = {"command": {"_tag": "Remember", "content": content, "tags": ["bench"]}}
    if request_id is not None:  # an idempotent write, as a workspace memory always is
        body["requestId"] = request_id
    return json.dumps(body).encode()


def workspace_memory_body(bot: str, nonce: str, worker: int, seq: int) -> bytes:
    """A workspace memory of bot `bot` (`POST /api/app/workspace/memories`), a fresh requestId
    each time; content like `remember_body`'s."""
    content = (
        f"bench memory w{worker} n{seq}: the customer prefers short answers, "
        "metric units and a summary at the end"
    )
    return json.dumps(
        {
            "requestId": f"bench-{nonce}-{worker}-{seq}",
            "scope": "bot",
            "bot": bot,
            "content": content,
        }
    ).encode()


async def http_load(
    *,
    host: str,
    port: int,
    method: str,
    path: str,
    token: str | None,
    remember: bool,
    expect: int,
    concurrency: int,
    warmup: float,
    seconds: float,
    workspace_bot: str | None = None,
    request_ids: bool = False,
) -> dict[str, Any]:
    sizes = [0, 0]  # total body bytes, responses
    fresh = remember or workspace_bot is not None  # a new body per request
    fixed = None if fresh else build_request(method, host, port, path, token)
    nonce = os.urandom(4).hex()

    def request_body(index: int, seq: int) -> bytes:
        if workspace_bot is not None:
            return workspace_memory_body(workspace_bot, nonce, index, seq)
        return remember_body(index, seq, f"bench-{nonce}-{index}-{seq}" if request_ids else None)

    async def make_op(index: int):
        conn = HttpConnection(host, port)

        async def op(seq: int) -> None:
            raw = fixed or build_request(method, host, port, path, token, request_body(index, seq))
            status, body = await conn.request(raw)
            if status != expect:
                raise HttpError(f"HTTP {status}: {body[:200]!r}")
            sizes[0] += len(body)
            sizes[1] += 1

        return op, conn.close

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    out = await closed_loop(make_op, concurrency=concurrency, warmup=warmup, seconds=seconds)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    out["response_bytes"] = round(sizes[0] / sizes[1]) if sizes[1] else 0
    out["client_cpu_s"] = round(
        (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 3
    )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._load")
    sub = p.add_subparsers(dest="kind", required=True)
    h = sub.add_parser("http", help="closed-loop HTTP load; token from OPENBOT_BENCH_TOKEN")
    h.add_argument("--host", default="127.0.0.1")
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--method", default="GET")
    h.add_argument("--path", required=True)
    h.add_argument("--remember", action="store_true", help="send a fresh Remember body each time")
    h.add_argument(
        "--ws-memory", metavar="BOT", help="send a fresh workspace memory of BOT each time"
    )
    h.add_argument("--request-ids", action="store_true", help="a requestId in each Remember")
    h.add_argument("--expect", type=int, default=200)
    h.add_argument("--concurrency", type=int, default=8)
    h.add_argument("--warmup", type=float, default=1.0)
    h.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args(argv)
    out = asyncio.run(
        http_load(
            host=args.host,
            port=args.port,
            method=args.method,
            path=args.path,
            token=os.environ.get("OPENBOT_BENCH_TOKEN"),
            remember=args.remember,
            expect=args.expect,
            concurrency=args.concurrency,
            warmup=args.warmup,
            seconds=args.seconds,
            workspace_bot=args.ws_memory,
            request_ids=args.request_ids,
        )
    )
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def descendant_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of this process and its descendants (from /proc; Linux only), by pid,
    with each one's command line ("" for this process). Other sessions' processes are not
    descendants and are not counted."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                rest = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        pid = int(name)
        parent[pid] = int(rest[1])
        cpu[pid] = (int(rest[11]) + int(rest[12])) / tick
    me = os.getpid()
    mine = {me}
    grew = True
    while grew:
        new = {p for p, pp in parent.items() if pp in mine and p not in mine}
        mine |= new
        grew = bool(new)
    out: dict[int, tuple[str, float]] = {}
    for pid in mine:
        cmd = ""
        if pid != me:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
        out[pid] = (cmd, cpu.get(pid, 0.0))
    return out
