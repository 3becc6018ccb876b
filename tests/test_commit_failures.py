"""What a failed commit leaves behind: nothing acknowledged is lost, nothing unstored is served."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from actors.shard.service import ShardService
from engine.errors import StorageError
from engine.memory_entries import Reader
from storage.group_commit import GroupCommitter

R = Reader(user="u1", org="o1", uses_bot=True)


def _failing_on(monkeypatch, marker: str, times: int = 1):
    """Make every group commit (journal append) holding a row that mentions `marker` fail,
    `times` times."""
    original = GroupCommitter.append_record
    left = itertools.count(times, -1)

    def append(self, batches):
        rows = [w for batch in batches for w in batch]
        if any(marker in repr(getattr(w, "row", "")) for w in rows) and next(left) > 0:
            raise StorageError("disk full (simulated)")
        return original(self, batches)

    monkeypatch.setattr(GroupCommitter, "append_record", append)


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


@pytest.mark.anyio
async def test_state_built_on_a_failed_change_is_never_served(shards, monkeypatch):
    _failing_on(monkeypatch, "mem_x", times=10)

    svc = shards(new_id=_ids("mem_seed", "mem_x", "mem_y"))
    await svc.remember("bot:b", R, "seed")
    results = await asyncio.gather(
        svc.remember("bot:b", R, "x"),
        svc.remember("bot:b", R, "y"),
        svc.read_memory("bot:b", R),
        return_exceptions=True,
    )
    after = await svc.read_memory("bot:b", R)  # reloaded from the file
    await shards.close(svc)
    x, y, read = results
    assert isinstance(x, StorageError)
    # The read saw x in memory; it must fail rather than show a change that is not on disk.
    assert isinstance(read, StorageError) or "x" not in [e.content for e in read.entries]
    assert not isinstance(y, Exception)  # its own rows committed: acknowledged, and kept
    assert sorted(e.content for e in after.entries) == ["seed", "y"]


@pytest.mark.anyio
async def test_a_purge_ends_the_replay_of_stored_answers(shards):
    svc = shards()
    first = await svc.remember("bot:b", R, "note", request_id="r1")
    assert await svc.purge("bot:b", "from:u1") == 1
    again = await svc.remember("bot:b", R, "note", request_id="r1")
    page = await svc.read_memory("bot:b", R)
    await shards.close(svc)
    assert again.id != first.id and [e.id for e in page.entries] == [again.id]


def test_a_failing_checkpoint_never_fails_a_durable_write(tmp_path, monkeypatch, caplog):
    """The journal row committed, so the write is acknowledged and its event
    published live; the failed checkpoint is logged and retried until it succeeds."""
    original = GroupCommitter.apply_journal
    failures = itertools.count(3, -1)  # the first three checkpoints fail

    def checkpoint(self, con):
        if self.unapplied and next(failures) > 0:
            raise StorageError("disk full while applying the journal (simulated)")
        return original(self, con)

    monkeypatch.setattr(GroupCommitter, "apply_journal", checkpoint)
    monkeypatch.setattr("storage.group_commit.CHECKPOINT_PAUSE", 0.0)

    async def go():
        svc = ShardService(tmp_path, 0)
        svc.committer.checkpoint_rows = 1  # every commit tries to checkpoint
        svc.committer.checkpoint_idle = 30.0  # no idle checkpoint in between
        # The flush loop waits for each checkpoint: the failures come in a known order.
        svc.committer.background = False
        before = svc.events.published
        written = [await svc.remember("bot:b", R, f"note {n}") for n in range(2)]
        published = svc.events.published - before
        pool = svc.kernel.loaded_pool("bot:b")
        page = await svc.read_memory("bot:b", R)
        # A read of the tables: the third failure, then its retry applies the journal.
        rows = await svc.db.run(
            lambda con: con.execute("SELECT count(*) FROM memory_entries").fetchall()
        )
        assert rows == [(2,)]
        failures_seen = svc.committer.checkpoint_failures
        await svc.close()
        again = ShardService(tmp_path, 0)
        after = await again.read_memory("bot:b", R)
        await again.close()
        return written, published, pool, page, failures_seen, after

    with caplog.at_level("WARNING", logger="openbot.storage"):
        written, published, pool, page, failures_seen, after = asyncio.run(go())
    assert len(written) == 2 and published == 2  # both acknowledged, both events live
    assert pool is not None and not pool.poisoned  # the pool was not thrown away
    assert sorted(e.content for e in page.entries) == ["note 0", "note 1"]
    assert failures_seen == 3
    assert sum("journal rows" in r.getMessage() for r in caplog.records) == 3
    assert sorted(e.content for e in after.entries) == ["note 0", "note 1"]


@pytest.mark.anyio
async def test_deleting_a_chats_history_commits_first_then_clears_and_announces(
    shards, monkeypatch
):
    """`delete_items` fails without changing anything when its commit
    fails, and once it commits the history is gone and `chat.items.deleted` is published."""
    from actors.shard.batch import Batch
    from engine.directory import Chat
    from engine.events import ChatItemsDeleted
    from storage.group_commit import DeleteWhere

    original = GroupCommitter.append_record
    fail = [True]

    def append(self, batches):
        deletes = any(
            isinstance(w, DeleteWhere) and w.table == "chat_items" for b in batches for w in b
        )
        if deletes and fail[0]:
            raise StorageError("disk full (simulated)")
        return original(self, batches)

    monkeypatch.setattr(GroupCommitter, "append_record", append)

    svc = shards()
    chat = Chat(id="chat_1", kind="direct", owner="u1", org="o1", bot="b1")
    conv = svc.chat_logs
    log = await conv.log(chat.id)
    sink = Batch()
    items = [(conv.item(log, None, "person", "u1"), "one")]
    conv.append(log, chat, items, sink)
    items = [(conv.item(log, None, "person", "u1"), "two")]
    conv.append(log, chat, items, sink)
    await conv.commit(chat.id, sink)
    with pytest.raises(StorageError):
        await svc.delete_chat_items(chat.id, chat)
    kept = [i.text for i in await svc.chat_items(chat.id)]
    fail[0] = False
    seq = svc.events.published
    count = await svc.delete_chat_items(chat.id, chat)
    events = [e.data for e in await svc.events.after(seq)]
    gone = await svc.chat_items(chat.id)
    await shards.close(svc)
    again = shards()
    reloaded = await again.chat_items(chat.id)
    await shards.close(again)
    assert kept == ["one", "two"]  # the failed delete changed nothing
    assert count == 2 and gone == [] and reloaded == []
    assert events == [ChatItemsDeleted(chat="chat_1", count=2)]


def test_a_pools_key_counts_as_stored_only_with_its_own_batch(tmp_path, monkeypatch):
    """Keys travel with their batch (actors/shard/batch.py): a batch built across an await (a
    step waiting for its model) keeps its new pool key; another batch committing meanwhile does
    not mark it stored, so when the first one fails the next write still carries the key and a
    restart can open what it sealed."""
    _failing_on(monkeypatch, "req_poison")

    async def go():
        from actors.shard.batch import Batch
        from storage.group_commit import Put

        svc = ShardService(tmp_path, 0, new_id=_ids("mem_other", "mem_kept"))
        stored = (await svc.kernel.pool("bot:b")).stored  # new: its key is not on disk yet
        built = Batch().key(stored).add(Put("requests", ("req_poison", "b", "{}", b"")))
        await svc.remember("bot:other", R, "meanwhile")  # another batch commits in between
        kept_back = not stored.persisted
        with pytest.raises(StorageError):
            await svc.kernel.commit(built)
        still_unstored = not stored.persisted
        await svc.remember("bot:b", R, "kept")  # must carry the pool's key again
        await svc.close()
        again = ShardService(tmp_path, 0)
        page = await again.read_memory("bot:b", R)
        await again.close()
        return kept_back, still_unstored, [e.content for e in page.entries]

    assert asyncio.run(go()) == (True, True, ["kept"])
