"""A keyword search touching few of an index's rows scores only those rows: the hits, their
order and their scores are those of scoring every row (storage/search_index.py)."""

from __future__ import annotations

import random

import numpy as np

from storage import search_index as si
from storage.search_index import Stats, TermIndex, ranked
from storage.term_keys import Analyzer

AN = Analyzer(b"s" * 32)
WORDS = [f"w{k}" for k in range(400)]


def _dense(idx: TermIndex, query: list[int], depth: int, stats: Stats | None = None, allowed=None):
    scores = idx.scores(query, stats)
    return [] if scores is None else ranked(scores, idx.row_ids(), depth, allowed)


def _index(rng: random.Random, n: int) -> tuple[TermIndex, dict[str, str]]:
    idx, texts = TermIndex(), {}
    for k in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        if k % 50 == 0:
            text += " rare tea"  # a few rows hold the query's rare words
        texts[f"e{k}"] = text
        idx.put(f"e{k}", AN.keys(text))
    return idx, texts


def test_a_few_touched_rows_rank_and_score_as_the_whole_index_does():
    rng = random.Random(7)
    idx, texts = _index(rng, 3_000)
    for k in range(0, 3_000, 7):  # dead rows, some holding the rare words
        idx.remove(f"e{k}")
    for k in range(1, 3_000, 100):  # edits: a row's old postings are dead
        idx.put(f"e{k}", AN.keys(texts[f"e{k}"] + " tea tea"))
    queries = ["rare tea", "tea", "w3 rare", "nothing here", "w5"]
    for q in queries:
        keys = AN.query(q)
        for depth in (1, 5, 40, 500):
            assert idx.search(keys, depth) == _dense(idx, keys, depth), (q, depth)
        stats = Stats(live=10_000, total_len=60_000.0, df={k: 30 for k in keys})
        assert idx.search(keys, 40, stats=stats) == _dense(idx, keys, 40, stats), q
        odd = lambda i: int(i[1:]) % 2 == 1  # noqa: E731
        assert idx.search(keys, 10, odd) == _dense(idx, keys, 10, allowed=odd), q


def test_labels_score_as_the_whole_index_scores_them():
    """Records under a label (`Caroline: …`) and queries naming it: the label's own weight and
    length norm, and the rule that a name alone finds nothing when the query says more."""
    rng = random.Random(11)
    idx = TermIndex()
    for k in range(3_000):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        if k % 40 == 0:
            text = f"{'Caroline' if k % 80 else 'Melanie'}: {text} rare"
        idx.put(f"e{k}", AN.keys(text))
    for q in ["Caroline rare", "Caroline", "what does Melanie say rare", "Melanie w3", "rare"]:
        keys = AN.query(q)
        for depth in (1, 10, 200):
            assert idx.search(keys, depth) == _dense(idx, keys, depth), (q, depth)
        stats = idx.stats(keys)
        assert idx.search(keys, 5, stats=stats) == _dense(idx, keys, 5, stats), q


def test_the_sparse_path_is_the_one_taken_for_rare_words(monkeypatch):
    idx, _ = _index(random.Random(3), 2_000)
    calls = []
    monkeypatch.setattr(TermIndex, "scores", lambda *a: calls.append(a) or np.zeros(0))
    assert idx.search(AN.query("rare tea"), 5)  # found without scoring every row
    assert not calls
    monkeypatch.setattr(si, "SPARSE_RATIO", 10**9)
    idx.search(AN.query("rare tea"), 5)
    assert calls  # too many postings for the rows: every row is scored


def test_joined_postings_follow_new_rows_and_merges():
    idx = TermIndex()
    idx.put("a", AN.keys("tea time"))
    idx.put("b", AN.keys("tea"))
    first = [i for i, _ in idx.search(AN.query("tea"), 10)]
    assert sorted(first) == ["a", "b"]
    idx.put("c", AN.keys("tea tea tea"))  # the tail grew since the last search
    assert idx.search(AN.query("tea"), 10)[0][0] == "c"
    idx.merge()  # as many new rows again as the tail held: its length is no proof alone
    for k, entry_id in enumerate(("d", "e", "f")):
        idx.put(entry_id, AN.keys(" ".join(["tea"] * (4 + k))))
    found = [i for i, _ in idx.search(AN.query("tea"), 10)]
    assert found[0] == "f" and sorted(found) == ["a", "b", "c", "d", "e", "f"]


def test_joined_postings_searched_between_writes_are_those_joined_at_once():
    """A term's postings joined at one search and extended by the next with only what the tail
    gained since give the hits and scores of an index holding the same writes searched once."""
    rng = random.Random(5)
    writes: list[tuple[str, str | None]] = []  # (id, text) put, (id, None) removed
    searched = TermIndex()

    def replayed() -> TermIndex:
        idx = TermIndex()
        for entry_id, text in writes:
            idx.put(entry_id, AN.keys(text)) if text is not None else idx.remove(entry_id)
        return idx

    queries = [AN.query(q) for q in ("tea", "rare tea w1", "w2 w3", "w4")]
    for step in range(400):
        entry_id = f"e{rng.randrange(120)}"
        if rng.random() < 0.15:
            writes.append((entry_id, None))
            searched.remove(entry_id)
        else:
            text = " ".join(rng.choice([*WORDS[:6], "tea", "rare"]) for _ in range(4))
            writes.append((entry_id, text))
            searched.put(entry_id, AN.keys(text))
        if step % 3 == 0:
            keys = rng.choice(queries)
            assert searched.search(keys, 50) == replayed().search(keys, 50), step
