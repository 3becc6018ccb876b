"""The event pump's poll with one bytes reply (actors/shard/packed.py): `events_packed`
answers exactly what `events_after` does, as one msgpack `EventBatch`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from actors.contracts import EVENT_BATCH
from actors.shard.service import ShardService
from engine.events import MemoryChanged
from engine.memory_entries import Reader

POOL = "bot:b1"
ALICE = Reader(user="u1", org="o1", channels=frozenset({"c1", "c2"}), uses_bot=True)

pytestmark = pytest.mark.usefixtures("no_env_key")


Shard = ShardService  # what `PlacedShardService` is, without Ray's start-up guard


def test_events_packed_equals_events_after(tmp_path: Path) -> None:
    async def body(svc: Shard) -> None:
        made = await asyncio.gather(*(svc.remember(POOL, ALICE, f"n{i}") for i in range(24)))
        ids = {e.id for e in made}
        assert len(ids) == 24
        head, events = await svc.events_after(0, 1000, 0.0)
        packed = await svc.events_packed(0, 1000, 0.0)
        assert isinstance(packed, bytes)
        batch = EVENT_BATCH.decode(packed)
        assert (batch.head, batch.events) == (head, events)
        changed = [e.data.entry for e in batch.events if isinstance(e.data, MemoryChanged)]
        assert sorted(changed) == sorted(ids)
        assert [e.seq for e in batch.events] == list(range(1, head.head + 1))
        assert all(e.audience.users == ("u1",) for e in batch.events)
        # A page from the middle, and a long-poll with nothing new that times out empty.
        middle = EVENT_BATCH.decode(await svc.events_packed(10, 5, 0.0))
        assert [e.seq for e in middle.events] == [11, 12, 13, 14, 15]
        idle = EVENT_BATCH.decode(await svc.events_packed(head.head, 1000, 0.05))
        assert idle.events == [] and idle.head == head
        # A long-poll is answered by the next publish, with it.
        waiting = asyncio.create_task(svc.events_packed(head.head, 1000, 5.0))
        await asyncio.sleep(0.05)
        await svc.remember(POOL, ALICE, "late")
        late = EVENT_BATCH.decode(await asyncio.wait_for(waiting, 5))
        assert [e.seq for e in late.events] == [head.head + 1]
        assert msgspec.msgpack.decode(packed)["head"]["epoch"] == head.epoch

    async def main() -> None:
        svc = Shard(tmp_path / "data", 0)
        try:
            await body(svc)
        finally:
            await svc.close()

    asyncio.run(main())


@pytest.mark.anyio
async def test_a_garbled_packed_workspace_write_is_invalid_input_and_stores_nothing(
    tmp_path: Path,
) -> None:
    from engine.errors import InvalidInput

    svc = Shard(tmp_path / "data", 0)
    try:
        before = await svc.events_after(0, 1000, 0.0)
        for junk in (b"", b"\x81\xa3bad\x01", msgspec.msgpack.encode({"access": 1})):
            with pytest.raises(InvalidInput):
                await svc.workspace_create_memory_packed(junk)
        assert await svc.events_after(0, 1000, 0.0) == before
    finally:
        await svc.close()
