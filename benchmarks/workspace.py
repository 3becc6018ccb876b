"""Workspace memory: prompt packing, keyword and semantic search, export and import.

    .venv/bin/python -m benchmarks.workspace [--quick] [--dim N] [--records N] [--no-http]

1. **pack** — `engine.prompt_budget.pack` (SC-5) over 10,000 entries in three scopes (bot, user,
   project; profile, log and note tiers): time per pack, the budget filled.
2. **search** — 100,000 records of one account in its bot pool
   on a real shard in this process (DuckDB file, group commit, AES-GCM; no Ray, no
   HTTP, so the figures are the engine's time): `keyword` is `Workspace.entries` with `q` and
   semantic search off; `semantic` is `SemanticSearch.search` alone over the same candidates,
   with a zero-latency in-process embedding function (`--dim` dimensions, 384 by default, like
   a small sentence-embedding model); `both` is `Workspace.entries` with `q` and semantic search
   on, which is what one shard does for `GET /memories?q=`. `cold` is the first search after the
   shard opened (pools and vectors loaded from the file and decrypted), timed over `--cold-runs`
   opens (3; each with its CPU time). Every query is a new one, so the query-vector cache never
   answers. All records are in one pool (the scale the search targets are set at);
   `index_per_write_ms` is what keyword indexing adds to a write (term keys made and put into the
   pool's in-memory index).
3. **writes over HTTP** — a local Ray session, one shard and a real gateway (uvicorn on
   127.0.0.1): workspace memory writes (`POST /api/app/workspace/memories`, bot scope) against
   Remember (`POST /v1/bots/{bot}/memory`, with a requestId like every workspace
   write) by the bot's owner, the same concurrency, each a closed loop of raw HTTP/1.1
   keep-alive requests from a child process (benchmarks/_load.py), in alternating rounds
   (Remember, workspace, Remember, workspace); the ratio is workspace over Remember, rounds
   summed. `--no-http` skips it.
4. **export / import** — an account with 10,000 records written through `workspace_create_memory`
   (receipts and revisions as in production): the account file tree of the stopped data
   directory (storage/file_export.py), written to disk; imported into a new data directory; and
   exported again (byte-identical is checked). The Markdown memory export (`GET /memory-export`:
   listing + `engine.memory_export.render`) is timed too.

Writes benchmarks/results/workspace.json and prints a table. `--quick` shrinks the search to
20,000 records, the sample counts and the HTTP rounds (the export stays at 10,000 records);
`--records` sets the search's record count.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import platform
import random
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from actors.contracts import WorkspaceAccess, WorkspaceQuery
from actors.directory import DirectoryService
from actors.shard.batch import Batch
from actors.shard.service import ShardService
from actors.workspace.semantic import SemanticSearch
from benchmarks._load import percentile
from engine import memory_union as bm
from engine import scoped_memory as sm
from engine.memory_entries import Reader, Scope
from engine.memory_export import render as render_markdown
from engine.projects import ProjectCreate
from engine.prompt_budget import BUDGET, ScopedEntry, pack
from engine.scoped_memory import WorkspaceMemoryCreate
from storage.vector_store import VectorStore

ACCOUNT, BOT, ORG, PROJECT = "u_bench", "b_bench", "o_bench", "p_bench"
POOLS = (f"bot:{BOT}", f"user:{ACCOUNT}", f"project:{PROJECT}")
ACCESS = WorkspaceAccess(account=ACCOUNT, bots=frozenset({BOT}))
DAY_MS = 86_400_000
NOW_MS = 1_760_000_000_000
# Words for synthetic memories: a few common, most rare, so queries have varied selectivity.
COMMON = [
    "customer",
    "prefers",
    "deploy",
    "review",
    "meeting",
    "report",
    "weekly",
    "team",
    "project",
    "release",
]
RARE = [f"{a}{b}" for a in ("zan", "kor", "mel", "vit", "sup", "dra") for b in range(40)]
FILLER = [
    "the",
    "a",
    "with",
    "and",
    "before",
    "after",
    "during",
    "every",
    "some",
    "our",
    "their",
    "on",
    "in",
    "for",
    "of",
]
INSTRUCTIONS = (
    "You have a memory. What follows is what you know; each line says when it was last "
    "updated and where it comes from. Use it, and say when it may be out of date."
)


def sentence(rnd: random.Random, n: int) -> str:
    words = [rnd.choice(COMMON) for _ in range(3)] + [rnd.choice(RARE) for _ in range(3)]
    words += [rnd.choice(FILLER) for _ in range(rnd.randint(4, 14))]
    rnd.shuffle(words)
    return f"Note {n}: " + " ".join(words) + "."


class InstantEmbedder:
    """A zero-latency, deterministic stand-in for an embedding model: a signed hashed bag of
    words in `dim` dimensions (not a test double of the HTTP client, which the tests cover;
    this isolates the engine's own time)."""

    name = "instant"

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.ident = f"instant:{dim}"
        self.calls = 0

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for word in re.findall(r"\w+", text.casefold()):
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "big")
            v[h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        return v

    async def embed(self, texts):
        self.calls += 1
        return [self.vector(t) for t in texts]

    async def close(self) -> None:
        pass


def _summary(samples_s: list[float]) -> dict:
    lat = sorted(samples_s)
    return {
        "n": len(lat),
        "p50_ms": round(percentile(lat, 0.50) * 1000, 3),
        "p99_ms": round(percentile(lat, 0.99) * 1000, 3),
        "mean_ms": round(sum(lat) / len(lat) * 1000, 3),
        "max_ms": round(lat[-1] * 1000, 3),
    }


async def _timed(runs: int, op: Callable[[int], Awaitable[object]]) -> list[float]:
    out = []
    for k in range(runs):
        t0 = time.perf_counter()
        await op(k)
        out.append(time.perf_counter() - t0)
    return out


# --- 1. prompt packing ----------------------------------------------------------------------------


def bench_pack(entries: int, runs: int) -> dict:
    rnd = random.Random(5)
    scopes, tiers = ("bot", "user", "project"), ("profile", "log", "log", "note")
    items = [
        ScopedEntry(
            id=f"mem_{n:06d}",
            scope=scopes[n % 3],
            tier=tiers[rnd.randrange(len(tiers))],
            content=sentence(rnd, n),
            updated_at=NOW_MS - rnd.randrange(365) * DAY_MS,
            source=f"{scopes[n % 3]}:x_{n % 7}",
        )
        for n in range(entries)
    ]
    samples = []
    packed = None
    for _ in range(runs):
        t0 = time.perf_counter()
        packed = pack(items, instructions=INSTRUCTIONS)
        samples.append(time.perf_counter() - t0)
    assert packed is not None and len(packed.text) <= BUDGET
    return {
        "entries": entries,
        **_summary(samples),
        "chars": len(packed.text),
        "included": len(packed.included),
    }


# --- shared set-up ----------------------------------------------------------------------------


def _open(data: Path, embedder: InstantEmbedder | None) -> ShardService:
    svc = ShardService(data, 0, embedder=embedder)
    svc.peers.connect(directory=DirectoryService(data))  # what the features call without Ray
    return svc


async def _close(svc: ShardService) -> None:
    await svc.close()
    svc.peers.directory().store.db.close()


async def _account(svc: ShardService) -> None:
    d = svc.peers.directory()
    await d.create_org("Bench", ORG)
    await d.create_user("Bench", [ORG], ACCOUNT)
    await d.create_bot(name="Helper", org=ORG, owner=ACCOUNT, id=BOT)
    await svc.workspace_save_project(
        ACCOUNT, ORG, ProjectCreate(requestId="bench-project", name="Bench"), PROJECT
    )


# --- 2. search ------------------------------------------------------------------------------------


async def seed_search(data: Path, records: int, embedder: InstantEmbedder) -> None:
    """`records` records straight into the shard's tables (content sealed, vectors sealed), as
    the workspace would have written them; far faster than one request each."""
    svc = _open(data, embedder)
    await _account(svc)
    ws, vectors = svc.workspace, VectorStore(svc.db)
    rnd = random.Random(7)
    batch: list = []
    block: list = []
    for n in range(records):
        pool_id = POOLS[0]  # one pool holds them all: the scale the search targets are set at
        pool = await svc.workspace_pools.pool(pool_id)
        content = sentence(rnd, n)
        entry = sm.user_create(
            entry_id=f"mem_{n:07d}",
            pool=pool_id,
            contributor=BOT,
            content=content,
            operator=ACCOUNT,
            now=NOW_MS - rnd.randrange(365) * DAY_MS,
            tier=("profile", "log", "note")[n % 3],
            key=pool.fp_key,
            tags=bm.record_tags(ACCOUNT, ORG),  # as `workspace_create_memory` tags a bot record
        ).entry
        cipher = pool.keyed.cipher
        batch.append(
            ws.store.entry_row(entry, ws.store.seal(cipher, pool_id, entry.id, content), new=True)
        )
        keys = svc.kernel.analyzer(pool_id).keys(content)
        batch.append(  # the term hashes the workspace stores with each write
            svc.kernel.terms.row(pool_id, entry.id, entry.content_fp, keys, n + 1)
        )
        block.append((entry.id, entry.content_fp, embedder.vector(content)))
        if len(block) == 128 or n == records - 1:  # as the background embeds: in batches
            batch.append(vectors.block(pool_id, embedder.ident, n, block, cipher))
            block = []
        if len(batch) >= 4_000 or n == records - 1:
            rows = Batch(writes=batch)
            for p in POOLS:
                rows.key((await svc.workspace_pools.pool(p)).keyed)
            await svc.kernel.commit(rows)
            batch = []
    await _close(svc)


async def bench_search(
    data: Path, records: int, runs: int, dim: int, cold_runs_wanted: int = 3
) -> dict:
    embedder = InstantEmbedder(dim)
    t0 = time.perf_counter()
    await seed_search(data, records, embedder)
    seed_s = time.perf_counter() - t0
    svc = _open(data, embedder)
    semantic = svc.workspace.semantic
    assert isinstance(semantic, SemanticSearch)
    semantic.min_score = 0.1  # two query words against a record's many: one shared word scores
    # under the default floor
    rnd = random.Random(11)
    queries = [f"{rnd.choice(RARE)} {rnd.choice(COMMON)}" for _ in range(3 * runs + 1)]

    def query(q: str) -> WorkspaceQuery:
        return WorkspaceQuery(pools=POOLS[:1], projects=(), q=q, limit=50)

    # cold: the first search loads the pools and their vectors from the file. Measured again
    # after `cold_runs - 1` more opens (a new query each), as one figure is at the mercy of
    # whatever else the machine does; with the CPU time of this process (all its threads).
    load_at_cold = os.getloadavg()[0]
    cold_runs: list[tuple[float, float]] = []
    for k in range(max(1, cold_runs_wanted)):
        if k:
            await _close(svc)
            # A shard opens in a new process: the closed one's garbage (a loaded pool's
            # hundreds of MB) is not the next open's to collect mid-search.
            gc.collect()
            svc = _open(data, embedder)
            semantic = svc.workspace.semantic
            assert isinstance(semantic, SemanticSearch)
            semantic.min_score = 0.1
        t0, c0 = time.perf_counter(), time.process_time()
        listing = await svc.workspace_entries(
            ACCESS, query(f"{queries[0]} {RARE[k]}" if k else queries[0])
        )
        cold_runs.append((time.perf_counter() - t0, time.process_time() - c0))
        if not k:
            found_cold = len(listing.entries)
    cold_s = cold_runs[0][0]

    async def both(k: int):
        return await svc.workspace_entries(ACCESS, query(queries[1 + k]))

    pools = [(await svc.workspace_pools.pool(POOLS[0]), lambda _: True)]

    async def semantic_only(k: int):
        return await semantic.search(queries[1 + runs + k], pools, 50)

    both_s = await _timed(runs, both)
    semantic_s = await _timed(runs, semantic_only)
    svc.listings.semantic = None
    hits = []

    async def keyword(k: int):
        hits.append(
            len((await svc.workspace_entries(ACCESS, query(queries[1 + 2 * runs + k]))).hits)
        )

    keyword_s = await _timed(runs, keyword)
    svc.listings.semantic = semantic
    # Indexing a write: its term keys (tokenize, stem, keyed hash) and the in-memory index.
    pool = pools[0][0]
    texts = [sentence(rnd, records + k) for k in range(2_000)]
    t0 = time.perf_counter()
    for k, text in enumerate(texts):
        pool.index.put(f"mem_new_{k}", svc.kernel.analyzer(pool.id).keys(text))
    index_ms = (time.perf_counter() - t0) / len(texts) * 1000
    await _close(svc)
    return {
        "records": records,
        "dim": dim,
        "seed_s": round(seed_s, 1),
        "cold_ms": round(cold_s * 1000, 1),
        "cold_runs_ms": [round(w * 1000, 1) for w, _ in cold_runs],
        "cold_runs_cpu_ms": [round(c * 1000, 1) for _, c in cold_runs],
        "load_at_cold": round(load_at_cold, 2),
        "cold_found": found_cold,
        "keyword": _summary(keyword_s) | {"mean_hits": round(sum(hits) / len(hits), 1)},
        "semantic": _summary(semantic_s),
        "both": _summary(both_s),
        "embedded_at_search": semantic.embedded,
        "index_per_write_ms": round(index_ms, 3),
    }


# --- 3. writes over HTTP -------------------------------------------------------------------------


def _http_writes(port: int, token: str, path: str, extra: list[str], args) -> dict:
    """One closed-loop round of POSTs from a child process (benchmarks/_load.py)."""
    cmd = [sys.executable, "-m", "benchmarks._load", "http", "--port", str(port)]
    cmd += ["--path", path, "--method", "POST", "--expect", "201", *extra]
    cmd += ["--concurrency", str(args.concurrency), "--warmup", str(args.http_warmup)]
    cmd += ["--seconds", str(args.http_seconds)]
    from benchmarks.memory_ops import cpu_by_role

    cpu0 = cpu_by_role()
    proc = subprocess.run(
        cmd,
        cwd=Path(__file__).resolve().parent.parent,
        env={**os.environ, "OPENBOT_BENCH_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=args.http_warmup + args.http_seconds + 120,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed ({proc.returncode}): {proc.stderr[-2000:]}")
    cpu1 = cpu_by_role()
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["errors"]:
        raise RuntimeError(f"{path}: {out['errors']} failed requests: {out['error_samples']}")
    # CPU seconds of the shard and of this process (the gateway thread, Ray's driver), summed
    # over the rounds into ms per write (warm-up included).
    out["cpu_s"] = {k: cpu1[k] - cpu0[k] for k in ("shard", "driver")}
    return out


def bench_http_writes(data: Path, args) -> dict:
    """Workspace memory writes against Remember over HTTP, side by side on one server."""
    import httpx
    import ray

    from actors.runtime.engine import Engine, start_ray
    from gateway.app import create_app
    from gateway.live_server import LiveServer

    ray_tmp = tempfile.mkdtemp(prefix="obwsh", dir="/tmp")  # short: Ray's socket paths
    admin_token = "bench-admin-" + secrets.token_hex(8)
    start_ray(tmp_dir=ray_tmp)
    engine = Engine.start(data, shards=1, prefix=f"bench-wsh-{secrets.token_hex(3)}")
    server = LiveServer(create_app(engine, admin_token), lifespan="auto")
    rounds: list[dict] = []
    try:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{server.port}",
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=60,
        ) as admin:

            def post(path: str, body: dict) -> dict:
                resp = admin.post(path, json=body)
                resp.raise_for_status()
                return resp.json()

            org = post("/v1/admin/orgs", {"name": "bench"})["id"]
            user = post("/v1/admin/users", {"name": "writer", "orgs": [org]})
            bot = post("/v1/admin/bots", {"name": "helper", "org": org, "owner": user["id"]})
        token, bot_id = user["token"], bot["id"]

        def coalesced() -> dict[str, tuple[int, int]]:
            """(calls, requests) of the gateway's coalesced writes so far, per kind."""
            out = {"remember": (0, 0), "workspace": (0, 0)}
            for port in engine.shard_ports:
                for w in list(port._writes.values()):
                    for kind, c in (("remember", w.remember), ("workspace", w.workspace_create)):
                        calls, requests = out[kind]
                        out[kind] = (calls + c.calls, requests + c.requests)
            return out

        for _ in range(args.http_rounds):
            before = coalesced()
            remember = _http_writes(
                server.port,
                token,
                f"/v1/bots/{bot_id}/memory",
                ["--remember", "--request-ids"],
                args,
            )
            ws = _http_writes(
                server.port, token, "/api/app/workspace/memories", ["--ws-memory", bot_id], args
            )
            after = coalesced()
            for kind, out in (("remember", remember), ("workspace", ws)):
                out["coalesced"] = tuple(
                    a - b for a, b in zip(after[kind], before[kind], strict=True)
                )
            rounds.append({"remember": remember, "workspace": ws})
    finally:
        server.stop()
        engine.stop()
        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    def rate(kind: str) -> float:
        count = sum(r[kind]["count"] for r in rounds)
        return count / sum(r[kind]["seconds"] for r in rounds)

    def p50(kind: str) -> float:
        return round(float(np.median([r[kind]["p50_ms"] for r in rounds])), 2)

    def cpu_ms(kind: str) -> dict[str, float]:
        ops = sum(r[kind]["ops_incl_warmup"] for r in rounds)
        return {
            role: round(sum(r[kind]["cpu_s"][role] for r in rounds) / ops * 1000, 3)
            for role in ("shard", "driver")
        }

    def per_call(kind: str) -> float:
        calls = sum(r[kind]["coalesced"][0] for r in rounds)
        return round(sum(r[kind]["coalesced"][1] for r in rounds) / max(calls, 1), 2)

    return {
        "concurrency": args.concurrency,
        # Requests per coalesced call (actors/runtime/coalesce.py): a Ray call costs the shard
        # about as much as a write, so fewer requests per call cost more CPU per write.
        "remember_per_call": per_call("remember"),
        "workspace_per_call": per_call("workspace"),
        "rounds": len(rounds),
        "seconds_each": args.http_seconds,
        "remember_per_s": round(rate("remember"), 1),
        "workspace_per_s": round(rate("workspace"), 1),
        "ratio": round(rate("workspace") / rate("remember"), 3),
        "remember_p50_ms": p50("remember"),
        "workspace_p50_ms": p50("workspace"),
        "remember_cpu_ms": cpu_ms("remember"),
        "workspace_cpu_ms": cpu_ms("workspace"),
        "per_round": [
            {k: r[k]["throughput_per_s"] for k in ("remember", "workspace")} for r in rounds
        ],
    }


# --- 4. export / import ---------------------------------------------------------------------------


async def seed_export(data: Path, records: int) -> dict:
    """`records` records written the way people write them (one request each, 64 at a time),
    then the Markdown memory export; the shard is closed afterwards (the tree export reads the
    files)."""
    svc = _open(data, None)
    await _account(svc)
    rnd = random.Random(13)
    scopes = (Scope.BOT, Scope.USER, Scope.PROJECT)
    slots = asyncio.Semaphore(64)  # many people writing at once: group commit batches them

    async def write(n: int, content: str, tier: str) -> None:
        body = WorkspaceMemoryCreate(
            requestId=f"bench-{n}",
            scope=scopes[n % 3],
            bot=BOT,
            project=PROJECT if n % 3 == 2 else None,
            content=content,
            tier=tier,
        )
        async with slots:
            await svc.workspace_create_memory(ACCESS, body)

    tiers = ("profile", "log", "log", "note")
    t0 = time.perf_counter()
    await asyncio.gather(*(write(n, sentence(rnd, n), rnd.choice(tiers)) for n in range(records)))
    write_s = time.perf_counter() - t0
    # Side by side: as many Remember writes (pinned entries) into the bot's pool, the
    # same 64 at a time, on the same shard (workspace writes at least as fast).
    reader = Reader(user=ACCOUNT, org=ORG, uses_bot=True)

    async def remember(n: int, content: str) -> None:
        async with slots:
            await svc.remember(f"bot:{BOT}", reader, content, [], request_id=f"bench-r{n}")

    t0 = time.perf_counter()
    await asyncio.gather(*(remember(n, sentence(rnd, n)) for n in range(records)))
    remember_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    listing = await svc.workspace_entries(
        ACCESS, WorkspaceQuery(pools=POOLS[:2], projects=None, limit=records)
    )
    text = render_markdown(listing.entries, account=ACCOUNT, pool_names=listing.names)
    markdown_s = time.perf_counter() - t0
    await _close(svc)
    return {
        "records": records,
        "write_s": round(write_s, 2),
        "writes_per_s": round(records / write_s),
        "remember_per_s": round(records / remember_s),
        "markdown_export_ms": round(markdown_s * 1000, 1),
        "markdown_bytes": len(text.encode()),
        "markdown_lines": text.count("\n- ("),
    }


def bench_tree(data: Path, root: Path) -> dict:
    try:
        from storage.file_export import render_data_dir
        from storage.file_import import import_tree
        from storage.tree_files import write_tree
    except ImportError:  # TODO(export): the tree export/import is not in this tree yet
        return {"tree": "storage/file_export.py not available: Markdown export only"}
    out, imported, again = root / "tree", root / "imported", root / "tree-again"
    t0 = time.perf_counter()
    files = render_data_dir(data, ACCOUNT)
    write_tree(out, files)
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = import_tree(out, imported, shards=1)
    import_s = time.perf_counter() - t0
    again_files = render_data_dir(imported, ACCOUNT)
    write_tree(again, again_files)
    same = _tree_bytes(out) == _tree_bytes(again)
    return {
        "export_s": round(export_s, 3),
        "import_s": round(import_s, 3),
        "files": len(files),
        "tree_bytes": sum(len(b) for b in files.values()),
        "imported_records": result.records,
        "round_trip_identical": same,
    }


def _tree_bytes(base: Path) -> dict[str, bytes]:
    return {
        p.relative_to(base).as_posix(): p.read_bytes()
        for p in sorted(base.rglob("*"))
        if p.is_file()
    }


# --- main -----------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dim", type=int, default=384, help="embedding dimensions (semantic search)")
    p.add_argument("--records", type=int, default=None, help="search records (100,000)")
    p.add_argument("--no-http", action="store_true", help="skip the writes over HTTP")
    p.add_argument("--concurrency", type=int, default=8, help="HTTP clients at once")
    p.add_argument("--http-rounds", type=int, default=None, help="rounds of each (3; quick 2)")
    p.add_argument("--http-seconds", type=float, default=None, help="seconds per round (5)")
    p.add_argument("--http-warmup", type=float, default=1.0)
    p.add_argument("--cold-runs", type=int, default=3, help="opens timed for the first search")
    args = p.parse_args()
    args.http_rounds = args.http_rounds or (2 if args.quick else 3)
    args.http_seconds = args.http_seconds or (3.0 if args.quick else 5.0)
    search_records = args.records or (20_000 if args.quick else 100_000)
    runs = 10 if args.quick else 30
    root = Path(tempfile.mkdtemp(prefix="obws"))
    os.environ.pop("OPENBOT_MASTER_KEY", None)  # each data directory makes its own key file
    try:
        packing = bench_pack(10_000, 20 if args.quick else 100)
        search = asyncio.run(
            bench_search(root / "search", search_records, runs, args.dim, args.cold_runs)
        )
        export = asyncio.run(seed_export(root / "export", 10_000))
        export |= bench_tree(root / "export", root)
        http = None if args.no_http else bench_http_writes(root / "http", args)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"workspace: {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}; in-process shard")
    line = "{:<44} {:>10} {:>10} {:>10}"
    print(line.format("operation", "p50 ms", "p99 ms", "mean ms"))
    print(
        line.format(
            f"pack {packing['entries']:,} entries, 3 scopes",
            packing["p50_ms"],
            packing["p99_ms"],
            packing["mean_ms"],
        )
    )
    n = f"{search['records']:,}"
    for name, label in (
        ("keyword", f"keyword search, {n} records"),
        ("semantic", f"semantic search, {n} x {search['dim']}d"),
        ("both", "keyword + semantic (one shard's GET ?q=)"),
    ):
        r = search[name]
        print(line.format(label, r["p50_ms"], r["p99_ms"], r["mean_ms"]))
    print(
        f"first search after open (loads {n} records and vectors): {search['cold_ms']} ms "
        f"(load average {search['load_at_cold']}); each open: {search['cold_runs_ms']} ms, "
        f"CPU {search['cold_runs_cpu_ms']} ms"
    )
    print(f"keyword indexing per write: {search['index_per_write_ms']} ms")
    print(
        f"write {export['records']:,} records through workspace_create_memory, 64 at a time: "
        f"{export['write_s']} s ({export['writes_per_s']}/s; Remember on the same shard: "
        f"{export['remember_per_s']}/s)"
    )
    if http is not None:
        print(
            f"writes over HTTP, {http['concurrency']} clients, {http['rounds']} rounds of "
            f"{http['seconds_each']} s each: workspace memory {http['workspace_per_s']}/s "
            f"(p50 {http['workspace_p50_ms']} ms), Remember {http['remember_per_s']}/s "
            f"(p50 {http['remember_p50_ms']} ms): ratio {http['ratio']}; CPU ms per write "
            f"(shard, gateway and driver): workspace {tuple(http['workspace_cpu_ms'].values())}, "
            f"Remember {tuple(http['remember_cpu_ms'].values())}"
        )
    print(
        f"export account of {export['records']:,} records: Markdown "
        f"{export['markdown_export_ms']} ms ({export['markdown_bytes']:,} bytes)"
    )
    if "export_s" in export:
        print(
            f"  account file tree: export {export['export_s']} s ({export['files']} files, "
            f"{export['tree_bytes']:,} bytes), import {export['import_s']} s, "
            f"round trip identical: {export['round_trip_identical']}"
        )
    else:
        print(f"  {export['tree']}")
    out = Path(__file__).parent / "results" / "workspace.json"
    out.parent.mkdir(exist_ok=True)
    doc = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "quick": args.quick,
        "pack": packing,
        "search": search,
        "export": export,
        "http_writes": http,
    }
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
