"""The memory bot's spend totals in memory (actors/learning/memory_bot_runtime.py): only the current
day's and month's are kept, so a runtime that charges every day for a year holds no more than
one that started today; totals of a period that ended are written before they are dropped."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

from actors.learning.memory_bot_runtime import MemoryBotRuntime
from engine.memory_bot_settings import MemoryBotSettings
from engine.models import Completion, Price, Usage
from storage.chat_store import ChatStore
from storage.crypto import Keyring
from storage.database import Database
from storage.group_commit import GroupCommitter
from storage.memory_store import MemoryStore
from storage.shard_schema import MIGRATIONS, TABLES

DAY_MS = 86_400_000
START = 1_767_225_600_000  # 2026-01-01T00:00Z


def test_the_spend_map_keeps_only_the_current_periods(tmp_path: Path) -> None:
    async def main() -> None:
        db = Database(tmp_path / "shard-0.duckdb", MIGRATIONS)
        committer = GroupCommitter(db, TABLES, checkpoint_rows=10_000, checkpoint_idle=3600)
        chats = ChatStore(MemoryStore(db, Keyring(os.urandom(32))))
        now = [START]
        runtime = MemoryBotRuntime(
            models={}, chats=chats, committer=committer, clock=lambda: now[0]
        )
        model = SimpleNamespace(name="m", price=Price(input_micros_per_mtok=10**6))
        settings = MemoryBotSettings()
        done = Completion(text="ok", usage=Usage(input_tokens=5, output_tokens=0))
        pools = [f"bot:b{i}" for i in range(3)]
        for day in range(40):
            now[0] = START + day * DAY_MS
            for pool in pools:
                await runtime.charge(pool, settings, model, done)
            await committer.submit(runtime.spend_rows())
            # each pool: today's total and this month's, nothing older
            assert runtime.stats()["spend_entries"] == 2 * len(pools), day
        # A day ends between a charge and the write of its total: written, then dropped.
        await runtime.charge(pools[0], settings, model, done)
        now[0] += DAY_MS
        await runtime.charge(pools[1], settings, model, done)
        await committer.submit(runtime.spend_rows())
        # today's total of the one pool charged today, and this month's of each pool
        assert runtime.stats()["spend_entries"] == 1 + len(pools)
        # what ended was written before it was dropped: the first day's and month's totals
        assert await chats.spend(pools[0], "day:2026-01-01") == (5, 0)
        assert await chats.spend(pools[0], "month:2026-01") == (31 * 5, 0)
        assert await chats.spend(pools[0], "month:2026-02") == (10 * 5, 0)
        await committer.close()
        db.close()

    asyncio.run(main())
