"""Where a shard's Remember spends its CPU, in this process (no Ray, no HTTP): a `ShardService` on
a DuckDB file in a temp dir, a pool seeded like `benchmarks.memory_ops` (`--entries` pinned
entries), then `--count` Remembers from `--callers` concurrent callers, optionally under cProfile.

    .venv/bin/python -m benchmarks.remember_profile [--count 2000] [--callers 8] [--profile]
        [--no-journal]

Prints Remembers per second, CPU ms per Remember (all threads, and the event loop's), writes
per group commit, and with `--profile` the top functions by cumulative and by own time.
`--no-journal` makes each group commit a DuckDB transaction instead of a journal record (what
the journal saves). A script for finding costs, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import io
import pstats
import secrets
import tempfile
import time

from actors.shard.service import ShardService
from engine.memory_entries import EntryMeta, Layer, Reader
from storage.stats import STATS

ORG = "o1"
POOL = "bot:b1"
READER = Reader(user="u_reader", org=ORG, uses_bot=True)
FILLER = "; remembered for the load benchmark, roughly one line of prose like a real note"


def commit_seconds() -> tuple[float, int]:
    """Total seconds and count of group commits so far in this process (storage/stats.py)."""
    for h in STATS.snapshot()["histograms"]:
        if h[0] == "openbot_shard_commit_seconds":
            return h[-2], h[-1]
    return 0.0, 0


def seed(entries: int) -> list[list[tuple[EntryMeta, str]]]:
    chunks: list[list[tuple[EntryMeta, str]]] = [[]]
    base = time.time_ns() // 1_000_000 - entries
    for i in range(entries):
        user = READER.user if i % 10 == 0 else f"u_other_{i % max(1, entries // 20)}"
        meta = EntryMeta(
            id="mem_" + secrets.token_hex(12),
            pool=POOL,
            layer=Layer.PINNED,
            tags=(f"from:{user}", f"for:person:{user}", f"org:{ORG}", "bench"),
            created_at=base + i,
            updated_at=base + i,
        )
        if len(chunks[-1]) == 1000:
            chunks.append([])
        chunks[-1].append((meta, f"seed note {i} of {user}{FILLER}"))
    return chunks


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        svc = ShardService(tmp, 0, models={})
        for chunk in seed(args.entries):
            if chunk:
                await svc.add_entries(POOL, chunk)
        committer = svc.kernel.committer
        committer.journal = args.journal
        tx0, b0 = committer.transactions, committer.batches
        counter = iter(range(args.count))

        async def caller(w: int) -> None:
            for n in counter:
                content = (
                    f"bench remember w{w} n{n}: the customer prefers short answers, "
                    "metric units and a summary at the end"
                )
                await svc.remember(POOL, READER, content, ("bench",), None)

        gc_time = [0.0, 0.0, 0]  # seconds in the collector, start of the current one, count

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                gc_time[1] = time.process_time()
            else:
                gc_time[0] += time.process_time() - gc_time[1]
                gc_time[2] += 1

        gc.callbacks.append(on_gc)
        s0, n0 = commit_seconds()
        prof = cProfile.Profile() if args.profile else None
        cpu0, loop0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        if prof:
            prof.enable()
        await asyncio.gather(*(caller(w) for w in range(args.callers)))
        if prof:
            prof.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        loop_cpu = time.thread_time() - loop0  # this thread runs the event loop
        tx, b = committer.transactions - tx0, committer.batches - b0
        s1, n1 = commit_seconds()
        print(
            f"{args.count} Remembers, {args.callers} callers, {args.entries} entries, "
            f"journal {'on' if args.journal else 'off'}: "
            f"{args.count / wall:.0f}/s, {1000 * cpu / args.count:.2f} ms CPU each "
            f"({1000 * loop_cpu / args.count:.2f} ms on the event loop's thread), "
            f"{b / max(tx, 1):.1f} writes per commit ({tx} commits); "
            f"{gc_time[2]} collections, {1000 * gc_time[0] / args.count:.2f} ms GC each; "
            f"a commit takes {1000 * (s1 - s0) / max(n1 - n0, 1):.2f} ms (wall), "
            f"the committer is busy {100 * (s1 - s0) / wall:.0f}% of the time"
        )
        gc.callbacks.remove(on_gc)
        await svc.kernel.close()
        if prof:
            for key in ("cumulative", "tottime"):
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
                print(out.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--callers", type=int, default=8)
    p.add_argument("--entries", type=int, default=10_000)
    p.add_argument("--profile", action="store_true")
    p.add_argument(
        "--no-journal",
        dest="journal",
        action="store_false",
        help="each group commit a DuckDB transaction, not a journal record",
    )
    p.add_argument("--top", type=int, default=35)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
