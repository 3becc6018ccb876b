"""The shard kernel's commit pipeline on its own (actors/shard/kernel.py), on a DuckDB file and on
an in-memory database: what a batch publishes and when, what a failed one drops, one load per pool.
"""

from __future__ import annotations

import asyncio

import pytest

from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel
from engine import commands
from engine.errors import StorageError
from engine.events import Audience, ChatItemCreated
from engine.memory_entries import Reader
from storage.group_commit import GroupCommitter
from tests.waiting import until

R = Reader(user="u1", org="o1", uses_bot=True)
EVENT = (ChatItemCreated(chat="chat_1", item="i-1", kind="person"), Audience(users=("u1",)))


@pytest.fixture(params=["file", "memory"])
def kernel_args(request, tmp_path):
    return {"db_path": ":memory:"} if request.param == "memory" else {}


def _fail_commits(monkeypatch) -> list[bool]:
    failing = [True]
    original = GroupCommitter.append_record

    def append(self, batches):
        if failing[0]:
            raise StorageError("disk full (simulated)")
        return original(self, batches)

    monkeypatch.setattr(GroupCommitter, "append_record", append)
    return failing


def _remember(kernel: ShardKernel, pool, entry_id: str, text: str):
    """A Remember as the memory API stages it (call under the pool's exclusive lock)."""
    outcome = commands.remember(
        pool=pool.id, entry_id=entry_id, reader=R, topics=(), now=1, version=pool.version
    )
    sealed = {entry_id: kernel.store.seal_content(pool.stored, entry_id, text)}
    return kernel.stage_outcome(pool, outcome, sealed)


@pytest.mark.anyio
async def test_a_batch_publishes_its_events_only_once_durable(tmp_path, kernel_args):
    kernel = ShardKernel(tmp_path, 0, **kernel_args)
    fut = kernel.stage(Batch(events=[EVENT]))
    before = kernel.events.published  # queued, not committed: nobody may hear of it yet
    await fut
    after = [e.data for e in await kernel.events.after(0)]
    await kernel.close()
    assert before == 0
    assert after == [EVENT[0]]


def test_commit_hooks_run_after_the_events_and_a_failing_one_skips_nothing(
    tmp_path, kernel_args, caplog
):
    """A batch's `done` hooks run once its events are published (a hook may read them), and a
    hook that raises is logged: the events still go out and the later hooks still run."""

    async def go():
        kernel = ShardKernel(tmp_path, 0, **kernel_args)
        ran: list[tuple[str, int]] = []

        def failing() -> None:
            ran.append(("first", kernel.events.published))
            raise RuntimeError("hook failed (simulated)")

        batch = Batch(events=[EVENT]).done(failing)
        batch.done(lambda: ran.append(("second", kernel.events.published)))
        await kernel.stage(batch)
        await asyncio.sleep(0)  # (the hooks run in the future's done callback)
        after = [e.data for e in await kernel.events.after(0)]
        await kernel.close()
        return ran, after

    with caplog.at_level("ERROR"):
        ran, after = asyncio.run(go())
    assert ran == [("first", 1), ("second", 1)]
    assert after == [EVENT[0]]
    assert [r.getMessage() for r in caplog.records if r.name == "openbot"] == [
        "a commit hook failed"
    ]


@pytest.mark.anyio
async def test_a_failed_batch_drops_the_state_built_on_it(tmp_path, kernel_args, monkeypatch):
    failing = _fail_commits(monkeypatch)

    kernel = ShardKernel(tmp_path, 0, **kernel_args)
    pool = await kernel.pool("bot:b")
    dropped: list[str] = []
    async with pool.lock.exclusive():
        fut = _remember(kernel, pool, "mem_1", "lost")
    assert fut is not None
    fut.add_done_callback(lambda f: f.exception())
    hooked = kernel.stage(Batch(events=[EVENT]).fail(lambda: dropped.append("chat")))
    assert hooked is not None
    with pytest.raises(StorageError):
        await kernel.settle(pool, fut, reads_state=False)
    with pytest.raises(StorageError):
        await hooked
    failing[0] = False
    reloaded = await kernel.pool("bot:b")
    state = (pool.poisoned, reloaded is not pool, list(reloaded.entries), dropped)
    published = kernel.events.published
    await kernel.close()
    poisoned, fresh, entries, dropped = state
    assert poisoned and fresh  # the failed change is never served
    assert entries == []
    assert dropped == ["chat"]  # the batch's own failure hook ran
    assert published == 0  # no event of a failed batch goes out


@pytest.mark.anyio
async def test_a_read_of_state_that_includes_a_failed_change_fails(tmp_path, monkeypatch):
    _fail_commits(monkeypatch)

    kernel = ShardKernel(tmp_path, 0)
    pool = await kernel.pool("bot:b")
    async with pool.lock.exclusive():
        fut = _remember(kernel, pool, "mem_1", "lost")
    assert fut is not None
    fut.add_done_callback(lambda f: f.exception())
    # A read that saw the change in memory waits for its commit and must not answer.
    async with pool.lock.shared():
        pending = pool.pending
    with pytest.raises(StorageError):
        await kernel.settle(pool, pending)
    await kernel.close()


@pytest.mark.anyio
async def test_concurrent_first_uses_of_a_pool_load_it_once(tmp_path, kernel_args):
    """24 callers at once on a new pool get one pool (one data key): two loads would seal with
    two keys and lose whatever the losing one sealed."""

    kernel = ShardKernel(tmp_path, 0, **kernel_args)
    pools = await asyncio.gather(*(kernel.pool("bot:b") for _ in range(24)))
    written = []
    for n, pool in enumerate(pools):
        async with pool.lock.exclusive():
            written.append(_remember(kernel, pool, f"mem_{n}", f"text {n}"))
    await asyncio.gather(*written)
    ids = {id(p) for p in pools}
    count = len((await kernel.pool("bot:b")).entries)
    await kernel.close()
    assert len(ids) == 1
    assert count == 24


def test_a_new_pools_key_is_stored_with_its_first_change(tmp_path):
    async def go():
        kernel = ShardKernel(tmp_path, 0)
        pool = await kernel.pool("bot:b")
        async with pool.lock.exclusive():
            fut = _remember(kernel, pool, "mem_1", "kept")
        await kernel.settle(pool, fut, reads_state=False)
        await kernel.close()
        again = ShardKernel(tmp_path, 0)
        reloaded = await again.pool("bot:b")
        text = again.store.open_content(reloaded.stored, "mem_1")
        await again.close()
        return pool.stored.persisted, text

    assert asyncio.run(go()) == (True, "kept")


def test_a_feature_runs_on_a_kernel_alone_and_numbers_concurrent_items_once(tmp_path, kernel_args):
    """Chat logs (actors/chats/chat_logs.py) built on nothing but a kernel: 24 items said at
    once into one chat get 24 distinct positions, all listed once durable, none lost."""
    from actors.chats.chat_logs import ChatLogs
    from engine.directory import Chat
    from storage.chat_store import ChatStore

    chat = Chat(id="chat_1", kind="direct", owner="u1", org="o1", bot="b1")

    async def go():
        kernel = ShardKernel(tmp_path, 0, **kernel_args)
        logs = ChatLogs(kernel, ChatStore(kernel.store))
        said = await asyncio.gather(
            *(logs.say(chat, None, "person", "u1", f"line {n}") for n in range(24))
        )
        listed = await logs.items(chat.id)
        events = await kernel.events.after(0)
        await kernel.close()
        return [i.seq for i in said], [v.text for v in listed], len(events)

    seqs, texts, events = asyncio.run(go())
    assert sorted(seqs) == list(range(1, 25))
    assert sorted(texts) == sorted(f"line {n}" for n in range(24))
    assert events == 24  # one chat.item.created each, published with its commit


def _held_loads(kernel: ShardKernel) -> tuple[asyncio.Event, asyncio.Event]:
    """Pool loads that wait for `release` once `started`: (started, release)."""
    load = kernel.store.load
    started, release = asyncio.Event(), asyncio.Event()

    async def held(pool_id):
        started.set()
        await release.wait()
        return await load(pool_id)

    kernel.store.load = held  # type: ignore[method-assign]
    return started, release


def test_a_load_whose_only_caller_was_cancelled_counts_as_resident(tmp_path, kernel_args):
    """The load goes on in its own task (others may wait for it) and keeps the pool: its
    residency is registered there, or the pool could never be evicted."""

    async def go():
        kernel = ShardKernel(tmp_path, 0, **kernel_args)
        started, release = _held_loads(kernel)
        before = len(kernel.residency)
        caller = asyncio.create_task(kernel.pool("bot:b"))
        await until(started.is_set, "the load runs")
        caller.cancel()
        release.set()
        await until(lambda: kernel.is_loaded("bot:b"), "the pool loaded")
        state = (caller.cancelled(), kernel.is_loaded("bot:b"), len(kernel.residency) - before)
        await kernel.close()
        return state

    assert asyncio.run(go()) == (True, True, 1)


def test_close_waits_for_a_load_whose_caller_was_cancelled(tmp_path, kernel_args):
    """A load left running by its cancelled caller is waited for by close: nothing reads the
    database after it closed, and no task is left behind."""

    async def go():
        kernel = ShardKernel(tmp_path, 0, **kernel_args)
        started, release = _held_loads(kernel)
        caller = asyncio.create_task(kernel.pool("bot:b"))
        await until(started.is_set, "the load runs")
        caller.cancel()
        release.set()  # the load goes on while close runs: close must wait for it
        await kernel.close()
        me = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        return left, kernel.is_loaded("bot:b")

    left, loaded = asyncio.run(go())
    assert left == []
    assert loaded  # it completed (on the open file) before close went on


def test_a_chat_log_load_left_by_its_cancelled_caller_is_resident_and_awaited_by_close(
    tmp_path, kernel_args
):
    """The same for chat logs (actors/chats/chat_logs.py): the log is counted as resident
    from its load's task, and the kernel's close waits for that load."""
    from actors.chats.chat_logs import ChatLogs
    from storage.chat_store import ChatStore

    async def go():
        kernel = ShardKernel(tmp_path, 0, **kernel_args)
        store = ChatStore(kernel.store)
        load = store.load

        started, release = asyncio.Event(), asyncio.Event()

        async def held(chat):
            started.set()
            await release.wait()
            return await load(chat)

        store.load = held  # type: ignore[method-assign]
        logs = ChatLogs(kernel, store)
        before = len(kernel.residency)
        caller = asyncio.create_task(logs.log("chat_1"))
        await until(started.is_set, "the load runs")
        caller.cancel()
        release.set()  # the load goes on while close runs: close must wait for it
        await kernel.close()
        me = asyncio.current_task()
        left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        return left, logs.is_loaded("chat_1"), len(kernel.residency) - before

    left, loaded, resident = asyncio.run(go())
    assert left == [] and loaded
    assert resident == 1
