"""A shard that Remembers until it is killed (tests/test_commit_journal.py kills it with SIGKILL).

    python -m tests.journal_writer <data_dir> <round> <callers>

Prints `sent <requestId>` before each Remember and `ack <requestId> <entry id>` once it is
acknowledged (durable), flushed line by line. Checkpoints are frequent (every 3 journal
records, and when idle for 5 ms) so kills land in appends, checkpoints and the emptying of the
file alike.
"""

from __future__ import annotations

import asyncio
import itertools
import sys

from actors.shard.service import ShardService
from engine.memory_entries import Reader

POOL = "bot:b_crash"
READER = Reader(user="u_crash", org="o_crash", uses_bot=True)


def content(request_id: str) -> str:
    return f"note {request_id}"


async def main(data_dir: str, round_: str, callers: int) -> None:
    svc = ShardService(data_dir, 0, models={})
    svc.committer.checkpoint_rows = 3
    svc.committer.checkpoint_idle = 0.005
    counter = itertools.count()

    async def caller(w: int) -> None:
        while True:
            request_id = f"r{round_}-{w}-{next(counter)}"
            print("sent", request_id, flush=True)
            entry = await svc.remember(POOL, READER, content(request_id), (), request_id)
            print("ack", request_id, entry.id, flush=True)

    print("ready", flush=True)
    await asyncio.gather(*(caller(w) for w in range(callers)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
