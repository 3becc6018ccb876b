"""Fusion lab: the rankings of benchmarks/retrieval.py computed in process, to compare ways of
fusing them quickly (no Ray, no HTTP; the same keyword index and analyzer as a shard, the same
embedding model, exact cosine instead of the shard's int8 vectors).

    .venv/bin/python -m benchmarks.retrieval_lab [--data synthetic|locomo-like] [--quick]

Keyword hits come from storage/search_index.py's TermIndex, each turn indexed with the previous
turn's words as a shard does for records written in a row (actors/workspace/pools.py), or
without (`own`); semantic hits are cosines of all-MiniLM-L6-v2 (kind onnx) vectors, cached in
/tmp between runs. Every fusion is engine/workspace_search.py's or a candidate for it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks._conversations import Conversation
from engine import workspace_search as wsr
from engine.workspace_search import Hit
from storage.search_index import Analyzer, TermIndex

DEPTH = 1_000


def load(data: str, quick: bool) -> list[Conversation]:
    if data == "locomo-like":
        from benchmarks._locomo_like import make

        return make(5, 300) if quick else make(20, 300)
    from benchmarks._conversations import make as make_synthetic

    return make_synthetic(3, 300) if quick else make_synthetic(10, 600)


def vectors(texts: list[str], threads: int) -> np.ndarray:
    digest = hashlib.sha1("\n".join(texts).encode()).hexdigest()[:16]
    path = Path("/tmp") / f"oblab-vec-{digest}.npy"
    if path.exists():
        return np.load(path)
    from actors.models.embeddings import OnnxEmbeddings

    async def run() -> np.ndarray:
        model = OnnxEmbeddings("lab", threads=threads, batch_size=64)
        return np.asarray(await model.embed(texts), dtype=np.float32)

    out = asyncio.run(run())
    np.save(path, out)
    return out


def keyword_lists(convs, questions, context: bool) -> list[list[Hit]]:
    analyzer = Analyzer(b"k" * 32)
    index = TermIndex()
    prev = None
    for c in convs:
        for t in c.turns:
            own = analyzer.keys(t.content)
            keys = own if prev is None or not context else np.sort(np.concatenate((own, prev)))
            index.put(t.id, keys)
            prev = own
    return [
        [Hit(id=i, score=s, kinds=("keyword",)) for i, s in index.search(analyzer.query(q), DEPTH)]
        for q in questions
    ]


def semantic_lists(ids, dvec, qvec, min_score=0.2) -> list[list[Hit]]:
    sims = qvec @ dvec.T
    out = []
    for row in sims:
        top = np.argpartition(-row, DEPTH)[:DEPTH]
        top = top[np.argsort(-row[top], kind="stable")]
        out.append(
            [Hit(id=ids[j], score=float(row[j]), kinds=("semantic",)) for j in top if row[j] >= min_score]
        )
    return out


def recall(ranked, evidence, k):
    return len(set(ranked[:k]) & set(evidence)) / len(evidence)


def mrr(ranked, evidence):
    for n, r in enumerate(ranked[:10]):
        if r in evidence:
            return 1.0 / (n + 1)
    return 0.0


def evaluate(rankings, evidence, kinds=None):
    r5 = np.mean([recall(r, e, 5) for r, e in zip(rankings, evidence, strict=True)])
    r10 = [recall(r, e, 10) for r, e in zip(rankings, evidence, strict=True)]
    m = np.mean([mrr(r, e) for r, e in zip(rankings, evidence, strict=True)])
    out = {"r5": round(float(r5), 3), "r10": round(float(np.mean(r10)), 3), "mrr": round(float(m), 3)}
    if kinds is not None:
        by = defaultdict(list)
        for k, v in zip(kinds, r10, strict=True):
            by[k].append(v)
        out["by_kind"] = {k: round(float(np.mean(v)), 3) for k, v in sorted(by.items())}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="locomo-like", choices=("synthetic", "locomo-like"))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    convs = load(args.data, args.quick)
    turns = [t for c in convs for t in c.turns]
    qs = [q for c in convs for q in c.questions]
    ids = [t.id for t in turns]
    evidence = [q.evidence for q in qs]
    kinds = [q.kind for q in qs]
    print(f"{args.data}: {len(turns)} turns, {len(qs)} questions", flush=True)
    t0 = time.perf_counter()
    dvec = vectors([t.content for t in turns], args.threads)
    qvec = vectors([q.text for q in qs], args.threads)
    print(f"vectors {time.perf_counter() - t0:.1f} s", flush=True)
    kw_ctx = keyword_lists(convs, [q.text for q in qs], context=True)
    kw_own = keyword_lists(convs, [q.text for q in qs], context=False)
    sem = semantic_lists(ids, dvec, qvec)
    runs = {
        "keyword (context)": [[h.id for h in L] for L in kw_ctx],
        "keyword (own)": [[h.id for h in L] for L in kw_own],
        "semantic": [[h.id for h in L] for L in sem],
    }
    yes = lambda _: True  # noqa: E731
    for name, kw in (("ctx", kw_ctx), ("own", kw_own)):
        for k in (10, 60):
            runs[f"rrf k={k} {name}"] = [
                [h.id for h in wsr.merge_hits(a, b, yes, 10, k=k)] for a, b in zip(kw, sem, strict=True)
            ]
    for name, r in runs.items():
        print(f"{name:<28} {evaluate(r, evidence, kinds)}")
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
