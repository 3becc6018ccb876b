"""RWLock (ACL-9): readers share, a writer is alone, waiting writers are preferred, no deadlock.

Sequencing uses asyncio.Event; `_spin` only yields to the loop (no timed sleeps) so that tasks
that *could* run get the chance to, before we check that they did not.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from actors.shard.rwlock import RWLock


async def _spin(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


class Holder:
    """A task that takes the lock, records that it got in, and holds it until released."""

    def __init__(self, lock: RWLock, name: str, mode: str, log: list[str]) -> None:
        self.lock, self.name, self.mode, self.log = lock, name, mode, log
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        cm = self.lock.shared() if self.mode == "r" else self.lock.exclusive()
        async with cm:
            self.log.append(self.name)
            self.entered.set()
            await self.release.wait()

    async def finish(self) -> None:
        self.release.set()
        await self.task


@pytest.mark.anyio
async def test_readers_share() -> None:
    lock, log = RWLock(), []
    readers = [Holder(lock, f"r{i}", "r", log) for i in range(5)]
    await asyncio.wait_for(asyncio.gather(*(r.entered.wait() for r in readers)), 2)
    assert lock.readers == 5
    assert not lock.writing
    for r in readers:
        await r.finish()
    assert lock.readers == 0


@pytest.mark.anyio
async def test_writer_excludes_readers_and_writers() -> None:
    lock, log = RWLock(), []
    w1 = Holder(lock, "w1", "w", log)
    await w1.entered.wait()
    assert lock.writing
    r = Holder(lock, "r", "r", log)
    w2 = Holder(lock, "w2", "w", log)
    await _spin()
    assert log == ["w1"]
    assert lock.readers == 0
    await w1.finish()
    # w2 was waiting: writers are preferred, so it goes before the reader.
    await asyncio.wait_for(w2.entered.wait(), 2)
    await _spin()
    assert log == ["w1", "w2"]
    assert lock.readers == 0
    await w2.finish()
    await asyncio.wait_for(r.entered.wait(), 2)
    assert not lock.writing
    await r.finish()
    assert log == ["w1", "w2", "r"]


@pytest.mark.anyio
async def test_readers_block_a_writer_until_all_leave() -> None:
    lock, log = RWLock(), []
    r1, r2 = Holder(lock, "r1", "r", log), Holder(lock, "r2", "r", log)
    await r1.entered.wait()
    await r2.entered.wait()
    w = Holder(lock, "w", "w", log)
    await _spin()
    assert not w.entered.is_set()
    await r1.finish()
    await _spin()
    assert not w.entered.is_set()
    await r2.finish()
    await asyncio.wait_for(w.entered.wait(), 2)
    assert lock.writing and lock.readers == 0
    await w.finish()
    assert not lock.writing


@pytest.mark.anyio
async def test_waiting_writer_blocks_new_readers() -> None:
    lock, log = RWLock(), []
    r1 = Holder(lock, "r1", "r", log)
    await r1.entered.wait()
    w = Holder(lock, "w", "w", log)
    await _spin()
    late = [Holder(lock, f"late{i}", "r", log) for i in range(3)]
    await _spin()
    assert log == ["r1"], "a new reader overtook a waiting writer"
    await r1.finish()
    await asyncio.wait_for(w.entered.wait(), 2)
    await _spin()
    assert log == ["r1", "w"]
    await w.finish()
    # All readers that queued behind the writer get in together.
    await asyncio.wait_for(asyncio.gather(*(r.entered.wait() for r in late)), 2)
    assert lock.readers == 3
    for r in late:
        await r.finish()


@pytest.mark.anyio
async def test_exception_inside_releases_the_lock() -> None:
    lock = RWLock()
    with pytest.raises(RuntimeError):
        async with lock.exclusive():
            raise RuntimeError("boom")
    assert not lock.writing
    with pytest.raises(RuntimeError):
        async with lock.shared():
            raise RuntimeError("boom")
    assert lock.readers == 0
    async with lock.exclusive():
        assert lock.writing


@pytest.mark.anyio
async def test_cancelled_waiting_writer_does_not_wedge_the_lock() -> None:
    lock, log = RWLock(), []
    r1 = Holder(lock, "r1", "r", log)
    await r1.entered.wait()
    w = Holder(lock, "w", "w", log)
    await _spin()
    w.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w.task
    await r1.finish()
    w2 = Holder(lock, "w2", "w", log)
    await asyncio.wait_for(w2.entered.wait(), 2)
    await w2.finish()
    r2 = Holder(lock, "r2", "r", log)
    await asyncio.wait_for(r2.entered.wait(), 2)
    await r2.finish()
    assert log == ["r1", "w2", "r2"]


@pytest.mark.anyio
async def test_cancelled_waiting_writer_lets_queued_readers_share() -> None:
    lock, log = RWLock(), []
    r1 = Holder(lock, "r1", "r", log)
    await r1.entered.wait()
    w = Holder(lock, "w", "w", log)
    await _spin()
    r2 = Holder(lock, "r2", "r", log)
    await _spin()
    assert log == ["r1"]
    w.task.cancel()
    await _spin()
    try:
        # Nobody writes or waits to write any more: r2 should share with r1.
        assert r2.entered.is_set()
    finally:
        await r1.finish()
        await r2.finish()


@pytest.mark.anyio
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_many_interleaved_tasks_keep_the_invariants(seed: int) -> None:
    rng = random.Random(seed)

    lock = RWLock()
    state = {"readers": 0, "writers": 0, "max_readers": 0, "done": 0}

    async def reader(spins: int) -> None:
        await _spin(rng.randrange(3))
        async with lock.shared():
            assert state["writers"] == 0 and not lock.writing
            state["readers"] += 1
            state["max_readers"] = max(state["max_readers"], state["readers"])
            await _spin(spins)
            assert state["writers"] == 0
            state["readers"] -= 1
        state["done"] += 1

    async def writer(spins: int) -> None:
        await _spin(rng.randrange(3))
        async with lock.exclusive():
            assert state["writers"] == 0 and state["readers"] == 0
            assert lock.readers == 0 and lock.writing
            state["writers"] += 1
            await _spin(spins)
            assert state["readers"] == 0
            state["writers"] -= 1
        state["done"] += 1

    tasks = [(writer if rng.random() < 0.3 else reader)(rng.randrange(4)) for _ in range(300)]
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert state["done"] == 300
    assert state["max_readers"] > 1  # readers really did overlap
    assert lock.readers == 0 and not lock.writing
