"""Ranking workspace and bot memory search (SC-7): fusing what the retrievers
found.

Keyword hits (BM25, storage/search_index.py) and semantic hits (cosine,
actors/workspace/semantic.py) are fused by weighted reciprocal rank fusion: a record's score is
the sum over the lists it is in of `weight / (k + rank)`. Both kinds are kept, a record found
both ways rises, and a semantic hit need not contain the query. Only records the reader may see
are ranked, and they are filtered *before* ranking, so hidden records cannot shift the order of
visible ones.

Each list is fused as deep as `fusion_depth` says (1,000 hits by default, far below anything
the first `limit` could need), then the fusion is cut at `limit`.

Pure: the caller passes hits (and vectors, for the reference cosine ranking).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec

from engine.errors import InvalidInput

FUSION_DEPTH = 1_000  # per list and shard; see fusion_depth
RRF_K = 10  # small: recall@10 wants each list's best near the top (benchmarks/retrieval.py)
# Keyword's list weighs more than semantic's: a record is indexed with its thread's words, a
# vector holds its own text only. Chosen on LoCoMo's tuning half and kept because it held on
# the held-out half (docs/search.md).
FUSION_WEIGHTS = (1.5, 1.0)


class Hit(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One found record. `score` is a BM25 score (keyword), a cosine (semantic) or a fused rank
    score (merged); `kinds` names the retrievers that found it."""

    id: str
    score: float
    kinds: tuple[str, ...]


def fusion_depth(limit: int, weights: Sequence[float], k: int = RRF_K, floor: int = 0) -> int:
    """How many hits of each list to fuse for the first `limit` results: at least `floor`, and
    deep enough that a record below this rank in every list scores less than the `limit`-th
    hit of the strongest list alone, so it could never be among them. (A record that one list
    ranks within and the other below gets less than weight/(k + depth) from the second: the
    only difference from fusing the whole lists.)"""
    w_max, w_sum = max(weights), sum(weights)
    return max(limit, floor, math.floor(w_sum / w_max * (k + limit)) - k + 1)


def cosine_top_k(
    query_vec: Sequence[float],
    vectors: Mapping[str, Sequence[float]] | Iterable[tuple[str, Sequence[float]]],
    k: int,
    *,
    min_score: float | None = None,
) -> list[Hit]:
    """The `k` vectors most similar to `query_vec` by cosine, best first (ties by id).

    Plain Python for the small sets of one reader's pools; a zero vector has no direction and is
    never a hit. Vectors of another dimension than the query's are a caller error.
    """
    if k <= 0:
        return []
    items = vectors.items() if isinstance(vectors, Mapping) else vectors
    # Scaled to unit length first: multiplying two tiny norms would underflow to zero.
    q_norm = math.hypot(*query_vec)
    if q_norm == 0:
        return []
    unit = [x / q_norm for x in query_vec]
    hits = []
    for vec_id, vec in items:
        if len(vec) != len(query_vec):
            raise InvalidInput(
                f"vector {vec_id!r} has {len(vec)} dimensions, the query {len(query_vec)}",
                code="dimension_mismatch",
            )
        norm = math.hypot(*vec)
        if norm == 0:
            continue
        score = math.fsum(u * (x / norm) for u, x in zip(unit, vec, strict=True))
        if min_score is None or score >= min_score:
            hits.append(Hit(id=vec_id, score=score, kinds=("semantic",)))
    return heapq.nsmallest(k, hits, key=lambda h: (-h.score, h.id))


def merge_hits(
    keyword_hits: Iterable[Hit],
    semantic_hits: Iterable[Hit],
    allowed: Callable[[str], bool],
    limit: int,
    *,
    k: int = RRF_K,
    weights: tuple[float, float] = (1.0, 1.0),
) -> list[Hit]:
    """Keyword and semantic hits in one list of at most `limit`, each record once (SC-7).

    Each list is first cut to what `allowed` lets through, then ranked by its own score; a
    record's fused score is the sum of weight/(k + rank) over the lists it is in (`weights`:
    keyword's, semantic's). Ties go to the better
    single rank, then keyword before semantic, then id. With `limit` >= 2 and an allowed hit of
    each kind, both kinds are in the result.
    """
    if limit <= 0:
        return []
    if isinstance(semantic_hits, Sequence) and not semantic_hits:
        return _one_list(keyword_hits, allowed, limit, k, weights[0])
    verdict: dict[str, bool] = {}

    def ok(hit: Hit) -> bool:
        seen = verdict.get(hit.id)
        if seen is None:
            seen = verdict[hit.id] = bool(allowed(hit.id))
        return seen

    # Plain dicts and tuples: this runs over a thousand hits of each list per search.
    fused: dict[str, float] = {}
    best: dict[str, tuple[int, int]] = {}  # (rank, list index): the tie-breakers
    kinds: dict[str, tuple[str, ...]] = {}
    for index, (kind, hits) in enumerate((("keyword", keyword_hits), ("semantic", semantic_hits))):
        weight = weights[index]
        listed: set[str] = set()  # listed twice by one search: its better rank counts
        rank = 0
        for hit in sorted(filter(ok, hits), key=_by_score):
            hit_id = hit.id
            if hit_id in listed:
                continue
            listed.add(hit_id)
            rank += 1
            share = weight / (k + rank)
            if hit_id in fused:
                fused[hit_id] += share
                kinds[hit_id] += (kind,)
                if rank < best[hit_id][0]:
                    best[hit_id] = (rank, index)
            else:
                fused[hit_id] = share
                best[hit_id] = (rank, index)
                kinds[hit_id] = (kind,)
    order = sorted(fused, key=lambda i: (-fused[i], best[i], i))
    return [Hit(id=i, score=fused[i], kinds=kinds[i]) for i in order[:limit]]


def _one_list(
    hits: Iterable[Hit], allowed: Callable[[str], bool], limit: int, k: int, weight: float
) -> list[Hit]:
    """`merge_hits` of keyword hits alone: each rank scores less than the one before, so the
    fused order is the list's own, and the walk stops at `limit`."""
    out: list[Hit] = []
    listed: set[str] = set()
    for hit in sorted(hits, key=_by_score):
        hit_id = hit.id
        if hit_id in listed or not allowed(hit_id):
            continue
        listed.add(hit_id)
        out.append(Hit(id=hit_id, score=weight / (k + len(out) + 1), kinds=("keyword",)))
        if len(out) == limit:
            break
    return out


def combine(
    rankings: Sequence[tuple[Sequence[Hit], Sequence[Hit], Sequence[Hit]]], limit: int
) -> list[Hit]:
    """One ranking from the rankings of several shards, each (its keyword hits, its semantic
    hits, its fused ranking), as every search path that asks more than one shard combines
    them: one shard ranked everything, so its fusion is exact; several are fused again by
    their per-retriever scores."""
    if len(rankings) == 1:
        return list(rankings[0][2][:limit])
    return merge_hits(
        [h for keyword, _, _ in rankings for h in keyword],
        [h for _, semantic, _ in rankings for h in semantic],
        _everything,
        limit,
    )


def _everything(_: str) -> bool:
    return True


def _by_score(hit: Hit) -> tuple[float, str]:
    return (-hit.score, hit.id)
