"""ShardService driven directly (no Ray): memory API round trips, durability across a restart,
encryption at rest, provenance (facts and observations), purge, conflicts, concurrency and
context() (docs/requirements.md §1, §2, §6; docs/design.md §7)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable

import msgspec
import pytest

from actors.shard.service import ShardService
from engine.errors import Conflict, InvalidInput
from engine.memory_bot_settings import SettingsPatch
from engine.memory_entries import AccessProof, EntryMeta, Layer, Reader, Source, Status
from tests.shard_kit import Shards

POOL = "bot:b1"
ALICE = Reader(user="u1", org="o1", uses_bot=True)
BOB = Reader(user="u2", org="o1", uses_bot=True)
MARKER = "zebra-marker-7781"


pytestmark = pytest.mark.usefixtures("no_env_key")


class Env:
    """A data dir plus a clock and an id source that keep counting across restarts."""

    def __init__(self, shards: Shards) -> None:
        self.shards = shards
        self.data = shards.path / "data"
        self._t = itertools.count(1_000)
        self._ids = itertools.count(1)

    def clock(self) -> int:
        return next(self._t)

    def new_id(self) -> str:
        return f"mem_{next(self._ids):04d}"

    def service(self, **kw) -> ShardService:
        return self.shards(path=self.data, clock=self.clock, new_id=self.new_id, **kw)

    async def run(self, body: Callable[[ShardService], Awaitable]):
        """`body` on a ShardService of its own, closed after it: each run opens the files anew."""
        svc = self.service()
        result = await body(svc)
        await self.shards.close(svc)
        return result


@pytest.fixture
def env(shards: Shards) -> Env:
    return Env(shards)


def fact(entry_id: str, user: str = "u1", chat: str = "k1", now: int = 10) -> EntryMeta:
    return EntryMeta(
        id=entry_id,
        pool=POOL,
        layer=Layer.FACT,
        tags=(f"from:{user}", f"for:person:{user}", "org:o1", f"chat:{chat}", "tea"),
        sources=(Source(chat=chat, item="i-1"),),
        proofs=(AccessProof(chat=chat, item="i-1", org="o1", audience=(f"for:person:{user}",)),),
        created_at=now,
        updated_at=now,
    )


def observation(entry_id: str, source: str, now: int = 20) -> EntryMeta:
    # Deliberately without the `chat:` tag: purge must follow the source link.
    return EntryMeta(
        id=entry_id,
        pool=POOL,
        layer=Layer.OBSERVATION,
        tags=("for:person:u1", "org:o1", "likes-tea"),
        sources=(Source(entry=source),),
        confidence=0.8,
        created_at=now,
        updated_at=now,
    )


async def snapshot(svc: ShardService) -> tuple:
    return (
        await svc.read_memory(POOL, ALICE),
        await svc.memory_log(POOL, ALICE),
        await svc.memory_bot_settings(POOL),
        await svc.context(POOL, ALICE, 1_000),
    )


@pytest.mark.anyio
async def test_memory_api_round_trip_survives_restart(env: Env) -> None:
    async def first(svc: ShardService) -> tuple:
        e1 = await svc.remember(POOL, ALICE, "I drink tea", ["drinks", "tea"])
        assert e1.layer == Layer.PINNED and e1.status == Status.ACTIVE
        assert e1.tags == ("from:u1", "for:person:u1", "org:o1", "drinks", "tea")
        e2 = await svc.remember(POOL, ALICE, "I live in Oslo")
        await svc.remember(POOL, BOB, "bob's secret")
        page = await svc.read_memory(POOL, ALICE)
        assert [e.content for e in page.entries] == ["I live in Oslo", "I drink tea"]
        assert page.version == 3
        assert [e.id for e in (await svc.read_memory(POOL, ALICE, ["tea"])).entries] == [e1.id]
        assert (await svc.read_memory(POOL, ALICE, ["nope"])).entries == ()
        assert [e.content for e in (await svc.read_memory(POOL, BOB)).entries] == ["bob's secret"]

        gone = await svc.forget(POOL, ALICE, e2.id)
        assert gone.status == Status.RETRACTED and gone.content == "I live in Oslo"
        assert gone.updatedAt > gone.createdAt
        page = await svc.read_memory(POOL, ALICE)
        assert page.version == 4 and {e.status for e in page.entries} == {"active", "retracted"}

        log = await svc.memory_log(POOL, ALICE)
        assert [(r.version, r.entry, r.change, r.who) for r in log.changes] == [
            (1, e1.id, "created", "person"),
            (2, e2.id, "created", "person"),
            (4, e2.id, "retracted", "person"),
        ]
        s = await svc.patch_memory_bot_settings(POOL, SettingsPatch(expected=0, instructions="hi"))
        assert s.version == 1 and s.instructions == "hi"
        with pytest.raises(Conflict):
            await svc.patch_memory_bot_settings(POOL, SettingsPatch(expected=0, concurrency=2))
        ctx = await svc.context(POOL, ALICE, 1_000)
        assert ctx.text == "I drink tea" and ctx.entries == (e1.id,)
        return await snapshot(svc)

    before = await env.run(first)
    after = await env.run(snapshot)  # a new ShardService on the same directory
    assert after == before
    assert after[0].version == 4 and after[2].instructions == "hi"

    async def purge(svc: ShardService) -> None:
        with pytest.raises(InvalidInput):
            await svc.purge(POOL, "tea")  # a topic is not a purge tag
        assert await svc.purge(POOL, "from:u9") == 0
        assert (await svc.read_memory(POOL, ALICE)).version == 4  # nothing changed
        assert await svc.purge(POOL, "from:u1") == 2
        page = await svc.read_memory(POOL, ALICE)
        assert page.entries == () and page.version == 5
        assert (await svc.memory_log(POOL, ALICE)).changes == ()
        assert len((await svc.read_memory(POOL, BOB)).entries) == 1

    await env.run(purge)

    async def reopened(svc: ShardService) -> None:
        page = await svc.read_memory(POOL, ALICE)
        assert page.entries == () and page.version == 5
        assert (await svc.memory_bot_settings(POOL)).instructions == "hi"
        assert len((await svc.memory_log(POOL, BOB)).changes) == 1
        assert svc.db.query("SELECT count(*) FROM memory_log") == [(1,)]

    await env.run(reopened)


@pytest.mark.anyio
async def test_no_plaintext_at_rest(env: Env) -> None:
    async def body(svc: ShardService) -> None:
        e = await svc.remember(POOL, ALICE, f"pinned {MARKER} text", ["zebra-topic-7781"])
        await svc.add_entries(POOL, [(fact("mem_f1"), f"fact {MARKER}")])
        await svc.patch_memory_bot_settings(
            POOL, SettingsPatch(expected=0, instructions=f"instructions {MARKER}")
        )
        await svc.forget(POOL, ALICE, e.id)
        await svc.set_status(POOL, "mem_f1", Status.INVALIDATED)

    await env.run(body)
    files = [p for p in env.data.rglob("*") if p.is_file()]
    assert any(p.suffix == ".duckdb" for p in files)
    raw = b"".join(p.read_bytes() for p in files)
    assert MARKER.encode() not in raw
    # Positive control: topics are metadata in the clear, and the scan does find them.
    assert b"zebra-topic-7781" in raw

    async def readable(svc: ShardService) -> None:
        contents = {e.content for e in (await svc.read_memory(POOL, ALICE)).entries}
        assert contents == {f"pinned {MARKER} text", f"fact {MARKER}"}
        assert MARKER in (await svc.memory_bot_settings(POOL)).instructions

    await env.run(readable)


@pytest.mark.anyio
async def test_facts_observations_invalidation_and_purge(env: Env) -> None:
    async def body(svc: ShardService) -> None:
        v = await svc.add_entries(
            POOL, [(fact("mem_f1"), "said: I like tea"), (observation("mem_o1", "mem_f1"), "tea")]
        )
        assert v == 1
        page = await svc.read_memory(POOL, ALICE)
        assert [(e.id, e.layer) for e in page.entries] == [
            ("mem_f1", "fact"),
            ("mem_o1", "observation"),
        ]
        assert page.entries[1].confidence == 0.8
        assert page.entries[1].sources == (Source(entry="mem_f1"),)
        assert (await svc.read_memory(POOL, BOB)).entries == ()
        assert (await svc.context(POOL, ALICE, 100)).entries == ("mem_f1", "mem_o1")
        assert [r.who for r in (await svc.memory_log(POOL, ALICE)).changes] == ["memory_bot"] * 2

        # The fact stops being true: it stays as history, the conclusion on it is hidden.
        assert await svc.set_status(POOL, "mem_f1", Status.INVALIDATED) == 2
        page = await svc.read_memory(POOL, ALICE)
        assert [e.id for e in page.entries] == ["mem_f1"]
        assert page.entries[0].status == "invalidated" and page.entries[0].invalidatedAt
        assert page.entries[0].content == "said: I like tea"  # ciphertext carried over
        ctx = await svc.context(POOL, ALICE, 100)
        assert ctx.entries == () and not ctx.hasEntries
        log = (await svc.memory_log(POOL, ALICE)).changes
        assert [(r.version, r.entry, r.change) for r in log] == [
            (1, "mem_f1", "created"),
            (2, "mem_f1", "invalidated"),
        ]

        # Another chat's fact survives the purge of k1.
        await svc.add_entries(POOL, [(fact("mem_f2", chat="k2"), "other chat")])
        await svc.flush()
        assert svc.db.query("SELECT count(*) FROM memory_log") == [(4,)]
        assert await svc.purge(POOL, "chat:k1") == 2
        assert [e.id for e in (await svc.read_memory(POOL, ALICE)).entries] == ["mem_f2"]
        assert [r.entry for r in (await svc.memory_log(POOL, ALICE)).changes] == ["mem_f2"]
        await svc.flush()
        assert svc.db.query("SELECT id FROM memory_entries") == [("mem_f2",)]
        assert svc.db.query("SELECT entry FROM memory_log") == [("mem_f2",)]

    await env.run(body)


@pytest.mark.anyio
async def test_add_entries_rejects_entries_that_do_not_fit(env: Env) -> None:
    async def body(svc: ShardService) -> None:
        await svc.add_entries(POOL, [(fact("mem_f1"), "x")])
        with pytest.raises(InvalidInput):
            await svc.add_entries(POOL, [(fact("mem_f1"), "again")])
        other = msgspec.structs.replace(fact("mem_f9"), pool="bot:other")
        with pytest.raises(InvalidInput):
            await svc.add_entries(POOL, [(other, "y")])
        assert (await svc.read_memory(POOL, ALICE)).version == 1

    await env.run(body)


@pytest.mark.anyio
async def test_same_entry_id_in_two_pools_survives_restart(env: Env) -> None:
    other = "bot:b2"

    async def write(svc: ShardService) -> None:
        await svc.add_entries(POOL, [(fact("mem_same"), "in b1")])
        meta = msgspec.structs.replace(fact("mem_same"), pool=other)
        await svc.add_entries(other, [(meta, "in b2")])

    await env.run(write)

    async def read(svc: ShardService) -> None:
        assert [e.content for e in (await svc.read_memory(POOL, ALICE)).entries] == ["in b1"]
        assert [e.content for e in (await svc.read_memory(other, ALICE)).entries] == ["in b2"]

    await env.run(read)


@pytest.mark.anyio
async def test_forget_by_another_user_is_a_conflict(env: Env) -> None:
    async def body(svc: ShardService) -> None:
        e = await svc.remember(POOL, ALICE, "mine")
        before = await snapshot(svc)
        with pytest.raises(Conflict):
            await svc.forget(POOL, BOB, e.id)
        with pytest.raises(Conflict):
            await svc.forget(POOL, ALICE, "mem_does_not_exist")
        after = await snapshot(svc)
        assert after == before and after[0].version == 1
        # Forgetting twice changes nothing the second time.
        await svc.forget(POOL, ALICE, e.id)
        again = await svc.forget(POOL, ALICE, e.id)
        assert again.status == Status.RETRACTED
        assert (await svc.read_memory(POOL, ALICE)).version == 2

    await env.run(body)


@pytest.mark.anyio
async def test_concurrent_remembers_and_reads(env: Env) -> None:
    async def body(svc: ShardService) -> None:
        writes = [svc.remember(POOL, ALICE, f"note {i}") for i in range(50)]
        results = await asyncio.gather(*writes)
        assert len({r.id for r in results}) == 50
        log = (await svc.memory_log(POOL, ALICE)).changes
        assert sorted(r.version for r in log) == list(range(1, 51))
        assert (await svc.read_memory(POOL, ALICE)).version == 50
        stats = await svc.stats()
        assert stats["transactions"] < stats["batches"]  # group commit did merge

        # Reads interleaved with writes never fail and never see a torn state: every entry of
        # this pool belongs to alice, so the entries she sees always equal the version.
        calls = []
        for i in range(30):
            calls.append(svc.remember(POOL, ALICE, f"more {i}"))
            calls.append(svc.read_memory(POOL, ALICE))
            calls.append(svc.memory_log(POOL, ALICE))
            calls.append(svc.context(POOL, ALICE, 50))
        out = await asyncio.gather(*calls)
        for page in out[1::4]:
            assert len(page.entries) == page.version
        for page in out[2::4]:
            assert len(page.changes) == page.version

    await env.run(body)

    async def after(svc: ShardService) -> None:
        page = await svc.read_memory(POOL, ALICE)
        assert page.version == 80 and len(page.entries) == 80
        log = (await svc.memory_log(POOL, ALICE)).changes
        assert [r.version for r in log] == list(range(1, 81))

    await env.run(after)


@pytest.mark.anyio
async def test_context_limit_and_usable_entries(env: Env) -> None:
    async def body(svc: ShardService) -> None:
        empty = await svc.context(POOL, ALICE, 100)
        assert (empty.text, empty.entries, empty.hasEntries) == ("", (), False)
        a = await svc.remember(POOL, ALICE, "a")
        b = await svc.remember(POOL, ALICE, "bbbbbbbbbb")
        c = await svc.remember(POOL, ALICE, "cc")
        await svc.remember(POOL, BOB, "bob only")
        gone = await svc.remember(POOL, ALICE, "retracted one")
        await svc.forget(POOL, ALICE, gone.id)
        # Memory order: newest first -> cc, bbbbbbbbbb, a.
        full = await svc.context(POOL, ALICE, 1_000)
        assert full.text == "cc\nbbbbbbbbbb\na" and full.entries == (c.id, b.id, a.id)
        # "a" would fit in 5, but filling stops at the first entry that does not.
        five = await svc.context(POOL, ALICE, 5)
        assert five.text == "cc" and five.entries == (c.id,) and five.hasEntries
        exact = await svc.context(POOL, ALICE, len("cc\nbbbbbbbbbb"))
        assert exact.entries == (c.id, b.id)
        zero = await svc.context(POOL, ALICE, 0)
        assert (zero.text, zero.entries, zero.hasEntries) == ("", (), True)
        with pytest.raises(InvalidInput):
            await svc.context(POOL, ALICE, -1)
        assert (await svc.context(POOL, BOB, 1_000)).text == "bob only"

    await env.run(body)
