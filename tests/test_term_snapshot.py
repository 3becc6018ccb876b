"""The stored snapshot of a workspace pool's keyword index (storage/term_store.py):
a load restores it and applies only the term rows written after it, and ranks exactly as an
index built from every row; writes made while one is stored are never lost from it; a damaged
one is not used; nothing in it reads in the clear."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import duckdb
import pytest

from actors.contracts import WorkspaceAccess
from actors.directory import DirectoryService
from actors.shard.service import ShardService
from engine.memory_entries import Scope
from engine.scoped_memory import WorkspaceMemoryChange, WorkspaceMemoryCreate
from storage.search_index import TermIndex

ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))
POOL = "user:u_ann"
SECRET = "quokkamarmalade"  # never on disk in the clear
WORDS = [f"{a}{b}" for a in ("zan", "kor", "mel", "vit", "sup") for b in ("ax", "ol", "um", "er")]

pytestmark = pytest.mark.usefixtures("no_env_key")


def _shard(data: Path, snapshot_rows: int) -> ShardService:
    svc = ShardService(data, 0, search={"context_window_s": 0})
    svc.peers.connect(directory=DirectoryService(data))
    svc.workspace_pools.snapshot_rows = snapshot_rows
    return svc


async def _close(svc: ShardService) -> None:
    await svc.close()
    svc.peers.directory().store.db.close()


def _text(rnd: random.Random, n: int) -> str:
    return f"Note {n} " + " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 9)))


async def _create(svc: ShardService, n: int, content: str) -> str:
    body = WorkspaceMemoryCreate(requestId=f"r-{n}", scope=Scope.USER, bot="b_1", content=content)
    return (await svc.workspace_create_memory(ANN, body)).id


async def _ranking(svc: ShardService, q: str) -> dict[str, float]:
    pool = await svc.workspace_pools.pool(POOL)
    return dict(pool.index.search(svc.kernel.analyzer(POOL).query(q), 1_000))


def _snapshots(data: Path) -> list[tuple]:
    con = duckdb.connect(str(data / "shard-0.duckdb"), read_only=True)
    try:
        return con.execute("SELECT pool, covers FROM search_snapshots").fetchall()
    finally:
        con.close()


class _Spy:
    """Counts restores of snapshots and the rows each load builds (TermIndex, patched)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.restored: list[int] = []
        self.built: list[int] = []
        restore, build = TermIndex.restore, TermIndex.build_flat

        def spy_restore(index, postings):
            self.restored.append(len(postings.ids))
            return restore(index, postings)

        def spy_build(index, ids, lengths, flat, **kw):
            if ids:  # (a entry pool's empty index too)
                self.built.append(len(ids))
            return build(index, ids, lengths, flat, **kw)

        monkeypatch.setattr(TermIndex, "restore", spy_restore)
        monkeypatch.setattr(TermIndex, "build_flat", spy_build)


def test_a_load_restores_the_snapshot_applies_later_rows_and_ranks_as_a_full_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    rnd = random.Random(3)
    queries = [f"{a} {b}" for a, b in zip(WORDS, reversed(WORDS), strict=True)] + ["note"]

    async def first() -> list[str]:
        svc = _shard(tmp_path, snapshot_rows=1)  # the close stores a snapshot
        ids = [await _create(svc, n, _text(rnd, n)) for n in range(40)]
        await _close(svc)
        return ids

    ids = asyncio.run(first())
    ((pool, covers),) = _snapshots(tmp_path)
    assert pool == POOL and covers == 40  # one term row per record, seq 1..40

    async def second() -> None:  # writes after the snapshot; none stored at this close
        svc = _shard(tmp_path, snapshot_rows=10_000)
        for n in range(40, 45):
            await _create(svc, n, _text(rnd, n))
        await svc.workspace_change_memory(  # a record in the snapshot, edited: its old words go
            ANN,
            WorkspaceMemoryChange(requestId="e-1", id=ids[0], expectedRevision=1, content=SECRET),
        )
        await _close(svc)

    asyncio.run(second())
    assert _snapshots(tmp_path) == [(POOL, 40)]
    spy = _Spy(monkeypatch)

    async def restored() -> dict[str, dict[str, float]]:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        out = {q: await _ranking(svc, q) for q in [*queries, SECRET]}
        await _close(svc)
        return out

    got = asyncio.run(restored())
    assert spy.restored == [40] and spy.built == [6]  # the 5 new rows and the edited one
    assert list(got[SECRET]) == [ids[0]]
    # The same data without the snapshot: every row built at once.
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))
    con.execute("DELETE FROM search_snapshots")
    con.close()
    spy.restored.clear()
    spy.built.clear()

    async def rebuilt() -> dict[str, dict[str, float]]:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        out = {q: await _ranking(svc, q) for q in [*queries, SECRET]}
        await _close(svc)
        return out

    want = asyncio.run(rebuilt())
    assert spy.restored == [] and spy.built == [45]
    for q in want:
        assert got[q].keys() == want[q].keys(), q
        for entry_id, score in want[q].items():
            assert got[q][entry_id] == pytest.approx(score, rel=1e-5), q


def test_writes_made_while_a_snapshot_is_stored_are_found_after_a_restart(tmp_path: Path):
    """32 writers at once while the snapshot is built, editing records it may hold: each
    edit's term row is either in it or after its `covers`, never lost between the two (a lost
    one would leave the record found by its old words after a restart)."""

    async def first() -> list[str]:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        ids = [await _create(svc, n, f"Note {n} zanax") for n in range(32)]
        pool = await svc.workspace_pools.pool(POOL)

        async def edit(n: int, entry_id: str) -> None:
            await asyncio.sleep(0.001 * (n % 8))
            change = WorkspaceMemoryChange(
                requestId=f"e-{n}", id=entry_id, expectedRevision=1, content=f"Note {n} korol"
            )
            await svc.workspace_change_memory(ANN, change)

        edits = [edit(n, i) for n, i in enumerate(ids)]
        await asyncio.gather(svc.workspace_pools.snapshot(pool), *edits)
        await _close(svc)  # no new snapshot (threshold): the next load needs the later rows
        return ids

    ids = asyncio.run(first())
    ((_, covers),) = _snapshots(tmp_path)
    assert 32 <= covers <= 64

    async def again() -> None:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        assert set(await _ranking(svc, "korol")) == set(ids)
        assert await _ranking(svc, "zanax") == {}
        await _close(svc)

    asyncio.run(again())


def _word(n: int, tag: str) -> str:
    """A word of its own for record `n` (letters only: the analyzer keeps it whole)."""
    return tag + "".join("abcdefghij"[int(d)] for d in str(n)) + "zq"


def test_snapshots_taken_among_concurrent_writes_leave_every_record_indexed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """48 writes (24 new records, 24 edits of stored ones; in sequence, so each new record
    re-indexes the one before it: derived rows staged apart) in three waves of 16 at once, each
    while one of three snapshots is sealed and stored: after a restart each record is in the
    index exactly once, found by its current words and not by its old ones, and the load ranks
    as a build from every row does. A row written while the last snapshot is stored has a seq
    above its `covers` (the highest seq of the rows it was built from, read with them); one at
    or below it would be lost."""
    spy = _Spy(monkeypatch)
    import itertools
    import time

    from actors.workspace import pools as pools_mod

    seal = pools_mod.seal_snapshot  # (on the worker thread that builds the snapshot)

    async def first() -> tuple[list[str], list[str]]:
        svc = ShardService(tmp_path, 0, search={"context_window_s": 60})
        svc.peers.connect(directory=DirectoryService(tmp_path))
        svc.workspace_pools.snapshot_rows = 10_000  # none at the close: only those taken here
        old = [await _create(svc, n, f"Note {_word(n, 'old')}") for n in range(24)]
        pool = await svc.workspace_pools.pool(POOL)
        loop = asyncio.get_running_loop()
        sealing = [asyncio.Event() for _ in range(3)]
        taken = itertools.count()

        def slow_seal(*args):  # as a large pool's: a wave of writes goes on meanwhile
            loop.call_soon_threadsafe(sealing[next(taken)].set)
            time.sleep(0.05)
            return seal(*args)

        monkeypatch.setattr(pools_mod, "seal_snapshot", slow_seal)

        async def edit(n: int) -> None:
            await sealing[n // 8].wait()
            change = WorkspaceMemoryChange(
                requestId=f"e-{n}", id=old[n], expectedRevision=1, content=f"Now {_word(n, 'ed')}"
            )
            await svc.workspace_change_memory(ANN, change)

        async def create(n: int) -> str:
            await sealing[(n - 24) // 8].wait()
            return await _create(svc, n, f"Note {_word(n, 'new')}")

        async def snapshots() -> None:
            for _ in range(3):
                await svc.workspace_pools.snapshot(pool)

        done = await asyncio.gather(
            snapshots(), *(edit(n) for n in range(24)), *(create(n) for n in range(24, 48))
        )
        await _close(svc)
        return old, list(done[25:])

    old, new = asyncio.run(first())
    assert len(_snapshots(tmp_path)) == 1

    async def again() -> dict[str, dict[str, float]]:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        pool = await svc.workspace_pools.pool(POOL)
        rows = [i for i in pool.index.row_ids() if i is not None]
        assert sorted(rows) == sorted(old + new) and len(pool.index) == 48  # each once
        out = {}
        for n, entry_id in enumerate(old):  # edited: by its own new words only
            assert not set(await _ranking(svc, _word(n, "old"))) & set(old)
            out[_word(n, "ed")] = await _ranking(svc, _word(n, "ed"))
            assert list(out[_word(n, "ed")]) == [entry_id]
        for n, entry_id in enumerate(new, start=24):  # (and by its neighbours' words)
            out[_word(n, "new")] = await _ranking(svc, _word(n, "new"))
            assert entry_id in out[_word(n, "new")]
        out["note"] = await _ranking(svc, "note now")
        await _close(svc)
        return out

    got = asyncio.run(again())
    assert spy.restored  # the snapshot was used
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))
    con.execute("DELETE FROM search_snapshots")
    con.close()
    want = asyncio.run(again())
    for q in want:
        assert got[q].keys() == want[q].keys(), q
        for entry_id, score in want[q].items():
            assert got[q][entry_id] == pytest.approx(score, rel=1e-5), q


@pytest.mark.parametrize("lost", ["row", "record", "both"])
def test_with_a_snapshot_a_record_in_no_row_is_indexed_and_one_gone_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: str
):
    """A load counts whether the snapshot and the rows after it (new records, an edit of one in
    it) hold every record and only records: a record in neither (written after the snapshot,
    its row lost) is indexed from its text at load, and a record of the snapshot gone since is
    taken out of the index."""
    spy = _Spy(monkeypatch)

    async def first() -> list[str]:
        svc = _shard(tmp_path, snapshot_rows=1)  # the close stores a snapshot
        ids = [await _create(svc, n, f"Note {_word(n, 'w')}") for n in range(12)]
        await _close(svc)
        svc = _shard(tmp_path, snapshot_rows=10_000)  # rows after it, none stored at close
        ids += [await _create(svc, n, f"Note {_word(n, 'w')}") for n in range(12, 15)]
        edit = WorkspaceMemoryChange(
            requestId="e", id=ids[0], expectedRevision=1, content="Now edited"
        )
        await svc.workspace_change_memory(
            ANN, edit
        )  # a row after it of a record in it: not counted twice
        await _close(svc)
        return ids

    ids = asyncio.run(first())
    rowless = ids[13] if lost != "record" else None
    gone = ids[7] if lost != "row" else None
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))
    con.execute("DELETE FROM search_terms WHERE entry = ?", [rowless])
    con.execute("DELETE FROM ws_entries WHERE id = ?", [gone])
    con.close()
    spy.restored.clear()

    async def again() -> None:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        pool = await svc.workspace_pools.pool(POOL)
        assert spy.restored == [12]
        assert sorted(i for i in pool.index.row_ids() if i is not None) == sorted(
            i for i in ids if i != gone
        )
        if rowless is not None:
            assert list(await _ranking(svc, _word(13, "w"))) == [rowless]
        if gone is not None:
            assert gone not in pool.index and await _ranking(svc, _word(7, "w")) == {}
        await _close(svc)

    asyncio.run(again())


def test_a_damaged_snapshot_is_not_used_and_nothing_is_stored_in_the_clear(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    async def first() -> str:
        svc = _shard(tmp_path, snapshot_rows=1)
        a = await _create(svc, 0, f"The {SECRET} recipe needs oranges.")
        await _create(svc, 1, "Lunch is at noon.")
        await _close(svc)
        return a

    a = asyncio.run(first())
    assert len(_snapshots(tmp_path)) == 1
    raw = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert SECRET.encode() not in raw and b"orange" not in raw and b"noon" not in raw
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))
    (body,) = con.execute("SELECT body FROM search_snapshots").fetchone()
    damaged = body[:-1] + bytes([body[-1] ^ 1])
    con.execute("UPDATE search_snapshots SET body = ?", [damaged])
    con.close()

    async def again() -> None:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        with caplog.at_level(logging.WARNING, logger="openbot.workspace"):
            assert list(await _ranking(svc, "oranges")) == [a]
        assert "keyword snapshot of user:u_ann not used" in caplog.text
        await _close(svc)

    asyncio.run(again())


def test_with_a_snapshot_records_gone_and_rows_listed_twice_are_sorted_out_at_load(
    tmp_path: Path,
):
    """A snapshot that holds a record gone since (its row removed by hand), and later rows that
    list a record twice: the gone one is no hit, the twice-listed one is indexed from its text
    (not from either row), everything else as stored."""

    async def first() -> list[str]:
        svc = _shard(tmp_path, snapshot_rows=1)
        ids = [await _create(svc, n, f"Note {n} zanax") for n in range(3)]
        await _close(svc)
        return ids

    a, b, c = asyncio.run(first())
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"))
    con.execute("DELETE FROM ws_entries WHERE id = ?", [a])  # gone, still in the snapshot
    (row,) = con.execute("SELECT * FROM search_terms WHERE entry = ?", [c]).fetchall()
    other = con.execute("SELECT terms, tfs FROM search_terms WHERE entry = ?", [b]).fetchone()
    for seq in (100, 101):  # c twice after the snapshot, wrong terms
        con.execute(
            "INSERT INTO search_terms VALUES (?, ?, ?, ?, ?, ?, ?)",
            [*row[:4], other[0], seq, other[1]],
        )
    con.close()

    async def again() -> None:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        assert set(await _ranking(svc, "zanax")) == {b, c}
        assert set(await _ranking(svc, "2")) == {c}  # "Note 2": c's own text
        assert set(await _ranking(svc, "1")) == {b}
        await _close(svc)

    asyncio.run(again())


def test_rows_written_after_a_load_are_above_the_snapshot_even_past_the_last_stored_row(
    tmp_path: Path,
):
    """A snapshot may cover seqs no stored row has (rows whose commit failed after it took
    them): a load continues the pool's seqs above `covers`, so an edit made then is applied by
    the next load and not taken as already in the snapshot."""
    from actors.shard.batch import Batch
    from storage.term_store import TermStore, seal_snapshot

    async def first() -> list[str]:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        ids = [await _create(svc, n, f"Note {n} zanax") for n in range(3)]
        pool = await svc.workspace_pools.pool(POOL)
        index = TermIndex()
        ids_, lengths, flat, _ = await svc.db.run(lambda con: TermStore.read_all(con, POOL))
        index.build_flat(ids_, lengths, flat)
        body = seal_snapshot(pool.keyed.cipher, POOL, 100, index.postings())
        await svc.kernel.commit(Batch(writes=[TermStore.snapshot_row(POOL, 100, body)]))
        await _close(svc)
        return ids

    a, _, _ = asyncio.run(first())

    async def edit() -> None:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        change = WorkspaceMemoryChange(requestId="e-1", id=a, expectedRevision=1, content="korol")
        await svc.workspace_change_memory(ANN, change)
        await _close(svc)

    asyncio.run(edit())

    async def again() -> None:
        svc = _shard(tmp_path, snapshot_rows=10_000)
        assert list(await _ranking(svc, "korol")) == [a]
        assert a not in await _ranking(svc, "zanax")
        await _close(svc)

    asyncio.run(again())


def test_a_pool_evicted_and_loaded_again_is_neither_checked_nor_snapshotted_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A pool the residency budget evicts and loads again and again (two pools over the
    budget, used in turn) must not pay a walk of every record and a new snapshot of the whole
    index at each load, a cost that grows with the pool: its term rows are checked once per
    shard (every row written since is the shard's own), and a snapshot is stored again only
    once the rows after it are a share of the records. Counted, not timed."""
    from actors.workspace import pools as pools_mod
    from storage.term_store import TermStore

    checks: list[str] = []
    fingerprints = TermStore.fingerprints

    async def counted(self, pool):
        checks.append(pool)
        return await fingerprints(self, pool)

    monkeypatch.setattr(TermStore, "fingerprints", counted)
    share = pools_mod.SNAPSHOT_SHARE
    rnd = random.Random(5)

    async def go() -> list[int]:
        svc = _shard(tmp_path, snapshot_rows=2)
        pools = svc.workspace_pools
        pools.upkeep_delay = 0
        n = 0
        for n in range(8 * share):
            await _create(svc, n, _text(rnd, n))
        covers = []

        async def reload() -> None:
            await svc.kernel.committer.drain()
            assert pools.evict(POOL)
            await pools.pool(POOL)
            await pools.upkept()
            covers.append(max((c for _, c in _snapshots_of(svc)), default=-1))

        await reload()  # every row since the last snapshot (none): a snapshot
        for _ in range(3):  # fewer new rows than a share of the records: none
            await _create(svc, n := n + 1, _text(rnd, n))
            await reload()
        for _ in range(3 * share):  # then as many as a share: one again
            await _create(svc, n := n + 1, _text(rnd, n))
        await reload()
        await _close(svc)
        return covers

    covers = asyncio.run(go())
    assert covers[0] == covers[1] == covers[2] == covers[3] and covers[0] > 0
    assert covers[4] > covers[3]
    assert checks == [POOL]  # the first load's check only


def _snapshots_of(svc: ShardService) -> list[tuple]:
    return svc.db.query("SELECT pool, covers FROM search_snapshots")
