"""Many accounts on one machine: resident memory bounded by the residency budget, and the first
read of an account that is not in memory.

    .venv/bin/python -m benchmarks.accounts [--quick] [--accounts N] [--cache-records N]

Runs one real shard in this process (DuckDB files, group commit, encryption; no Ray, no HTTP):
`--accounts` accounts (100,000; `--quick` 2,000), each a bot memory of 10 entries its person may
see, stored in chunks; then reads each of a sample of the accounts written first twice, the first
time cold (evicted by the budget: read from the database), the second warm, and samples the
process's resident memory (RSS) as the accounts are written and read, and how much of it is
DuckDB's own buffer pool (`duckdb_memory()`: the table blocks it caches, bounded by its memory
limit, `OPENBOT_DUCKDB_MEMORY`, not by the residency budget). Targets: the first read of a cold
account p50 at most 20 ms; RSS after reading the sample, less DuckDB's buffer pool, at most
`RSS_BASE` plus `RSS_PER_RECORD` times `--cache-records` (the budget keeps what the shard has
loaded bounded, whatever the number of accounts); the whole RSS is printed beside it. Writes
benchmarks/results/accounts.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from actors.shard.service import ShardService
from engine.memory_entries import EntryMeta, Layer, Reader

ENTRIES = 10  # memories per account
CHUNK = 200  # accounts stored per batch of calls awaited together
COLD_P50_MAX_MS = 20.0
RSS_BASE = 400 * 2**20  # the process with Python, DuckDB and the shard, before any pool
RSS_PER_RECORD = 4 * 1024  # a loaded record with its share of indexes and caches, generously


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def duckdb_bytes(svc: ShardService) -> int:
    """Memory DuckDB's buffer manager holds for the shard's file (its cached blocks)."""

    def read(con) -> int:
        return con.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()").fetchone()[0]

    return int(await svc.kernel.db.run(read) or 0)


def reader(n: int) -> Reader:
    return Reader(user=f"u_{n}", org="o1", uses_bot=True)


def entries(n: int) -> list[tuple[EntryMeta, str]]:
    user = f"u_{n}"
    return [
        (
            EntryMeta(
                id=f"mem_{n:06d}_{k}",
                pool=f"bot:b_{n}",
                layer=Layer.PINNED,
                tags=(f"from:{user}", f"for:person:{user}", "org:o1", "note"),
                created_at=k,
                updated_at=k,
            ),
            f"note {k} of account {n}: a sentence of ordinary length, as a person would say it",
        )
        for k in range(ENTRIES)
    ]


async def run(accounts: int, sample: int, cache_records: int, root: Path) -> dict:
    svc = ShardService(root / "data", 0, cache_records=cache_records)
    rss_start = rss()
    rss_seen = [rss_start]
    t0 = time.perf_counter()
    for start in range(0, accounts, CHUNK):
        batch = range(start, min(accounts, start + CHUNK))
        await asyncio.gather(*(svc.add_entries(f"bot:b_{n}", entries(n)) for n in batch))
        if start % (CHUNK * 50) == 0:
            rss_seen.append(rss())
    write_s = time.perf_counter() - t0
    await svc.committer.drain()
    while svc.committer.unapplied:  # the journal applied, as after an idle moment
        await asyncio.sleep(0.05)
    rss_written, duck_written = rss(), await duckdb_bytes(svc)
    # From the first half written: the budget made room for later accounts by evicting them
    # (a budget of at least half the accounts' records would keep some of them in memory).
    picked = random.Random(7).sample(range(accounts // 2), min(sample, accounts // 2))
    cold: list[float] = []
    warm: list[float] = []
    for n in picked:
        for out in (cold, warm):
            t = time.perf_counter()
            page = await svc.read_memory(f"bot:b_{n}", reader(n))
            out.append((time.perf_counter() - t) * 1000)
            if len(page.entries) != ENTRIES:
                raise RuntimeError(f"account {n} reads {len(page.entries)} entries")
    rss_read, duck_read = rss(), await duckdb_bytes(svc)
    await svc.close()
    load = os.getloadavg()[0]
    return {
        "accounts": accounts,
        "entries_per_account": ENTRIES,
        "cache_records": cache_records,
        "write_s": round(write_s, 1),
        "sample": sample,
        "cold_p50_ms": round(statistics.median(cold), 2),
        "cold_p99_ms": round(sorted(cold)[min(len(cold) - 1, int(len(cold) * 0.99))], 2),
        "warm_p50_ms": round(statistics.median(warm), 2),
        "rss_start_mib": round(rss_start / 2**20, 1),
        "rss_max_while_writing_mib": round(max(rss_seen) / 2**20, 1),
        "rss_written_mib": round(rss_written / 2**20, 1),
        "rss_after_reads_mib": round(rss_read / 2**20, 1),
        "duckdb_written_mib": round(duck_written / 2**20, 1),
        "duckdb_after_reads_mib": round(duck_read / 2**20, 1),
        "rss_after_reads_less_duckdb_mib": round((rss_read - duck_read) / 2**20, 1),
        "load": load,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--accounts", type=int, default=None)
    p.add_argument("--sample", type=int, default=None)
    p.add_argument("--cache-records", type=int, help="default 5,000 quick, else 50,000")
    args = p.parse_args()
    accounts = args.accounts or (2_000 if args.quick else 100_000)
    if args.cache_records is None:
        args.cache_records = 5_000 if args.quick else 50_000
    sample = args.sample or min(accounts, 200 if args.quick else 1_000)
    root = Path(tempfile.mkdtemp(prefix="obaccounts"))
    load_start = os.getloadavg()[0]
    try:
        r = asyncio.run(run(accounts, sample, args.cache_records, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bound = (RSS_BASE + RSS_PER_RECORD * args.cache_records) / 2**20
    print(
        f"accounts: {accounts:,} accounts of {ENTRIES} memories, cache_records "
        f"{args.cache_records:,}; {sample} read cold then warm; {os.cpu_count()} CPUs; "
        f"load {load_start:.1f}-{r['load']:.1f}"
    )
    print(f"  written in {r['write_s']} s")
    print(f"  first read (cold) p50 {r['cold_p50_ms']} ms, p99 {r['cold_p99_ms']} ms")
    print(f"  second read (warm) p50 {r['warm_p50_ms']} ms")
    print(
        f"  RSS: {r['rss_start_mib']} MiB at start, at most {r['rss_max_while_writing_mib']} MiB "
        f"while writing, {r['rss_written_mib']} MiB written, {r['rss_after_reads_mib']} MiB "
        "after the reads"
    )
    print(
        f"  of which DuckDB's buffer pool: {r['duckdb_written_mib']} MiB written, "
        f"{r['duckdb_after_reads_mib']} MiB after the reads"
    )
    checks = [
        (f"cold read p50 <= {COLD_P50_MAX_MS} ms", r["cold_p50_ms"] <= COLD_P50_MAX_MS),
        (
            f"RSS after the reads less DuckDB's buffer pool <= {bound:.0f} MiB (bounded by "
            f"cache_records): {r['rss_after_reads_less_duckdb_mib']} MiB",
            r["rss_after_reads_less_duckdb_mib"] <= bound,
        ),
    ]
    for what, ok in checks:
        print(f"target: {what}: {'PASS' if ok else 'FAIL'}")
    out = Path(__file__).parent / "results" / "accounts.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "result": r}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
