"""The gateway's page cache: served only while the event stream says the pool is unchanged."""

from __future__ import annotations

import time

import ray

from engine.directory import bot_pool
from engine.memory_entries import EntryMeta, Layer, Reader
from gateway.read_cache import ReadCache


class FakeHub:
    def __init__(self) -> None:
        self.head = 10
        self.epoch = "e1"
        self.changed: dict[str, int] = {}
        self.ok = True

    def fresh(self, shard, epoch, pool, fill):
        return (
            self.ok
            and epoch == self.epoch
            and self.head >= fill
            and self.changed.get(pool, 0) <= fill
        )


READER = Reader(user="u1", org="o1", uses_bot=True)


def test_page_served_until_the_pool_changes():
    hub = FakeHub()
    cache = ReadCache(hub)
    key = cache.key("bot:b", READER, ())
    cache.put(key, 0, "e1", 10, b"page", cache.generation("bot:b"))
    assert cache.get(key) == b"page"
    hub.changed["bot:other"] = 11  # another pool changing does not matter
    hub.head = 11
    assert cache.get(key) == b"page"
    hub.changed["bot:b"] = 12
    hub.head = 12
    assert cache.get(key) is None
    assert cache.get(key) is None  # dropped, not just skipped


def test_nothing_is_kept_when_the_hub_is_behind_or_broken_or_replaced():
    hub = FakeHub()
    cache = ReadCache(hub)
    key = cache.key("bot:b", READER, ())
    cache.put(key, 0, "e1", 11, b"ahead of the hub", 0)
    assert cache.get(key) is None
    cache.put(key, 0, "e1", 10, b"page", 0)
    hub.ok = False
    assert cache.get(key) is None
    hub.ok = True
    cache.put(key, 0, "e1", 10, b"page", 0)
    hub.epoch = "e2"
    assert cache.get(key) is None


def test_a_local_write_during_the_read_keeps_the_page_out():
    hub = FakeHub()
    cache = ReadCache(hub)
    key = cache.key("bot:b", READER, ())
    started = cache.generation("bot:b")
    cache.forget_pool("bot:b")  # a write through this gateway, meanwhile
    cache.put(key, 0, "e1", 10, b"maybe stale", started)
    assert cache.get(key) is None


def test_keys_separate_readers_and_filters_and_the_size_is_capped():
    hub = FakeHub()
    cache = ReadCache(hub, max_bytes=10)
    other = Reader(user="u2", org="o1", uses_bot=True)
    k1, k2 = cache.key("bot:b", READER, ()), cache.key("bot:b", other, ())
    assert k1 != k2 and cache.key("bot:b", READER, ("x",)) != k1
    cache.put(k1, 0, "e1", 1, b"123456", 0)
    cache.put(k2, 0, "e1", 1, b"abcdef", 0)  # over 10 bytes: the oldest goes
    assert cache.get(k1) is None and cache.get(k2) == b"abcdef"


def write_elsewhere(engine, world, entry_id: str, content: str) -> None:
    """A pinned entry for alice in the world's bot's memory, written straight to the shard (as
    the memory bot does), not through any gateway."""
    alice = world.users["alice"]
    meta = EntryMeta(
        id=entry_id,
        pool=bot_pool(world.bot),
        layer=Layer.PINNED,
        tags=(f"for:person:{alice}", f"org:{world.org}"),
        created_at=1,
        updated_at=1,
    )
    ray.get(engine.shard_for(alice).add_entries.remote(bot_pool(world.bot), [(meta, content)]))


def test_a_change_made_elsewhere_reaches_the_cached_page(engine, world):
    """A change that did not go through this gateway (here: the memory bot, straight to the
    shard) invalidates the page through the event stream."""
    url = f"/v1/bots/{world.bot}/memory"
    with world.client("alice") as alice:
        alice.post(url, json={"command": {"_tag": "Remember", "content": "first"}})
        assert len(alice.get(url).json()["entries"]) == 1
        assert len(alice.get(url).json()["entries"]) == 1  # cached by now
        write_elsewhere(engine, world, "mem_from_elsewhere", "second")
        deadline = time.monotonic() + 2
        while True:  # the event takes one long-poll return to reach the hub
            entries = alice.get(url).json()["entries"]
            if len(entries) == 2 or time.monotonic() > deadline:
                break
        assert {e["content"] for e in entries} == {"first", "second"}
