"""Signals the retrieval lab measures that no search path has (benchmarks/retrieval_lab.py
`--halves --expand`, `--feedback` and `--sentences`): chosen and compared on LoCoMo's tuning
half, reported for both halves in docs/search.md.

- **Word expansion.** Each rarer word of a query brings the pool's words nearest to it by
  embedding (a word of another stem, itself rare in the pool): "martial arts" brings
  "kickboxing", "video games" brings "valorant". The added words, with the query's names, are
  searched as a third keyword list and fused with the other two: a record that answers a list
  question in words the question does not use is found by keywords too.
- **Keyword feedback.** The words the first keyword hits share (RM3's weighting: a hit's
  rank, the word's share of the record, its rarity), with the query's names, searched as
  another keyword list: records that say what the first hits say in their words.
- **Sentence vectors.** A record of several sentences is also scored by its best sentence's
  cosine (each sentence with the record's label), so one relevant sentence among small talk
  counts for more than in the whole record's mean-pooled vector.
- **Dense feedback.** The query's vector moved toward the mean vector of the first fused hits
  (Rocchio), the fused list's first candidates ranked again by it: records that say what the
  first hits say, in other words than the query's. No second pass over the pool.
- **Vector neighbours.** The fused list's candidates whose vectors are near two or more of the
  first hits: the other items of a list question's answer look like its first items.
- **Flat keyword lists.** A keyword list whose tenth score is near its first barely tells its
  records apart; the semantic list may then weigh more.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from engine import text_terms

_WORD = re.compile(r"[a-z][a-z-]{2,}")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")


def words(text: str) -> list[str]:
    """Lower-case words of three letters or more, possessive 's and stop words dropped."""
    text = text.lower().replace("'s ", " ").replace("\u2019s ", " ") + " "
    return [w for w in _WORD.findall(text) if w not in text_terms.STOP_WORDS]


class Vocabulary:
    """The pool's words (record bodies, labels apart), each with its stem, its record count and
    its vector; `names`: the pool's labels' words, never expanded nor added."""

    def __init__(
        self,
        records: Sequence[str],
        embed: Callable[[list[str]], np.ndarray],
        stem: Callable[[list[str]], list[str]],
    ) -> None:
        df: Counter[str] = Counter()
        names: set[str] = set()
        for text in records:
            label, body = text_terms.split_label(text)
            names.update(label.lower().split())
            df.update(set(words(body)))
        self.names = frozenset(names)
        self.records = len(records)
        self.words = sorted(w for w in df if w not in names)
        self.df = np.array([df[w] for w in self.words])
        self.stems = stem(self.words)
        self.vectors = embed(self.words)
        self._df = df
        self._embed = embed
        self._stem = stem

    def expand(
        self,
        query: str,
        min_cos: float,
        per_word: int,
        max_share: float,
        query_vec: np.ndarray | None = None,
        query_share: float = 0.0,
    ) -> str:
        """The query's names and, for each of its words in at most `max_share` of the records,
        up to `per_word` pool words at cosine `min_cos` or more, of another stem than every
        query word's and themselves in at most `max_share` of the records ("" when none).

        With `query_vec` (the whole query's unit vector) and `query_share`, a word's candidates
        are taken by their cosine with it plus `query_share` times their cosine with the whole
        query: of a word's neighbours, those the question is about come first ("outdoor" in "what
        outdoor activities has John done with his colleagues?" brings "hiking" before
        "street")."""
        mine = words(query)
        stems = set(self._stem(mine))
        asked = [w for w in mine if w not in self.names and self._df[w] <= max_share * self.records]
        added: list[str] = []
        to_query = None
        if query_vec is not None and query_share:
            to_query = query_share * (self.vectors @ query_vec)
        if asked:
            for vec in self._embed(asked):
                sims = self.vectors @ vec
                near = np.flatnonzero(sims >= min_cos)
                rank = sims[near] if to_query is None else sims[near] + to_query[near]
                n = 0
                for j in near[np.argsort(-rank, kind="stable")]:
                    if n >= per_word:
                        break
                    word = self.words[j]
                    if self.stems[j] in stems or word in added:
                        continue
                    if self.df[j] > max_share * self.records:
                        continue
                    added.append(word)
                    n += 1
        if not added:
            return ""
        return " ".join([w for w in mine if w in self.names] + added)


class Feedback:
    """Keyword pseudo-relevance feedback: the words the first keyword hits share, weighed as
    RM3 weighs a feedback document's terms (its rank's weight times the word's share of the
    record times its idf), searched as a list of their own. `records`: the pool's texts,
    indexed by their row; labels' words are names, never added."""

    def __init__(self, records: Sequence[str], stem: Callable[[list[str]], list[str]]) -> None:
        df: Counter[str] = Counter()
        names: set[str] = set()
        self.bodies: list[list[str]] = []
        for text in records:
            label, body = text_terms.split_label(text)
            names.update(label.lower().split())
            self.bodies.append(words(body))
            df.update(set(self.bodies[-1]))
        self.names = frozenset(names)
        self.bodies = [[w for w in b if w not in self.names] for b in self.bodies]
        self.df = df
        self.records = len(records)
        self._stem = stem

    def query(self, query: str, rows: Sequence[int], per_query: int, max_share: float) -> str:
        """The query's names and up to `per_query` words of the records at `rows` (the first
        keyword hits, best first), each in at most `max_share` of the records and of another
        stem than the query's words and the other added words ("" when none)."""
        mine = words(query)
        weight: Counter[str] = Counter()
        for rank, row in enumerate(rows):
            body = self.bodies[row]
            for word, n in Counter(body).items():
                df = self.df[word]
                if df <= max_share * self.records:
                    weight[word] += n / len(body) * math.log(self.records / df) / (rank + 1)
        ranked = [w for w, _ in sorted(weight.items(), key=lambda kv: (-kv[1], kv[0]))]
        ranked = ranked[: 3 * per_query]
        stems = set(self._stem(mine))
        added: list[str] = []
        for word, stem in zip(ranked, self._stem(ranked), strict=True):
            if len(added) < per_query and stem not in stems:
                added.append(word)
                stems.add(stem)
        if not added:
            return ""
        return " ".join([w for w in mine if w in self.names] + added)


def sentences(text: str) -> list[str]:
    """A record's sentences of two words or more, each with the record's label (`Name: …`);
    [] for a record of one sentence (its own vector is its sentence's)."""
    label, _ = text_terms.split_label(text)
    head = text[: text.index(":") + 2] if label else ""
    parts = [p for p in _SENTENCE_END.split(text[len(head) :]) if len(p.split()) >= 2]
    return [head + p for p in parts] if len(parts) > 1 else []


def best_sentence(
    whole: np.ndarray, qvec: np.ndarray, svec: np.ndarray, owner: Sequence[int], share: float
) -> np.ndarray:
    """Cosines (queries x records): each record's whole-text cosine plus `share` of what its
    best sentence adds to it."""
    best = whole.copy()
    sims = qvec @ svec.T
    for col, row in enumerate(owner):
        np.maximum(best[:, row], sims[:, col], out=best[:, row])
    return whole + share * (best - whole)


def dense_feedback(
    query_vec: np.ndarray,
    first: Sequence[int],
    candidates: Sequence[int],
    vectors: np.ndarray,
    share: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The `candidates` (rows of `vectors`, unit vectors) ordered by cosine with the query's
    vector plus `share` times the mean vector of the `first` hits, renormalised; with those
    cosines. Without first hits the query's own vector ranks them."""
    query = np.asarray(query_vec, dtype=np.float64)
    if len(first):
        query = query + share * vectors[list(first)].mean(axis=0)
        norm = np.linalg.norm(query)
        query = query / norm if norm else query
    rows = np.asarray(candidates, dtype=np.int64)
    cos = vectors[rows] @ query if len(rows) else np.zeros(0)
    order = np.argsort(-cos, kind="stable")
    return rows[order], cos[order]


def vector_neighbours(
    first: Sequence[int],
    candidates: Sequence[int],
    vectors: np.ndarray,
    min_cos: float,
    need: int = 2,
) -> list[int]:
    """The `candidates` at cosine `min_cos` or more with at least `need` of the `first` hits
    (a record is not its own neighbour), those near the most first hits first, then by the sum
    of those cosines."""
    if not len(first) or not len(candidates):
        return []
    sims = vectors[list(candidates)] @ vectors[list(first)].T
    for n, row in enumerate(candidates):
        sims[n, [j for j, f in enumerate(first) if f == row]] = -1.0
    near = sims >= min_cos
    count = near.sum(axis=1)
    total = np.where(near, sims, 0.0).sum(axis=1)
    chosen = [n for n in range(len(candidates)) if count[n] >= need]
    chosen.sort(key=lambda n: (-count[n], -total[n], n))
    return [candidates[n] for n in chosen]


def flat(scores: Sequence[float], share: float, place: int = 10) -> bool:
    """Whether a ranked list's score at `place` is at least `share` of its first."""
    return len(scores) >= place and scores[0] > 0 and scores[place - 1] >= share * scores[0]
