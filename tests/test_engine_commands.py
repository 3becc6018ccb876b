"""Remember, Forget and purge (API-2, API-4), the visible change log (API-3) and memory order
(MEM-5), on pools held in plain dicts."""

from __future__ import annotations

import itertools

import pytest

from engine import commands
from engine.commands import forget, purge, purge_selection, remember, validate_content, visible_log
from engine.errors import Conflict, InvalidInput, TooLarge
from engine.memory_entries import (
    AccessProof,
    Change,
    EntryMeta,
    Layer,
    LogRow,
    Reader,
    Source,
    Status,
    Who,
)
from engine.order import in_memory_order
from engine.visibility import visible_ids

A = Reader(user="a", org="o1", channels=frozenset({"c1"}))
B = Reader(user="b", org="o1", channels=frozenset({"c1"}))
A_ELSEWHERE = Reader(user="a", org="o2", channels=frozenset({"c1"}))


def entry(entry_id: str, *tags: str, layer=Layer.PINNED, created=1, **kw) -> EntryMeta:
    return EntryMeta(
        id=entry_id,
        pool="p",
        layer=layer,
        tags=("org:o1", *tags),
        created_at=created,
        updated_at=created,
        **kw,
    )


def obs(entry_id: str, *sources: str, tags=("for:person:a",), created=1) -> EntryMeta:
    return entry(
        entry_id,
        *tags,
        layer=Layer.OBSERVATION,
        created=created,
        sources=tuple(Source(entry=s) for s in sources),
    )


def fact(entry_id: str, *tags: str, created=1) -> EntryMeta:
    grants = tuple(t for t in tags if t.startswith("for:"))
    return entry(
        entry_id,
        *tags,
        layer=Layer.FACT,
        created=created,
        sources=(Source(chat="k1", item=entry_id),),
        proofs=(AccessProof(chat="k1", item=entry_id, org="o1", audience=grants),),
    )


def as_pool(*entries: EntryMeta) -> dict[str, EntryMeta]:
    return {e.id: e for e in entries}


def apply(pool: dict[str, EntryMeta], outcome: commands.Outcome) -> dict[str, EntryMeta]:
    new = {**pool, **{e.id: e for e in outcome.upserts}}
    for entry_id in outcome.deletes:
        del new[entry_id]
    return new


# --------------------------------------------------------------------------- remember


def test_remember_makes_a_pinned_entry_only_the_caller_sees():
    out = remember(
        pool="p", entry_id="m1", reader=A, topics=["diet", "x-1", "diet"], now=50, version=7
    )
    (e,) = out.upserts
    assert e.tags == ("from:a", "for:person:a", "org:o1", "diet", "x-1")
    assert (e.id, e.pool, e.layer, e.status) == ("m1", "p", Layer.PINNED, Status.ACTIVE)
    assert (e.created_at, e.updated_at, e.sources, e.proofs) == (50, 50, (), ())
    assert out.version == 8 and out.deletes == ()
    assert out.log == (LogRow(version=8, at=50, who=Who.PERSON, entry="m1", change=Change.CREATED),)
    pool = apply({}, out)
    assert visible_ids(A, pool) == {"m1"}
    assert visible_ids(B, pool) == set()
    assert visible_ids(A_ELSEWHERE, pool) == set()


def test_remember_without_topics():
    (e,) = remember(pool="p", entry_id="m", reader=B, topics=(), now=1, version=0).upserts
    assert e.tags == ("from:b", "for:person:b", "org:o1")


@pytest.mark.parametrize(
    ("topic", "code"),
    [
        ("for:bot", "system_tag_not_allowed"),
        ("for:person:b", "system_tag_not_allowed"),
        ("org:o2", "system_tag_not_allowed"),
        ("from:b", "system_tag_not_allowed"),
        ("a:", "system_tag_not_allowed"),
        ("Diet", "invalid_tag"),
        ("two words", "invalid_tag"),
        ("snake_case", "invalid_tag"),
        ("", "invalid_tag"),
        ("x" * 65, "invalid_tag"),
        (7, "invalid_tag"),
    ],
)
def test_remember_rejects_system_tags_and_bad_topics(topic, code):
    with pytest.raises(InvalidInput) as info:
        remember(pool="p", entry_id="m", reader=A, topics=["ok", topic], now=1, version=0)
    assert info.value.code == code


def test_remember_topic_limits():
    ok = [f"t{i}" for i in range(commands.MAX_TOPICS - 1)] + ["x" * 64]
    out = remember(pool="p", entry_id="m", reader=A, topics=[*ok, "t0"], now=1, version=0)
    assert out.upserts[0].tags[3:] == tuple(ok)  # duplicates do not count
    with pytest.raises(InvalidInput):
        remember(pool="p", entry_id="m", reader=A, topics=[*ok, "one-more"], now=1, version=0)


def test_validate_content():
    limit = commands.MAX_CONTENT_CHARS
    assert validate_content("x" * limit) == "x" * limit
    with pytest.raises(TooLarge):
        validate_content("x" * (limit + 1))
    for bad in ("", "   \n", None, 12, b"bytes"):
        with pytest.raises(InvalidInput):
            validate_content(bad)


# --------------------------------------------------------------------------- forget


@pytest.mark.parametrize("entry_id", ["nope", "bs", "other-org", "no-audience"])
def test_forget_what_the_caller_cannot_see_is_a_conflict(entry_id):
    pool = as_pool(
        entry("bs", "for:person:b"),
        EntryMeta(
            id="other-org", pool="p", layer=Layer.PINNED, tags=("org:o2", "for:person:a"),
            created_at=1, updated_at=1,
        ),
        entry("no-audience", "from:a"),
    )  # fmt: skip
    with pytest.raises(Conflict) as info:
        forget(entries=pool, entry_id=entry_id, reader=A, now=9, version=3)
    assert info.value.code == "not_yours"


def test_forget_an_entry_only_the_caller_sees_retracts_it():
    pool = as_pool(entry("m", "from:a", "for:person:a", "diet", revision=2))
    out = forget(entries=pool, entry_id="m", reader=A, now=9, version=3)
    (e,) = out.upserts
    assert (e.status, e.updated_at, e.revision, e.tags) == (
        Status.RETRACTED, 9, 3, pool["m"].tags,
    )  # fmt: skip
    assert e.forgotten_by == frozenset()
    assert out.version == 4
    assert out.log == (LogRow(version=4, at=9, who=Who.PERSON, entry="m", change=Change.RETRACTED),)
    after = apply(pool, out)
    assert visible_ids(A, after) == {"m"}  # still listed to them, as history


def test_forgetting_a_retracted_entry_changes_nothing():
    pool = as_pool(entry("m", "for:person:a", status=Status.RETRACTED))
    out = forget(entries=pool, entry_id="m", reader=A, now=9, version=3)
    assert out == commands.Outcome(version=3)


@pytest.mark.parametrize(
    "grants",
    [
        ("for:person:a", "for:person:b"),
        ("for:channel:c1",),
        ("for:person:a", "for:channel:c1"),
        ("for:bot",),
    ],
)
def test_forget_a_shared_entry_drops_only_the_caller(grants):
    a = Reader(user="a", org="o1", channels=frozenset({"c1"}), uses_bot=True)
    b = Reader(user="b", org="o1", channels=frozenset({"c1"}), uses_bot=True)
    pool = as_pool(entry("s", "from:b", *grants))
    out = forget(entries=pool, entry_id="s", reader=a, now=9, version=3)
    (e,) = out.upserts
    assert e.status == Status.ACTIVE
    assert "for:person:a" not in e.tags
    assert e.forgotten_by == frozenset({"a"})
    assert (e.updated_at, e.revision, out.version) == (9, 2, 4)
    assert out.log == (LogRow(version=4, at=9, who=Who.PERSON, entry="s", change=Change.FORGOTTEN),)
    after = apply(pool, out)
    assert visible_ids(a, after) == set()
    assert visible_ids(b, after) == {"s"}
    with pytest.raises(Conflict):  # it is no longer theirs
        forget(entries=after, entry_id="s", reader=a, now=10, version=4)


def test_forgetting_a_fact_hides_conclusions_built_on_it():
    pool = as_pool(fact("f", "for:person:a"), fact("g", "for:person:a"), obs("o", "f", "g"))
    assert visible_ids(A, pool) == {"f", "g", "o"}
    after = apply(pool, forget(entries=pool, entry_id="f", reader=A, now=9, version=1))
    assert after["f"].status == Status.RETRACTED
    assert visible_ids(A, after) == {"f", "g"}


# --------------------------------------------------------------------------- purge


@pytest.mark.parametrize("tag", ["from:a", "chat:k1", "org:o1", "channel:c1"])
def test_purge_accepts_the_four_system_tag_kinds(tag):
    assert purge_selection({}, tag) == set()


@pytest.mark.parametrize(
    "tag",
    ["for:person:a", "for:channel:c1", "for:bot", "app:search", "project:p1", "diet", "from:",
     "chat:a b", "org:x:y", "", None, 3],
)  # fmt: skip
def test_purge_rejects_other_tags(tag):
    with pytest.raises(InvalidInput):
        purge_selection({}, tag)
    with pytest.raises(InvalidInput):
        purge(entries={}, tag=tag, version=1)


def test_purge_selection_takes_derived_observations_transitively():
    pool = as_pool(
        fact("f1", "chat:k1", "for:person:a"),
        fact("f2", "chat:k2", "for:person:a"),
        entry("p", "for:person:a", "chat:k1"),
        obs("o1", "f1", "f2"),  # derived from a selected fact
        obs("o2", "o1"),  # derived from a derived one, without the tag
        obs("o3", "o2", "p"),
        obs("loop1", "loop2", "o3"),
        obs("loop2", "loop1"),
        obs("keep", "f2"),
        entry("other", "for:person:a", "chat:k10"),
    )
    selected = purge_selection(pool, "chat:k1")
    assert selected == {"f1", "p", "o1", "o2", "o3", "loop1", "loop2"}
    out = purge(entries=pool, tag="chat:k1", version=5)
    assert out.version == 6
    assert out.deletes == tuple(sorted(selected))
    assert out.upserts == () and out.log == ()
    assert set(apply(pool, out)) == {"f2", "keep", "other"}


def test_purge_with_an_empty_selection_keeps_the_version():
    pool = as_pool(entry("p", "for:person:a", "from:a"))
    assert purge(entries=pool, tag="from:b", version=5) == commands.Outcome(version=5)
    assert purge(entries=pool, tag="org:o2", version=5).deletes == ()
    assert purge(entries=pool, tag="org:o1", version=5).deletes == ("p",)


# --------------------------------------------------------------------------- visible_log


def test_visible_log_keeps_rows_about_entries_the_reader_sees_now():
    pool = as_pool(
        entry("mine", "for:person:a"),
        entry("gone-for-me", "for:person:b", "for:channel:c1", forgotten_by=frozenset({"a"})),
        entry("theirs", "for:person:b"),
        entry("retracted", "for:person:a", status=Status.RETRACTED),
        obs("hidden", "theirs"),
    )
    versions = itertools.count(1)
    rows = [
        LogRow(version=next(versions), at=10, who=who, entry=e, change=Change.CREATED)
        for e, who in [
            ("mine", Who.PERSON),
            ("theirs", Who.MEMORY_BOT),
            ("purged", Who.PERSON),
            ("retracted", Who.PROMOTION),
            ("gone-for-me", Who.PERSON),
            ("hidden", Who.MEMORY_BOT),
            ("mine", Who.MEMORY_BOT),
        ]
    ]
    assert [(r.version, r.entry) for r in visible_log(rows, pool, A)] == [
        (1, "mine"), (4, "retracted"), (7, "mine"),
    ]  # fmt: skip
    assert [r.entry for r in visible_log(rows, pool, B)] == ["theirs", "gone-for-me"]
    assert visible_log(rows, pool, A_ELSEWHERE) == []


# --------------------------------------------------------------------------- memory order


def test_in_memory_order():
    entries = [
        obs("o-old", "x", created=1),
        fact("f-new", created=9),
        entry("p-b", created=5),
        obs("o-new", "x", created=8),
        entry("p-a", created=5),
        fact("f-old", created=2),
        entry("p-new", created=6),
        obs("o-tie-b", "x", created=8),
    ]
    expected = ["p-new", "p-a", "p-b", "f-new", "f-old", "o-new", "o-tie-b", "o-old"]
    for perm in itertools.permutations(entries, 4):
        rest = [e for e in entries if e not in perm]
        assert [e.id for e in in_memory_order([*perm, *rest])] == expected
    assert in_memory_order([]) == []
