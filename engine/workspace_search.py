"""Searching workspace memory (SPEC SC-7, `workspace_memory_search`, `GET /memories?q=`).

Keyword search matches the words of the body: every query term must appear, case-insensitively,
and hits are scored by how often their terms occur. Text without spaces between words (Chinese,
Japanese) is matched by substring, since there are no words to split it into; elsewhere a term
matches the words it begins (`deploy` finds "deployment", `art` does not find "start").

With semantic search enabled, keyword hits and semantic hits are merged by reciprocal rank
fusion: both kinds are kept, a record found both ways rises, and a semantic hit need not contain
the query. Only records the reader may see are kept, and they are filtered *before* ranking so
that hidden records cannot shift the order of visible ones.

The caller passes decrypted text of candidate records; this module neither reads nor stores.
"""

from __future__ import annotations

import heapq
import math
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence

import msgspec

from engine.errors import InvalidInput

# Scripts written without spaces between words. Hangul is not among them: Korean uses spaces.
_NO_SPACE = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u31f0-\u31ff"  # katakana extensions
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uf900-\ufaff"  # CJK compatibility ideographs
    "\U00020000-\U0003134f"  # CJK extensions B-G
)
_TOKEN = re.compile(rf"[{_NO_SPACE}]+|[^\W_{_NO_SPACE}]+")
_NO_SPACE_RUN = re.compile(rf"^[{_NO_SPACE}]+$")
RRF_K = 60  # the usual constant: keeps one list's top hit from swamping the other's


class Hit(msgspec.Struct, frozen=True, kw_only=True):
    """One found record. `score` is a term count (keyword), a cosine (semantic) or a fused rank
    score (merged); `kinds` says how it was found."""

    id: str
    score: float
    kinds: tuple[str, ...]


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def terms(query: str) -> tuple[str, ...]:
    """The query's terms, deduplicated in order: words, and runs of spaceless script."""
    return tuple(dict.fromkeys(_TOKEN.findall(_fold(query))))


def _count(term: str, folded: str, words: Sequence[str]) -> int:
    if _NO_SPACE_RUN.match(term):
        return folded.count(term)
    return sum(1 for w in words if w.startswith(term))


def keyword_search(query: str, docs: Iterable[tuple[str, str]], limit: int) -> list[Hit]:
    """Records whose text contains every term of `query`, best first: by total occurrences of the
    terms, then by id so that equal scores come out in a stable order. An empty query finds
    nothing."""
    wanted = terms(query)
    if not wanted or limit <= 0:
        return []
    hits = []
    for doc_id, text in docs:
        folded = _fold(text)
        words = [w for w in _TOKEN.findall(folded) if not _NO_SPACE_RUN.match(w)]
        score = 0
        for term in wanted:
            n = _count(term, folded, words)
            if n == 0:
                break
            score += n
        else:
            hits.append(Hit(id=doc_id, score=float(score), kinds=("keyword",)))
    return heapq.nsmallest(limit, hits, key=lambda h: (-h.score, h.id))


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
) -> list[Hit]:
    """Keyword and semantic hits in one list of at most `limit`, each record once (SC-7).

    Each list is first cut to what `allowed` lets through, then ranked by its own score; a
    record's fused score is the sum of 1/(k + rank) over the lists it is in. Ties go to the better
    single rank, then keyword before semantic, then id. With `limit` >= 2 and an allowed hit of
    each kind, both kinds are in the result.
    """
    if limit <= 0:
        return []
    verdict: dict[str, bool] = {}

    def ok(hit_id: str) -> bool:
        if hit_id not in verdict:
            verdict[hit_id] = bool(allowed(hit_id))
        return verdict[hit_id]

    fused: dict[str, float] = {}
    best: dict[str, tuple[int, int]] = {}  # (rank, list index): the tie-breakers
    kinds: dict[str, list[str]] = {}
    for index, (kind, hits) in enumerate((("keyword", keyword_hits), ("semantic", semantic_hits))):
        ranked = sorted((h for h in hits if ok(h.id)), key=lambda h: (-h.score, h.id))
        rank = 0
        for hit in ranked:
            if kind in kinds.get(hit.id, ()):
                continue  # listed twice by one search: its better rank already counted
            rank += 1
            fused[hit.id] = fused.get(hit.id, 0.0) + 1.0 / (k + rank)
            best[hit.id] = min(best.get(hit.id, (rank, index)), (rank, index))
            kinds.setdefault(hit.id, []).append(kind)
    order = sorted(fused, key=lambda i: (-fused[i], best[i], i))
    return [Hit(id=i, score=fused[i], kinds=tuple(kinds[i])) for i in order[:limit]]
