"""Coalesced writes, in process: many Remembers (or workspace memory creations) in one
call to a shard, each answered on its own (actors/shard/remember_batch.py, packed.py), and the
gateway-side `Coalescer` that makes such calls (actors/runtime/coalesce.py). Over real Ray and
HTTP: tests/test_coalesced_http.py."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import msgspec
import pytest

from actors.contracts import (
    COALESCED,
    REPLIES,
    CallError,
    RememberCall,
    WorkspaceAccess,
    WorkspaceCreateCall,
    WorkspaceQuery,
)
from actors.runtime.coalesce import Coalescer
from actors.shard.service import ShardService
from engine.errors import Conflict, NotFound, StorageError, Unavailable
from engine.events import MemoryChanged
from engine.memory_entries import Reader
from engine.scoped_memory import WorkspaceMemoryCreate
from storage.group_commit import GroupCommitter

pytestmark = pytest.mark.usefixtures("no_env_key")
POOL = "bot:b_co"
ANN = Reader(user="u_ann", org="o_1", uses_bot=True)
BEN = Reader(user="u_ben", org="o_1", uses_bot=True)
_enc = msgspec.msgpack.Encoder()


Shard = ShardService  # what `PlacedShardService` is, without Ray's start-up guard


def _call(content: str, rid: str | None = None, reader: Reader = ANN, **kw) -> bytes:
    return _enc.encode(
        RememberCall(pool=kw.get("pool", POOL), reader=reader, content=content, request_id=rid,
                     topics=kw.get("topics", ()))
    )  # fmt: skip


async def _many(svc: Shard, calls: list[bytes]) -> list[dict | CallError]:
    replies = REPLIES.decode(await svc.remember_many(_enc.encode(calls)))
    assert len(replies) == len(calls)
    return [r if isinstance(r, CallError) else msgspec.json.decode(r) for r in replies]


def _changed(events) -> list[str]:
    return [e.data.entry for e in events if isinstance(e.data, MemoryChanged)]


def _ids(prefix: list[str]):
    """Entry ids `mem_<prefix>_<n>`: a test names the ids of the call it wants to fail."""
    n = itertools.count()
    return lambda: f"mem_{prefix[0]}_{next(n)}"


def test_each_of_30_remembers_in_one_call_gets_its_own_answer_in_one_commit(tmp_path: Path):
    async def go():
        svc = Shard(tmp_path, 0)
        try:
            await svc.remember(POOL, ANN, "warm")  # the pool's key is stored: one commit below
            calls, want = [], []
            for i in range(30):
                kind = i % 6
                if kind == 0:
                    calls.append(_call(f"note {i}", topics=("t",)))
                    want.append(("ok", f"note {i}"))
                elif kind == 1:
                    calls.append(_call("   "))
                    want.append(("err", "invalid_content"))
                elif kind == 2:
                    calls.append(b"\x93not a call")
                    want.append(("err", "invalid_input"))
                elif kind == 3:
                    calls.append(_call(f"ben {i}", reader=BEN))
                    want.append(("ok", f"ben {i}"))
                elif kind == 4:
                    calls.append(_call(f"bad tag {i}", topics=("Not A Tag!",)))
                    want.append(("err", "invalid_tag"))
                else:
                    calls.append(_call("x" * 200_000))
                    want.append(("err", "content_too_long"))
            seq = svc.events.published
            before = svc.kernel.committer.transactions
            got = await _many(svc, calls)
            txns = svc.kernel.committer.transactions - before
            events = await svc.events.after(seq)
            ann = await svc.read_memory(POOL, ANN)
            ben = await svc.read_memory(POOL, BEN)
        finally:
            await svc.close()
        return got, want, txns, events, ann, ben

    got, want, txns, events, ann, ben = asyncio.run(go())
    for answer, (kind, what) in zip(got, want, strict=True):
        if kind == "ok":
            assert isinstance(answer, dict) and answer["content"] == what, answer
        else:
            assert isinstance(answer, CallError) and answer.code == what, answer
    made = [a["id"] for a in got if isinstance(a, dict)]
    assert len(set(made)) == 10
    assert txns == 1  # the call's ten entries, their receipts and events: one group commit
    assert sorted(_changed(events)) == sorted(made)  # one memory.changed each, none else
    assert sorted(e.content for e in ann.entries) == sorted(
        ["warm", *(f"note {i}" for i in range(0, 30, 6))]
    )
    assert sorted(e.content for e in ben.entries) == sorted(f"ben {i}" for i in range(3, 30, 6))


def test_a_request_id_writes_once_within_a_call_across_calls_and_after_a_restart(
    tmp_path: Path,
):
    async def go():
        svc = Shard(tmp_path, 0)
        seq = svc.events.published
        first = await _many(
            svc,
            [
                _call("once", "r1"),
                _call("once", "r1"),  # the same request twice in one call: one write
                _call("other", "r1"),  # the same id for another request: refused
                _call("once", "r1", reader=BEN),  # ids are per caller
                _call("twice", "r2"),
            ],
        )
        # Two calls at once repeating them, then one call repeating them.
        again = await asyncio.gather(
            *(_many(svc, [_call("twice", "r2"), _call("once", "r1")]) for _ in range(24))
        )
        events = await svc.events.after(seq)
        page = await svc.read_memory(POOL, ANN)
        await svc.close()
        svc = Shard(tmp_path, 0)
        later = await _many(svc, [_call("once", "r1"), _call("other", "r1")])
        await svc.close()
        return first, again, events, page, later

    first, again, events, page, later = asyncio.run(go())
    assert first[0] == first[1] and first[0]["content"] == "once"
    assert isinstance(first[2], CallError) and first[2].code == "request_id_reused"
    assert first[3]["id"] != first[0]["id"]
    assert all(pair == [first[4], first[0]] for pair in again)
    assert sorted(e.content for e in page.entries) == ["once", "twice"]
    assert sorted(_changed(events)) == sorted([first[0]["id"], first[3]["id"], first[4]["id"]])
    assert later[0] == first[0]
    assert isinstance(later[1], CallError) and later[1].code == "request_id_reused"


def _fail_commits_with(monkeypatch, marker: str) -> list[int]:
    """Every journal append holding a row that mentions `marker` fails (counted). Term rows
    do not count: a record's batch carries the one of the record written before it (indexed
    again with its words), which is another write's."""
    original = GroupCommitter.append_record
    failed: list[int] = []

    def append(self, batches):
        rows = [w for batch in batches for w in batch if w.table != "search_terms"]
        if any(marker in repr(getattr(w, "row", "")) for w in rows):
            failed.append(len(rows))
            raise StorageError("disk full (simulated)")
        return original(self, batches)

    monkeypatch.setattr(GroupCommitter, "append_record", append)
    return failed


def test_a_failed_commit_fails_exactly_its_calls_requests_and_stores_none_of_them(
    tmp_path: Path, monkeypatch
):
    failed = _fail_commits_with(monkeypatch, "mem_doomed")
    prefix = ["kept"]

    async def go():
        svc = Shard(tmp_path, 0, new_id=_ids(prefix))
        seq = svc.events.published
        kept = await _many(svc, [_call(f"kept {i}", f"k{i}") for i in range(8)])
        # Two calls side by side: the group committer may merge them; only the doomed one fails
        # (it retries each alone), and a replay of a committed request in it is still answered.
        prefix[0] = "doomed"
        doomed_call = [_call(f"doomed {i}", f"d{i}") for i in range(8)]
        # A replay of a committed request, and a repeat of one of this call's own (which must
        # fail with it: its answer was never stored).
        doomed_call += [_call("kept 0", "k0"), _call("doomed 3", "d3")]
        task = asyncio.ensure_future(_many(svc, doomed_call))
        await asyncio.sleep(0)
        prefix[0] = "fine"
        fine = await _many(svc, [_call(f"fine {i}") for i in range(4)])
        doomed = await task
        prefix[0] = "retry"
        retried = await _many(svc, [_call("doomed 0", "d0")])
        events = await svc.events.after(seq)
        await svc.close()
        svc = Shard(tmp_path, 0)
        page = await svc.read_memory(POOL, ANN)
        await svc.close()
        return kept, doomed, fine, retried, events, page

    kept, doomed, fine, retried, events, page = asyncio.run(go())
    assert failed, "the doomed call's commit was never tried"
    assert all(isinstance(d, CallError) and d.kind == "StorageError" for d in doomed[:8])
    assert doomed[8] == kept[0]  # answered before, committed before: still answered
    assert isinstance(doomed[9], CallError) and doomed[9].kind == "StorageError"
    assert all(isinstance(a, dict) for a in [*kept, *fine, *retried])
    assert retried[0]["id"].startswith("mem_retry_")  # the failed answer was never kept
    contents = sorted(e.content for e in page.entries)
    assert contents == sorted(
        [*(f"kept {i}" for i in range(8)), *(f"fine {i}" for i in range(4)), "doomed 0"]
    )
    assert not any("doomed" in i for i in _changed(events))  # no event for what failed
    assert len(_changed(events)) == 8 + 4 + 1


def test_calls_for_several_pools_and_a_pool_that_fails_to_load_fail_only_their_own(
    tmp_path: Path,
):
    async def go():
        svc = Shard(tmp_path, 0)
        load = svc.kernel.store.load

        async def broken(pool_id: str):
            if pool_id == "bot:b_broken":
                raise StorageError("cannot read this pool (simulated)")
            return await load(pool_id)

        svc.kernel.store.load = broken
        got = await _many(
            svc,
            [
                _call("in a", pool="bot:b_a"),
                _call("in b", pool="bot:b_b"),
                _call("lost", pool="bot:b_broken"),
                _call("in a again", pool="bot:b_a"),
            ],
        )
        pages = [await svc.read_memory(p, ANN) for p in ("bot:b_a", "bot:b_b")]
        await svc.close()
        return got, pages

    got, (a, b) = asyncio.run(go())
    assert [g["content"] for g in got if isinstance(g, dict)] == ["in a", "in b", "in a again"]
    assert isinstance(got[2], CallError) and got[2].kind == "StorageError"
    assert sorted(e.content for e in a.entries) == ["in a", "in a again"]
    assert [e.content for e in b.entries] == ["in b"]


def test_workspace_creations_in_one_call_each_get_their_own_answer(tmp_path: Path):
    ann = WorkspaceAccess(account="u_ann", bots=frozenset({"b_ws"}))

    def create(content: str, rid: str, access: WorkspaceAccess = ann, scope: str = "user") -> bytes:
        body = WorkspaceMemoryCreate(bot="b_ws", scope=scope, content=content, requestId=rid)
        return _enc.encode(WorkspaceCreateCall(access=access, body=body))

    async def go():
        svc = Shard(tmp_path, 0)
        calls = [create(f"fact {i}", f"w{i}") for i in range(24)]
        calls += [
            create("fact 0", "w0"),  # a repeat of the first: its answer, no second record
            create("another", "w0"),  # the same id for another request
            create("nobody's", "w99", access=WorkspaceAccess(account="u_eve")),  # no use of the bot
            create("bad id", "has spaces and is not an id"),
            b"\x93junk",
        ]
        replies = REPLIES.decode(await svc.workspace_create_memory_many(_enc.encode(calls)))
        # Answered by the first call: replayed, or refused for another body under the id.
        again = REPLIES.decode(
            await svc.workspace_create_memory_many(
                _enc.encode([*calls[:2], create("changed", "w1"), create("fact 99", "w99")])
            )
        )
        await svc.close()
        return replies, again

    replies, again = asyncio.run(go())
    views = [msgspec.json.decode(r) for r in replies[:25]]
    assert [v["content"] for v in views[:24]] == [f"fact {i}" for i in range(24)]
    assert len({v["id"] for v in views[:24]}) == 24
    assert views[24] == views[0]
    codes = [r.code for r in replies[25:] if isinstance(r, CallError)]
    assert codes[0] == "request_id_reused"
    assert [r.kind for r in replies[25:]] == [
        "Conflict",
        "Forbidden",
        "InvalidInput",
        "InvalidInput",
    ]
    assert [msgspec.json.decode(r) for r in again[:2]] == views[:2]
    assert isinstance(again[2], CallError) and again[2].code == "request_id_reused"
    assert msgspec.json.decode(again[3])["content"] == "fact 99"


def test_each_creation_of_a_call_is_checked_for_its_own_caller_and_pool(tmp_path: Path):
    """A call's requests from one caller to one pool are checked once; any other caller or
    pool, in any order, is checked on its own: one may write, the next may not."""
    ann = WorkspaceAccess(account="u_ann", bots=frozenset({"b_ws"}))
    eve = WorkspaceAccess(account="u_eve", bots=frozenset({"b_eve"}))

    def create(rid: str, access: WorkspaceAccess, bot: str = "b_ws") -> bytes:
        body = WorkspaceMemoryCreate(bot=bot, scope="user", content=f"fact {rid}", requestId=rid)
        return _enc.encode(WorkspaceCreateCall(access=access, body=body))

    calls = [
        create("a1", ann),
        create("a2", ann, bot="b_eve"),  # the same caller, a bot it does not use
        create("e1", eve, bot="b_ws"),  # another caller, the first one's bot
        create("a3", ann),
        create("e2", eve),  # may write its own user pool through its own bot
        create("a4", ann),
    ]

    async def go(path: Path, together: bool):
        svc = Shard(path, 0)
        if together:
            replies = REPLIES.decode(await svc.workspace_create_memory_many(_enc.encode(calls)))
        else:
            replies = []
            for c in calls:
                replies += REPLIES.decode(await svc.workspace_create_memory_many(_enc.encode([c])))
        await svc.close()
        return [
            (r.kind, r.code) if isinstance(r, CallError) else msgspec.json.decode(r)["pool"]
            for r in replies
        ]

    together = asyncio.run(go(tmp_path / "one", True))
    assert together == asyncio.run(go(tmp_path / "each", False))  # as each alone
    assert together[:2] == ["user:u_ann", ("Forbidden", "no_access")]
    assert together[2] == ("Forbidden", "no_access") and together[3] == "user:u_ann"
    assert together[5] == "user:u_ann" and together[4] != together[3]


# --- the gateway's side: the Coalescer -------------------------------------------------------


class FakeShard:
    """Answers each request with its reversed bytes, or an error for b"bad"; records the calls;
    each call takes one loop turn per request (so others can queue meanwhile)."""

    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []
        self.failing: set[int] = set()  # which calls fail as a whole (0: the first)

    async def send(self, call: bytes) -> bytes:
        requests = COALESCED.decode(call)
        self.calls.append(requests)
        n = len(self.calls) - 1
        for _ in range(3):
            await asyncio.sleep(0)
        if n in self.failing:
            raise Unavailable("the engine is restarting; try again", code="engine_unavailable")
        out: list[bytes | CallError] = []
        for r in requests:
            if r == b"bad":
                out.append(CallError.of(Conflict("no", code="nope", details={"at": 1})))
            elif r == b"gone":
                out.append(CallError.of(NotFound("missing")))
            else:
                out.append(r[::-1])
        return _enc.encode(out)


def test_an_idle_coalescer_sends_at_once_and_a_busy_one_queues_into_the_next_call():
    async def go():
        shard = FakeShard()
        co = Coalescer(shard.send)
        alone = await co.call(b"one")
        first = asyncio.ensure_future(co.call(b"first"))
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # its call is in flight
        assert shard.calls == [[b"one"], [b"first"]]
        requests = [b"bad" if i % 5 == 0 else b"gone" if i % 7 == 0 else f"r{i}".encode()
                    for i in range(30)]  # fmt: skip
        got = await asyncio.gather(*(co.call(r) for r in requests), return_exceptions=True)
        return shard, alone, await first, requests, got, co

    shard, alone, first, requests, got, co = asyncio.run(go())
    assert (alone, first) == (b"eno", b"tsrif")
    # The burst came while a call was in flight: all 30 go in the next call, none alone.
    assert shard.calls[2:] == [requests]
    assert (co.calls, co.requests) == (3, 32)
    for r, g in zip(requests, got, strict=True):
        if r == b"bad":
            assert isinstance(g, Conflict) and g.code == "nope" and g.details == {"at": 1}
        elif r == b"gone":
            assert isinstance(g, NotFound) and g.code == "not_found"
        else:
            assert g == r[::-1]


def test_a_failed_call_fails_its_requests_only_and_cancelled_ones_are_not_sent():
    async def go():
        shard = FakeShard()
        co = Coalescer(shard.send, max_requests=4)
        shard.failing = {0}
        first = asyncio.ensure_future(co.call(b"a"))
        await asyncio.sleep(0)  # in flight
        queued = [asyncio.ensure_future(co.call(f"q{i}".encode())) for i in range(6)]
        gone = asyncio.ensure_future(co.call(b"cancelled"))
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(Unavailable):
            await first
        got = await asyncio.gather(*queued)
        return shard, got

    shard, got = asyncio.run(go())
    assert got == [f"q{i}".encode()[::-1] for i in range(6)]
    assert shard.calls == [[b"a"], [b"q0", b"q1", b"q2", b"q3"], [b"q4", b"q5"]]  # at most 4
    assert all(b"cancelled" not in c for c in shard.calls)


def test_a_bug_in_one_request_fails_its_pools_share_and_stores_none_of_it(tmp_path: Path):
    async def go():
        svc = Shard(tmp_path, 0)
        await svc.remember(POOL, ANN, "before")
        seal = svc.kernel.store.seal_content

        def buggy(stored, entry_id, content):
            if content == "trips a bug":
                raise RuntimeError("a bug after the entry was half applied")
            return seal(stored, entry_id, content)

        svc.kernel.store.seal_content = buggy
        seq = svc.events.published
        got = await _many(
            svc,
            [
                _call("staged first"),
                _call("trips a bug"),
                _call("   "),  # refused on its own, as always
                _call("elsewhere", pool="bot:b_other"),
                _call("after it"),
            ],
        )
        events = await svc.events.after(seq)
        page = await svc.read_memory(POOL, ANN)
        await svc.close()
        return got, events, page

    got, events, page = asyncio.run(go())
    assert [g.code if isinstance(g, CallError) else g["content"] for g in got] == [
        "engine_error",
        "engine_error",
        "invalid_content",
        "elsewhere",
        "engine_error",
    ]
    assert [e.content for e in page.entries] == ["before"]  # reloaded: nothing of the call
    assert len(_changed(events)) == 1  # the other pool's entry only


def test_a_failed_workspace_commit_fails_exactly_its_calls_creations(tmp_path: Path, monkeypatch):
    """A pool's creations of one call are one batch: a failed commit fails them all, stores
    none of them, and nothing else (a replay of a committed creation, another call)."""
    failed = _fail_commits_with(monkeypatch, "mem_doomed")
    ann = WorkspaceAccess(account="u_ann", bots=frozenset({"b_ws"}))
    prefix = ["kept"]
    n = itertools.count()

    def create(i: int) -> bytes:
        body = WorkspaceMemoryCreate(
            bot="b_ws", scope="user", content=f"fact {i}", requestId=f"f{i}"
        )
        return _enc.encode(WorkspaceCreateCall(access=ann, body=body))

    async def many(svc: Shard, calls: list[bytes]) -> list:
        return REPLIES.decode(await svc.workspace_create_memory_many(_enc.encode(calls)))

    async def go():
        svc = Shard(tmp_path, 0)
        svc.workspace.new_id = lambda: f"mem_{prefix[0]}_{next(n)}"
        kept = await many(svc, [create(i) for i in range(3)])
        prefix[0] = "doomed"
        doomed = asyncio.ensure_future(
            many(svc, [create(i) for i in range(3, 7)] + [create(0), create(4)])
        )
        await asyncio.sleep(0)
        prefix[0] = "fine"
        fine = await many(svc, [create(i) for i in range(7, 9)])
        doomed = await doomed
        prefix[0] = "retry"
        retried = await many(svc, [create(3)])
        listing = await svc.workspace_entries(ann, WorkspaceQuery(pools=("user:u_ann",)))
        await svc.close()
        return kept, doomed, fine, retried, listing

    kept, doomed, fine, retried, listing = asyncio.run(go())
    assert failed
    assert [r.kind if isinstance(r, CallError) else "ok" for r in doomed] == [
        "StorageError", "StorageError", "StorageError", "StorageError", "ok", "StorageError"
    ]  # fmt: skip
    assert doomed[4] == kept[0]  # a replay of a committed creation is still answered
    assert all(isinstance(r, bytes) for r in [*kept, *fine, *retried])
    assert msgspec.json.decode(retried[0])["id"].startswith("mem_retry_")
    contents = sorted(e.content for e in listing.entries)
    assert contents == sorted(f"fact {i}" for i in (0, 1, 2, 3, 7, 8))


class HeldShard:
    """Each call waits until the test releases it (by its index); records the calls."""

    def __init__(self) -> None:
        self.calls: list[list[bytes]] = []
        self.gates: list[asyncio.Event] = []

    async def send(self, call: bytes) -> bytes:
        requests = COALESCED.decode(call)
        self.calls.append(requests)
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        return _enc.encode([r[::-1] for r in requests])


async def _turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_two_calls_in_flight_the_next_requests_go_while_the_first_call_waits():
    async def go():
        shard = HeldShard()
        co = Coalescer(shard.send, max_calls=2)
        first = asyncio.ensure_future(co.call(b"a"))
        await _turns()
        # The first call is held (its group syncing): the next request goes in a call of its
        # own at once, instead of waiting for the first to come back.
        second = asyncio.ensure_future(co.call(b"b"))
        await _turns()
        assert shard.calls == [[b"a"], [b"b"]]
        queued = [asyncio.ensure_future(co.call(r)) for r in (b"c", b"d", b"e")]
        await _turns()
        assert len(shard.calls) == 2  # at most two in flight: these wait for one to return
        shard.gates[1].set()  # the second returns first: its task takes all that queued
        await _turns()
        assert shard.calls[2] == [b"c", b"d", b"e"]
        assert await second == b"b" and not first.done()
        shard.gates[0].set()
        shard.gates[2].set()
        return await first, await asyncio.gather(*queued), co

    first, queued, co = asyncio.run(go())
    assert (first, queued) == (b"a", [b"c", b"d", b"e"])
    assert (co.calls, co.requests) == (3, 5)


class FakeActor:
    """A shard actor's handle for `RayShard` without Ray: the coalesced Remember calls, plain
    and followed, held until the test answers them; the event poll never answers."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, asyncio.Future]] = []
        self.remember_many = self._method("plain")
        self.remember_many_followed = self._method("followed")
        self.events_packed = self._method("poll")

    def _method(self, kind: str):
        actor = self

        class Method:
            @staticmethod
            def remote(*args):
                fut = asyncio.get_running_loop().create_future()
                actor.sent.append((kind, fut))
                return fut

        return Method()


def test_two_write_calls_in_flight_both_bring_events_back_and_each_event_comes_once():
    from actors.contracts import EventBatch, Followed
    from actors.runtime.shard_proxy import RayShard
    from engine.events import NOBODY, Event, MemoryChanged, ShardHead

    def event(seq: int) -> Event:
        data = MemoryChanged(pool="bot:b", bot="b", entry=f"m{seq}", version=seq, change="created")
        return Event(seq=seq, at=seq, data=data, audience=NOBODY)

    def followed(reply: bytes, events: list[Event], head: int) -> bytes:
        batch = EventBatch(head=ShardHead(epoch="e", oldest=0, head=head), events=events)
        return _enc.encode(
            Followed(replies=msgspec.Raw(_enc.encode([reply])), events=batch, upto=head)
        )

    async def go():
        actor = FakeActor()
        port = RayShard("s", "ns", handle=actor)
        port.write_calls = 2
        pump = asyncio.ensure_future(port.events_after(0, wait=30))  # a pump follows here
        await _turns()
        a = asyncio.ensure_future(port.remember_packed(b"a"))
        await _turns()
        b = asyncio.ensure_future(port.remember_packed(b"b"))
        await _turns()
        # Both follow: a call sent plain would leave its commit's events to the pump's poll,
        # one more Ray call per commit.
        assert [k for k, _ in actor.sent] == ["poll", "followed", "followed"]
        # Both said the same `seen`: the second's reply (answered first) carries the first
        # call's event too, and the first's reply comes after with that event again.
        actor.sent[2][1].set_result(followed(b"b!", [event(1), event(2)], 2))
        actor.sent[1][1].set_result(followed(b"a!", [event(1)], 1))
        got = (await a, await b)
        head, events = await pump
        return got, [e.seq for e in events], head.head

    got, seqs, head = asyncio.run(go())
    assert got == (b"a!", b"b!")
    assert (seqs, head) == ([1, 2], 2)  # each event once, in order


def test_a_second_call_waits_until_as_many_requests_wait_as_the_first_carries():
    async def go():
        shard = HeldShard()
        co = Coalescer(shard.send, max_calls=2)
        a = asyncio.ensure_future(co.call(b"a"))
        await _turns()
        b = asyncio.ensure_future(co.call(b"b"))
        await _turns()
        burst = [asyncio.ensure_future(co.call(f"x{i}".encode())) for i in range(3)]
        await _turns()
        shard.gates[0].set()  # the first returns: its task takes the burst (3) in one call
        await _turns()
        shard.gates[1].set()  # the second returns with nothing queued: two calls end, one left
        await _turns()
        assert shard.calls[2] == [b"x0", b"x1", b"x2"] and len(shard.calls) == 3
        # One call of 3 in flight: 2 waiting requests do not make a call of their own ...
        late = [asyncio.ensure_future(co.call(f"y{i}".encode())) for i in range(2)]
        await _turns()
        assert len(shard.calls) == 3
        # ... the third does: a call as large as the one in flight.
        late.append(asyncio.ensure_future(co.call(b"y2")))
        await _turns()
        assert shard.calls[3] == [b"y0", b"y1", b"y2"]
        shard.gates[2].set()
        shard.gates[3].set()
        return await a, await b, await asyncio.gather(*burst), await asyncio.gather(*late)

    a, b, burst, late = asyncio.run(go())
    assert (a, b) == (b"a", b"b")
    assert burst == [f"x{i}".encode()[::-1] for i in range(3)]
    assert late == [f"y{i}".encode()[::-1] for i in range(3)]


def test_each_event_loop_has_its_own_coalescers_whichever_asked_last():
    """A shard proxy's writes are per event loop (a coalescer's futures belong to one), also
    when loops take turns and when the last loop that asked is gone."""
    from actors.runtime.shard_proxy import RayShard

    proxy = RayShard("shard", "ns", handle=object())

    async def mine():
        return proxy.writes()

    loop_a, loop_b = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        first_a = loop_a.run_until_complete(mine())
        first_b = loop_b.run_until_complete(mine())
        assert first_a is not first_b
        assert loop_a.run_until_complete(mine()) is first_a
        assert loop_a.run_until_complete(mine()) is first_a
        assert loop_b.run_until_complete(mine()) is first_b
    finally:
        loop_a.close()
        loop_b.close()
    del loop_a, loop_b
    assert asyncio.run(mine()) not in (first_a, first_b)  # a new loop: writes of its own
