"""One workspace memory pool as it is held in memory (`WorkspacePool`), and what its writes keep.

A `WorkspacePool` is one pool's records (`bot:<id>`, `user:<accountId>`, `project:<id>`) as stored,
with its lock, its pending commit and its keyword index; actors/workspace/pools.py loads, keeps
and evicts them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import NamedTuple

from storage.memory_store import StoredPool
from storage.search_index import TermIndex
from storage.workspace_store import StoredWorkspacePool


class Written(NamedTuple):
    """A new record as its successor in sequence sees it: whose, when, its own term keys,
    those of the record before it and of the one before that (None: none in sequence). (A
    tuple: one is made per write, a frozen dataclass costs several times as much.)"""

    contributor: str | None
    at: int
    entry_id: str
    fp: str
    own: list[int]
    before: list[int] | None
    further: list[int] | None = None


@dataclass
class WorkspacePool:
    stored: StoredWorkspacePool
    keyed: StoredPool  # the entry pool state that holds this pool's data key
    fp_key: bytes
    lock: asyncio.Lock
    pending: asyncio.Future[None] | None = None
    poisoned: bool = False
    index: TermIndex = field(default_factory=TermIndex)  # keyword search, in memory only
    # The last new record of each write stream (engine/write_context.py): context for the
    # stream's next one, and it for it.
    last_written: dict = field(default_factory=dict)
    # Each thread's records in its order (engine/write_context.py `Thread`), made from the
    # stored records at the first threaded write after a load (`threads_ready`), and the own
    # term keys of the threaded records read so far, entry -> (content fp, keys).
    threads: dict = field(default_factory=dict)
    threads_ready: bool = False
    thread_own: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    thread_seq: int = 0
    # While a coalesced call's creations are decided (actors/workspace/create_batch.py): their
    # keys, entry -> [fp, own, before, after], indexed and stored once all are in.
    gathering: dict[str, list] | None = None
    bot_org: str | None = None  # a bot pool's bot's home org (its records' `org:` tag)
    # Records as bot-memory entries (actors/shard/memory_reader.py), per record state.
    metas: dict = field(default_factory=dict)
    # The seq of the pool's last term row (each new one takes the next: `next_seq`), and the
    # highest one its stored keyword snapshot covers (-1: none); storage/term_store.py.
    terms_seq: int = 0
    snapshot_covers: int = -1
    snapshotting: bool = False

    # The pool's id (`stored.pool`, which never changes): an attribute, as every step of a
    # write reads it, several times.
    id: str = field(init=False)

    def __post_init__(self) -> None:
        self.id = self.stored.pool

    def next_seq(self) -> int:
        self.terms_seq += 1
        return self.terms_seq
