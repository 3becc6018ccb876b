"""Learning input and the server's checks on what the memory bot proposes (engine/learning.py)."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.learning import (
    Audience,
    ContextEntry,
    EvidenceItem,
    build_request,
    context_selection,
    counted_topics,
    decide,
    encoded_entry,
    topic_counts,
)
from engine.memory_entries import AccessProof, EntryMeta, Layer, Reader, Source, Status
from engine.tags import topics_of
from engine.visibility import visible_ids

AUD_A = Audience(chat="chat_1", org="o1", grant="for:person:a")
AUD_B = Audience(chat="chat_2", org="o1", grant="for:person:b")
EVIDENCE = {
    ("chat_1", "i-1"): EvidenceItem(
        chat="chat_1", item="i-1", kind="person", author="a", text="I moved to Oslo"
    ),
    ("chat_1", "i-2"): EvidenceItem(
        chat="chat_1", item="i-2", kind="bot", author="b_1", text="Noted"
    ),
    ("chat_1", "i-3"): EvidenceItem(
        chat="chat_1", item="i-3", kind="notification", author="system", text="x"
    ),
    ("chat_2", "i-1"): EvidenceItem(
        chat="chat_2", item="i-1", kind="person", author="b", text="I like tea"
    ),
}


def _ids():
    return (f"mem_{n}" for n in itertools.count())


def _call(name, **args):
    return (name, json.dumps(args).encode())


def _decide(calls, entries=None, audience=AUD_A, ids=None):
    return decide(
        calls,
        pool="bot:b_1",
        entries=entries or {},
        evidence=EVIDENCE,
        audience=audience,
        now=100,
        new_ids=ids or _ids(),
    )


def test_fact_tags_and_proofs_come_from_the_turn_not_the_model():
    d = _decide(
        [
            _call(
                "learn_fact",
                content="Lives in Oslo",
                items=[{"chat": "chat_1", "item": "i-1"}],
                topics=["home"],
            )
        ]
    )
    assert d.rejected == []
    ((meta, content),) = d.new
    assert content == "Lives in Oslo" and meta.layer == Layer.FACT
    assert meta.tags == ("from:a", "for:person:a", "org:o1", "chat:chat_1", "home")
    assert meta.sources == (Source(chat="chat_1", item="i-1"),)
    assert meta.proofs == (
        AccessProof(chat="chat_1", item="i-1", org="o1", audience=("for:person:a",)),
    )
    assert visible_ids(Reader(user="a", org="o1"), {meta.id: meta}) == {meta.id}
    assert visible_ids(Reader(user="b", org="o1"), {meta.id: meta}) == set()


def test_group_fact_belongs_to_the_channel():
    aud = Audience(chat="chat_1", org="o1", grant="for:channel:c1", channel="c1")
    ((meta, _),) = _decide(
        [_call("learn_fact", content="x", items=[{"chat": "chat_1", "item": "i-1"}])], audience=aud
    ).new
    assert (
        "for:channel:c1" in meta.tags
        and "channel:c1" in meta.tags
        and "for:person:a" not in meta.tags
    )


def test_bad_calls_are_rejected_and_the_valid_rest_applies():
    calls = [
        _call("learn_fact", content="bot said it", items=[{"chat": "chat_1", "item": "i-2"}]),
        _call("learn_fact", content="a notice", items=[{"chat": "chat_1", "item": "i-3"}]),
        _call("learn_fact", content="made up", items=[{"chat": "chat_1", "item": "i-99"}]),
        _call(
            "learn_fact",
            content="sneaky",
            items=[{"chat": "chat_1", "item": "i-1"}],
            topics=["for:bot"],
        ),
        _call(
            "learn_fact",
            content="bad topic",
            items=[{"chat": "chat_1", "item": "i-1"}],
            topics=["Bad Topic"],
        ),
        ("learn_fact", b"{not json"),
        _call("learn_fact", content="extra", items=[], tags=["x"]),
        _call("delete_everything"),
        _call("learn_fact", content="Lives in Oslo", items=[{"chat": "chat_1", "item": "i-1"}]),
    ]
    d = _decide(calls)
    assert [m.tags for m, _ in d.new] == [("from:a", "for:person:a", "org:o1", "chat:chat_1")]
    assert len(d.rejected) == 8
    assert all(r.reason for r in d.rejected)


def test_observation_over_two_peoples_facts_is_visible_to_neither_alone():
    ids = _ids()
    fa = _decide(
        [_call("learn_fact", content="a", items=[{"chat": "chat_1", "item": "i-1"}])], ids=ids
    ).new[0][0]
    fb = _decide(
        [_call("learn_fact", content="b", items=[{"chat": "chat_2", "item": "i-1"}])],
        audience=AUD_B,
        ids=ids,
    ).new[0][0]
    pool = {fa.id: fa, fb.id: fb}
    d = _decide(
        [_call("learn_observation", content="both", entries=[fa.id, fb.id], confidence=0.7)],
        entries=pool,
        ids=ids,
    )
    ((obs, _),) = d.new
    pool[obs.id] = obs
    assert {"from:a", "from:b", "chat:chat_1", "chat:chat_2"} <= set(obs.tags)
    for user in ("a", "b"):
        assert obs.id not in visible_ids(Reader(user=user, org="o1"), pool)
    bad = _decide(
        [_call("learn_observation", content="x", entries=["mem_missing"], confidence=0.5)],
        entries=pool,
    )
    assert bad.new == [] and "missing" in bad.rejected[0].reason
    worse = _decide(
        [_call("learn_observation", content="x", entries=[fa.id], confidence=1.5)], entries=pool
    )
    assert worse.new == [] and worse.rejected


def test_invalidate_and_rename_change_tags_or_status_only():
    fact = EntryMeta(
        id="f1",
        pool="bot:b_1",
        layer=Layer.FACT,
        tags=("for:person:a", "org:o1", "trips"),
        sources=(Source(chat="chat_1", item="i-1"),),
        proofs=(AccessProof(chat="chat_1", item="i-1", org="o1", audience=("for:person:a",)),),
        created_at=1,
        updated_at=1,
    )
    pinned = EntryMeta(
        id="p1",
        pool="bot:b_1",
        layer=Layer.PINNED,
        tags=("for:person:a", "org:o1", "trips"),
        created_at=1,
        updated_at=1,
    )
    d = _decide(
        [
            _call("rename_topic", **{"from": "trips", "to": "travel"}),
            _call("invalidate", entry="f1"),
            _call("invalidate", entry="p1"),
        ],
        entries={"f1": fact, "p1": pinned},
    )
    changed = {m.id: m for m in d.changed}
    assert changed["f1"].status == Status.INVALIDATED and changed["f1"].invalidated_at == 100
    assert "travel" in changed["f1"].tags and "trips" not in changed["f1"].tags
    assert (
        changed["p1"].tags == ("for:person:a", "org:o1", "travel")
        and changed["p1"].status == Status.ACTIVE
    )
    assert [r.tool for r in d.rejected] == ["invalidate"]  # pinned entries are a person's


def test_context_takes_300_valid_entries_and_counts_topics_over_all():
    entries = {
        f"p{n:03d}": EntryMeta(
            id=f"p{n:03d}",
            pool="bot:b",
            layer=Layer.PINNED,
            tags=("for:person:a", "org:o1", "t"),
            created_at=n,
            updated_at=n,
        )
        for n in range(350)
    }
    entries["bad"] = EntryMeta(
        id="bad",
        pool="bot:b",
        layer=Layer.FACT,
        tags=("for:person:a", "org:o1", "t"),
        sources=(Source(chat="c", item="i"),),
        created_at=999,
        updated_at=999,
    )
    entries["dep"] = EntryMeta(
        id="dep",
        pool="bot:b",
        layer=Layer.OBSERVATION,
        tags=("for:person:a", "org:o1", "t"),
        sources=(Source(entry="bad"),),
        created_at=999,
        updated_at=999,
    )
    chosen, topics = context_selection(entries)
    assert len(chosen) == 300 and chosen[0].id == "p349"
    assert topics == {"t": 350}  # the unprovable fact and its dependent are left out


def test_request_stays_under_the_limit_whole_and_keeps_person_words_first():
    items = [
        EvidenceItem(
            chat="c", item=f"i-{n}", kind="person" if n % 2 else "bot", author="a", text="w" * 500
        )
        for n in range(40)
    ]
    entries = [
        ContextEntry(
            id=f"e{n}",
            layer="fact",
            tier="log",
            scope="bot",
            content="z" * 300,
            topics=(),
            status="active",
        )
        for n in range(100)
    ]
    text, kept = build_request(items, entries, {"t": 1}, limit=12_000)
    assert len(text) <= 12_000
    parsed = json.loads(text)  # whole JSON, nothing cut mid-string
    assert all(len(i["text"]) == 500 for i in parsed["evidence"])
    assert sum(i.kind == "person" for i in kept) == 20  # every person item made it
    assert len(kept) < 40 and parsed["entries"] == []  # the rest had to give way
    assert [i.item for i in kept] == sorted((i.item for i in kept), key=lambda s: int(s[2:]))


def _sized_request(evidence, entries, topics, limit):
    """`build_request` by element sizes alone (its general path), to check its shortcut."""
    import msgspec

    from engine.learning import LearningRequest

    enc = msgspec.json.Encoder()
    sizes_e = [len(enc.encode(e)) + 1 for e in entries]
    sizes_i = [len(enc.encode(i)) + 1 for i in evidence]
    room = limit - len(enc.encode(LearningRequest(evidence=[], entries=[], topics=dict(topics))))
    keep = set()
    for k in sorted(range(len(evidence)), key=lambda k: (evidence[k].kind != "person", -k)):
        if sizes_i[k] <= room:
            keep.add(k)
            room -= sizes_i[k]
    n = 0
    for size in sizes_e:
        if size > room:
            break
        n += 1
        room -= size
    kept = [evidence[k] for k in sorted(keep)]
    req = LearningRequest(evidence=kept, entries=list(entries[:n]), topics=dict(topics))
    text = enc.encode(req).decode()
    if len(text) > limit:
        text = enc.encode(LearningRequest(evidence=kept, entries=list(entries[:n]), topics={}))
        text = text.decode()
    return text, kept


def test_a_request_that_fits_whole_is_what_sizing_each_element_would_keep():
    """Around the limit (and with non-ASCII text, whose bytes outnumber its characters) the
    request built at once is the one the element-wise sizing builds."""
    for n_items, n_entries, text in itertools.product((0, 1, 3), (0, 1, 4), ("w" * 40, "é" * 25)):
        items = [
            EvidenceItem(chat="c", item=f"i-{k}", kind="person", author="a", text=text)
            for k in range(n_items)
        ]
        entries = [
            ContextEntry(
                id=f"e{k}",
                layer="fact",
                tier="log",
                scope="bot",
                content=text,
                topics=("t",),
                status="active",
            )
            for k in range(n_entries)
        ]
        whole = len(_sized_request(items, entries, {"t": 1}, 100_000)[0].encode())
        for limit in range(max(2, whole - 4), whole + 6):
            got = build_request(items, entries, {"t": 1}, limit=limit)
            assert got == _sized_request(items, entries, {"t": 1}, limit), (limit, whole)
            # Entries a reader kept encoded make the same request, sized the same way.
            raw = [encoded_entry(e) for e in entries]
            assert build_request(items, raw, {"t": 1}, limit=limit) == got, (limit, whole)


def test_context_selection_of_entries_in_memory_order_needs_no_sort():
    """Entries given in memory order (`ordered`) select as the sorting path does."""
    from engine.order import in_memory_order

    entries = {
        f"p{n}": EntryMeta(
            id=f"p{n}",
            pool="bot:b",
            layer=Layer.PINNED,
            tags=("for:person:a", "org:o1", f"t{n % 3}"),
            created_at=n,
            updated_at=n,
        )
        for n in range(320)
    }
    entries["bad"] = EntryMeta(
        id="bad",
        pool="bot:b",
        layer=Layer.FACT,
        tags=("for:person:a", "org:o1", "t"),
        sources=(Source(chat="c", item="i"),),
        created_at=999,
        updated_at=999,
    )
    ordered = {m.id: m for m in in_memory_order(entries.values())}
    assert context_selection(ordered, ordered=True) == context_selection(entries)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.lists(
            st.sampled_from(["a", "b", "b", "seed", "org:o1", "for:person:u", "c"]), max_size=5
        ),
        max_size=12,
    )
)
def test_topics_counted_from_each_entrys_topics_are_the_topic_counts(tag_lists):
    """LRN-7's topic counts, from the topics a reader's kept view holds per entry, equal those
    counted over the entries' tag sets (a topic named twice in one entry counts twice)."""
    valid = [
        EntryMeta(
            id=f"m{n}",
            pool="bot:b1",
            layer=Layer.PINNED,
            tags=tuple(tags),
            created_at=n,
            updated_at=n,
        )
        for n, tags in enumerate(tag_lists)
    ]
    counted = counted_topics(topics_of(m.tags) for m in valid)
    assert counted == topic_counts(valid)
    assert list(counted) == sorted(counted)
