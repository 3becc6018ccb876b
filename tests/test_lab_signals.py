"""The retrieval lab's word expansion and sentence scoring (benchmarks/_lab_signals.py)."""

import numpy as np
import Stemmer

from benchmarks._lab_signals import Vocabulary, best_sentence, sentences

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
