"""Which records a workspace record is read with: its thread, else its write stream.

A record that names its thread (`thread` and `position` on the write: the conversation it is
a turn of and its place there) is read with the records of the same thread next to it in the
thread's order (`Thread`): the one before and after it, and the second one before. That is
structure, not timing, so two clients writing interleaved conversations, or one writing with
many requests in flight, index every turn with the same neighbours as one writing them in
order. A thread's neighbours are by the same contributor with the same visibility, like a
stream's.

A record that names no thread falls back to its write stream, which does depend on timing: a
new record written soon after the last new one of its stream is indexed with that one's
words too (storage/search_index.py `in_context`), and that one with the new one's: the turns of
a conversation kept as memories find each other's questions (actors/workspace/pools.py
`indexed`). A stream is what the server knows of a write, per pool:

- the contributor (the bot the record is stored under);
- the record's visibility: a bot pool's record tags (`from:`, `for:`, `org:`, which decide who
  may read it; user and project records have none: whoever reads the pool reads them all).
  Neighbours are read by exactly the same people, so a record is never found by the words of
  a record its reader may not see; and two people writing to one bot pool at once are two
  streams;
- the record's topics: a client writing several conversations at once (round-robin, or with
  many requests in flight) keeps each conversation's context by naming it in `topics` (in
  arrival order; naming the thread keeps the conversation's own order).

Measured by benchmarks/retrieval_lab.py --write-order (quick LoCoMo-like set, keyword / hybrid
recall@10): in order 0.703 / 0.759, no context 0.714 / 0.736; round-robin across conversations
with the pool's last record as neighbour 0.666 / 0.739, with each conversation in `topics`
0.704 / 0.759 (on the synthetic set, context is worth 15 points of keyword recall). Choosing
among a stream's recent records by shared words instead, always or once the writes looked
interleaved, did no better than the last record on interleaved writes and lost up to 4 points
on ordered ones, so a stream's neighbour is its last record.

Pure: time is passed in.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable, MutableMapping
from typing import Protocol, TypeVar

from engine.scoped_memory import Origin, WorkspaceEntry

STREAMS = 256  # streams of a pool remembered at most (the least recent dropped first)


class _At(Protocol):
    at: int


T = TypeVar("T", bound=_At)


def stream_of(contributor: str, tags: Iterable[str], topics: Iterable[str]) -> Hashable:
    return (contributor, tuple(sorted(tags)), tuple(sorted(topics)))


def in_window(last: _At | None, now: int, window_ms: int) -> bool:
    """Whether a record written at `now` is read with `last` (0: context off)."""
    return window_ms > 0 and last is not None and 0 <= now - last.at <= window_ms


def remember(
    streams: MutableMapping[Hashable, T], stream: Hashable, last: T, now: int, window_ms: int
) -> None:
    """Make `last` its stream's last record. Streams whose last is out of the window are
    dropped on each insert (one is never read with again, and a client naming a new topic per
    write adds one each): they are the oldest, so the scan starts there and stops at the first
    still in the window. At most `STREAMS` stay."""
    streams.pop(stream, None)
    # Insertion order is write order, oldest first (a clock stepping back only drops a stream
    # early, or leaves a stale one until the scan reaches it: context lost, nothing else).
    while streams:
        oldest = next(iter(streams))
        if in_window(streams[oldest], now, window_ms):
            break
        del streams[oldest]
    streams[stream] = last
    while len(streams) > STREAMS:
        del streams[next(iter(streams))]


def placed(entry: WorkspaceEntry) -> tuple[str, int] | None:
    """A record's thread and position: the one its write named, else, for a record learned
    from a chat, that chat, in the order the records were learned (extraction reads a chat's
    items in their order). None: in no thread."""
    if entry.thread:
        return entry.thread, entry.position
    if entry.origin == Origin.SYNTHESIZED and entry.evidence:
        return "chat:" + entry.evidence[0].split("/", 1)[0], entry.created_at
    return None


def thread_of(contributor: str, tags: Iterable[str], thread: str) -> Hashable:
    return ("thread", contributor, tuple(sorted(tags)), thread)


class Thread:
    """One thread's records in the thread's order: by position, ties by arrival (`seq`).

    `insert` answers which records already in the thread read differently with the new one
    there (their context is made again): the one before it (a new next), the one after it (a
    new previous) and the second one after it (a new second previous)."""

    __slots__ = ("_at", "_keys")

    def __init__(self) -> None:
        self._keys: list[tuple[int, int, str]] = []
        self._at: dict[str, tuple[int, int, str]] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._at

    def insert(self, entry_id: str, position: int, seq: int) -> list[str]:
        if entry_id in self._at:
            return []
        key = (position, seq, entry_id)
        insort(self._keys, key)
        self._at[entry_id] = key
        i = bisect_left(self._keys, key)
        return [self._keys[j][2] for j in (i - 1, i + 1, i + 2) if 0 <= j < len(self._keys)]

    def touching(self, entry_id: str) -> list[str]:
        """The records whose context holds this one's words (as `insert` answers)."""
        key = self._at.get(entry_id)
        if key is None:
            return []
        i = bisect_left(self._keys, key)
        return [self._keys[j][2] for j in (i - 1, i + 1, i + 2) if 0 <= j < len(self._keys)]

    def around(self, entry_id: str) -> tuple[str | None, str | None, str | None]:
        """The record before, the one after and the second one before (None: none)."""
        key = self._at.get(entry_id)
        if key is None:
            return None, None, None
        i = bisect_left(self._keys, key)

        def at(j: int) -> str | None:
            return self._keys[j][2] if 0 <= j < len(self._keys) else None

        return at(i - 1), at(i + 1), at(i - 2)
