"""Workspace memory search (SC-7): keyword hits, semantic hits, and their authorized merge."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import InvalidInput
from engine.workspace_search import Hit, cosine_top_k, keyword_search, merge_hits, terms

DOCS = [
    ("m3", "Deploy on Fridays. Deployment needs a green build."),
    ("m1", "We deploy to staging first."),
    ("m2", "The release train leaves on Fridays"),
    ("m4", "项目决策\uff1a周五发布\uff0c先部署到预发环境"),  # CJK colon and comma
    ("m5", "用 Python 写部署脚本"),
    ("m6", "Start the art show"),
]


def kw(query: str, limit: int = 10) -> list[str]:
    return [h.id for h in keyword_search(query, DOCS, limit)]


# --- keyword --------------------------------------------------------------------------------------


def test_terms_are_case_insensitive_and_all_must_appear():
    assert kw("DEPLOY") == ["m3", "m1"]
    assert kw("deploy fridays") == ["m3"]
    assert kw("deploy mondays") == []


def test_scores_count_term_occurrences_and_ties_go_by_id():
    hits = keyword_search("deploy", DOCS, 10)
    assert [(h.id, h.score, h.kinds) for h in hits] == [
        ("m3", 2.0, ("keyword",)),
        ("m1", 1.0, ("keyword",)),
    ]
    tied = keyword_search("x", [("b", "x"), ("a", "X"), ("c", "x x")], 10)
    assert [h.id for h in tied] == ["c", "a", "b"]
    assert [h.id for h in keyword_search("x", [("b", "x"), ("a", "X"), ("c", "x x")], 2)] == [
        "c",
        "a",
    ]


def test_a_term_matches_words_it_begins_not_the_middle_of_words():
    assert kw("art") == ["m6"]  # not "Start"
    assert kw("deploy") == ["m3", "m1"]  # "Deployment" counts


def test_spaceless_scripts_match_substrings():
    assert kw("部署") == ["m4", "m5"]
    assert kw("周五发布") == ["m4"]
    assert kw("python 部署") == ["m5"]
    assert kw("Python部署") == ["m5"]  # split into a word and a run of Han characters
    assert kw("发布 周一") == []


def test_empty_queries_and_limits():
    assert kw("") == [] and kw("  ,.  ") == []
    assert kw("deploy", limit=0) == []
    assert terms("Hello, hello WORLD") == ("hello", "world")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet="ab 部署.,", max_size=20), max_size=12),
    st.text(alphabet="ab 部署", max_size=6),
    st.integers(0, 12),
)
def test_every_hit_contains_every_term_and_order_is_stable(texts, query, limit):
    docs = [(f"d{n:02d}", t) for n, t in enumerate(texts)]
    hits = keyword_search(query, docs, limit)
    assert len(hits) <= limit
    assert hits == sorted(hits, key=lambda h: (-h.score, h.id))
    text = dict(docs)
    for hit in hits:
        for term in terms(query):
            assert term in text[hit.id].casefold()
    assert hits == keyword_search(query, list(reversed(docs)), limit)


# --- semantic -------------------------------------------------------------------------------------


def test_cosine_top_k():
    vectors = {
        "a": [1.0, 0.0],
        "b": [0.6, 0.8],
        "c": [-1.0, 0.0],
        "z": [0.0, 0.0],
        "a2": [2.0, 0.0],
    }
    hits = cosine_top_k([1.0, 0.0], vectors, 3)
    assert [h.id for h in hits] == ["a", "a2", "b"]
    assert hits[0].score == pytest.approx(1.0) and hits[2].score == pytest.approx(0.6)
    assert hits[0].kinds == ("semantic",)
    assert [h.id for h in cosine_top_k([1.0, 0.0], vectors.items(), 10, min_score=0.5)] == [
        "a",
        "a2",
        "b",
    ]
    assert cosine_top_k([0.0, 0.0], vectors, 3) == []
    assert cosine_top_k([1.0, 0.0], vectors, 0) == []
    with pytest.raises(InvalidInput):
        cosine_top_k([1.0, 0.0, 0.0], vectors, 3)


vec_st = st.lists(st.floats(-10, 10, allow_nan=False), min_size=3, max_size=3)


@settings(max_examples=200, deadline=None)
@given(
    vec_st,
    st.dictionaries(st.text(alphabet="abcdef", min_size=1, max_size=3), vec_st),
    st.integers(0, 8),
)
def test_cosine_top_k_agrees_with_brute_force(query, vectors, k):
    def cos(u, v):
        nu, nv = math.hypot(*u), math.hypot(*v)
        if nu == 0 or nv == 0:
            return None
        return sum((a / nu) * (b / nv) for a, b in zip(u, v, strict=True))

    hits = cosine_top_k(query, vectors, k)
    scored = {i: cos(query, v) for i, v in vectors.items()}
    expected = sorted(
        (i for i, s in scored.items() if s is not None), key=lambda i: (-scored[i], i)
    )
    if cos(query, query) is None:
        expected = []
    assert len(hits) == min(k, len(expected))
    for hit, want in zip(hits, expected, strict=False):
        assert hit.score == pytest.approx(scored[want], abs=1e-9)
    assert all(-1 - 1e-9 <= h.score <= 1 + 1e-9 for h in hits)


# --- merged ---------------------------------------------------------------------------------------


def k(i: str, score: float = 1.0) -> Hit:
    return Hit(id=i, score=score, kinds=("keyword",))


def s(i: str, score: float = 0.5) -> Hit:
    return Hit(id=i, score=score, kinds=("semantic",))


def test_merge_keeps_both_kinds_once_each_and_only_what_is_allowed():
    keyword = [k("m1", 3), k("m2", 2), k("secret", 9)]
    semantic = [s("m9", 0.9), s("m2", 0.8), s("hidden", 0.99)]
    merged = merge_hits(keyword, semantic, lambda i: i.startswith("m"), 10)
    assert [h.id for h in merged] == ["m2", "m1", "m9"]
    assert merged[0].kinds == ("keyword", "semantic")
    assert merged[1].kinds == ("keyword",) and merged[2].kinds == ("semantic",)


def test_a_semantic_hit_need_not_contain_the_query():
    docs = [("m1", "We deploy on Fridays"), ("m2", "Releases go out at the end of the week")]
    keyword = keyword_search("deploy", docs, 10)
    assert [h.id for h in keyword] == ["m1"]
    vectors = {"m1": [0.9, 0.1], "m2": [0.8, 0.3]}
    merged = merge_hits(keyword, cosine_top_k([1.0, 0.2], vectors, 10), lambda _: True, 10)
    assert {h.id for h in merged} == {"m1", "m2"}
    assert "deploy" not in dict(docs)["m2"]


def test_hidden_hits_do_not_move_visible_ones():
    with_hidden = merge_hits([k("x", 9), k("a", 2)], [s("b")], lambda i: i != "x", 10)
    without = merge_hits([k("a", 2)], [s("b")], lambda _: True, 10)
    assert with_hidden == without


def test_allowed_is_asked_once_per_record_and_limits_hold():
    asked: list[str] = []

    def allowed(i: str) -> bool:
        asked.append(i)
        return True

    merged = merge_hits([k("a"), k("b")], [s("a"), s("c")], allowed, 2)
    assert sorted(asked) == ["a", "b", "c"]
    assert [h.id for h in merged] == ["a", "b"]
    assert merge_hits([k("a")], [s("a")], allowed, 0) == []


ids_st = st.lists(st.sampled_from(list("abcdefgh")), max_size=8)


@settings(max_examples=300, deadline=None)
@given(ids_st, ids_st, st.sets(st.sampled_from(list("abcdefgh"))), st.integers(0, 10))
def test_merge_properties(kw_ids, sem_ids, hidden, limit):
    keyword = [k(i, float(len(kw_ids) - n)) for n, i in enumerate(kw_ids)]
    semantic = [s(i, 1.0 - n / 10) for n, i in enumerate(sem_ids)]
    merged = merge_hits(keyword, semantic, lambda i: i not in hidden, limit)
    got = [h.id for h in merged]
    assert len(got) == len(set(got)) <= limit
    assert not set(got) & hidden
    assert set(got) <= set(kw_ids) | set(sem_ids)
    visible_kw = set(kw_ids) - hidden
    visible_sem = set(sem_ids) - hidden
    assert len(got) == min(limit, len(visible_kw | visible_sem))
    for h in merged:
        assert ("keyword" in h.kinds) == (h.id in visible_kw)
        assert ("semantic" in h.kinds) == (h.id in visible_sem)
    # SC-7: with room for two, neither kind crowds the other out.
    if limit >= 2 and visible_kw and visible_sem:
        kinds = {kind for h in merged for kind in h.kinds}
        assert kinds == {"keyword", "semantic"}
