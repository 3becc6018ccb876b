"""Widening requests (ACL-4) checked against the visibility oracle.

The oracle of tests/test_engine_visibility_oracle.py (written from docs/requirements.md, sharing no
code with the engine) decides who sees what before and after an accepted request. The property: an
accepted request never lets a reader see an entry unless that reader may see every source of it
under the source's own rule (for a pinned entry: its own rule, or its author sharing it), never
hides anything, and changes no other entry except through that one.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import Conflict, InvalidInput
from engine.memory_entries import AccessProof, EntryMeta, Layer, Reader, Source, Status
from engine.widening import widen
from tests.test_engine_visibility_oracle import (
    CHANNELS,
    ORGS,
    USERS,
    admits,
    cases,
    fact,
    observation,
    oracle_visible,
    pinned,
)

WIDEN_GRANTS = (*(f"for:person:{u}" for u in USERS), *(f"for:channel:{c}" for c in CHANNELS))
WIDEN_GRANTS = (*WIDEN_GRANTS, "for:bot")
READERS = [
    Reader(user=u, org=o, channels=frozenset(cs), uses_bot=b)
    for u in (*USERS, "u9")
    for o in ORGS
    for n in range(len(CHANNELS) + 1)
    for cs in itertools.combinations(CHANNELS, n)
    for b in (True, False)
]


def sources_admit(reader: Reader, pool: dict, entry: EntryMeta) -> bool:
    """Written from ACL-3/ACL-5: the reader may see every source under its own rule."""
    if entry.layer == Layer.FACT:
        return bool(entry.sources) and all(
            any(
                p.org == reader.org and admits(reader, p.audience)
                for p in entry.proofs
                if (p.chat, p.item) == (s.chat, s.item)
            )
            for s in entry.sources
        )
    if entry.layer == Layer.OBSERVATION:
        return bool(entry.sources) and all(
            s.entry in pool
            and pool[s.entry].status == Status.ACTIVE
            and oracle_visible(reader, pool, s.entry)
            for s in entry.sources
        )
    return oracle_visible(reader, pool, entry.id)  # pinned: its own rule, as it was


def depends_on(pool: dict, entry_id: str, target: str, path: frozenset = frozenset()) -> bool:
    entry = pool.get(entry_id)
    if entry is None or entry_id in path:
        return False
    return any(
        s.entry == target
        or (s.entry is not None and depends_on(pool, s.entry, target, path | {entry_id}))
        for s in entry.sources
    )


@settings(max_examples=120, deadline=None)
@given(case=cases(), data=st.data())
def test_acl4_an_accepted_widening_never_reaches_past_the_sources(case, data):
    pool, _ = case
    entry_id = data.draw(st.sampled_from([*pool, "missing1"]))
    grant = data.draw(st.sampled_from(WIDEN_GRANTS))
    requester = data.draw(st.sampled_from([None, *USERS]))
    try:
        changed = widen(pool, entry_id, grant, requester=requester, now=99)
    except Conflict:
        return  # refused: nothing changes
    entry = pool[entry_id]
    after = dict(pool)
    if changed is not None:
        assert changed.tags == (*entry.tags, grant)
        assert (changed.sources, changed.proofs, changed.layer) == (
            entry.sources,
            entry.proofs,
            entry.layer,
        )
        after[entry_id] = changed
    shared = (
        entry.layer == Layer.PINNED
        and not entry.sources
        and {t[5:] for t in entry.tags if t.startswith("from:")} == {requester}
    )
    for reader in READERS:
        for eid in pool:
            before_vis = oracle_visible(reader, pool, eid)
            after_vis = oracle_visible(reader, after, eid)
            assert not (before_vis and not after_vis), (reader, eid)  # never hides
            if after_vis and not before_vis:
                assert eid == entry_id or depends_on(pool, eid, entry_id), (reader, eid)
        if oracle_visible(reader, after, entry_id) and not shared:
            assert sources_admit(reader, pool, entry), reader


# --------------------------------------------------------------------------- hand-written cases


def as_pool(*entries: EntryMeta) -> dict[str, EntryMeta]:
    return {e.id: e for e in entries}


def test_acl4_a_fact_is_widened_only_to_what_every_proof_admits():
    pool = as_pool(fact("f", "i1", "for:channel:c1"))
    with pytest.raises(Conflict) as e:
        widen(pool, "f", "for:bot", requester="u1", now=2)
    assert e.value.code == "widen_refused"
    with pytest.raises(Conflict):  # a member of c1 outside the channel is not admitted by it
        widen(pool, "f", "for:person:u1", requester="u1", now=2)
    assert widen(pool, "f", "for:channel:c1", requester=None, now=2) is None  # already so
    two = EntryMeta(
        id="g",
        pool="p",
        layer=Layer.FACT,
        tags=("org:o1", "for:channel:c1"),
        created_at=1,
        updated_at=1,
        sources=(Source(chat="k1", item="i1"), Source(chat="k2", item="i2")),
        proofs=(AccessProof(chat="k1", item="i1", org="o1", audience=("for:channel:c1",)),),
    )
    with pytest.raises(Conflict):  # a source without an access proof is never widened (ACL-11)
        widen(as_pool(two), "g", "for:channel:c1", requester="u1", now=2)


def test_acl4_an_observation_needs_every_source_recursively_and_active():
    base = as_pool(
        fact("f1", "i1", "for:person:u1"),
        fact("f2", "i2", "for:person:u2"),
        observation("o", ("f1", "f2"), "for:person:u2"),  # u1 forgot it
        observation("loop", ("loop",)),
    )
    with pytest.raises(Conflict):
        widen(base, "o", "for:person:u1", requester="u1", now=2)
    with pytest.raises(Conflict):
        widen(base, "loop", "for:person:u1", requester="u1", now=2)
    shared = as_pool(
        fact("f1", "i1", "for:channel:c1"),
        fact("f2", "i2", "for:channel:c1"),
        observation("o", ("f1",), "for:person:u1"),
        observation("top", ("o", "f2"), "for:person:u1"),
    )
    # o's source f1 admits only the channel: o is not widened to it through its own tags.
    changed = widen(shared, "o", "for:channel:c1", requester=None, now=2)
    assert changed is not None and "for:channel:c1" in changed.tags
    gone = dict(shared, f1=EntryMeta(**{**_fields(shared["f1"]), "status": Status.INVALIDATED}))
    with pytest.raises(Conflict):  # ACL-10: an invalidated source supports nothing
        widen(gone, "o", "for:channel:c1", requester=None, now=2)


def test_acl4_a_pinned_entry_is_shared_only_by_its_person_never_by_a_model_or_owner():
    pool = as_pool(pinned("p", "from:u1", "for:person:u1"), pinned("w", "from:u2", "for:bot"))
    changed = widen(pool, "p", "for:bot", requester="u1", now=2)
    assert changed is not None and changed.tags[-1] == "for:bot" and changed.revision == 2
    for requester in (None, "u2"):  # the memory bot, the bot's owner: no
        with pytest.raises(Conflict):
            widen(pool, "p", "for:bot", requester=requester, now=2)
    with pytest.raises(Conflict):
        widen(pool, "w", "for:channel:c1", requester=None, now=2)
    with pytest.raises(InvalidInput):
        widen(pool, "p", "org:o2", requester="u1", now=2)
    with pytest.raises(InvalidInput):
        widen(pool, "p", "for:project:p1", requester="u1", now=2)


def _fields(entry: EntryMeta) -> dict:
    import msgspec

    return msgspec.structs.asdict(entry)
