"""A shard's durable event log (docs/design.md §8).

Events get shard-wide sequence numbers when they are queued and are written in the same group
commit transaction as the change they describe; they are *published* (handed to listeners) only
once that transaction committed, in seq order. The newest events stay in memory for live
delivery and short resumes; older ones are read back from the file. The log keeps the last
`retain` events; a cursor older than that gets `reset`.

The epoch is a random id stored in the file when it is created. It survives restarts, so cursors
stay valid across them; a restored or replaced data directory must get a new one (`new_epoch`),
and cursors from the old epoch are then reset.
"""

from __future__ import annotations

import asyncio
import bisect
import secrets
from collections.abc import Sequence
from pathlib import Path

import msgspec

from engine.events import Audience, Event, Payload, ShardHead
from storage.database import Database, new_private_dir
from storage.group_commit import DeleteBelow, Insert, Write
from storage.shard_schema import EVENTS

# A snapshot carries this instead of an epoch: whoever opens it next gives it a new one, so
# cursors handed out before the backup cannot silently resume against restored data.
RESTORED = "restored"
MARK_RESTORED = "UPDATE snap.shard_meta SET value = 'restored' WHERE key = 'epoch'"
_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(Event)
RING = 10_000
FOLLOWERS = 256  # followers whose handed-over events a shard remembers (a few per gateway)


def backup_offline(data_dir: Path, dest_dir: Path, *, with_key: bool = False) -> list[str]:
    """Snapshot a stopped server's data directory (no process may hold its files) into a new
    folder of mode 0700, files 0600; the master key only `with_key`."""
    from storage.crypto import KEY_FILE, write_key_copy
    from storage.data_dir_io import open_shard
    from storage.directory_store import MIGRATIONS as DIRECTORY_MIGRATIONS
    from storage.group_commit import FORGET_JOURNAL

    new_private_dir(dest_dir)
    files = []
    for path in sorted(data_dir.glob("*.duckdb")):
        if path.name.startswith("shard-"):
            # Opening applies the commit journal a crash left: the copy has every write.
            db, committer = open_shard(path)
            then = [MARK_RESTORED, FORGET_JOURNAL]
        else:
            db, committer, then = Database(path, DIRECTORY_MIGRATIONS), None, []
        try:
            asyncio.run(db.snapshot(dest_dir / path.name, then))
        finally:
            if committer is not None:
                committer.release()
            db.close()
        files.append(str(dest_dir / path.name))
    if with_key:
        files.append(str(write_key_copy(data_dir, dest_dir / KEY_FILE)))
    return files


def new_epoch(db: Database) -> str:
    """Give the file a new epoch (after a restore or import): old cursors will be reset."""
    epoch = secrets.token_hex(8)

    def write(con):
        con.execute("DELETE FROM shard_meta WHERE key = 'epoch'")
        con.execute("INSERT INTO shard_meta VALUES ('epoch', ?)", [epoch])

    db.run_sync(write)
    return epoch


class EventLog:
    def __init__(self, db: Database, *, retain: int = 100_000) -> None:
        self.db = db
        self.retain = retain
        rows = db.query("SELECT value FROM shard_meta WHERE key = 'epoch'")
        self.epoch = rows[0][0] if rows and rows[0][0] != RESTORED else new_epoch(db)
        first, last = db.query("SELECT min(seq), max(seq) FROM events")[0]
        self.published = last or 0
        self.oldest = first or self.published + 1
        self._next = self.published + 1
        recent = db.query(
            "SELECT doc FROM events WHERE seq > ? ORDER BY seq", [self.published - RING]
        )
        # Newest events, in seq order (seqs may have gaps where a transaction failed).
        self._ring: list[Event] = [_dec.decode(doc) for (doc,) in recent]
        self._new = asyncio.Event()
        # Follower (a gateway's view of this log) → the last seq it was handed with a reply of
        # its own (a coalesced write's, `handed`): its waiting poll need not answer for those.
        self._handed: dict[str, int] = {}
        # Polls waiting for new events now, and polls that waited so far: what a caller (a
        # test) can wait on or check instead of timing a poll.
        self.waiting = 0
        self.waits = 0

    @property
    def staged(self) -> int:
        """The last seq handed out: every change made so far is described by events <= this."""
        return self._next - 1

    def head(self) -> ShardHead:
        return ShardHead(epoch=self.epoch, oldest=self.oldest, head=self.published)

    def stage(
        self, items: Sequence[tuple[Payload, Audience]], at: int
    ) -> tuple[list[Event], list[Write]]:
        """Number new events and the rows that store them (to go in the change's batch)."""
        events: list[Event] = []
        writes: list[Write] = []
        for data, audience in items:
            event = Event(seq=self._next, at=at, data=data, audience=audience)
            self._next += 1
            events.append(event)
            kind = data.__struct_config__.tag
            writes.append(Insert(EVENTS.name, (event.seq, at, kind, _enc.encode(event).decode())))
        if events and events[-1].seq % 1000 == 0 and events[-1].seq > self.retain:
            writes.append(DeleteBelow(EVENTS.name, "seq", events[-1].seq - self.retain + 1))
        return events, writes

    def publish(self, events: Sequence[Event]) -> None:
        """Called once the events' transaction committed (in commit order)."""
        if not events:
            return
        self._ring.extend(events)
        if len(self._ring) > 2 * RING:
            del self._ring[:-RING]
        self.published = events[-1].seq
        floor = self.published - self.retain + 1
        if floor > self.oldest:
            self.oldest = floor
        self._new.set()
        self._new = asyncio.Event()

    def handed(self, follower: str, upto: int) -> None:
        """`follower` got every published event up to `upto` with a reply of its own (a write's,
        actors/shard/packed.py): its waiting poll need not answer for them. Its concurrent
        writes' replies can note theirs out of order: the note keeps the highest."""
        known = self._handed.pop(follower, -1)  # re-inserted: the oldest follower goes first
        self._handed[follower] = max(known, upto)
        if len(self._handed) > FOLLOWERS:
            del self._handed[next(iter(self._handed))]

    def _covered(self, seq: int, follower: str | None) -> bool:
        """Nothing published after `seq` that `follower` was not handed already."""
        return seq >= self.published or (
            follower is not None and self._handed.get(follower, -1) >= self.published
        )

    async def after(self, seq: int, *, limit: int = 1000, wait: float = 0.0) -> list[Event]:
        """Published events with seq > `seq` (up to `limit`), oldest first; waits up to `wait`
        s for new ones."""
        return (await self.page(seq, limit=limit, wait=wait))[0]

    async def page(
        self, seq: int, *, limit: int = 1000, wait: float = 0.0
    ) -> tuple[list[Event], ShardHead]:
        """`after`, with the head the events were read at: they are every published event in
        (`seq`, head] (up to `limit`), even when the log moved on while they were read."""
        await self._wait(seq, wait, None)
        return await self._read(seq, limit)

    async def follow_page(
        self, seq: int, follower: str, *, limit: int = 1000, wait: float = 0.0
    ) -> tuple[int, list[Event], ShardHead]:
        """A follower's poll (actors/runtime/follow.py): `page`, but it also waits while every
        event it would answer with was handed to the follower already (`handed`): one answer
        then covers several commits, and the events come with the write replies meanwhile. It
        answers from the last seq handed to the follower if that is past `seq` (a poll sent
        long ago need not resend what replies brought since): the events are every published
        event in (since, head], and `since` comes first in the answer."""
        await self._wait(seq, wait, follower)
        since = max(seq, self._handed.get(follower, -1))
        return (since, *await self._read(since, limit))

    async def _wait(self, seq: int, wait: float, follower: str | None) -> None:
        if wait <= 0 or not self._covered(seq, follower):
            return
        deadline = asyncio.get_running_loop().time() + wait
        self.waiting += 1
        self.waits += 1
        try:
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    return
                try:
                    # (not `wait_for`: on 3.11 it can swallow a cancellation that comes as the
                    # event is set, and the poll would wait on after its caller left)
                    async with asyncio.timeout(remaining):
                        await self._new.wait()
                except TimeoutError:
                    return
                # The writes that this publish answers reply in this turn of the loop: let them
                # record what they handed over before deciding whether this poll must answer.
                await asyncio.sleep(0)
                if not self._covered(seq, follower):
                    return
        finally:
            self.waiting -= 1

    async def _read(self, seq: int, limit: int) -> tuple[list[Event], ShardHead]:
        if seq >= self.published:
            return [], self.head()
        ring = self._ring
        if ring and seq + 1 >= ring[0].seq:
            start = bisect.bisect_right(ring, seq, key=lambda e: e.seq)
            return ring[start : start + limit], self.head()
        published = self.published
        head = self.head()
        rows = await self.db.run(
            lambda con: con.execute(
                "SELECT doc FROM events WHERE seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                [seq, published, limit],
            ).fetchall()
        )
        return [_dec.decode(doc) for (doc,) in rows], head
