"""CPU per write inside one shard, in this process (no Ray, no HTTP): Remember and
workspace memory writes (bot scope) side by side, as the HTTP benchmarks send them (each with a
requestId), on a `ShardService` over a DuckDB file in a temp dir.

    .venv/bin/python -m benchmarks.write_cpu [--count 2000] [--callers 2 8] [--rounds 3]
                                             [--entries 10000] [--profile ws|remember]
                                             [--coalesced 8] [--only ws|remember|plain]
                                             [--cache-records N]

For each caller count, `--rounds` alternating rounds (Remember, workspace, ...) of `--count`
writes each; prints the CPU of this process per write (all threads: event loop, database
thread, journal sync) and writes per group commit, best round and median. Two callers give about
the commits per write a shard actor sees under `benchmarks.memory_ops` (2 writes per commit).
To compare two versions of the code on a busy machine, run this in both checkouts one after the
other, more than once, and compare the best figures: CPU time is far less inflated by other
processes than wall time, but not immune (cache misses, frequency).

The collector is set as a shard actor sets it once started (`--default-gc`: the interpreter's
settings).

`--coalesced N`: N requests per call, as a gateway's coalesced calls bring them (HTTP: about 4
with 8 clients). On a machine too busy for CPU times, count instructions instead: run one kind
(`--only ws --rounds 1`; `plain` is a Remember without a requestId) under `valgrind
--tool=callgrind` at two `--count`s and divide the difference of the totals by the difference
of the counts (deterministic, whatever the load),
with `OPENBLAS_NUM_THREADS=1`: OpenBLAS's idle worker threads spin for as long as the
scheduler lets them, a count that changes from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable

import msgspec

from actors.contracts import RememberCall, WorkspaceAccess, WorkspaceCreateCall
from actors.directory import DirectoryService
from actors.runtime.hosting import tune_gc
from actors.shard.service import ShardService
from engine.memory_entries import EntryMeta, Layer, Reader
from engine.scoped_memory import WorkspaceMemoryCreate

ORG, ACCOUNT, BOT = "o_bench", "u_bench", "b_bench"
POOL = f"bot:{BOT}"
READER = Reader(user=ACCOUNT, org=ORG, uses_bot=True)
ACCESS = WorkspaceAccess(account=ACCOUNT, bots=frozenset({BOT}))
TEXT = "the customer prefers short answers, metric units and a summary at the end; note {}"


async def seed(svc: ShardService, entries: int) -> None:
    base = time.time_ns() // 1_000_000 - entries
    chunk: list[tuple[EntryMeta, str]] = []
    for i in range(entries):
        user = ACCOUNT if i % 10 == 0 else f"u_other_{i % max(1, entries // 20)}"
        meta = EntryMeta(
            id=f"mem_seed{i:08d}",
            pool=POOL,
            layer=Layer.PINNED,
            tags=(f"from:{user}", f"for:person:{user}", f"org:{ORG}", "bench"),
            created_at=base + i,
            updated_at=base + i,
        )
        chunk.append((meta, f"seed note {i} of {user}; one line of prose like a real note"))
        if len(chunk) == 1000:
            await svc.add_entries(POOL, chunk)
            chunk = []
    if chunk:
        await svc.add_entries(POOL, chunk)


async def measure(
    svc: ShardService,
    write: Callable[[int], Awaitable[object]],
    count: int,
    callers: int,
    per_call: int = 1,
) -> tuple[float, float, float]:
    """(ms of CPU per write, writes per commit, ms of the event loop thread's CPU per write)
    of `count` writes from `callers` callers."""
    committer = svc.kernel.committer
    tx0, b0 = committer.transactions, committer.batches
    counter = iter(range(count // per_call))

    async def caller() -> None:
        for n in counter:
            await write(n)

    cpu0, loop0 = time.process_time(), time.thread_time()
    await asyncio.gather(*(caller() for _ in range(callers)))
    await committer.drain()
    cpu, loop = time.process_time() - cpu0, time.thread_time() - loop0
    tx, b = committer.transactions - tx0, committer.batches - b0
    return 1000 * cpu / count, b / max(tx, 1), 1000 * loop / count


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        svc = ShardService(tmp, 0, models={}, cache_records=args.cache_records)
        directory = DirectoryService(tmp)
        svc.peers.connect(directory=directory)
        await directory.create_org("Bench", ORG)
        await directory.create_user("Bench", [ORG], ACCOUNT)
        await directory.create_bot(name="Helper", org=ORG, owner=ACCOUNT, id=BOT)
        await seed(svc, args.entries)
        if not args.default_gc:
            # As a shard actor runs (actors/runtime/hosting.py): what start-up made frozen,
            # full collections rarer. With the interpreter's defaults, when a full collection
            # comes depends on how many objects survive, and one more or fewer in a window
            # moves its CPU more than a change to the write path does.
            tune_gc()
        serial = iter(range(10**9))

        async def remember(n: int) -> None:
            i = next(serial)
            await svc.remember(POOL, READER, TEXT.format(i), ("bench",), f"r-{i}")

        async def ws(n: int) -> None:
            i = next(serial)
            body = WorkspaceMemoryCreate(
                requestId=f"w-{i}", scope="bot", bot=BOT, content=TEXT.format(i), tier="note"
            )
            await svc.workspace_create_memory(ACCESS, body)

        packer = msgspec.msgpack.Encoder()

        def packed(kind: str, n: int) -> bytes:
            i = next(serial)
            if kind == "remember":
                return packer.encode(
                    RememberCall(
                        pool=POOL,
                        reader=READER,
                        content=TEXT.format(i),
                        topics=("bench",),
                        request_id=f"r-{i}",
                    )
                )
            if kind == "plain":
                return packer.encode(
                    RememberCall(
                        pool=POOL, reader=READER, content=TEXT.format(i), topics=("bench",)
                    )
                )
            body = WorkspaceMemoryCreate(
                requestId=f"w-{i}", scope="bot", bot=BOT, content=TEXT.format(i), tier="note"
            )
            return packer.encode(WorkspaceCreateCall(access=ACCESS, body=body))

        def many(kind: str, method: Callable[[bytes], Awaitable[bytes]]):
            # As a gateway sends them (actors/runtime/coalesce.py): `--coalesced` requests a
            # call, one call in flight per caller.
            async def write(n: int) -> None:
                size = args.coalesced
                await method(packer.encode([packed(kind, n) for _ in range(size)]))

            return write

        async def plain(n: int) -> None:
            i = next(serial)
            await svc.remember(POOL, READER, TEXT.format(i), ("bench",))

        kinds = {"remember": remember, "plain": plain, "ws": ws}
        per = max(1, args.coalesced)
        if args.coalesced:
            kinds = {
                "remember": many("remember", svc.remember_many),
                "plain": many("plain", svc.remember_many),
                "ws": many("ws", svc.workspace_create_memory_many),
            }
        if args.only:
            kinds = {args.only: kinds[args.only]}
        for kind in kinds.values():  # warm up: pools loaded, receipt keys read, memos filled
            await measure(svc, kind, 200, 2, per)
        if args.profile:
            prof = cProfile.Profile(time.thread_time)
            prof.enable()
            cpu, per, _ = await measure(svc, kinds[args.profile], args.count, args.callers[0], per)
            prof.disable()
            print(f"{args.profile}: {cpu:.3f} ms CPU per write (profiled), {per:.1f} per commit")
            for key in ("cumulative", "tottime"):
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
                print(out.getvalue())
        else:
            for callers in args.callers:
                got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in kinds}
                for _ in range(args.rounds):
                    for name, kind in kinds.items():
                        got[name].append(await measure(svc, kind, args.count, callers, per))
                line = [f"{callers} callers:"]
                for name, rs in got.items():
                    cpus = [c for c, _, _ in rs]
                    loops = [lp for _, _, lp in rs]
                    line.append(
                        f"{name} {min(cpus):.3f} ms CPU/write best, "
                        f"{statistics.median(cpus):.3f} median, event loop {min(loops):.3f} "
                        f"({rs[0][1]:.1f} per commit; rounds {[round(c, 3) for c in cpus]})"
                    )
                print("  ".join(line), flush=True)
        await svc.close()
        directory.store.db.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=2000)
    p.add_argument("--callers", type=int, nargs="+", default=[2, 8])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--entries", type=int, default=10_000)
    p.add_argument("--profile", choices=["remember", "plain", "ws"], default=None)
    p.add_argument("--top", type=int, default=40)
    p.add_argument(
        "--only", choices=["remember", "plain", "ws"], default=None, help="one kind only"
    )
    p.add_argument(
        "--coalesced", type=int, default=0, help="requests per coalesced call (0: one by one)"
    )
    p.add_argument(
        "--cache-records",
        type=int,
        default=None,
        help="the shard's residency budget (records kept loaded; the default's otherwise): "
        "below the two pools' records together, each round loads the other kind's pool again",
    )
    p.add_argument(
        "--default-gc",
        action="store_true",
        help="keep the interpreter's collector settings (not a shard actor's)",
    )
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
