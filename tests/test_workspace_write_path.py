"""The workspace memory write path over HTTP (as fast as Remember): a creation's
answer is its HTTP body from the shard on, and a well-formed creation is decoded in one pass,
with every other body decoded (and refused) as before."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from actors.contracts import WORKSPACE_ENTRY_VIEW, WorkspaceAccess, WorkspaceCreateCall
from actors.directory import DirectoryService
from actors.shard.service import ShardService
from engine.casing import to_wire
from engine.errors import InvalidInput
from engine.memory_entries import Scope
from engine.scoped_memory import WorkspaceMemoryChange, WorkspaceMemoryCreate
from gateway import wire
from gateway.workspace_memory_routes import decode_memory_write
from tests.waiting import until

ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))

pytestmark = pytest.mark.usefixtures("no_env_key")


def test_a_created_records_answer_is_the_body_the_gateway_would_encode(tmp_path: Path):
    """The shard answers a workspace creation with its HTTP body (JSON), which the gateway sends
    on as it is: the same bytes as its own encoding of the view (camelCase keys, nulls kept)."""

    async def main() -> tuple[bytes, bytes]:
        svc = ShardService(tmp_path, 0)
        svc.peers.connect(directory=DirectoryService(tmp_path))
        body = WorkspaceMemoryCreate(
            requestId="r-1", scope=Scope.USER, bot="b_1", content="Tea at 5."
        )
        call = msgspec.msgpack.encode(WorkspaceCreateCall(access=ANN, body=body))
        alone = await svc.workspace_create_memory_packed(call)
        (many,) = msgspec.msgpack.decode(
            await svc.workspace_create_memory_many(msgspec.msgpack.encode([call]))
        )
        await svc.close()
        svc.peers.directory().store.db.close()
        return alone, many

    alone, many = asyncio.run(main())
    view = WORKSPACE_ENTRY_VIEW.decode(alone)
    assert view.content == "Tea at 5." and view.layer is None
    assert alone == msgspec.json.encode(to_wire(view)) == many  # (a replay: the same bytes)


def _slow(body: bytes):
    """Every body decoded the general way, without the one-pass path (the reference)."""
    raw = wire.decode_any(body)
    if not isinstance(raw, dict):
        raise InvalidInput("body must be a JSON object", code="invalid_body")
    kind = WorkspaceMemoryChange if "expectedRevision" in raw else WorkspaceMemoryCreate
    try:
        return msgspec.convert(raw, type=kind)
    except msgspec.ValidationError as e:
        raise InvalidInput(str(e), code="invalid_body") from e


@pytest.mark.parametrize(
    "body",
    [
        b'{"requestId": "r-1", "scope": "user", "bot": "b_1", "content": "Tea at 5."}',
        b'{"requestId": "r-1", "scope": "bot", "bot": "b_1", "content": "x", "tier": "note",'
        b' "topics": ["a", "b"]}',
        b'{"request_id": "r-1", "scope": "user", "bot": "b_1", "content": "old names"}',
        b'{"requestId": "r-1", "id": "mem_1", "expectedRevision": 2, "content": "an edit"}',
    ],
)
def test_a_memory_write_decodes_as_before(body: bytes):
    got = decode_memory_write(body)
    assert type(got) is type(_slow(body)) and got == _slow(body)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"", "invalid_json"),
        (b"{", "invalid_json"),
        (b"[1]", "invalid_body"),
        (b'{"requestId": "r-1", "scope": "user", "bot": "b_1"}', "invalid_body"),
        (b'{"requestId": "r-1", "scope": "user", "bot": "b_1", "content": 5}', "invalid_body"),
        (b'{"requestId": "r", "scope": "user", "bot": "b", "content": "x", "extra": 1}', None),
    ],
)
def test_a_bad_memory_write_is_refused_as_before(body: bytes, code: str | None):
    with pytest.raises(InvalidInput) as fast:
        decode_memory_write(body)
    with pytest.raises(InvalidInput) as slow:
        _slow(body)
    assert (fast.value.code, str(fast.value)) == (slow.value.code, str(slow.value))
    assert code is None or fast.value.code == code


def test_request_locks_taken_together_exclude_each_other_and_are_released_on_cancel():
    """`WorkspaceReceipts.requests` (a coalesced call's requestIds) waits for a key that a single
    write holds, never holds two bodies of one key at once (32 calls racing over 4 keys), and
    a call cancelled while waiting leaves no lock and no slot behind."""
    from actors.workspace.receipts import WorkspaceReceipts

    receipts = WorkspaceReceipts(kernel=None)  # type: ignore[arg-type]  # (locks only)
    holders: dict[str, int] = {}
    clash = []

    async def call(keys: list[str]) -> None:
        async with receipts.requests(keys):
            for k in set(keys):
                holders[k] = holders.get(k, 0) + 1
                clash.extend([k] if holders[k] > 1 else [])
            await asyncio.sleep(0)
            for k in set(keys):
                holders[k] -= 1

    async def main() -> None:
        keys = ["a", "b", "c", "d"]
        await asyncio.gather(*(call([keys[i % 4], keys[(i * 3) % 4], "a"]) for i in range(32)))
        assert not clash and receipts.requests_in_flight() == {}
        async with receipts.request("b"):
            waiting = asyncio.ensure_future(call(["a", "b"]))
            # The call holds "a" and waits for "b", which this request holds.
            await until(lambda: receipts.requests_in_flight().get("b") == (True, 2))
            assert not waiting.done()
            assert receipts.requests_in_flight() == {"a": (True, 1), "b": (True, 2)}
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
        assert receipts.requests_in_flight() == {}

    asyncio.run(main())


def test_a_request_cancelled_as_it_is_handed_the_key_hands_it_on():
    """The holder of a requestId's turn leaves and hands it to the first waiter, which is
    cancelled before it runs: the turn goes on to the next waiter (nobody is left waiting
    for a key nobody holds), and nothing is left behind."""
    from actors.workspace.receipts import WorkspaceReceipts

    receipts = WorkspaceReceipts(kernel=None)  # type: ignore[arg-type]  # (locks only)
    got: list[str] = []

    async def wait_for(name: str) -> None:
        async with receipts.request("k"):
            got.append(name)

    async def main() -> None:
        async with receipts.request("k"):
            first = asyncio.ensure_future(wait_for("first"))
            second = asyncio.ensure_future(wait_for("second"))
            await until(lambda: receipts.requests_in_flight().get("k") == (True, 3))
        first.cancel()  # handed the turn on the way out above, not run yet
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.wait_for(second, 5)
        assert got == ["second"] and receipts.requests_in_flight() == {}

    asyncio.run(main())


def test_a_bot_records_audience_is_kept_by_pool_and_tags_and_a_projects_never():
    """Who hears of a change: a bot record's audience depends on its pool and tags alone and
    is kept; a project's follows its members as they change (never kept)."""
    from types import SimpleNamespace

    from actors.workspace.access import WorkspaceRules
    from engine import scoped_memory as sm
    from engine.events import NOBODY, Audience

    members = {"p1": SimpleNamespace(org="o_p", members=("u_a",))}
    projects = SimpleNamespace(known=lambda: members)
    rules = WorkspaceRules(
        pools=SimpleNamespace(get=lambda _pool: None), projects=projects, peers=None, index=0
    )

    def record(pool: str, tags: tuple[str, ...]) -> sm.WorkspaceEntry:
        return sm.user_create(
            entry_id="mem_1", pool=pool, contributor="b1", content="x", operator="u_a", now=1,
            tags=tags,
        ).entry  # fmt: skip

    one = ("from:u_a", "for:bot", "org:o1")
    for _ in range(2):  # asked again: the same answer
        assert rules.audience("bot:b1", record("bot:b1", one)) == Audience(org="o1", bot="b1")
        assert rules.audience("bot:b2", record("bot:b2", one)) == Audience(org="o1", bot="b2")
        two = record("bot:b1", (*one, "org:o2"))
        assert rules.audience("bot:b1", two) == NOBODY
    in_project = record("project:p1", ())
    assert rules.audience("project:p1", in_project) == Audience(org="o_p", users=("u_a",))
    members["p1"] = SimpleNamespace(org="o_p", members=("u_a", "u_b"))
    assert rules.audience("project:p1", in_project) == Audience(org="o_p", users=("u_a", "u_b"))
