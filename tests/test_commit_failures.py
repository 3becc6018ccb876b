"""What a failed commit leaves behind: nothing acknowledged is lost, nothing unstored is served."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from actors.shard import ShardService
from engine.errors import StorageError
from engine.memory import Reader
from storage.group_commit import GroupCommitter

R = Reader(user="u1", org="o1", uses_bot=True)


def _failing_on(monkeypatch, marker: str, times: int = 1):
    """Make every transaction holding a row that mentions `marker` fail, `times` times."""
    original = GroupCommitter._commit
    left = itertools.count(times, -1)

    def commit(self, batches, con):
        rows = [w for batch in batches for w in batch]
        if any(marker in repr(getattr(w, "row", "")) for w in rows) and next(left) > 0:
            raise StorageError("disk full (simulated)")
        return original(self, batches, con)

    monkeypatch.setattr(GroupCommitter, "_commit", commit)


def _ids(*names):
    it = iter(names)
    return lambda: next(it)


def test_a_failed_first_write_does_not_lose_the_pools_key(tmp_path, monkeypatch):
    _failing_on(monkeypatch, "mem_first")

    async def go():
        svc = ShardService(tmp_path, 0, new_id=_ids("mem_first", "mem_second"))
        with pytest.raises(StorageError):
            await svc.remember("bot:b", R, "lost")
        await svc.remember("bot:b", R, "kept")  # acknowledged: must survive a restart
        await svc.close()
        again = ShardService(tmp_path, 0)
        page = await again.read_memory("bot:b", R)
        await again.close()
        return page

    assert [e.content for e in asyncio.run(go()).entries] == ["kept"]


def test_state_built_on_a_failed_change_is_never_served(tmp_path, monkeypatch):
    _failing_on(monkeypatch, "mem_x", times=10)

    async def go():
        svc = ShardService(tmp_path, 0, new_id=_ids("mem_seed", "mem_x", "mem_y"))
        await svc.remember("bot:b", R, "seed")
        results = await asyncio.gather(
            svc.remember("bot:b", R, "x"),
            svc.remember("bot:b", R, "y"),
            svc.read_memory("bot:b", R),
            return_exceptions=True,
        )
        after = await svc.read_memory("bot:b", R)  # reloaded from the file
        await svc.close()
        return results, after

    (x, y, read), after = asyncio.run(go())
    assert isinstance(x, StorageError)
    # The read saw x in memory; it must fail rather than show a change that is not on disk.
    assert isinstance(read, StorageError) or "x" not in [e.content for e in read.entries]
    assert not isinstance(y, Exception)  # its own rows committed: acknowledged, and kept
    assert sorted(e.content for e in after.entries) == ["seed", "y"]


def test_a_purge_ends_the_replay_of_stored_answers(tmp_path):
    async def go():
        svc = ShardService(tmp_path, 0)
        first = await svc.remember("bot:b", R, "note", request_id="r1")
        assert await svc.purge("bot:b", "from:u1") == 1
        again = await svc.remember("bot:b", R, "note", request_id="r1")
        page = await svc.read_memory("bot:b", R)
        await svc.close()
        return first, again, page

    first, again, page = asyncio.run(go())
    assert again.id != first.id and [e.id for e in page.entries] == [again.id]
