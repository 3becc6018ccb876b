"""Guards of access to a pool: its lock (ACL-9), what reads decrypt (ACL-8, LRN-8) and visibility
edges found by mutation testing (ACL-1, ACL-2)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from engine.memory_entries import Reader, Status
from tests.guards.kit import (
    BOB,
    CONFIDE,
    CipherSpy,
    fact_meta,
    learning_route,
    observation_meta,
    pinned_meta,
)
from tests.openai_stub import completion
from tests.shard_kit import ANN, POOL, run_turn

# --- ACL-9: the pool's lock -------------------------------------------------------------------


@pytest.mark.anyio
async def test_ACL_9_reads_wait_for_a_change_and_changes_wait_for_reads(shards, fresh):
    """While a change holds the pool's lock no read runs; while a read holds it no change runs.

    Breaks tried: in `RWLock.shared`, `if self._writer or self._waiting_writers:` → `if False:`
    → "a read ran while a change held the lock"; in `RWLock.exclusive`, `if self._writer or
    self._readers or self._waiting_writers:` → `if False:` → "a change ran under a read"; in
    `MemoryReader.read`, `async with pool.lock.shared():` → `if True:` → "a read ran while a
    change held the lock"."""

    svc = shards(stubs=fresh)
    first = await svc.remember(POOL, ANN, "Ann drinks green tea")
    pool = await svc.kernel.pool(POOL)
    async with pool.lock.exclusive():  # a change deciding and queueing
        reads = [
            asyncio.create_task(svc.read_memory(POOL, ANN)),
            asyncio.create_task(svc.context(POOL, ANN, 1_000)),
            asyncio.create_task(svc.has_entries(POOL, ANN)),
            asyncio.create_task(svc.memory_log(POOL, ANN)),
        ]
        await asyncio.sleep(0.2)
        pending = [t for t in reads if not t.done()]
        assert pending == reads, "a read ran while a change held the lock"
    await asyncio.gather(*reads)
    async with pool.lock.shared():  # a read checking visibility and decrypting
        changes = [
            asyncio.create_task(svc.remember(POOL, ANN, "Ann moved to Oslo")),
            asyncio.create_task(svc.set_status(POOL, first.id, Status.INVALIDATED)),
            asyncio.create_task(svc.forget(POOL, ANN, first.id)),
        ]
        await asyncio.sleep(0.2)
        assert not any(t.done() for t in changes), "a change ran under a read"
    await asyncio.gather(*changes, return_exceptions=True)


@pytest.mark.anyio
async def test_ACL_9_24_concurrent_retries_of_one_request_store_one_entry(shards, fresh):
    """The receipt check and the write are one atomic step under the exclusive lock.

    Break tried: `async with pool.lock.exclusive():` in `ShardService.remember` → `if True:` →
    `assert 24 == 1`: each retry missed the receipt while it was read from disk."""

    svc = shards(stubs=fresh)
    # The pool's stored receipts are not read yet: the first check awaits the disk.
    answers = await asyncio.gather(
        *(svc.remember(POOL, ANN, "Ann likes trains", request_id="r1") for _ in range(24))
    )
    page = await svc.read_memory(POOL, ANN)
    await shards.close(svc)
    assert len({a.id for a in answers}) == 1
    assert [e.content for e in page.entries] == ["Ann likes trains"]


# --- ACL-8: visibility never decrypts ----------------------------------------------------------


@pytest.mark.anyio
async def test_ACL_8_reads_decrypt_only_what_the_reply_shows(shards, fresh, monkeypatch):
    """Visibility is decided from tags, sources and proofs; content is decrypted only for the
    entries the reply carries, and checking an observation's sources never decrypts them.

    Breaks tried (each fails): in `ShardService._read`, a line `[self.store.open_content(
    pool.stored, i) for i in pool.candidates(reader)]` before the visibility check (decrypt
    every candidate first) → "decrypted more than the reply shows" (mem_h1..h4 decrypted); the
    same line in `context_parts` → hidden ids among the decrypted; `has_entries` returning
    `any(vis.usable(i) and self.store.open_content(...) ...)` → `{'mem_a2'} == set()`. After
    main's one-bot-memory read (actors/shard/memory_reader.py): `Snapshot.visible_entries`
    filtering on `self.open(i) and check(i)` → "decrypted more than the reply shows"."""
    spy = CipherSpy(monkeypatch)
    entries = [
        (fact_meta("mem_a1", "u_ann", 10), "Ann drinks green tea"),
        (observation_meta("mem_a2", "mem_a1", now=20), "Ann likes hot drinks"),
        (fact_meta("mem_b1", "u_bob", 11), "Bob drinks coffee"),
        # Candidates for Ann (their audience names her or the bot) that she may not see:
        (observation_meta("mem_h1", "mem_b1", now=21), "hidden: built on Bob's entry"),
        (
            msgspec.structs.replace(fact_meta("mem_h2", "u_ann", 12), proofs=()),
            "hidden: no access proof",
        ),
        (pinned_meta("mem_h3", ("for:person:u_ann", "org:o2")), "hidden: another org"),
        (pinned_meta("mem_h4", ("for:bot", "org:o2")), "hidden: another org's bot entry"),
        (pinned_meta("mem_h5", ("org:o1",)), "hidden: no audience at all"),
    ]
    hidden = {"mem_h1", "mem_h2", "mem_h3", "mem_h4", "mem_h5", "mem_b1"}

    svc = shards(stubs=fresh)
    await svc.add_entries(POOL, entries)
    await shards.close(svc)
    svc = shards(stubs=fresh)  # loaded from disk: nothing decrypted in memory yet
    out = {}
    spy.reset()
    out["page"] = await svc.read_memory(POOL, ANN)
    out["page_opened"] = spy.entries(spy.opened)
    # Only the observation, on a fresh load (a read keeps what it opened): its source is
    # checked, never decrypted.
    await shards.close(svc)
    svc = shards(stubs=fresh)
    spy.reset()
    out["obs"] = await svc.read_memory(POOL, ANN, tags=["insight"])
    out["obs_opened"] = spy.entries(spy.opened)
    spy.reset()
    out["ctx"] = await svc.context(POOL, ANN, len("Ann drinks green tea"))
    out["ctx_opened"] = spy.entries(spy.opened)
    spy.reset()
    out["has"] = await svc.has_entries(POOL, ANN)
    out["refs"] = await svc.validate_references(POOL, ANN, ["mem_a1", "mem_a2"])
    out["log"] = await svc.memory_log(POOL, ANN)
    out["meta_opened"] = spy.entries(spy.opened)
    await shards.close(svc)
    shown = {e.id for e in out["page"].entries}
    assert shown == {"mem_a1", "mem_a2"}
    assert out["page_opened"] == shown, "decrypted more than the reply shows"
    assert not out["page_opened"] & hidden
    assert out["ctx"].entries == ("mem_a1",) and out["ctx"].hasEntries
    # ENR-5: at most the first entry that did not fit is decrypted, never a later one.
    assert out["ctx_opened"] - {"mem_a1"} <= {"mem_a2"} and not out["ctx_opened"] & hidden
    assert [e.id for e in out["obs"].entries] == ["mem_a2"]
    assert out["obs_opened"] == {"mem_a2"}, "checking a source decrypted it"
    assert out["has"] and out["refs"] and out["meta_opened"] == set()


# --- LRN-8: tag and status changes leave the ciphertext alone ------------------------------------


@pytest.mark.anyio
async def test_LRN_8_status_and_topic_changes_never_decrypt_or_reseal_content(
    shards, fresh, monkeypatch
):
    """`set_status`, and learning's `invalidate` and `rename_topic`, rewrite metadata only: the
    stored ciphertext is carried over byte for byte and the content is neither decrypted for the
    change nor sealed again (the learning *context* may decrypt what the model is shown).

    Breaks tried (each fails): in `ShardService.set_status`, passing `{entry_id:
    self.store.seal_content(pool.stored, entry_id, self.store.open_content(pool.stored,
    entry_id))}` to `_queue` → "a status change touched the content" ({'mem_f1'} opened and
    sealed); in `LearningRunner._apply`, `sealed = {...}` also re-sealing every
    `decision.changed` entry → "learning re-sealed changed entries"."""
    spy = CipherSpy(monkeypatch)
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you. Tell Ann and put it right."))
    calls = [("rename_topic", {"from": "tea", "to": "drinks"}), ("invalidate", {"entry": "mem_f2"})]
    mem.routes.append(learning_route(completion(None, tool_calls=calls)))

    svc = shards(stubs=fresh)
    await svc.add_entries(
        POOL,
        [
            (fact_meta("mem_f1", "u_ann", 10), "Ann drinks green tea"),
            (fact_meta("mem_f2", "u_ann", 11), "Ann drinks tea at nine"),
            (fact_meta("mem_f3", "u_ann", 12), "Ann dislikes black tea"),
        ],
    )
    pool = await svc.kernel.pool(POOL)
    before = dict(pool.stored.sealed)
    spy.reset()
    await svc.set_status(POOL, "mem_f1", Status.INVALIDATED)
    status_touched = (spy.entries(spy.opened), spy.entries(spy.sealed))
    after_status = dict(pool.stored.sealed)
    spy.reset()
    await run_turn(svc, "I moved to Oslo, not Bergen")
    learn_sealed = spy.entries(spy.sealed)
    jobs = await svc.learning_jobs(POOL)
    await shards.close(svc)
    svc = shards(stubs=fresh)  # what is on disk
    pool = await svc.kernel.pool(POOL)
    on_disk = {i: pool.stored.sealed[i] for i in before}
    page = await svc.read_memory(POOL, ANN)
    await shards.close(svc)
    assert status_touched == (set(), set()), "a status change touched the content"
    assert after_status == before
    assert jobs[-1].status == "done", jobs
    entries = {e.id: e for e in page.entries}
    # The learning step did change them: a topic renamed everywhere, one entry invalidated.
    assert "drinks" in entries["mem_f3"].tags and "tea" not in entries["mem_f3"].tags
    assert entries["mem_f2"].status == "invalidated" and entries["mem_f1"].status == "invalidated"
    assert entries["mem_f3"].content == "Ann dislikes black tea"
    assert not learn_sealed & set(before), "learning re-sealed changed entries"
    assert on_disk == before, "stored ciphertext changed"


# --- found by mutation testing (engine/visibility.py) -------------------------------------------


def test_ACL_1_an_unknown_kind_of_for_tag_admits_nobody():
    """A `for:` tag of a kind the engine does not know fails closed.

    Surviving mutants this kills (checked): `grant_admits`' final `return False` → `return
    True`; `directly_visible`'s `return org_ok and admitted and ...` → `org_ok or admitted and
    ...` (the shard's audience index hides both from the other tests: such entries are never
    candidates)."""
    from engine.visibility import directly_visible, grant_admits

    odd = pinned_meta("mem_x", ("org:o1", "for:team:t1"))
    for reader in (ANN, BOB, Reader(user="t1", org="o1", channels=frozenset({"t1"}))):
        assert not grant_admits(reader, "for:team:t1")
        assert not directly_visible(reader, odd)


def test_ACL_2_any_one_grant_admits_whatever_the_other_grants_say():
    """An entry for several audiences admits a reader named by any one of them.

    Surviving mutant this kills: in `directly_visible`, `elif not admitted and
    tag.startswith("for:")` → `elif not admitted or ...` (a later grant overrode an earlier
    one that admitted the reader)."""
    from engine.visibility import directly_visible

    both = pinned_meta("mem_y", ("org:o1", "for:person:u_ann", "for:channel:c9", "tea"))
    assert directly_visible(ANN, both)
    assert directly_visible(Reader(user="u_bob", org="o1", channels=frozenset({"c9"})), both)
    assert not directly_visible(BOB, both)
