"""Which records a new workspace record is read with (engine/write_context.py): the
last one of its write stream — same contributor, visibility and topics in one pool — so that
conversations written at once keep their own context and a record is never found by the words
of one its reader may not see; and keyword hits of several pools ranked as one pool's."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from actors.contracts import WorkspaceAccess, WorkspaceQuery
from actors.directory import DirectoryService
from actors.shard.service import ShardService
from engine import memory_union as bm
from engine import write_context as wc
from engine.memory_entries import Reader, Scope, Tier
from engine.projects import ProjectCreate
from engine.scoped_memory import WorkspaceEntry, WorkspaceMemoryCreate

ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}), orgs=("o_1",))
BEN = WorkspaceAccess(account="u_ben", bots=frozenset({"b_1"}), orgs=("o_1",))

pytestmark = pytest.mark.usefixtures("no_env_key")


async def _open(data: Path, context_s: float = 120) -> ShardService:
    svc = ShardService(data, 0, search={"context_window_s": context_s})
    svc.peers.connect(directory=DirectoryService(data))
    d = svc.peers.directory()
    await d.create_org("Acme", "o_1")
    await d.create_user("Ann", ["o_1"], "u_ann")
    await d.create_user("Ben", ["o_1"], "u_ben")
    await d.create_bot(name="Bo", org="o_1", owner="u_ann", id="b_1")
    return svc


async def _close(svc: ShardService) -> None:
    await svc.close()
    svc.peers.directory().store.db.close()


async def _create(
    svc, who: WorkspaceAccess, content: str, scope=Scope.USER, topics=(), project=None
) -> str:
    body = WorkspaceMemoryCreate(
        requestId="r-" + secrets.token_hex(4),
        scope=scope,
        bot="b_1",
        content=content,
        topics=list(topics),
        project=project,
    )
    return (await svc.workspace_create_memory(who, body)).id


async def _found(svc, q: str, pools: tuple[str, ...], who: WorkspaceAccess = ANN) -> list[str]:
    query = WorkspaceQuery(pools=pools, q=q, using="keyword")
    return [h.id for h in (await svc.workspace_entries(who, query)).fused]


def test_conversations_written_at_once_keep_their_context_when_named_in_topics(tmp_path: Path):
    """Two conversations written turn by turn in alternation: named in `topics`, each reply is
    found by its own conversation's question and never by the other's; without topics the
    pool's last record is the neighbour (the other conversation's turn)."""

    async def main() -> None:
        svc = await _open(tmp_path)
        user = ("user:u_ann",)
        a1 = await _create(svc, ANN, "Did you go to the pottery workshop?", topics=["conv-a"])
        b1 = await _create(svc, ANN, "How is the new puppy doing?", topics=["conv-b"])
        a2 = await _create(svc, ANN, "Yes! I made a bowl and a mug.", topics=["conv-a"])
        b2 = await _create(svc, ANN, "He chewed my slippers.", topics=["conv-b"])
        assert await _found(svc, "pottery workshop", user) == [a1, a2]
        assert await _found(svc, "puppy", user) == [b1, b2]
        assert await _found(svc, "bowl", user) == [a2, a1]
        # No topics: one stream, each record read with the ones written just before it.
        c1 = await _create(svc, ANN, "Was the zither concert good?")
        c2 = await _create(svc, ANN, "Any news about the quokka?")
        c3 = await _create(svc, ANN, "It was loud and long.")
        assert await _found(svc, "zither", user) == [c1, c2, c3]
        found = await _found(svc, "quokka", user)
        assert found[0] == c2 and set(found) == {c1, c2, c3}
        await _close(svc)

    asyncio.run(main())


def test_two_people_writing_to_one_bot_pool_are_two_streams(tmp_path: Path):
    """Ann's and Ben's records in the bot's pool, written alternately: each person's reply is
    found by that person's own earlier words, never by the other's."""

    async def main() -> None:
        svc = await _open(tmp_path)
        bot = ("bot:b_1",)
        a1 = await _create(svc, ANN, "Did the pottery workshop go well?", Scope.BOT)
        b1 = await _create(svc, BEN, "The sailing regatta was cancelled.", Scope.BOT)
        a2 = await _create(svc, ANN, "Yes, two bowls came out fine.", Scope.BOT)
        b2 = await _create(svc, BEN, "Rain all week, sadly.", Scope.BOT)
        assert await _found(svc, "pottery", bot) == [a1, a2]
        assert await _found(svc, "regatta", bot, BEN) == [b1, b2]
        assert await _found(svc, "bowls", bot) == [a2, a1]
        await _close(svc)

    asyncio.run(main())


def test_a_record_is_found_by_the_words_two_records_before_it_in_its_stream(tmp_path: Path):
    """The answer two turns after a question ("Which bowl?" between) is found by the
    question's words, below the question and the turn between (the question is not found by
    the answer's words: only the record before is read with the one after); the other
    person's records,
    written in between, are never its context (a stream's chain is its own)."""

    async def main() -> None:
        svc = await _open(tmp_path)
        bot = ("bot:b_1",)
        a1 = await _create(svc, ANN, "Did the pottery workshop go well?", Scope.BOT)
        b1 = await _create(svc, BEN, "The sailing regatta was cancelled.", Scope.BOT)
        a2 = await _create(svc, ANN, "Which one do you mean?", Scope.BOT)
        b2 = await _create(svc, BEN, "Rain all week, sadly.", Scope.BOT)
        a3 = await _create(svc, ANN, "Two lopsided bowls came out of the kiln.", Scope.BOT)
        b3 = await _create(svc, BEN, "Maybe next month then.", Scope.BOT)
        assert await _found(svc, "pottery workshop", bot) == [a1, a2, a3]
        assert await _found(svc, "regatta", bot, BEN) == [b1, b2, b3]
        assert await _found(svc, "kiln bowls", bot) == [a3, a2]  # the second after: not
        await _close(svc)

    asyncio.run(main())


def test_a_record_others_may_read_is_never_indexed_with_a_narrower_ones_words(tmp_path: Path):
    """Records of one pool with different readers (a bot record for one person and one for
    every user of the bot) are different streams: neither is indexed with the other's words,
    whatever order they are written in; records with the same readers are."""

    async def main() -> None:
        svc = await _open(tmp_path)
        svc.workspace_pools.upkeep_delay = 3600  # no check of the pool against hand-made records
        await _create(svc, ANN, "Opening the pool.", Scope.BOT)
        pool = await svc.workspace_pools.pool("bot:b_1")
        private = ("from:u_ann", "for:person:u_ann", "org:o_1")
        public = ("from:u_ben", "for:bot", "org:o_1")  # (Ann's own: the first record's stream)
        analyzer = svc.workspace_pools.kernel.analyzer("bot:b_1")

        def write(entry_id: str, tags: tuple[str, ...], content: str) -> None:
            at = svc.workspace_pools.kernel.clock()
            entry = WorkspaceEntry(
                id=entry_id,
                scope=Scope.BOT,
                pool="bot:b_1",
                contributor="b_1",
                tier=Tier.PROFILE,
                content_fp="fp-" + entry_id,
                created_at=at,
                updated_at=at,
                tags=tags,
            )
            pool.stored.entries[entry_id] = entry
            svc.workspace_pools.indexed(pool, entry, content, new=True)

        def found(q: str) -> list[str]:
            return [i for i, _ in pool.index.search(analyzer.query(q), 10)]

        try:
            write("m_private", private, "The quokka password is hidden.")
            write("m_public", public, "Lunch is served at noon.")
            write("m_private2", private, "Remember the zither.")
            write("m_public2", public, "The cafeteria has soup.")
            assert found("quokka") == ["m_private", "m_private2"]
            assert found("zither") == ["m_private2", "m_private"]
            assert found("lunch") == ["m_public", "m_public2"]
            assert found("cafeteria") == ["m_public2", "m_public"]
        finally:
            for entry_id in ("m_private", "m_public", "m_private2", "m_public2"):
                del pool.stored.entries[entry_id]
                pool.index.remove(entry_id)
            await _close(svc)

    asyncio.run(main())


def test_keyword_hits_of_several_pools_rank_as_one_pools_would(tmp_path: Path):
    """A search over Ann's user pool and her project's pool ranks their records as one pool
    holding all of them would (Ben's pool holds the same texts): a word frequent in one pool
    and rare in the other does not lift the rare pool's records above better ones."""
    first = ["zork blip", "zork zork fleem", "zork gronk wibble", "fleem gronk"]
    second = ["zork wibble", "fleem plonk quux", "quux"]

    async def main() -> None:
        svc = await _open(tmp_path, context_s=0)
        await svc.workspace_save_project(
            "u_ann", "o_1", ProjectCreate(requestId="p", name="P"), "p_1"
        )
        text: dict[str, str] = {}
        for t in first:
            text[await _create(svc, ANN, t)] = t
        for t in second:
            text[await _create(svc, ANN, t, Scope.PROJECT, project="p_1")] = t
        for t in [*first, *second]:
            text[await _create(svc, BEN, t)] = t

        async def scores(
            q: str, who: WorkspaceAccess, projects: tuple[str, ...]
        ) -> dict[str, float]:
            pools = (f"user:{who.account}",)
            query = WorkspaceQuery(pools=pools, projects=projects, q=q, using="keyword")
            listing = await svc.workspace_entries(who, query)
            return {text[h.id]: round(h.score, 4) for h in listing.hits}

        for q in ("zork", "zork fleem", "wibble zork"):
            both = await scores(q, ANN, ("p_1",))
            assert len(both) > 1 and both == await scores(q, BEN, ()), q
        query = WorkspaceQuery(pools=("user:u_ann",), projects=("p_1",), q="zork", using="keyword")
        got = [h.id for h in (await svc.workspace_entries(ANN, query)).fused]
        assert text[got[0]] == "zork zork fleem"
        await _close(svc)

    asyncio.run(main())


def test_hidden_bot_records_never_move_the_callers_other_hits(tmp_path: Path):
    """Ann's ranking of her own records (user pool, searched with the bot's pool) is the same
    whether or not the bot's pool holds records of Ben's she may not read containing the
    query's words: the bot pool's statistics are never added to her pool's, so the order of
    her hits tells nothing of how many hidden records hold a word."""
    mine = ["zork blip", "zork zork fleem", "fleem gronk wibble", "fleem", "gronk"]
    pools = ("user:u_ann", "bot:b_1")

    async def main() -> None:
        svc = await _open(tmp_path, context_s=0)
        for t in mine:
            await _create(svc, ANN, t)
        await _create(svc, ANN, "quux plonk", Scope.BOT)  # the bot pool holds Ann's too

        async def ranking(q: str) -> list[tuple[str, float]]:
            query = WorkspaceQuery(pools=pools, q=q, using="keyword")
            return [
                (h.id, round(h.score, 5)) for h in (await svc.workspace_entries(ANN, query)).hits
            ]

        queries = ("zork fleem", "fleem gronk", "zork wibble")
        before = {q: await ranking(q) for q in queries}
        # Ben's: a record for him alone (as a bot writes one in a DM with him), and what the
        # bot learned talking with him alone.
        svc.workspace_pools.upkeep_delay = 3600  # no check of the pool against the hand-made record
        pool = await svc.workspace_pools.pool("bot:b_1")
        at = svc.workspace_pools.kernel.clock()
        tags = ("from:u_ben", "for:person:u_ben", "org:o_1")
        entry = WorkspaceEntry(
            id="m_ben",
            scope=Scope.BOT,
            pool="bot:b_1",
            contributor="b_1",
            tier=Tier.PROFILE,
            content_fp="fp-ben",
            created_at=at,
            updated_at=at,
            tags=tags,
        )
        pool.stored.entries[entry.id] = entry
        svc.workspace_pools.indexed(pool, entry, "zork zork zork fleem", new=True)
        ben = Reader(user="u_ben", org="o_1", uses_bot=True)
        learned = [(await svc.remember("bot:b_1", ben, "zork zork wibble")).id for _ in range(3)]
        hidden = {"m_ben", *learned}
        assert bm.record_visible(ben, entry)  # Ben's, hidden from Ann (below)
        assert not hidden & set(await _found(svc, "zork", pools))  # Ann may not read them
        try:
            for q in queries:
                assert len(before[q]) > 1 and await ranking(q) == before[q], q
        finally:
            del pool.stored.entries[entry.id]
            pool.index.remove(entry.id)
            await _close(svc)

    asyncio.run(main())


def test_streams_are_bounded_and_keep_the_recent_ones():
    class W:
        def __init__(self, at: int) -> None:
            self.at = at

    streams: dict = {}
    for n in range(wc.STREAMS + 10):
        wc.remember(streams, ("b", (), (f"t{n}",)), W(n), n, 1_000_000)
    assert len(streams) == wc.STREAMS and ("b", (), ("t0",)) not in streams
    wc.remember(streams, "late", W(10_000_000), 10_000_000, 1_000)
    assert list(streams) == ["late"]  # the others are out of the window: dropped
    assert wc.in_window(W(5), 5, 1) and not wc.in_window(W(5), 7, 1)
    assert not wc.in_window(W(5), 5, 0) and not wc.in_window(None, 5, 1)


def test_streams_out_of_the_window_are_dropped_on_each_insert():
    """A pool with few streams keeps none past the window: each insert drops the expired ones
    from the oldest end, stopping at the first still in the window."""

    class W:
        def __init__(self, at: int) -> None:
            self.at = at

    streams: dict = {}
    wc.remember(streams, "a", W(0), 0, 100)
    wc.remember(streams, "b", W(50), 50, 100)
    wc.remember(streams, "c", W(120), 120, 100)
    assert list(streams) == ["b", "c"]  # a: 120 ms old
    wc.remember(streams, "b", W(130), 130, 100)
    assert list(streams) == ["c", "b"]  # b written again: the most recent
    wc.remember(streams, "d", W(225), 225, 100)
    assert list(streams) == ["b", "d"]  # c out; b (95 ms) in: the scan stops there
    wc.remember(streams, "e", W(1_000), 1_000, 100)
    assert list(streams) == ["e"]
    wc.remember(streams, "f", W(1_001), 1_001, 0)  # context off: nothing is read with again
    assert list(streams) == ["f"]


def test_bot_memory_search_ranks_learned_entries_and_records_as_one_index(tmp_path: Path):
    """`GET /v1/bots/{bot}/memory?q=`: a bot's learned entries and its workspace records are
    two indexes merged by score; each hit scores as in one index holding every text."""
    from engine.memory_entries import Reader
    from storage.search_index import TermIndex

    learned = ["zork blip", "zork zork fleem", "zork gronk wibble", "fleem gronk"]
    records = ["zork wibble", "fleem plonk quux", "quux"]
    ann = Reader(user="u_ann", org="o_1", uses_bot=True)

    async def main() -> None:
        svc = await _open(tmp_path, context_s=0)
        for t in learned:
            await svc.remember("bot:b_1", ann, t, [])
        for t in records:
            await _create(svc, ANN, t, Scope.BOT)
        analyzer = svc.workspace_pools.kernel.analyzer("bot:b_1")
        one = TermIndex()
        one.build((t, analyzer.keys(t)) for t in [*learned, *records])
        for q in ("zork", "zork fleem", "quux wibble"):
            page = await svc.search_memory_page("bot:b_1", ann, q, 10)
            want = {t: round(s, 4) for t, s in one.search(analyzer.query(q), 10)}
            # The route's score is the fused one (the workspace search's); its order is BM25's.
            got = [want[e.content] for e in page.entries]
            assert set(want) == {e.content for e in page.entries}, q
            assert got == sorted(got, reverse=True), q
        await _close(svc)

    asyncio.run(main())
