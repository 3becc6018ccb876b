"""The shard's hot calls with one bytes argument and reply (actors/shard/packed.py): a Remember
as a msgpack `RememberCall` answered with the HTTP body, and the event pump's poll as one msgpack
`EventBatch` — the same answers as the Struct calls they stand for, byte for byte."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from actors.contracts import EVENT_BATCH, REMEMBER_CALL, RememberCall, pack
from actors.shard.service import ShardService
from engine.events import MemoryChanged
from engine.memory import Reader
from gateway.json_response import json

POOL = "bot:b1"
ALICE = Reader(user="u1", org="o1", channels=frozenset({"c1", "c2"}), uses_bot=True)

pytestmark = pytest.mark.usefixtures("no_env_key")


def run(tmp_path: Path, body) -> None:
    async def main() -> None:
        svc = ShardService(tmp_path / "data", 0)
        try:
            await body(svc)
        finally:
            await svc.close()

    asyncio.run(main())


def test_remember_call_round_trips() -> None:
    call = RememberCall(pool=POOL, reader=ALICE, content="é ✓", tags=("a", "b"), request_id="r")
    assert REMEMBER_CALL.decode(pack(call)) == call
    bare = RememberCall(pool=POOL, reader=Reader(user="u", org="o"), content="x")
    assert REMEMBER_CALL.decode(pack(bare)) == bare


def test_remember_json_is_the_routes_body(tmp_path: Path) -> None:
    async def body(svc: ShardService) -> None:
        call = RememberCall(
            pool=POOL, reader=ALICE, content="tea", tags=("drinks",), request_id="r1"
        )
        packed = await svc.remember_json(pack(call))
        # The same request id again through the Struct call: the same entry (not a second one),
        # which the gateway's json() would have written as exactly these bytes.
        again = await svc.remember(POOL, ALICE, "tea", ("drinks",), "r1")
        assert packed == json(again, 201).body
        doc = msgspec.json.decode(packed)
        assert doc["content"] == "tea" and "drinks" in doc["tags"] and "createdAt" in doc
        assert len((await svc.read_memory(POOL, ALICE)).entries) == 1

    run(tmp_path, body)


def test_events_packed_equals_events_after(tmp_path: Path) -> None:
    async def body(svc: ShardService) -> None:
        calls = [
            svc.remember_json(pack(RememberCall(pool=POOL, reader=ALICE, content=f"n{i}")))
            for i in range(24)
        ]
        ids = {msgspec.json.decode(b)["id"] for b in await asyncio.gather(*calls)}
        assert len(ids) == 24
        head, events = await svc.events_after(0, 1000, 0.0)
        batch = EVENT_BATCH.decode(await svc.events_packed(0, 1000, 0.0))
        assert (batch.head, batch.events) == (head, events)
        changed = [e.data.entry for e in batch.events if isinstance(e.data, MemoryChanged)]
        assert sorted(changed) == sorted(ids)
        assert [e.seq for e in batch.events] == list(range(1, head.head + 1))
        # A page from the middle, and a long-poll with nothing new that times out empty.
        middle = EVENT_BATCH.decode(await svc.events_packed(10, 5, 0.0))
        assert [e.seq for e in middle.events] == [11, 12, 13, 14, 15]
        idle = EVENT_BATCH.decode(await svc.events_packed(head.head, 1000, 0.05))
        assert idle.events == [] and idle.head == head

    run(tmp_path, body)
