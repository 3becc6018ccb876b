"""The pool-lock guard (ACL-9): no pool lock is held across an actor call or
a model call. The suite runs with the guard on (tests/conftest.py), in this process and in the
actors, and fails at the end if any turn, learning run, group round, chain or extraction held
one; these tests check the guard itself, and that the learning step's workspace extraction runs
outside the pool's lock."""

from __future__ import annotations

import asyncio

import pytest

from actors.runtime import lock_guard
from actors.runtime.lock_guard import PoolLockHeld, assert_no_pool_lock
from actors.shard.rwlock import PoolMutex, RWLock


async def _caught(fn) -> list[str]:
    """Run `fn` and give back what the guard recorded meanwhile (taken out of the session's
    list, which must end empty)."""
    start = len(lock_guard.violations)
    try:
        await fn()
    finally:
        caught = lock_guard.violations[start:]
        del lock_guard.violations[start:]
    return caught


def test_the_guard_is_on_in_the_test_suite():
    assert lock_guard.GUARD


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["shared", "exclusive"])
async def test_a_call_under_a_pool_lock_fails_and_one_after_it_passes(mode):
    async def go():
        lock = RWLock()
        async with getattr(lock, mode)():
            with pytest.raises(PoolLockHeld):
                assert_no_pool_lock("a call to the directory (get_chat)")
        assert_no_pool_lock("a call to the directory (get_chat)")  # released: fine

    assert await _caught(go) == ["a pool lock is held across a call to the directory (get_chat)"]


@pytest.mark.anyio
async def test_the_workspace_pool_mutex_counts_too_and_nesting_is_counted():
    async def go():
        lock, other = PoolMutex(), RWLock()
        async with lock:
            async with other.shared():
                assert lock_guard.held() == 2
            with pytest.raises(PoolLockHeld):
                assert_no_pool_lock("a model call")
        assert lock_guard.held() == 0
        assert_no_pool_lock("a model call")

    assert len(await _caught(go)) == 1


@pytest.mark.anyio
async def test_a_task_started_under_a_lock_does_not_inherit_it():
    """Only the task that holds the lock is held to it: work it spawns runs on its own."""

    async def go():
        lock = RWLock()
        async with lock.exclusive():
            child = asyncio.get_running_loop().create_task(_later())
        await child

    async def _later():
        await asyncio.sleep(0)
        assert_no_pool_lock("a model call")

    assert await _caught(go) == []


@pytest.mark.anyio
async def test_learning_sends_workspace_facts_outside_the_pool_lock(shards, monkeypatch):
    """`_stage_scoped` (calls to the directory for the facts' pools) is awaited while the
    learning task holds no pool lock; the staged facts are sent after the commit."""
    from actors.learning.runs import LearningRunner

    seen: list[int] = []

    async def stage(self, job, new, evidence, now):
        seen.append(lock_guard.held())
        return None, []

    monkeypatch.setattr(LearningRunner, "_stage_scoped", stage)

    from engine.chat_records import LearningJob

    svc = shards()
    pool = await svc.kernel.pool("bot:b1")
    job = LearningJob(
        id="job_1", pool="bot:b1", chat="chat_1", turn="t", upto=1, org="o1",
        grant="for:person:u1",
    )  # fmt: skip
    from engine.models import Completion

    await svc.learning.apply_step(job, pool, Completion(text="", tool_calls=[]), {})
    await shards.close(svc)
    assert seen == [0]


@pytest.mark.anyio
async def test_the_search_locks_count_too(shards, monkeypatch):
    """A pool's semantic-search lock counts as a pool lock: the record texts the background
    embeds are opened under it (and the model is called after it is released, or the guard
    would fail the suite)."""
    from actors.workspace.pools import WorkspacePools
    from engine.memory_entries import Scope
    from engine.scoped_memory import WorkspaceMemoryCreate
    from tests.test_semantic_search import ANN, InProcessEmbedder

    held: list[int] = []
    opened = WorkspacePools.open

    def open_(self, pool, entry_id):
        held.append(lock_guard.held())
        return opened(self, pool, entry_id)

    monkeypatch.setattr(WorkspacePools, "open", open_)

    async def go():
        emb = InProcessEmbedder()
        svc = shards(embedder=emb, search={"context_window_s": 0}, directory=True)
        body = WorkspaceMemoryCreate(requestId="r-1", scope=Scope.USER, bot="b_1", content="Tea.")
        await svc.workspace_create_memory(ANN, body)
        await svc.workspace.semantic.idle()
        await shards.close(svc)
        assert emb.texts == ["Tea."]

    assert await _caught(go) == []
    assert held and max(held) == 1
