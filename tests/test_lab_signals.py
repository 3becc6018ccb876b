"""The retrieval lab's word expansion and sentence scoring (benchmarks/_lab_signals.py)."""

import numpy as np
import Stemmer

from benchmarks._lab_signals import (
    Feedback,
    Vocabulary,
    best_sentence,
    dense_feedback,
    flat,
    sentences,
    vector_neighbours,
)

# Hand-made directions: "arts" sits near "kickboxing" and "karate", "art" (its own stem) nearer
# still; "hello" is everywhere and near "greetings".
AXES = {
    "arts": [1, 0, 0],
    "art": [1, 0, 0],
    "kickboxing": [0.9, 0.1, 0],
    "karate": [0.8, 0.2, 0],
    "painting": [0.2, 1, 0],
    "hello": [0, 0, 1],
    "greetings": [0, 0.1, 1],
}


def embed(words: list[str]) -> np.ndarray:
    vecs = np.array([AXES.get(w, [0.0, 0.0, 0.0]) for w in words], dtype=np.float32)
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs / np.where(norms == 0, 1, norms)


RECORDS = [
    "Maria (1 May 2023): Hello! I'm doing kickboxing these days.",
    "John (1 May 2023): Hello Maria, I love art.",
    "Maria (2 May 2023): Hello, karate next week. Greetings!",
    "John (2 May 2023): Hello painting.",
] + [f"John (3 May 2023): hello number {n}" for n in range(60)]


def vocab() -> Vocabulary:
    return Vocabulary(RECORDS, embed, Stemmer.Stemmer("english").stemWords)


def test_expansion_adds_near_words_of_other_stems_with_the_names():
    got = vocab().expand("What martial arts has Maria done?", 0.5, 3, 0.1).split()
    assert got[0] == "maria"  # names stay, so the label rule keeps the speaker's records
    assert set(got[1:]) == {"kickboxing", "karate"}  # "art" is the query's own stem


def test_expansion_skips_words_common_in_the_pool_and_far_words():
    v = vocab()
    assert v.expand("hello Maria", 0.5, 3, 0.1) == ""  # "hello" is in most records
    assert "painting" not in v.expand("martial arts", 0.5, 3, 0.1)
    assert v.expand("martial arts", 0.995, 3, 0.1) == ""


def test_sentences_carry_the_label_and_one_sentence_records_have_none():
    assert sentences("Ann (1 May): Hi there. I won the cup! Great.") == [
        "Ann (1 May): Hi there.",
        "Ann (1 May): I won the cup!",
    ]
    assert sentences("Ann: Just one sentence here.") == []


def test_best_sentence_lifts_a_record_by_its_best_sentence_only():
    whole = np.array([[0.2, 0.5]])
    svec = np.array([[1.0, 0.0], [0.0, 1.0]])
    cos = best_sentence(whole, np.array([[0.9, 0.1]]), svec, [0, 0], 0.5)
    assert np.allclose(cos, [[0.2 + 0.5 * (0.9 - 0.2), 0.5]])


# "done" has two neighbours: "finished" (its nearest) and "taekwondo", which is also near the
# martial sense of the whole query.
SENSES = {
    "done": [1, 0, 0],
    "finished": [0.95, 0.3, 0],
    "taekwondo": [0.8, 0, 0.6],
}
MARTIAL = np.array([0.0, 0.0, 1.0], dtype=np.float32)


def embed_senses(words: list[str]) -> np.ndarray:
    vecs = np.array([SENSES.get(w, [0.0, 1.0, 0.0]) for w in words], dtype=np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


SENSE_RECORDS = [
    "John (1 May 2023): I finished the report.",
    "John (2 May 2023): Taekwondo tonight!",
    "John (3 May 2023): All done here.",
] + [f"Maria (4 May 2023): filler {n}" for n in range(40)]


def test_expansion_with_the_query_vector_prefers_the_query_sense():
    v = Vocabulary(SENSE_RECORDS, embed_senses, Stemmer.Stemmer("english").stemWords)
    query = "What has John done?"
    assert v.expand(query, 0.5, 1, 0.1) == "john finished"
    assert v.expand(query, 0.5, 1, 0.1, MARTIAL, 0.5) == "john taekwondo"
    assert v.expand(query, 0.5, 1, 0.1, MARTIAL, 0.0) == "john finished"


def test_expansion_with_the_query_vector_keeps_the_word_cosine_floor():
    v = Vocabulary(SENSE_RECORDS, embed_senses, Stemmer.Stemmer("english").stemWords)
    # "taekwondo" is at cosine 0.8 of "done": above 0.9 only "finished" may come, however
    # near the query "taekwondo" is.
    assert v.expand("What has John done?", 0.9, 1, 0.1, MARTIAL, 5.0) == "john finished"


FEEDBACK_RECORDS = [
    "Maria (1 May 2023): hello, kickboxing and sparring today",
    "Maria (2 May 2023): hello, sparring after aikido class",
    "John (2 May 2023): hello, painting the fence and paints",
] + [f"John (3 May 2023): hello number {n}" for n in range(40)]


def feedback() -> Feedback:
    return Feedback(FEEDBACK_RECORDS, Stemmer.Stemmer("english").stemWords)


def test_feedback_adds_the_first_hits_rare_words_with_the_query_names():
    got = feedback().query("What martial arts has Maria done?", [0, 1], 2, 0.1).split()
    assert got[0] == "maria"  # the query's names stay; no label's word is ever added
    assert got[1] == "sparring"  # in both hits
    assert got[2] == "kickboxing"  # in the first hit only: weighs more than the second's
    assert "hello" not in got  # in every record
    assert feedback().query("What did Maria do?", [], 2, 0.1) == ""


def test_feedback_weighs_a_hit_by_its_rank():
    # "aikido" (second hit) sorts before "kickboxing" (first hit) by name: rank decides.
    assert feedback().query("Maria?", [0, 1], 2, 0.1) == "maria sparring kickboxing"


def test_feedback_skips_words_common_in_the_pool():
    # "sparring" is in 2 of 43 records: above a share of 0.03.
    assert feedback().query("Maria?", [0, 1], 1, 0.03) == "maria kickboxing"


def test_feedback_skips_words_of_the_query_stems():
    got = feedback().query("What does John paint?", [2], 3, 0.1).split()
    assert "painting" not in got and "paints" not in got
    assert "fence" in got


def unit(rows: list[list[float]]) -> np.ndarray:
    vecs = np.array(rows, dtype=np.float64)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


# Row 0 is the query's best match; rows 1 and 2 share its topic (axis 1) but not the query's
# words (axis 0); row 3 is off topic.
TOPIC = unit([[1, 1, 0], [0.3, 1, 0], [0.5, 0.2, 1], [0.6, 0, 1]])
QUERY = np.array([1.0, 0.0, 0.0])


def test_dense_feedback_moves_the_query_toward_the_first_hits():
    alone, _ = dense_feedback(QUERY, [0], [1, 2, 3], TOPIC, 0.0)
    assert list(alone) == [3, 2, 1]  # by the query's own vector
    moved, cos = dense_feedback(QUERY, [0], [1, 2, 3], TOPIC, 1.0)
    assert list(moved) == [1, 3, 2]  # the first hit's topic lifts row 1
    assert np.all(np.diff(cos) <= 0)
    query = QUERY + TOPIC[0]
    assert np.isclose(cos[0], TOPIC[1] @ query / np.linalg.norm(query))


def test_dense_feedback_ranks_only_the_candidates_and_without_first_hits_by_the_query():
    got, _ = dense_feedback(QUERY, [], [2, 1], TOPIC, 1.0)
    assert list(got) == [2, 1]
    got, cos = dense_feedback(QUERY, [0], [], TOPIC, 1.0)
    assert len(got) == 0 and len(cos) == 0


# Rows 0-2 near each other (cosines above 0.98), row 3 less near them (0.70-0.78), row 4 near
# none of them.
CLUSTER = unit([[1, 0, 0], [0.9, 0.1, 0], [0.9, 0, 0.1], [0.7, 0.7, 0.1], [0, 0, 1]])


def test_vector_neighbours_need_two_first_hits_and_skip_themselves():
    # Row 1 is a first hit: near the other first hit only (itself not counted), so not listed.
    assert vector_neighbours([0, 1], [1, 2, 3, 4], CLUSTER, 0.6) == [2, 3]
    assert vector_neighbours([0, 1], [1, 2, 3, 4], CLUSTER, 0.6, need=1) == [2, 3, 1]
    assert vector_neighbours([0, 1], [1, 2, 3, 4], CLUSTER, 0.75) == [2]  # row 3: one only
    assert vector_neighbours([0, 1], [1, 2, 3, 4], CLUSTER, 0.999) == []
    assert vector_neighbours([], [1, 2], CLUSTER, 0.5) == []


def test_vector_neighbours_near_the_most_first_hits_come_first():
    # Row 2 is near all three first hits; row 3 near the two others.
    assert vector_neighbours([0, 1, 3], [3, 2], CLUSTER, 0.6) == [2, 3]


def test_flat_compares_the_tenth_score_with_the_first():
    assert flat([10.0] + [6.0] * 9, 0.5)
    assert not flat([10.0] + [6.0] * 8 + [4.0], 0.5)
    assert not flat([10.0] * 9, 0.5)  # fewer than ten hits: not flat
    assert flat([10.0, 9.0, 8.0], 0.5, place=3)
