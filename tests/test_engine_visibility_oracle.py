"""Visibility (docs/requirements.md §2) checked against an independent oracle written from the
requirements text.

The oracle below is deliberately naive: a plain recursive definition that carries the path of
entries it is checking, so that a cycle shows up as an entry met again on its own path. It shares
no code with `engine.visibility`.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.memory_entries import AccessProof, EntryMeta, Layer, Reader, Source, Status
from engine.visibility import Visibility, visible_ids

ORGS = ("o1", "o2")
USERS = ("u1", "u2", "u3")
CHANNELS = ("c1", "c2")
CHATS = ("k1", "k2")
ITEMS = ("i1", "i2")
GRANTS = (
    *(f"for:person:{u}" for u in USERS),
    *(f"for:channel:{c}" for c in CHANNELS),
    "for:bot",
    "for:project:p1",
)
OTHER_TAGS = ("from:u1", "from:u2", "chat:k1", "channel:c1", "app:search", "topic-a", "b2")


# --------------------------------------------------------------------------- the oracle


def admits(reader: Reader, grants) -> bool:
    """Some grant tag lets the reader in (rule 2)."""
    allowed = {f"for:person:{reader.user}"} | {f"for:channel:{c}" for c in reader.channels}
    if reader.uses_bot:
        allowed.add("for:bot")
    return any(g in allowed for g in grants)


def is_item_source(s: Source) -> bool:
    return s.chat is not None and s.item is not None and s.entry is None


def is_entry_source(s: Source) -> bool:
    return s.entry is not None and s.chat is None and s.item is None


def oracle_visible(reader: Reader, pool: dict, entry_id: str, path: frozenset = frozenset()):
    if entry_id in path:
        return False  # a cycle
    entry = pool.get(entry_id)
    if entry is None:
        return False
    orgs = [t.split(":", 1)[1] for t in entry.tags if t.split(":", 1)[0] == "org"]
    if set(orgs) != {reader.org}:
        return False
    if reader.user in entry.forgotten_by:
        return False
    if not admits(reader, [t for t in entry.tags if t.startswith("for:")]):
        return False
    if entry.layer == Layer.PINNED:
        return True
    if not entry.sources:
        return False
    if entry.layer == Layer.FACT:
        for s in entry.sources:
            if not is_item_source(s):
                return False
            proofs = [p for p in entry.proofs if (p.chat, p.item) == (s.chat, s.item)]
            if not any(p.org == reader.org and admits(reader, p.audience) for p in proofs):
                return False
        return True
    # observation
    inner = path | {entry_id}
    for s in entry.sources:
        if not is_entry_source(s):
            return False
        source = pool.get(s.entry)
        if source is None or source.status != Status.ACTIVE:
            return False
        if not oracle_visible(reader, pool, s.entry, inner):
            return False
    return True


# --------------------------------------------------------------------------- strategies


GOOD_AUDIENCES = [("for:bot",), ("for:channel:c1",), ("for:person:u1", "for:person:u2")]
item_sources = st.builds(Source, chat=st.sampled_from(CHATS), item=st.sampled_from(ITEMS))
malformed_sources = st.sampled_from(
    [Source(), Source(chat="k1"), Source(item="i1"), Source(chat="k1", item="i1", entry="e0")]
)


@st.composite
def cases(draw) -> tuple[dict[str, EntryMeta], Reader]:
    """A pool and a reader. Each example draws a noise level per aspect (reader, tags, links,
    proofs, status, forgotten_by): at 0 that aspect is always the one that lets the reader in,
    higher levels break it ever more often, so that deep visible chains occur, and pools where
    a single kind of defect decides what is hidden, and wholly random pools."""
    aspects = ("reader", "tags", "links", "proofs", "status", "forgot")
    noise = {a: draw(st.sampled_from([0, 0, 10, 30, 100])) for a in aspects}

    def mostly(aspect, common, rare):
        return st.integers(0, 99).flatmap(lambda r: rare if r < noise[aspect] else common)

    def often(aspect, common, rare):
        return draw(mostly(aspect, common, rare))

    reader = Reader(
        user=often("reader", st.just("u1"), st.sampled_from(USERS)),
        org=often("reader", st.just("o1"), st.sampled_from(ORGS)),
        channels=often(
            "reader", st.just(frozenset({"c1"})), st.frozensets(st.sampled_from(CHANNELS))
        ),
        uses_bot=often("reader", st.just(True), st.booleans()),
    )
    audiences = st.lists(st.sampled_from(GRANTS), max_size=3).map(tuple)
    random_tags = st.builds(
        lambda orgs, grants, other: (*orgs, *grants, *other),
        st.lists(st.sampled_from([f"org:{o}" for o in ORGS]), max_size=2),
        audiences,
        st.lists(st.sampled_from(OTHER_TAGS), max_size=2),
    )
    good_tags = st.builds(
        lambda grants, other: ("org:o1", *grants, *other),
        st.sampled_from(GOOD_AUDIENCES),
        st.lists(st.sampled_from(OTHER_TAGS), max_size=2),
    )
    n = draw(st.integers(0, 25))
    ids = [f"e{i}" for i in range(n)]
    anything = st.sampled_from([*ids, "missing1", "missing2"])
    pool: dict[str, EntryMeta] = {}
    for i, entry_id in enumerate(ids):
        layer = draw(st.sampled_from([Layer.PINNED, Layer.FACT, Layer.OBSERVATION]))
        # Mostly earlier entries, so that long acyclic chains appear; sometimes itself, a later
        # entry or a missing one, which makes self-loops, cycles and dangling links.
        earlier = st.sampled_from(ids[:i]) if i else anything
        later = st.sampled_from([*ids[i:], "missing1", "missing2"])
        ref = st.builds(lambda e: Source(entry=e), earlier)
        any_ref = st.builds(lambda e: Source(entry=e), st.one_of(later, anything))
        mixed = st.lists(st.one_of(any_ref, item_sources, malformed_sources), max_size=3)
        if layer == Layer.FACT:
            sources = often("links", st.lists(item_sources, min_size=1, max_size=3), mixed)
        elif layer == Layer.OBSERVATION:
            sources = often(
                "links", st.lists(mostly("links", ref, any_ref), min_size=1, max_size=3), mixed
            )
        else:
            sources = often("links", st.just(()), mixed)
        # At most one proof per item: docs/requirements.md does not say what two conflicting
        # proofs mean.
        proofs = []
        for chat, item in sorted({(s.chat, s.item) for s in sources if s.chat and s.item}):
            org = often("proofs", st.just("o1"), st.sampled_from([None, *ORGS]))  # None: no proof
            if org is not None:
                audience = often("proofs", st.sampled_from(GOOD_AUDIENCES), audiences)
                proofs.append(AccessProof(chat=chat, item=item, org=org, audience=audience))
        pool[entry_id] = EntryMeta(
            id=entry_id,
            pool="p",
            layer=layer,
            tags=draw(st.permutations(often("tags", good_tags, random_tags))),
            created_at=i,
            updated_at=i,
            sources=tuple(sources),
            proofs=tuple(draw(st.permutations(proofs))),
            status=often("status", st.just(Status.ACTIVE), st.sampled_from(Status)),
            forgotten_by=often(
                "forgot", st.just(frozenset()), st.frozensets(st.sampled_from(USERS))
            ),
        )
    return pool, reader


@settings(max_examples=200, deadline=None)
@given(case=cases())
def test_visible_ids_matches_oracle(case):
    pool, reader = case
    expected = {i for i in pool if oracle_visible(reader, pool, i)}
    assert visible_ids(reader, pool) == expected


@settings(max_examples=200, deadline=None)
@given(case=cases(), data=st.data())
def test_memo_does_not_depend_on_query_order(case, data):
    """One `Visibility` asked in any order (and about unknown ids) agrees with the oracle."""
    pool, reader = case
    order = data.draw(st.permutations([*pool, "missing1"]))
    vis = Visibility(reader, pool)
    for entry_id in order:
        expected = oracle_visible(reader, pool, entry_id)
        assert vis.visible(entry_id) == expected, entry_id
        active = entry_id in pool and pool[entry_id].status == Status.ACTIVE
        assert vis.usable(entry_id) == (expected and active), entry_id
    subset = order[: len(order) // 2]
    assert visible_ids(reader, pool, subset) == {
        i for i in subset if oracle_visible(reader, pool, i)
    }


# --------------------------------------------------------------------------- hand-written cases

U1 = Reader(user="u1", org="o1")
U2 = Reader(user="u2", org="o1")


def pinned(entry_id: str, *tags: str, status: Status = Status.ACTIVE) -> EntryMeta:
    return EntryMeta(
        id=entry_id,
        pool="p",
        layer=Layer.PINNED,
        tags=("org:o1", *tags),
        created_at=1,
        updated_at=1,
        status=status,
    )


def fact(entry_id: str, item: str, *grants: str) -> EntryMeta:
    return EntryMeta(
        id=entry_id,
        pool="p",
        layer=Layer.FACT,
        tags=("org:o1", *grants),
        created_at=1,
        updated_at=1,
        sources=(Source(chat="k1", item=item),),
        proofs=(AccessProof(chat="k1", item=item, org="o1", audience=grants),),
    )


def observation(entry_id: str, sources: tuple[str, ...], *grants: str, **kw) -> EntryMeta:
    return EntryMeta(
        id=entry_id,
        pool="p",
        layer=Layer.OBSERVATION,
        tags=("org:o1", *(grants or ("for:person:u1",))),
        created_at=1,
        updated_at=1,
        sources=tuple(Source(entry=s) for s in sources),
        **kw,
    )


def as_pool(*entries: EntryMeta) -> dict[str, EntryMeta]:
    return {e.id: e for e in entries}


def test_cycle_of_two_observations_is_hidden():
    pool = as_pool(
        pinned("p", "for:person:u1"),
        observation("a", ("p", "b")),
        observation("b", ("a",)),
        observation("self", ("self",)),
        observation("above", ("a",)),
        observation("fine", ("p",)),
    )
    assert visible_ids(U1, pool) == {"p", "fine"}
    assert Visibility(U1, pool).visible("b") is False


def test_invalidated_source_hides_its_dependents_but_stays_visible():
    for status in (Status.INVALIDATED, Status.RETRACTED):
        pool = as_pool(
            pinned("a", "for:person:u1", status=status),
            observation("b", ("a",)),
            observation("c", ("b",)),
        )
        assert visible_ids(U1, pool) == {"a"}
    pool = as_pool(pinned("a", "for:person:u1"), observation("b", ("a",)), observation("c", ("b",)))
    assert visible_ids(U1, pool) == {"a", "b", "c"}


def test_observation_over_two_peoples_facts_is_visible_to_neither():
    pool = as_pool(
        fact("f1", "i1", "for:person:u1"),
        fact("f2", "i2", "for:person:u2"),
        observation("o", ("f1", "f2"), "for:person:u1", "for:person:u2"),
    )
    assert visible_ids(U1, pool) == {"f1"}
    assert visible_ids(U2, pool) == {"f2"}
    both = Reader(user="u3", org="o1", channels=frozenset({"c1"}))
    shared = as_pool(
        fact("f1", "i1", "for:channel:c1"),
        fact("f2", "i2", "for:channel:c1"),
        observation("o", ("f1", "f2"), "for:channel:c1"),
    )
    assert visible_ids(both, shared) == {"f1", "f2", "o"}
    assert visible_ids(Reader(user="u3", org="o2", channels=frozenset({"c1"})), shared) == set()


def test_fact_needs_a_proof_for_every_item():
    good = fact("f", "i1", "for:person:u1")
    two_items = EntryMeta(
        id="g",
        pool="p",
        layer=Layer.FACT,
        tags=good.tags,
        created_at=1,
        updated_at=1,
        sources=(Source(chat="k1", item="i1"), Source(chat="k1", item="i2")),
        proofs=good.proofs,
    )
    assert visible_ids(U1, as_pool(good, two_items)) == {"f"}


def test_deep_chain_of_observations_does_not_recurse():
    depth = 3000
    chain = [pinned("o0", "for:person:u1")]
    chain += [observation(f"o{i}", (f"o{i - 1}",)) for i in range(1, depth + 1)]
    pool = as_pool(*reversed(chain))  # the top of the chain is asked first
    assert Visibility(U1, pool).visible(f"o{depth}") is True
    assert visible_ids(U1, pool) == set(pool)
    assert visible_ids(U2, pool) == set()
    # Closing the chain into one long cycle hides every observation on it.
    chain[0] = observation("o0", (f"o{depth}",))
    assert visible_ids(U1, as_pool(*reversed(chain))) == set()
