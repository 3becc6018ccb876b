"""What a shard keeps between reads of a bot's memory (actors/shard/pool.py `kept`, `known`,
`open`): every change is seen by the next read of a reader whose view was kept, and content
opened for a read does not outlive its entry. In-process shard on real DuckDB files, no Ray."""

from __future__ import annotations

import pytest

from actors.shard.service import ShardService
from engine.memory_entries import Reader
from tests.test_shard_service import fact, observation

ALICE = Reader(user="u1", org="o1", uses_bot=True)
BOB = Reader(user="u2", org="o1", uses_bot=True)
POOL = "bot:b1"

pytestmark = pytest.mark.usefixtures("no_env_key")


async def _ids(svc: ShardService, reader: Reader) -> tuple[list[str], list[str]]:
    """What the reader may use (context) and see (the page), each read twice."""
    for _ in range(2):
        used = list((await svc.context(POOL, reader, 100_000)).entries)
        seen = [e.id for e in (await svc.read_memory(POOL, reader)).entries]
    return used, seen


@pytest.mark.anyio
async def test_the_next_read_sees_each_change_to_a_kept_view(shards):
    svc = shards()
    e1 = (await svc.remember(POOL, ALICE, "I drink tea")).id
    e2 = (await svc.remember(POOL, ALICE, "I live in Oslo")).id
    await svc.add_entries(POOL, [(fact("f1"), "likes tea"), (observation("o1", "f1"), "x")])
    first = await _ids(svc, ALICE)
    await svc.forget(POOL, ALICE, e2)  # the same entry, now forgotten by its reader
    forgotten = await _ids(svc, ALICE)
    e3 = (await svc.remember(POOL, ALICE, "I moved to Bergen")).id
    added = await _ids(svc, ALICE)
    await svc.purge(POOL, "chat:k1")  # the fact, and the observation resting on it
    purged = await _ids(svc, ALICE)
    bob = [await _ids(svc, BOB)]
    await svc.widen(POOL, e1, "for:bot", "u1")  # the same entry, for all who use the bot
    bob.append(await _ids(svc, BOB))
    await svc.forget(POOL, BOB, e1)  # kept for the others: only Bob no longer sees it
    bob.append(await _ids(svc, BOB))
    alice = await _ids(svc, ALICE)
    assert e1 in alice[0] and e1 in alice[1]
    assert sorted(first[0]) == sorted([e1, e2, "f1", "o1"]) == sorted(first[1])
    # Forgotten: retracted, so no longer used, and still seen as history.
    assert sorted(forgotten[0]) == sorted([e1, "f1", "o1"])
    assert sorted(forgotten[1]) == sorted([e1, e2, "f1", "o1"])
    assert sorted(added[0]) == sorted([e1, e3, "f1", "o1"])
    assert sorted(added[1]) == sorted([e1, e2, e3, "f1", "o1"])
    assert sorted(purged[0]) == sorted([e1, e3]) and sorted(purged[1]) == sorted([e1, e2, e3])
    assert bob == [([], []), ([e1], [e1]), ([], [])]


@pytest.mark.anyio
async def test_opened_content_goes_with_its_entry(shards):
    svc = shards()
    await svc.add_entries(POOL, [(fact("f1"), "likes tea"), (fact("f2", chat="k2"), "y")])
    context = await svc.context(POOL, ALICE, 100_000)
    pool = await svc.kernel.pool(POOL)
    await svc.memory_reader.learning_context(POOL, ALICE)  # its learning forms too
    before = pool.opened
    await svc.purge(POOL, "chat:k1")
    text, after = context.text, pool.opened
    assert "likes tea" in text
    assert before == {"f1", "f2"} and after == {"f2"}


@pytest.mark.anyio
async def test_a_ranked_hit_shows_its_entry_as_it_is_now(shards):
    """The record form of a learned entry a search returns is kept between searches while the
    entry is the same; a change to it (forgotten, purged) shows in the next search."""
    from actors.contracts import WorkspaceAccess, WorkspaceQuery

    access = WorkspaceAccess(account="u1", bots=frozenset({"b1"}), orgs=("o1",))

    async def hits(svc: ShardService, status: str = "all") -> dict[str, str]:
        query = WorkspaceQuery(pools=(POOL,), projects=(), q="tea", limit=10, status=status)
        listing = await svc.workspace_entries(access, query, ALICE)
        return {e.id: str(e.status) for e in listing.entries}

    svc = shards()
    e1 = (await svc.remember(POOL, ALICE, "I drink tea")).id
    e2 = (await svc.remember(POOL, ALICE, "green tea in the morning")).id
    first = [await hits(svc), await hits(svc)]
    await svc.forget(POOL, ALICE, e1)
    forgotten = await hits(svc)
    await svc.purge(POOL, "from:u1")
    purged = await hits(svc)
    assert first[0] == first[1] == {e1: "active", e2: "active"}
    assert forgotten == {e1: "forgotten", e2: "active"}
    assert purged == {}


@pytest.mark.anyio
async def test_a_context_over_kept_contents_follows_each_change(shards):
    """The contents a bot's contexts walk are kept with the reader's view: each change (a new
    entry, a purge, a forget) shows in the next context, whether it all fits, is cut, or is
    led by ranked hits."""
    svc = shards()
    read = svc.memory_reader.context_for
    await svc.add_entries(POOL, [(fact("f1", now=10), "a" * 10), (fact("f2", now=20), "b" * 10)])

    async def contexts() -> tuple:
        whole = await read(POOL, ALICE, 1_000, partial=False)
        cut = await read(POOL, ALICE, 15)
        led = await read(POOL, ALICE, 15, ["f1"])
        return whole, cut, led

    before = await contexts()
    assert await contexts() == before  # asked again: the same, from what was kept
    await svc.add_entries(POOL, [(fact("f3", chat="k2", now=30), "c" * 3)])
    added = await contexts()
    await svc.purge(POOL, "chat:k2")
    purged = await contexts()
    exact = await read(POOL, ALICE, 21, partial=False)  # "bbbbbbbbbb\naaaaaaaaaa": it fits
    e4 = (await svc.remember(POOL, ALICE, "d" * 4)).id
    remembered = await contexts()
    await svc.forget(POOL, ALICE, e4)
    forgotten = await contexts()
    a, b, c, d = ("f1", "a" * 10), ("f2", "b" * 10), ("f3", "c" * 3), (e4, "d" * 4)
    assert before == (([b, a], True, True), ([b], True, False), ([a], True, False))
    assert added == (([c, b, a], True, True), ([c, b], True, False), ([c, a], True, False))
    assert purged == before and forgotten == before
    assert exact == ([b, a], True, True)
    assert remembered == (([d, b, a], True, True), ([d, b], True, False), ([d, a], True, False))
    assert await read(POOL, ALICE, 15, partial=False) == ([], True, False)  # not all fits


@pytest.mark.anyio
async def test_a_kept_view_follows_a_change_to_what_an_observation_rests_on(shards):
    """A change to one entry moves a kept view in place only when nothing rests on it: an
    observation citing a forgotten fact leaves the reader's view with it."""
    svc = shards()
    await svc.add_entries(POOL, [(fact("f1"), "likes tea"), (observation("o1", "f1"), "x")])
    await svc.add_entries(POOL, [(fact("f2", chat="k2", now=15), "y")])
    assert sorted((await _ids(svc, ALICE))[0]) == ["f1", "f2", "o1"]
    await svc.forget(POOL, ALICE, "f1")
    assert (await _ids(svc, ALICE))[0] == ["f2"]


@pytest.mark.anyio
async def test_a_view_kept_across_more_changes_than_remembered_is_made_afresh(shards):
    from actors.shard.pool import EDITS

    svc = shards()
    await svc.add_entries(POOL, [(fact("f0", now=1), "zero")])
    assert (await _ids(svc, ALICE))[0] == ["f0"]
    for n in range(1, EDITS + 2):  # one at a time, with no read between them
        await svc.add_entries(POOL, [(fact(f"f{n}", chat=f"k{n}", now=n + 1), f"n{n}")])
    used = (await _ids(svc, ALICE))[0]
    assert used == [f"f{n}" for n in range(EDITS + 1, -1, -1)]


@pytest.mark.anyio
async def test_the_learning_context_kept_with_a_view_is_the_selection_made_afresh(shards):
    """LRN-7's context kept with the reader's view (each entry's provenance and learning form)
    is, after every change, what selecting from the whole read again gives."""
    from engine.learning import context_entry, context_selection, encoded_entry

    svc = shards()
    reader = svc.memory_reader

    async def both() -> tuple:
        kept = await reader.learning_context(POOL, ALICE)
        as_json = await reader.learning_context(POOL, ALICE, encoded=True)
        pool, ws = await reader.pools(POOL)
        snap = reader.snapshot(pool, ws, ALICE)
        chosen, topics = context_selection({m.id: m for m in snap.usable()}, ordered=True)
        afresh = [context_entry(m, snap.open(m.id)) for m in chosen]
        assert as_json == ([encoded_entry(e) for e in afresh], topics)  # kept apart: the same
        return kept, (afresh, topics)

    await svc.add_entries(POOL, [(fact("f1"), "likes tea"), (fact("f2", chat="k2"), "y")])
    steps = [await both()]
    e1 = (await svc.remember(POOL, ALICE, "I drink tea")).id
    steps.append(await both())
    await svc.add_entries(POOL, [(observation("o1", "f1"), "so: tea")])  # rests on f1
    steps.append(await both())
    await svc.forget(POOL, ALICE, e1)
    steps.append(await both())
    await svc.purge(POOL, "chat:k1")
    steps.append(await both())
    for kept, afresh in steps:
        assert kept == afresh
    assert [e.id for e in steps[2][0][0]] == [e1, "f1", "f2", "o1"]
    assert [e.id for e in steps[4][0][0]] == ["f2"]
