"""Retrieval quality of memory search through the public API.

    .venv/bin/python -m benchmarks.retrieval [--data synthetic|locomo-like] [--quick]
        [--conversations N] [--turns N]
    .venv/bin/python -m benchmarks.retrieval --data locomo --file PATH/locomo10.json [--quick]
        [--orders sequential,round-robin,concurrent-32] [--saved FILE] [--caption]

`--data locomo` reads the real LoCoMo file you downloaded (benchmarks/_locomo.py; not shipped
here, CC BY-NC): ten conversations, 5,882 turns, 1,536 questions (adversarial ones left out),
reported as a tuning half (conversations 1-5) and a held-out half (6-10), each turn naming its
conversation as its thread, for each write order, beside BM25, dense and RRF baselines
(benchmarks/_halves.py; `--quick`: two conversations of each half; `--saved FILE` keeps the
API's rankings, and reports from them again without the API when FILE exists). The rest of
this description is the generated sets'.

Data (seeded, generated; no PyPI package ships LoCoMo-style dialogs with evidence labels):
- `synthetic` (benchmarks/_conversations.py): small talk around facts said once, often as the
  answer to the other person's question, and paraphrased questions (two per fact);
- `locomo-like` (benchmarks/_locomo_like.py): harder and closer to real long dialogs: two
  people, dated sessions, life threads told over many sessions with reactions, asides and
  callbacks that reuse the question's words without answering it, the same threads in other
  conversations, and LoCoMo's question kinds (single-hop, temporal, multi-hop, open-domain).

Setup: a local Ray session, one shard, a real gateway (uvicorn on 127.0.0.1) with local
embeddings (`kind = "onnx"`, all-MiniLM-L6-v2 int8); one account writes every turn, in order,
as a workspace memory (`POST /api/app/workspace/memories`, content "Speaker: text"), then asks
every question with `GET /api/app/workspace/memories?q=…&limit=10` three ways: `using=keyword`,
`using=semantic` and the default hybrid. In the same run, on the same texts and questions: a plain
BM25 (bm25s, its own tokenizer with English stop words, no stemming) and a dense-only ranking (the
same embedding model, exact cosine over every turn) as references, and two plain reciprocal-rank
fusions (k = 60, each list 1,000 deep): of those two references (plain RRF) and of the API's own
keyword and semantic lists (`using=keyword` and `using=semantic` asked again with `limit=500`),
against which the default hybrid is measured.
`--write-order` writes the turns another way (benchmarks/_write_orders.py: N requests in
flight, one writer per conversation, round-robin, a project per conversation, sessions more
than the context window apart, the conversation in `topics`), `--content` with or without the
speaker and the session's date (the references keep "Speaker: text"; with `--data locomo`,
they read the same texts as the API).

Also compares workspace memory writes with Remember over HTTP (`--writes` of each, 8
clients at once). Reports recall@5, recall@10 (the share of a question's answer turns among the
first k) and MRR (first answer turn within 10); writes benchmarks/results/retrieval.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import actors.runtime.engine  # noqa: F401  (sets Ray's environment before anything imports ray)
from benchmarks._conversations import Conversation
from benchmarks._halves import ORDERS as HALF_ORDERS
from benchmarks._write_orders import CONTENTS, ORDERS, SLOW_WINDOW_S, write_through_api
from engine.workspace_search import Hit, merge_hits

WS = "/api/app/workspace"


def recall(ranked: list[str], evidence: list[str], k: int) -> float:
    return len(set(ranked[:k]) & set(evidence)) / len(evidence)


def mrr(ranked: list[str], evidence: list[str]) -> float:
    for n, r in enumerate(ranked[:10]):
        if r in evidence:
            return 1.0 / (n + 1)
    return 0.0


def score(rankings: list[list[str]], evidence: list[list[str]]) -> dict:
    return {
        "recall@5": round(
            float(np.mean([recall(r, e, 5) for r, e in zip(rankings, evidence, strict=True)])), 3
        ),
        "recall@10": round(
            float(np.mean([recall(r, e, 10) for r, e in zip(rankings, evidence, strict=True)])), 3
        ),
        "mrr": round(
            float(np.mean([mrr(r, e) for r, e in zip(rankings, evidence, strict=True)])), 3
        ),
    }


def plain_rrf(first: list[list[str]], second: list[list[str]], limit: int = 10) -> list[list[str]]:
    """Plain reciprocal-rank fusion (k = 60, equal weights) of two rankings per question."""

    def hits(ids: list[str], kind: str) -> list[Hit]:
        return [Hit(id=i, score=float(-n), kinds=(kind,)) for n, i in enumerate(ids)]

    return [
        [h.id for h in merge_hits(hits(a, "keyword"), hits(b, "semantic"), _yes, limit, k=60)]
        for a, b in zip(first, second, strict=True)
    ]


def _yes(_: str) -> bool:
    return True


def references(convs: list[Conversation], embed_threads: int) -> dict[str, list[list[str]]]:
    """Plain BM25 (bm25s), dense-only (exact cosine) and their plain RRF rankings, in this
    process (10 deep; the fusion of 1,000 of each)."""
    import bm25s

    from actors.models.embeddings import OnnxEmbeddings

    turns = [t for c in convs for t in c.turns]
    questions = [q.text for c in convs for q in c.questions]
    ids = [t.id for t in turns]
    retriever = bm25s.BM25()
    retriever.index(
        bm25s.tokenize([t.content for t in turns], stopwords="en", show_progress=False),
        show_progress=False,
    )
    docs, scores = retriever.retrieve(
        bm25s.tokenize(questions, stopwords="en", show_progress=False),
        k=min(1000, len(ids)),
        show_progress=False,
    )
    plain = [
        [ids[j] for j, s in zip(row, srow, strict=True) if s > 0]
        for row, srow in zip(docs, scores, strict=True)
    ]

    async def vectors() -> tuple[np.ndarray, np.ndarray]:
        model = OnnxEmbeddings("reference", threads=embed_threads, batch_size=64)
        d = np.asarray(await model.embed([t.content for t in turns]), dtype=np.float32)
        q = np.asarray(await model.embed(questions), dtype=np.float32)
        return d, q

    d, q = asyncio.run(vectors())
    sims = q @ d.T
    dense = [[ids[j] for j in np.argsort(-row)[:1000]] for row in sims]
    return {
        "plain_bm25": [r[:10] for r in plain],
        "dense_only": [r[:10] for r in dense],
        "plain_rrf": plain_rrf(plain, dense),
    }


def write_rates(client, bot: str, n: int) -> dict:
    """Workspace memory writes against Remember over HTTP: `n` of each, 8 clients at
    once, the same server and account (side by side, Remember first)."""
    if n <= 0:
        return {}

    def run(make) -> float:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            for resp in pool.map(make, range(n)):
                resp.raise_for_status()
        return round(n / (time.perf_counter() - t0), 1)

    tag = secrets.token_hex(3)
    remember = run(
        lambda k: client.post(
            f"/v1/bots/{bot}/memory",
            json={
                "requestId": f"rem-{tag}-{k}",
                "command": {"_tag": "Remember", "content": f"Remember note {k}", "tags": []},
            },
        )
    )
    workspace = run(
        lambda k: client.post(
            f"{WS}/memories",
            json={
                "requestId": f"ws-{tag}-{k}",
                "scope": "bot",
                "bot": bot,
                "content": f"Workspace note {k}",
            },
        )
    )
    return {"remember_per_s": remember, "workspace_per_s": workspace, "n": n}


def through_api(
    convs: list[Conversation],
    data: Path,
    threads: int,
    writes: int = 0,
    order: str = "sequential",
    content: str = "speaker",
) -> dict:
    import httpx
    import ray

    from actors.runtime.engine import Engine, start_ray
    from gateway.app import create_app
    from gateway.live_server import LiveServer

    admin_token = "bench-admin-" + secrets.token_hex(8)
    models = {"minilm": {"kind": "onnx", "threads": threads}}
    search: dict = {"embedding_model": "minilm"}
    if order == "slow":
        search["context_window_s"] = SLOW_WINDOW_S
    start_ray(tmp_dir=tempfile.mkdtemp(prefix="obret-ray-", dir="/tmp"))
    engine = Engine.start(
        data,
        shards=1,
        prefix=f"bench-ret-{secrets.token_hex(3)}",
        models_config=models,
        search_config=search,
    )
    server = LiveServer(create_app(engine, admin_token), lifespan="auto")
    base = f"http://127.0.0.1:{server.port}"
    out: dict = {}
    try:
        admin = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {admin_token}"}, timeout=120
        )
        org = admin.post("/v1/admin/orgs", json={"name": "retrieval"}).json()["id"]
        user = admin.post("/v1/admin/users", json={"name": "reader", "orgs": [org]}).json()
        bot = admin.post(
            "/v1/admin/bots", json={"name": "memory", "org": org, "owner": user["id"]}
        ).json()["id"]
        client = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {user['token']}"}, timeout=120
        )
        out["write_rates"] = write_rates(client, bot, writes)
        t0 = time.perf_counter()
        # memory id -> turn id; in order, one request each, as a conversation is kept, unless
        # --write-order says otherwise (benchmarks/_write_orders.py)
        ids = write_through_api(client, convs, order, content, bot)
        out["write_s"] = round(time.perf_counter() - t0, 1)
        out["writes_per_s"] = round(len(ids) / (time.perf_counter() - t0), 1)
        t0 = time.perf_counter()
        ray.get(engine.shards[0].search_idle.remote())  # every turn embedded
        out["embed_wait_s"] = round(time.perf_counter() - t0, 1)
        questions = [q.text for c in convs for q in c.questions]

        def ask(using: str, limit: int = 10):
            def one(q: str) -> tuple[list[str], float]:
                t = time.perf_counter()
                params = {"q": q, "limit": str(limit)}
                if using != "hybrid":
                    params["using"] = using
                resp = client.get(f"{WS}/memories", params=params)
                resp.raise_for_status()
                # write_rates' notes (bot scope) are hits too: they count as misses
                hits = [ids.get(e["id"], e["id"]) for e in resp.json()["entries"]]
                return hits, time.perf_counter() - t

            with ThreadPoolExecutor(4) as pool:
                got = list(pool.map(one, questions))
            lat = sorted(s for _, s in got)
            return [r for r, _ in got], round(lat[len(lat) // 2] * 1000, 1)

        for using in ("keyword", "semantic", "hybrid"):
            out[using], out[f"{using}_p50_ms"] = ask(using)
        # The API's own lists as deep as it gives them (limit 500), for a plain RRF of them.
        deep = {u: ask(u, 500)[0] for u in ("keyword", "semantic")}
        out["api_rrf"] = plain_rrf(deep["keyword"], deep["semantic"])
        client.close()
        admin.close()
    finally:
        server.stop()
        engine.stop()
        ray.shutdown()
    return out


def locomo_halves(args) -> None:
    """LoCoMo's tuning half (conversations 1-5) and held-out half (6-10), each write order
    (benchmarks/_halves.py); `--quick`: two conversations of each half."""
    from benchmarks import _halves
    from benchmarks._locomo import load

    convs = load(args.file, caption=args.caption)
    parts = _halves.halves(convs, args.quick)
    orders = tuple(o for o in args.orders.split(",") if o)
    for half, part in parts.items():
        turns = sum(len(c.turns) for c in part)
        print(f"{half}: {len(part)} conversations, {turns} turns", flush=True)
    os.environ.pop("OPENBOT_MASTER_KEY", None)
    t0 = time.perf_counter()
    if args.saved and Path(args.saved).exists():
        api = _halves.load_api(args.saved)
    else:
        root = Path(tempfile.mkdtemp(prefix="obret"))
        try:
            api = _halves.through_api(parts, root / "data", args.threads, orders, args.content)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        if args.saved:
            _halves.save_api(api, args.saved)
    vectors = _halves.embedder(args.threads)
    refs = {half: _halves.references(part, vectors, args.content) for half, part in parts.items()}
    figures = _halves.report(parts, api, refs, orders)
    load_avg = os.getloadavg()
    print(
        f"\nwrites {api['write_s']} s, embedding caught up {api['embed_wait_s']} s after; "
        f"run {time.perf_counter() - t0:.0f} s; load average {load_avg[0]:.2f}"
    )
    out = (
        Path(__file__).parent
        / "results"
        / ("retrieval-locomo-halves" + ("-quick" if args.quick else "") + ".json")
    )
    out.parent.mkdir(exist_ok=True)
    doc = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load": load_avg,
        "content": args.content,
        "orders": orders,
        "halves": figures,
    }
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="synthetic", choices=("synthetic", "locomo-like", "locomo"))
    p.add_argument("--file", help="--data locomo: the path of LoCoMo's locomo10.json")
    p.add_argument("--caption", action="store_true", help="--data locomo: photo captions too")
    p.add_argument("--quick", action="store_true", help="3 (locomo-like: 5) conversations")
    p.add_argument("--conversations", type=int, help="default 10 (locomo-like: 20)")
    p.add_argument("--turns", type=int, help="turns per conversation (600; locomo-like: 300)")
    p.add_argument("--threads", type=int, default=2, help="ONNX Runtime threads")
    p.add_argument("--writes", type=int, default=500, help="writes of each kind compared")
    p.add_argument("--write-order", default="sequential", choices=ORDERS)
    p.add_argument("--content", default="speaker", choices=CONTENTS)
    p.add_argument(
        "--orders",
        default=",".join(HALF_ORDERS),
        help="--data locomo: write orders, comma-separated (default: %(default)s)",
    )
    p.add_argument(
        "--saved",
        help="--data locomo: keep the API's rankings in this file, or report from it if it exists",
    )
    args = p.parse_args()
    if args.data == "locomo":
        if not args.file:
            p.error("--data locomo needs --file PATH (LoCoMo's data/locomo10.json)")
        locomo_halves(args)
        return
    else:
        if args.data == "locomo-like":
            from benchmarks._locomo_like import make

            n, turns = (5, 300) if args.quick else (args.conversations or 20, args.turns or 300)
        else:
            from benchmarks._conversations import make

            n, turns = (3, 300) if args.quick else (args.conversations or 10, args.turns or 600)
        convs = make(conversations=n, turns_per=turns)
    evidence = [q.evidence for c in convs for q in c.questions]
    kinds = [q.kind for c in convs for q in c.questions]
    total = sum(len(c.turns) for c in convs)
    print(f"{args.data}: {n} conversations, {total} turns, {len(evidence)} questions", flush=True)
    os.environ.pop("OPENBOT_MASTER_KEY", None)
    root = Path(tempfile.mkdtemp(prefix="obret"))
    try:
        api = through_api(
            convs, root / "data", args.threads, args.writes, args.write_order, args.content
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    refs = references(convs, args.threads)
    results = {
        "keyword (API, using=keyword)": score(api["keyword"], evidence),
        "semantic (API, using=semantic)": score(api["semantic"], evidence),
        "hybrid (API, default)": score(api["hybrid"], evidence),
        "plain RRF k=60 of the API's two lists": score(api["api_rrf"], evidence),
        "plain BM25 reference (bm25s)": score(refs["plain_bm25"], evidence),
        "dense-only reference (exact cosine)": score(refs["dense_only"], evidence),
        "plain RRF of BM25 and dense references": score(refs["plain_rrf"], evidence),
    }
    by_kind = {
        name: {
            kind: score(
                [r for r, k in zip(rank, kinds, strict=True) if k == kind],
                [e for e, k in zip(evidence, kinds, strict=True) if k == kind],
            )["recall@10"]
            for kind in sorted(set(kinds))
        }
        for name, rank in (
            ("keyword", api["keyword"]),
            ("semantic", api["semantic"]),
            ("hybrid", api["hybrid"]),
        )
    }
    line = "{:<42} {:>9} {:>9} {:>7}"
    print(line.format("retrieval", "recall@5", "recall@10", "MRR"))
    for name, r in results.items():
        print(line.format(name, r["recall@5"], r["recall@10"], r["mrr"]))
    print(
        f"writes {api['writes_per_s']}/s over HTTP; embedding caught up {api['embed_wait_s']} s "
        f"after the last write; query p50 keyword {api['keyword_p50_ms']} ms, semantic "
        f"{api['semantic_p50_ms']} ms, hybrid {api['hybrid_p50_ms']} ms"
    )
    for name, row in by_kind.items():
        print(f"recall@10 by question kind, {name}: {row}")
    rates = api["write_rates"]
    if rates:
        print(
            f"writes over HTTP, 8 clients: workspace memory {rates['workspace_per_s']}/s, "
            f"Remember {rates['remember_per_s']}/s"
        )
    suffix = "" if args.data == "synthetic" else "-" + args.data
    if args.write_order != "sequential" or args.content != "speaker":
        suffix += f"-{args.write_order}-{args.content}"
    out = Path(__file__).parent / "results" / f"retrieval{suffix}.json"
    out.parent.mkdir(exist_ok=True)
    doc = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "load": os.getloadavg(),
        "data": args.data,
        "write_order": args.write_order,
        "content": args.content,
        "conversations": n,
        "turns": total,
        "questions": len(evidence),
        "results": results,
        "recall@10_by_kind": by_kind,
        "writes_per_s": api["writes_per_s"],
        "embed_wait_s": api["embed_wait_s"],
        "write_rates": rates,
        "p50_ms": {u: api[f"{u}_p50_ms"] for u in ("keyword", "semantic", "hybrid")},
    }
    out.write_text(json.dumps(doc, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
