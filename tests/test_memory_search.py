"""Ranked memory search on a shard and over HTTP: workspace memories and
bot memory. Stems and paraphrases meet, a Chinese query finds a Chinese record, forgetting and
purging take hits away at once, the index survives a restart from stored term hashes, and no
word of a record reaches the disk in the clear."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import duckdb
import numpy as np
import pytest

from actors.contracts import WorkspaceAccess, WorkspaceQuery
from actors.directory import DirectoryService
from actors.shard.service import ShardService
from engine.errors import Conflict
from engine.memory_entries import Reader, Scope
from engine.scoped_memory import WorkspaceForget, WorkspaceMemoryChange, WorkspaceMemoryCreate
from storage.search_index import TermIndex
from tests.test_shard_service import fact

ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))
BEN = WorkspaceAccess(account="u_ben", bots=frozenset({"b_1"}))
ALICE = Reader(user="u1", org="o1", uses_bot=True)
BOB = Reader(user="u2", org="o1", uses_bot=True)
POOL = "bot:b1"
SECRET = "quokkamarmalade"  # a word that must never be found on disk in the clear


pytestmark = pytest.mark.usefixtures("no_env_key")


def _shard(data: Path, context_s: float = 0) -> ShardService:
    svc = ShardService(data, 0, search={"context_window_s": context_s})
    svc.peers.connect(directory=DirectoryService(data))
    return svc


async def _close(svc: ShardService) -> None:
    await svc.close()
    svc.peers.directory().store.db.close()


async def _create(svc: ShardService, who: WorkspaceAccess, content: str) -> str:
    body = WorkspaceMemoryCreate(
        requestId="r-" + secrets.token_hex(4), scope=Scope.USER, bot="b_1", content=content
    )
    return (await svc.workspace_create_memory(who, body)).id


async def _found(svc: ShardService, q: str, who: WorkspaceAccess = ANN, **kw) -> list[str]:
    query = WorkspaceQuery(pools=(f"user:{who.account}",), q=q, **kw)
    return [h.id for h in (await svc.workspace_entries(who, query)).fused]


def test_workspace_search_ranks_stems_paraphrases_and_chinese(tmp_path: Path):
    async def main() -> None:
        svc = _shard(tmp_path)
        deploy = await _create(svc, ANN, "We deployed the billing service on Friday.")
        train = await _create(svc, ANN, "The release train leaves on Fridays.")
        zh = await _create(svc, ANN, "我们讨论了明年的预算和招聘计划")
        other = await _create(svc, BEN, "Ben deployed the billing service too.")
        # Only a stem in common ("deployment" / "deployed"), no word of the question's own.
        assert await _found(svc, "deployment") == [deploy]
        # A paraphrase sharing no word form: "billing services deployments" ~ the record.
        found = await _found(svc, "When were billing services being deployed?")
        assert found[0] == deploy and other not in found
        assert set(await _found(svc, "friday")) == {deploy, train}
        assert await _found(svc, "讨论预算") == [zh]
        assert await _found(svc, "明年") == [zh]
        # limit cuts the ranking; scores go down.
        listing = await svc.workspace_entries(
            ANN, WorkspaceQuery(pools=("user:u_ann",), q="friday", limit=1)
        )
        assert len(listing.entries) == 1 and listing.fused[0].kinds == ("keyword",)
        await _close(svc)

    asyncio.run(main())


def test_context_window_zero_is_off_even_within_one_millisecond(tmp_path: Path):
    """`context_window_s = 0` turns context indexing off: two records written in the same
    millisecond (a fixed clock) are each found by their own words only."""

    async def main() -> None:
        svc = ShardService(tmp_path, 0, search={"context_window_s": 0}, clock=lambda: 1_000)
        svc.peers.connect(directory=DirectoryService(tmp_path))
        asked = await _create(svc, ANN, "Did you go to the pottery workshop?")
        answer = await _create(svc, ANN, "Yes! I made a bowl and a little mug.")
        assert await _found(svc, "pottery workshop") == [asked]
        assert await _found(svc, "bowl") == [answer]
        await _close(svc)

    asyncio.run(main())


def test_records_written_in_a_row_are_found_by_their_neighbours_words(tmp_path: Path):
    """Context-aware indexing, both ways: a reply is found by the words of the question it
    answered (and so, less, is the record after it), and the question by the words of its
    reply, each below the records with those words of their own; after a restart too, from
    the stored term keys. A record edited later is its own words again."""

    async def main() -> tuple[str, str, str]:
        svc = _shard(tmp_path, context_s=120)
        asked = await _create(svc, ANN, "Did you go to the pottery workshop?")
        answer = await _create(svc, ANN, "Yes! I made a bowl and a little mug.")
        after = await _create(svc, ANN, "It rained all afternoon.")
        # The record after the answer has the question's words too (the second before it),
        # below the answer's share of them.
        assert await _found(svc, "pottery workshop") == [asked, answer, after]
        found = await _found(svc, "bowl")  # its own words rank first, its neighbours' after
        assert found[0] == answer and set(found) == {asked, answer, after}
        assert await _found(svc, "rained") == [after, answer]  # the last one: one neighbour
        listing = await svc.workspace_entries(
            ANN, WorkspaceQuery(pools=("user:u_ann",), q="bowl mug")
        )
        assert listing.entries[0].content == "Yes! I made a bowl and a little mug."
        await _close(svc)
        return asked, answer, after

    asked, answer, after = asyncio.run(main())

    async def again() -> None:
        svc = _shard(tmp_path, context_s=120)
        found = await _found(svc, "bowl")
        assert found[0] == answer and set(found) == {asked, answer, after}
        await svc.workspace_change_memory(
            ANN,
            WorkspaceMemoryChange(
                requestId="r-e", id=asked, expectedRevision=1, content="Tea later?"
            ),
        )
        assert set(await _found(svc, "bowl")) == {answer, after}  # edited: its own words only
        await _close(svc)

    asyncio.run(again())


def test_an_edited_record_is_not_given_its_successors_words(tmp_path: Path):
    """The record before a new one is indexed again with the new one's words only if it is
    still what was written: edited in between, it keeps its own words."""

    async def main() -> None:
        svc = _shard(tmp_path, context_s=120)
        first = await _create(svc, ANN, "Did you go to the pottery workshop?")
        await svc.workspace_change_memory(
            ANN,
            WorkspaceMemoryChange(
                requestId="r-e", id=first, expectedRevision=1, content="Tea later?"
            ),
        )
        second = await _create(svc, ANN, "Yes! I made a bowl and a little mug.")
        assert await _found(svc, "bowl") == [second]
        assert await _found(svc, "tea") == [first]
        await _close(svc)

    asyncio.run(main())


def test_forget_and_edit_change_hits_at_once_and_the_index_survives_a_restart(tmp_path: Path):
    async def first() -> tuple[str, str]:
        svc = _shard(tmp_path)
        a = await _create(svc, ANN, f"The {SECRET} recipe needs oranges.")
        b = await _create(svc, ANN, "Lunch is at noon.")
        assert await _found(svc, SECRET) == [a]
        await svc.workspace_change_memory(
            ANN, WorkspaceForget(requestId="r-f", id=a, expectedRevision=1)
        )
        assert await _found(svc, SECRET) == []  # at once, no commit wait, no reload
        assert await _found(svc, SECRET, status="forgotten") == [a]
        await svc.workspace_change_memory(
            ANN,
            WorkspaceMemoryChange(
                requestId="r-e", id=b, expectedRevision=1, content="Lunch: soup."
            ),
        )
        assert await _found(svc, "noon") == [] and await _found(svc, "soup") == [b]
        await _close(svc)
        return a, b

    a, b = asyncio.run(first())

    # Nothing in the clear: not the word, not its stem, in any file of the data directory.
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    raw = b"".join(p.read_bytes() for p in files)
    assert SECRET.encode() not in raw and b"orange" not in raw and b"soup" not in raw
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"), read_only=True)
    rows = con.execute("SELECT entry, fp FROM search_terms").fetchall()
    con.close()
    assert {r[0] for r in rows} >= {a, b}

    async def again() -> None:
        svc = _shard(tmp_path)
        built = []
        original = TermIndex.build_flat

        def spy(self, ids, lengths, flat, **kw):
            built.append(len(ids))
            return original(self, ids, lengths, flat, **kw)

        TermIndex.build_flat = spy  # type: ignore[method-assign]
        opened = []
        real_open = svc.workspace_pools.open
        svc.workspace_pools.open = lambda pool, i: opened.append(i) or real_open(pool, i)  # type: ignore[method-assign]
        try:
            assert await _found(svc, "soup") == [b]
            assert await _found(svc, SECRET, status="all") == [a]
        finally:
            TermIndex.build_flat = original  # type: ignore[method-assign]
        assert built and opened == [b, a]  # only the hits were decrypted, not the pool
        await _close(svc)

    asyncio.run(again())


def test_bot_memory_search_sees_only_what_the_reader_may_and_purge_removes_at_once(
    tmp_path: Path,
):
    async def main() -> None:
        svc = ShardService(tmp_path, 0)
        mine = await svc.remember(POOL, ALICE, "Deploy the billing service on Fridays", ["ops"])
        theirs = await svc.remember(POOL, BOB, "Bob deploys billing on Mondays", ["ops"])
        await svc.add_entries(POOL, [(fact("mem_f1", user="u1"), "我们讨论了部署计划")])
        page = await svc.search_memory_page(POOL, ALICE, "deployment billing", 10)
        assert [e.id for e in page.entries] == [mine.id]  # Bob's is not Alice's to see
        assert page.entries[0].score > 0 and page.entries[0].foundBy == ("keyword",)
        assert [e.id for e in (await svc.search_memory_page(POOL, BOB, "billing", 10)).entries] == [
            theirs.id
        ]
        assert [e.id for e in (await svc.search_memory_page(POOL, ALICE, "讨论", 10)).entries] == [
            "mem_f1"
        ]
        await svc.forget(POOL, ALICE, mine.id)
        assert (await svc.search_memory_page(POOL, ALICE, "billing", 10)).entries == ()
        assert await svc.purge(POOL, "from:u2") >= 1
        assert (await svc.search_memory_page(POOL, BOB, "billing", 10)).entries == ()
        await svc.close()

    asyncio.run(main())

    async def after_restart() -> None:
        svc = ShardService(tmp_path, 0)
        assert (await svc.search_memory_page(POOL, BOB, "billing", 10)).entries == ()
        hits = (await svc.search_memory_page(POOL, ALICE, "部署", 10)).entries
        assert [e.id for e in hits] == ["mem_f1"]
        await svc.close()

    asyncio.run(after_restart())


# --- over HTTP ---------------------------------------------------------------------------------


def _remember(client, bot: str, content: str) -> dict:
    resp = client.post(
        f"/v1/bots/{bot}/memory",
        json={"command": {"_tag": "Remember", "content": content, "tags": []}},
    )
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_bot_memory_q_and_limit_over_http(world):
    world.grant("bob", "write")
    with world.client("alice") as alice, world.client("bob") as bob:
        a = _remember(alice, world.bot, "The quarterly budget review is on Thursday")
        b = _remember(alice, world.bot, "Budgets for travel were cut")
        _remember(bob, world.bot, "Bob's budget spreadsheet is in the shared drive")
        got = alice.get(f"/v1/bots/{world.bot}/memory", params={"q": "budgeting", "limit": 5})
        assert got.status_code == 200, got.text
        entries = got.json()["entries"]
        assert {e["id"] for e in entries} == {a["id"], b["id"]}
        assert all(e["foundBy"] == ["keyword"] and e["score"] > 0 for e in entries)
        one = alice.get(f"/v1/bots/{world.bot}/memory", params={"q": "budget", "limit": 1})
        assert len(one.json()["entries"]) == 1
        bad = alice.get(f"/v1/bots/{world.bot}/memory", params={"q": "budget", "limit": "0"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "out_of_range"
        # Without q the listing is as before: every visible entry, no scores.
        listing = alice.get(f"/v1/bots/{world.bot}/memory").json()["entries"]
        assert len(listing) == 2 and "score" not in listing[0]


def test_new_request_ids_read_no_receipt_and_repeats_still_answer_after_a_restart(
    tmp_path: Path,
):
    body = WorkspaceMemoryCreate(requestId="r-once", scope=Scope.USER, bot="b_1", content="Tea.")

    async def first() -> str:
        svc = _shard(tmp_path)
        entry = await svc.workspace_create_memory(ANN, body)
        await _close(svc)
        return entry.id

    first_id = asyncio.run(first())

    async def again() -> None:
        svc = _shard(tmp_path)
        finds = []
        real = svc.receipts.find
        svc.receipts.find = lambda *a: finds.append(a[0]) or real(*a)  # type: ignore[method-assign]
        fresh = [
            WorkspaceMemoryCreate(
                requestId=f"r-{n}", scope=Scope.USER, bot="b_1", content=f"Note {n}."
            )
            for n in range(24)
        ]
        await asyncio.gather(*(svc.workspace_create_memory(ANN, b) for b in fresh))
        assert finds == []  # 24 new ids at once: no receipt read
        assert (await svc.workspace_create_memory(ANN, body)).id == first_id  # a repeat: the answer
        other = WorkspaceMemoryCreate(
            requestId="r-once", scope=Scope.USER, bot="b_1", content="Coffee."
        )
        with pytest.raises(Conflict):
            await svc.workspace_create_memory(ANN, other)
        assert len(finds) == 2
        found = await svc.workspace_entries(ANN, WorkspaceQuery(pools=("user:u_ann",)))
        assert len(found.entries) == 25  # nothing written twice
        await _close(svc)

    asyncio.run(again())


@pytest.mark.parametrize("upkeep_slice", [1, 1_024])
def test_stored_terms_made_from_other_content_are_made_again_after_a_restart(
    tmp_path: Path, monkeypatch, upkeep_slice: int
):
    """A record's term row commits with the record, so a row made from other content should not
    happen; if one does (a file restored by hand, say), the first search after a restart may
    answer from it, and the pool's records are then indexed again from their content: the old
    words stop finding it and the real ones do, and the row is rewritten. (The check walks the
    rows in slices: with slices of one row the record stored last is in a later slice.)"""
    from actors.workspace import pools as pools_mod

    monkeypatch.setattr(pools_mod, "UPKEEP_SLICE", upkeep_slice)

    async def first() -> str:
        svc = _shard(tmp_path)
        await _create(svc, ANN, "Lunch is at noon.")
        a = await _create(svc, ANN, "The orchard needs pruning in March.")
        await _close(svc)
        return a

    a = asyncio.run(first())
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))
    (other,) = con.execute("SELECT terms FROM search_terms WHERE entry <> ?", [a]).fetchone()
    con.execute("UPDATE search_terms SET terms = ?, fp = 'stale' WHERE entry = ?", [other, a])
    con.close()

    async def again() -> None:
        svc = _shard(tmp_path)
        await _found(svc, "anything")  # loads the pool (and its stored terms as they are)
        await svc.workspace_pools.upkept()  # the check runs once the loading search is answered
        assert await _found(svc, "orchard pruning") == [a]
        assert a not in await _found(svc, "noon lunch")
        await svc.flush()
        fps = svc.db.query("SELECT fp FROM search_terms WHERE entry = ?", [a])
        assert fps and fps[0][0] != "stale"
        await _close(svc)

    asyncio.run(again())


def test_enrichment_context_takes_what_the_input_is_about_first(tmp_path: Path):
    """ENR-1/ENR-5: the memory bot's context for an input is chosen by the same
    ranked search as memory search. An entry that shares only a stem with the input ("deploys"
    for "deployment") and comes last in memory order is in the context although earlier entries
    fill the limit; the context stays in memory order, within the limit, and holds nothing the
    reader may not see; with no match it is `context` (memory order, first that does not fit)."""

    async def main() -> None:
        svc = ShardService(tmp_path, 0)
        wanted = await svc.remember(POOL, ALICE, "Ann deploys the billing service on Fridays")
        hidden = await svc.remember(POOL, BOB, "Bob deploys the billing service on Mondays")
        filler = [  # newer: first in memory order
            (await svc.remember(POOL, ALICE, f"Note {n}: the weekly tea rota, cups and saucers."))
            for n in range(12)
        ]
        limit = 200  # room for about four entries
        plain, has = await svc.context_parts(POOL, ALICE, limit)
        assert has and wanted.id not in {i for i, _ in plain}  # memory order alone misses it
        found = await svc.search_memory_page(POOL, ALICE, "When is the next deployment?", 32)
        first = [e.id for e in found.entries]
        # An id the reader may not use, first: checked again, it takes no room.
        parts, has, whole = await svc.memory_reader.context_for(
            POOL, ALICE, limit, [hidden.id, *first]
        )
        assert not whole
        assert parts == (await svc.memory_reader.context_for(POOL, ALICE, limit, first))[0]
        ids = [i for i, _ in parts]
        assert has and wanted.id in ids and hidden.id not in ids
        assert len("\n".join(t for _, t in parts)) <= limit
        order = [e.id for e in (await svc.read_memory(POOL, ALICE)).entries]
        assert ids == [i for i in order if i in ids]  # memory order
        assert ids[:-1] == [i for i, _ in plain][: len(ids) - 1]  # then filled as `context` does
        unrelated, _, _ = await svc.memory_reader.context_for(POOL, ALICE, limit)
        assert unrelated == plain
        # Only asked whether it all fits: to the character, and nothing made when it does not.
        reader = svc.memory_reader
        everything, _, _ = await reader.context_for(POOL, ALICE, 1_000_000)
        exact = len("\n".join(t for _, t in everything))
        assert await reader.context_for(POOL, ALICE, exact, partial=False) == (
            everything,
            True,
            True,
        )
        assert await reader.context_for(POOL, ALICE, exact - 1, partial=False) == ([], True, False)
        assert await reader.context_for(POOL, ALICE, limit, partial=False) == ([], True, False)
        assert filler  # (the entries above are what fills the limit)
        await svc.close()

    asyncio.run(main())


def _terms_rows(data: Path, edit) -> None:
    con = duckdb.connect(str(data / "shard-0.duckdb"))
    try:
        edit(con)
    finally:
        con.close()


def test_records_without_stored_terms_are_indexed_even_beside_rows_of_records_gone(
    tmp_path: Path,
):
    """A pool's load indexes from the stored term rows, dropping rows of records that are gone
    and tokenizing records that have none. With one of each, the counts agree: the missing
    record must still be found (a check comparing counts before dropping would miss it)."""

    async def first() -> tuple[str, str]:
        svc = _shard(tmp_path)
        a = await _create(svc, ANN, "The orchard needs pruning in March.")
        b = await _create(svc, ANN, "Lunch is at noon.")
        await _close(svc)
        return a, b

    a, b = asyncio.run(first())

    def edit(con) -> None:
        (row,) = con.execute("SELECT * FROM search_terms WHERE entry = ?", [b]).fetchall()
        con.execute("DELETE FROM search_terms WHERE entry = ?", [a])  # a: no row
        ghost = (row[0].replace(b, "gone"), row[1], "gone", *row[3:])  # a record gone since
        con.execute("INSERT INTO search_terms VALUES (?, ?, ?, ?, ?, ?, ?)", list(ghost))

    _terms_rows(tmp_path, edit)

    async def again() -> None:
        svc = _shard(tmp_path)
        assert await _found(svc, "orchard pruning") == [a]
        assert await _found(svc, "noon lunch") == [b]
        await svc.flush()
        assert svc.db.query("SELECT count(*) FROM search_terms WHERE entry = ?", [a]) == [(1,)]
        await _close(svc)

    asyncio.run(again())


def test_a_record_listed_twice_in_stored_terms_is_indexed_from_its_text(tmp_path: Path):
    """One term row per record (a write replaces it); a second row for one record (a file
    edited by hand) is not trusted: the record is indexed from its text and its row written
    again, and the other rows still serve."""

    async def first() -> tuple[str, str]:
        svc = _shard(tmp_path)
        a = await _create(svc, ANN, "The orchard needs pruning in March.")
        b = await _create(svc, ANN, "Lunch is at noon.")
        await _close(svc)
        return a, b

    a, b = asyncio.run(first())

    def edit(con) -> None:
        (row,) = con.execute("SELECT * FROM search_terms WHERE entry = ?", [b]).fetchall()
        twin = (row[0].replace(b, a), row[1], a, *row[3:])  # a second row of a, with b's words
        con.execute("INSERT INTO search_terms VALUES (?, ?, ?, ?, ?, ?, ?)", list(twin))

    _terms_rows(tmp_path, edit)

    async def again() -> None:
        svc = _shard(tmp_path)
        assert await _found(svc, "orchard pruning") == [a]
        assert await _found(svc, "noon lunch") == [b]  # not a: the twin's words are not its
        await svc.flush()
        assert svc.db.query("SELECT count(*) FROM search_terms WHERE entry = ?", [a]) == [(1,)]
        await _close(svc)

    asyncio.run(again())


def test_a_bot_pool_links_its_records_stored_without_an_org_tag_as_they_are_read(tmp_path: Path):
    """Records stored before migration 7 have no `org:` tag: a bot pool's records get the
    bot's home org as each is first read (no scan of every record's JSON at load: the first
    search after a shard opens); a record with one keeps it, and other pools have no bot to
    link to."""
    from storage.workspace_store import LazyEntries

    async def first() -> str:
        svc = _shard(tmp_path)
        a = await _create(svc, ANN, "The orchard needs pruning in March.")
        await _close(svc)
        return a

    a = asyncio.run(first())
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))
    try:
        (_key, pool, _, meta, content) = con.execute(
            "SELECT * FROM ws_entries WHERE id = ?", [a]
        ).fetchall()[0]
        doc = json.loads(meta.replace(pool, "bot:b_9"))
        doc["tags"] = ["from:u_nia", "for:bot"]
        old = json.dumps(doc | {"id": "old"})
        tagged = json.dumps(doc | {"id": "new", "tags": ["org:o_1", *doc["tags"]]})
        rows = [("k1", "bot:b_9", "old", old, content), ("k2", "bot:b_9", "new", tagged, content)]
        con.executemany("INSERT INTO ws_entries VALUES (?, ?, ?, ?, ?)", rows)
        for k, n in (("old", 1), ("new", 2)):  # their terms (the content is another pool's)
            con.execute(
                "INSERT INTO search_terms SELECT ?, 'bot:b_9', ?, fp, terms, ?, tfs "
                "FROM search_terms WHERE entry = ?",
                [f"bot:b_9\x00{k}", k, n, a],
            )
    finally:
        con.close()
    assert '"org:' not in meta  # a user pool's record: no org tag, nothing to link

    async def second() -> None:
        svc = _shard(tmp_path)
        d = svc.peers.directory()
        await d.create_org("Nine", "o_9")
        await d.create_user("Nia", ["o_9"], "u_nia")
        await d.create_bot(name="Nine", org="o_9", owner="u_nia", id="b_9")
        bot = (await svc.workspace_pools.pool("bot:b_9")).stored.entries
        user = (await svc.workspace_pools.pool(pool)).stored.entries
        assert isinstance(bot, LazyEntries) and set(bot) == {"old", "new"}
        assert "org:o_9" in bot["old"].tags and bot["old"].tags[-1] == "org:o_9"
        assert [t for t in bot["new"].tags if t.startswith("org:")] == ["org:o_1"]
        assert not any(t.startswith("org:") for t in user[a].tags)
        listed = {e.id: e.tags for e in bot.values()}  # a walk links the same way
        assert "org:o_9" in listed["old"] and "org:o_9" not in listed["new"]
        await _close(svc)

    asyncio.run(second())


def test_seed_term_rows_and_index_are_what_a_rebuild_from_the_sealed_content_gives(tmp_path):
    """Remember and the memory bot's entries are indexed from the plaintext the writer had (no
    decrypting of what was just sealed): each stored term row holds the keys the sealed content
    gives and the fingerprint of that very seal, and the pool's index ranks like one rebuilt
    from storage after a restart."""
    from actors.shard.kernel import sealed_fp, terms_pool
    from engine.memory_entries import EntryMeta, Layer

    texts = ["Deploy the billing service on Friday", "Soup for lunch at noon", "统一部署计划"]

    async def write() -> tuple[dict[str, str], list]:
        svc = ShardService(tmp_path, 0)
        made = {}
        for t in texts:
            made[(await svc.remember(POOL, ALICE, t, ("ops",), None)).id] = t
        meta = EntryMeta(id="mem_bot1", pool=POOL, layer=Layer.PINNED, tags=(
            "from:u1", "for:person:u1", "org:o1"), created_at=1, updated_at=1)  # fmt: skip
        await svc.add_entries(POOL, [(meta, "The billing team deploys on Fridays")])
        made["mem_bot1"] = "The billing team deploys on Fridays"
        pool = await svc.kernel.pool(POOL)
        an = svc.kernel.analyzer(POOL)
        rows = await svc.kernel.terms.load(terms_pool(POOL))
        assert set(rows) == set(made)
        for entry_id, text in made.items():
            fp, keys = rows[entry_id]
            assert fp == sealed_fp(pool.stored.sealed[entry_id])
            assert np.array_equal(
                keys, an.keys(svc.kernel.store.open_content(pool.stored, entry_id))
            )
            assert np.array_equal(keys, an.keys(text))
        q = an.query("deploying billing on friday lunch")
        live = pool.terms.search(q, 10)
        await svc.close()
        return made, live

    made, live = asyncio.run(write())

    async def reread() -> None:
        svc = ShardService(tmp_path, 0)
        pool = await svc.kernel.pool(POOL)
        fresh = TermIndex()
        fresh.build((i, svc.kernel.analyzer(POOL).keys(t)) for i, t in made.items())
        q = svc.kernel.analyzer(POOL).query("deploying billing on friday lunch")
        assert [i for i, _ in pool.terms.search(q, 10)] == [i for i, _ in live]
        assert dict(fresh.search(q, 10)).keys() == dict(live).keys()
        await svc.close()

    asyncio.run(reread())


def test_concurrent_writes_in_a_row_index_the_same_neighbours_in_memory_and_on_disk(
    tmp_path: Path,
):
    """24 records written at once, in whatever order the pool's lock takes them: each is found
    by its own word first and by its neighbours' (a chain: each record's words are in the next
    two records' and in the one before's),
    and a restart, which builds the index from the stored term rows, finds exactly the same."""
    words = [f"zq{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(24)]

    async def found_all(svc: ShardService) -> dict[str, list[str]]:
        return {w: await _found(svc, w, limit=10) for w in words}

    async def first() -> dict[str, list[str]]:
        svc = _shard(tmp_path, context_s=120)
        ids = await asyncio.gather(*(_create(svc, ANN, f"Note {w}.") for w in words))
        got = await found_all(svc)
        by_word = dict(zip(words, ids, strict=True))
        neighbours = {w: set(got[w]) - {by_word[w]} for w in words}
        assert all(got[w][0] == by_word[w] for w in words)  # own word first
        # One chain: found by the record before, the one after and the second after it.
        assert sorted(len(n) for n in neighbours.values()) == [1, 2, 2] + [3] * 21
        await _close(svc)
        return got

    before = asyncio.run(first())

    async def again() -> None:
        svc = _shard(tmp_path, context_s=120)
        assert await found_all(svc) == before
        await _close(svc)

    asyncio.run(again())
