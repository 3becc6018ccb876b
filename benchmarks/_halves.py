"""LoCoMo in a tuning half and a held-out half (`benchmarks.retrieval --data locomo`).

Conversations 1-5 are the tuning half: ranking changes are chosen on them (and on the generated
sets). Conversations 6-10 are held out: a change is kept only if it holds there too. Every figure
is reported for both halves and for each write order (benchmarks/_write_orders.py: in order,
round-robin across the half's conversations, 32 requests in flight), each turn a user-scope
workspace record naming its conversation as `thread` and its place as `position`.

One Ray session, one shard, one gateway (uvicorn on 127.0.0.1), local embeddings (all-MiniLM-L6-v2
int8 on ONNX Runtime); one account per half and write order, so each (half, order) is a pool of
that half's turns only. Every question is asked of its own pool three ways (`using=keyword`,
`using=semantic`, the default hybrid), 10 deep. Beside them, in the same run and on the same
texts: plain BM25 (bm25s when installed, else `plain_bm25` below: the same Okapi BM25, k1 1.5,
b 0.75, words of two or more letters, English stop words, no stemming), dense-only (the same
model, exact cosine) and their plain reciprocal-rank fusion (k = 60, each list 1,000 deep).

recall@10: the share of a question's evidence turns among the first 10 hits; hit@10: whether
any is. Both per question kind (LoCoMo's categories).
"""

from __future__ import annotations

import math
import re
import secrets
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks._conversations import Conversation
from benchmarks._write_orders import write_through_api

WS = "/api/app/workspace"
ORDERS = ("sequential", "round-robin", "concurrent-32")
USINGS = ("keyword", "semantic", "hybrid")
_WORD = re.compile(r"(?u)\b\w\w+\b")
# scikit-learn's English stop words (what bm25s's "en" list is)
_STOP_WORDS = """
    a about above after again against all am an and any are as at
    be because been before being below between both but by can did do does
    doing don down during each few for from further had has have having he
    her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off
    on once only or other our ours ourselves out over own same she should
    so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when
    where which while who whom why will with you your yours yourself yourselves
"""
_STOP = frozenset(_STOP_WORDS.split())


def halves(convs: list[Conversation], quick: bool) -> dict[str, list[Conversation]]:
    n = 2 if quick else 5
    return {"tuning (1-5)": convs[:n], "held-out (6-10)": convs[5 : 5 + n]}


def _tokens(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in _STOP]


def plain_bm25(docs: list[str], queries: list[str], depth: int = 1000) -> list[list[int]]:
    """Okapi BM25 (k1 1.5, b 0.75, Lucene's idf) of every doc for each query: doc indexes of
    the matching ones, best first."""
    try:
        import bm25s
    except ImportError:
        bm25s = None
    if bm25s is not None:
        r = bm25s.BM25()
        r.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
        found, scores = r.retrieve(
            bm25s.tokenize(queries, stopwords="en", show_progress=False),
            k=min(depth, len(docs)),
            show_progress=False,
        )
        return [
            [int(j) for j, s in zip(row, sr, strict=True) if s > 0]
            for row, sr in zip(found, scores, strict=True)
        ]
    toks = [_tokens(d) for d in docs]
    lens = np.array([len(t) for t in toks], dtype=np.float64)
    avgdl = max(lens.mean(), 1e-9) if len(toks) else 1.0
    postings: dict[str, dict[int, int]] = {}
    for i, t in enumerate(toks):
        for w in t:
            postings.setdefault(w, {}).setdefault(i, 0)
            postings[w][i] += 1
    out = []
    n = len(docs)
    for q in queries:
        s = np.zeros(n)
        for w in set(_tokens(q)):
            p = postings.get(w)
            if not p:
                continue
            idf = math.log(1 + (n - len(p) + 0.5) / (len(p) + 0.5))
            rows = np.fromiter(p.keys(), dtype=np.int64)
            tf = np.fromiter(p.values(), dtype=np.float64)
            s[rows] += idf * tf * 2.5 / (tf + 1.5 * (0.25 + 0.75 * lens[rows] / avgdl))
        hit = np.flatnonzero(s > 0)
        out.append(hit[np.lexsort((hit, -s[hit]))][:depth].tolist())
    return out


def references(
    part: list[Conversation], vectors, content: str = "speaker"
) -> dict[str, list[list[str]]]:
    """BM25, dense and their RRF over the texts the API was given (`content`)."""
    from benchmarks._write_orders import arrivals
    from benchmarks.retrieval import plain_rrf

    turns = [t for c in part for t in c.turns]
    questions = [q.text for c in part for q in c.questions]
    ids = [t.id for t in turns]
    held = {a.turn.id: a.content for a in arrivals(part, "sequential", content)}
    texts = [held[t.id] for t in turns]
    plain = [[ids[j] for j in row] for row in plain_bm25(texts, questions)]
    d = vectors(texts)
    q = vectors(questions)
    dense = [[ids[j] for j in np.argsort(-row)[:1000]] for row in q @ d.T]
    return {
        "BM25": [r[:10] for r in plain],
        "dense": [r[:10] for r in dense],
        "RRF(BM25, dense)": plain_rrf(plain, dense),
    }


def embedder(threads: int):
    """The reference model's vectors (cached in /tmp by benchmarks/retrieval_lab.py)."""
    from benchmarks.retrieval_lab import vectors as cached

    return lambda texts: cached(texts, threads)


def through_api(
    parts: dict[str, list[Conversation]],
    data: Path,
    threads: int,
    orders: tuple[str, ...],
    content: str,
    search: dict | None = None,
) -> dict:
    """(half, order) -> {using: rankings, using_p50_ms: ms}, plus write and embedding times."""
    import httpx
    import ray

    from actors.runtime.engine import Engine, start_ray
    from gateway.app import create_app
    from gateway.live_server import LiveServer

    admin_token = "bench-admin-" + secrets.token_hex(8)
    models = {"minilm": {"kind": "onnx", "threads": threads}}
    start_ray(tmp_dir=tempfile.mkdtemp(prefix="obhalf-ray-", dir="/tmp"))
    engine = Engine.start(
        data,
        shards=1,
        prefix=f"bench-half-{secrets.token_hex(3)}",
        models_config=models,
        search_config={"embedding_model": "minilm", **(search or {})},
    )
    server = LiveServer(create_app(engine, admin_token), lifespan="auto")
    base = f"http://127.0.0.1:{server.port}"
    out: dict = {}
    try:
        admin = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {admin_token}"}, timeout=300
        )
        org = admin.post("/v1/admin/orgs", json={"name": "halves"}).json()["id"]
        clients, ids = {}, {}
        t0 = time.perf_counter()
        for half, part in parts.items():
            for order in orders:
                user = admin.post(
                    "/v1/admin/users", json={"name": f"{half} {order}", "orgs": [org]}
                ).json()
                bot = admin.post(
                    "/v1/admin/bots", json={"name": "memory", "org": org, "owner": user["id"]}
                ).json()["id"]
                client = httpx.Client(
                    base_url=base, headers={"Authorization": f"Bearer {user['token']}"}, timeout=300
                )
                clients[half, order] = client
                ids[half, order] = write_through_api(
                    client, part, order, content, bot, threaded=True, tag=secrets.token_hex(2)
                )
        out["write_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        ray.get(engine.shards[0].search_idle.remote())  # every turn embedded
        out["embed_wait_s"] = round(time.perf_counter() - t0, 1)
        for (half, order), client in clients.items():
            questions = [q.text for c in parts[half] for q in c.questions]
            known = ids[half, order]
            got: dict = {}
            for using in USINGS:

                def one(
                    q: str, using: str = using, client=client, known=known
                ) -> tuple[list[str], float]:
                    t = time.perf_counter()
                    params = {"q": q, "limit": "10"}
                    if using != "hybrid":
                        params["using"] = using
                    resp = client.get(f"{WS}/memories", params=params)
                    resp.raise_for_status()
                    hits = [known.get(e["id"], e["id"]) for e in resp.json()["entries"]]
                    return hits, time.perf_counter() - t

                with ThreadPoolExecutor(4) as pool:
                    res = list(pool.map(one, questions))
                lat = sorted(s for _, s in res)
                got[using] = [r for r, _ in res]
                got[f"{using}_p50_ms"] = round(lat[len(lat) // 2] * 1000, 1)
            out[half, order] = got
            client.close()
        admin.close()
    finally:
        server.stop()
        engine.stop()
        ray.shutdown()
    return out


def save_api(api: dict, path: str) -> None:
    import json

    doc = {"|".join(k) if isinstance(k, tuple) else k: v for k, v in api.items()}
    Path(path).write_text(json.dumps(doc))


def load_api(path: str) -> dict:
    import json

    doc = json.loads(Path(path).read_text())
    return {tuple(k.split("|")) if "|" in k else k: v for k, v in doc.items()}


def measures(rankings: list[list[str]], part: list[Conversation]) -> dict:
    """recall@10 and hit@10, all questions and per kind."""
    qs = [q for c in part for q in c.questions]
    rec = [
        len(set(r[:10]) & set(q.evidence)) / len(q.evidence)
        for r, q in zip(rankings, qs, strict=True)
    ]
    hit = [float(bool(set(r[:10]) & set(q.evidence))) for r, q in zip(rankings, qs, strict=True)]
    out = {"all": (round(float(np.mean(rec)), 3), round(float(np.mean(hit)), 3), len(qs))}
    for kind in sorted({q.kind for q in qs}):
        sel = [i for i, q in enumerate(qs) if q.kind == kind]
        out[kind] = (
            round(float(np.mean([rec[i] for i in sel])), 3),
            round(float(np.mean([hit[i] for i in sel])), 3),
            len(sel),
        )
    return out


def report(parts: dict[str, list[Conversation]], api: dict, refs: dict, orders) -> dict:
    """Print one table per half; returns the figures."""
    doc: dict = {}
    for half, part in parts.items():
        rows: dict[str, dict] = {}
        for order in orders:
            for using in USINGS:
                rows[f"{using} ({order})"] = measures(api[half, order][using], part)
        for name, rank in refs[half].items():
            rows[name] = measures(rank, part)
        kinds = [k for k in rows[next(iter(rows))] if k != "all"]
        nq = rows[next(iter(rows))]
        print(f"\n{half}: {len(part)} conversations, {nq['all'][2]} questions")
        head = "{:<28}" + " {:>13}" * (1 + len(kinds))
        print(head.format("recall@10 / hit@10", "all", *[f"{k} ({nq[k][2]})" for k in kinds]))
        for name, m in rows.items():
            cells = [f"{m[k][0]:.3f} / {m[k][1]:.3f}" for k in ("all", *kinds)]
            print(head.format(name, *cells))
        rrf = rows["RRF(BM25, dense)"]["all"][0]
        gaps = {o: round(rows[f"hybrid ({o})"]["all"][0] - rrf, 3) for o in orders}
        p50 = {o: api[half, o]["hybrid_p50_ms"] for o in orders}
        print(f"hybrid - RRF(BM25, dense), recall@10: {gaps}; hybrid p50 ms: {p50}")
        doc[half] = {"rows": rows, "hybrid_minus_rrf": gaps, "hybrid_p50_ms": p50}
    return doc
