"""The shards' lane (actors/runtime/lane.py) when things go wrong: socket folders left by killed
shards, a path over the AF_UNIX limit, a host that raises what is not an Exception or an error
msgpack cannot carry, an answer over MAX_FRAME, and every engine error class coming back as Ray
would give it back."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from actors.contracts import LaneAddress, StepCall, StepOutcome
from actors.runtime import lane as lane_mod
from actors.runtime.lane import LaneClient, LaneServer
from engine.errors import Conflict, OpenBotError, Unavailable
from tests.test_shard_lane import NODE, Host, _call


@pytest.fixture
def base(monkeypatch):
    """A temp dir of the test's own (short: socket paths), used as the lanes' temp dir."""
    folder = tempfile.mkdtemp(prefix="obt-", dir="/tmp")
    monkeypatch.setattr(tempfile, "tempdir", folder)
    monkeypatch.delenv("RAY_TMPDIR", raising=False)  # set by a Ray session in this process
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _client(server: LaneServer, asked: list[int] | None = None) -> LaneClient:
    async def address() -> LaneAddress | None:
        if asked is not None:
            asked.append(1)
        return await server.open()

    return LaneClient(address, NODE)


async def _ok(call: StepCall) -> StepOutcome:
    return StepOutcome(status="done", reply=call.step.text)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _socket_in(folder: str, listen: bool) -> socket.socket | None:
    os.makedirs(folder, mode=0o700)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(os.path.join(folder, "s"))
    if listen:
        s.listen()
        return s
    s.close()  # the file stays, nobody listens: what a killed shard leaves
    return None


@pytest.mark.subprocess
def test_folders_of_killed_shards_are_swept_and_a_closed_server_opens_none(base):
    asyncio.run(_swept(base))


async def _swept(base: str) -> None:
    dead = _dead_pid()
    crashed = os.path.join(base, f"oblane-{dead}-abc")
    _socket_in(crashed, listen=False)
    still = os.path.join(base, f"oblane-{dead}-live")  # its pid is gone but someone listens
    listener = _socket_in(still, listen=True)
    mine = os.path.join(base, f"oblane-{os.getppid()}-up")  # a live process's
    _socket_in(mine, listen=False)
    old, young = os.path.join(base, "oblane-oldstyle"), os.path.join(base, "oblane-young")
    os.makedirs(old)
    os.makedirs(young)
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    server = LaneServer(NODE, Host(_ok))
    try:
        address = await server.open()
        assert address is not None and address.path.startswith(base)
        left = set(os.listdir(base))
        assert os.path.basename(crashed) not in left and "oblane-oldstyle" not in left
        assert {os.path.basename(still), os.path.basename(mine), "oblane-young"} <= left
        server.close()
        assert not os.path.exists(os.path.dirname(address.path))
        before = set(os.listdir(base))
        assert await server.open() is None  # closed for good: no folder nobody would remove
        assert set(os.listdir(base)) == before
    finally:
        server.close()
        assert listener is not None
        listener.close()


def test_a_path_over_the_unix_limit_falls_back_to_ray_quietly(base, caplog):
    asyncio.run(_too_long(base, caplog))


async def _too_long(base: str, caplog) -> None:
    deep = os.path.join(base, "d" * 100)
    os.makedirs(deep)
    tempfile.tempdir = deep
    server = LaneServer(NODE, Host(_ok))
    asked: list[int] = []
    client = _client(server, asked)
    with caplog.at_level(logging.INFO, logger="openbot.lane"):
        assert await server.open() is None
        assert await client.step(_call()) is None  # over Ray
        assert await client.step(_call()) is None
    assert os.listdir(deep) == []  # no folder left behind
    assert len(asked) == 1  # never asked again
    records = [r for r in caplog.records if r.name == "openbot.lane"]
    assert [r.levelname for r in records if r.levelno >= logging.WARNING] == ["WARNING"]


def test_a_socket_that_cannot_be_opened_leaves_no_folder(base, monkeypatch):
    async def refuse(*args, **kwargs):
        raise OSError(98, "address in use")

    monkeypatch.setattr(asyncio, "start_unix_server", refuse)

    async def main() -> None:
        server = LaneServer(NODE, Host(_ok))
        assert await server.open() is None
        assert await server.open() is None  # not tried again
        assert os.listdir(base) == []

    asyncio.run(main())


def test_every_call_is_answered_whatever_the_host_raises():
    asyncio.run(_answered())


class _Odd:
    pass


async def _answered() -> None:
    async def step(call: StepCall) -> StepOutcome:
        if call.step.text == "cancel":
            raise asyncio.CancelledError
        if call.step.text == "odd":
            raise Conflict("stale", code="stale_revision", details={"what": _Odd()})
        return StepOutcome(status="done", reply="ok")

    server = LaneServer(NODE, Host(step))
    client = _client(server)
    try:
        with pytest.raises(Unavailable) as e:
            await asyncio.wait_for(client.step(_call("cancel")), 5)
        assert e.value.code == "engine_unavailable"
        with pytest.raises(Conflict) as c:
            await asyncio.wait_for(client.step(_call("odd")), 5)
        assert (c.value.code, c.value.message, c.value.details) == ("stale_revision", "stale", {})
        outcome = await asyncio.wait_for(client.step(_call("fine")), 5)
        assert outcome is not None and outcome.reply == "ok"
    finally:
        await client.close()
        server.close()


def test_an_answer_over_max_frame_fails_that_call_only(monkeypatch):
    monkeypatch.setattr(lane_mod, "MAX_FRAME", 4096)
    asyncio.run(_oversize())


async def _oversize() -> None:
    ran: list[str] = []

    async def step(call: StepCall) -> StepOutcome:
        ran.append(call.step.text[:5])
        if call.step.text == "big":
            return StepOutcome(status="done", reply="x" * 8192)
        await asyncio.sleep(0.05)  # still waiting when the big answer is made
        return StepOutcome(status="done", reply=call.step.text)

    server = LaneServer(NODE, Host(step))
    asked: list[int] = []
    client = _client(server, asked)
    try:
        slow = asyncio.ensure_future(client.step(_call("slow")))
        with pytest.raises(Unavailable) as e:
            await asyncio.wait_for(client.step(_call("big")), 5)
        assert e.value.code == "engine_error" and "over the lane's limit" in e.value.message
        done = await asyncio.wait_for(slow, 5)
        assert done is not None and done.reply == "slow"
        again = await asyncio.wait_for(client.step(_call("again")), 5)
        assert again is not None and again.reply == "again"
        # An ask over the limit is not sent (so not run): the caller asks over Ray.
        assert await client.step(_call("y" * 8192)) is None
        assert ran == ["slow", "big", "again"] and len(asked) == 1
    finally:
        await client.close()
        server.close()


def _engine_errors() -> list[type[OpenBotError]]:
    # Every module that defines an error that may cross a shard's lane or Ray.
    import actors.learning.memory_bot_runtime  # BudgetSpent
    import actors.models.embeddings  # EmbeddingError
    import actors.models.errors  # noqa: F401  ModelError

    found, todo = [], [OpenBotError]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] in ("engine", "actors", "storage", "gateway"):
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_engine_error_comes_back_over_the_lane_as_over_ray():
    classes = _engine_errors()
    names = {c.__name__ for c in classes}
    assert {"ModelError", "EmbeddingError", "BudgetSpent", "StorageError", "Conflict"} <= names
    asyncio.run(_parity(classes))


async def _parity(classes: list[type[OpenBotError]]) -> None:
    by_name = {c.__qualname__: c for c in classes}

    async def step(call: StepCall) -> StepOutcome:
        raise by_name[call.step.text]("it failed", code="some_code", details={"n": 1})

    server = LaneServer(NODE, Host(step))
    client = _client(server)
    try:
        for cls in classes:
            raised = cls("it failed", code="some_code", details={"n": 1})
            over_ray = pickle.loads(pickle.dumps(raised))  # what Ray hands the caller
            with pytest.raises(OpenBotError) as e:
                await asyncio.wait_for(client.step(_call(cls.__qualname__)), 5)
            assert type(e.value) is type(over_ray) is cls
            got = (e.value.message, e.value.code, e.value.details)
            assert got == (over_ray.message, over_ray.code, over_ray.details)
    finally:
        await client.close()
        server.close()


def test_a_shard_without_a_lane_is_asked_again_later(monkeypatch):
    """A shard that answers no address (its lane closed as it stopped, or none could open) is
    asked again after CLOSED_RETRY_S: the shard restarted under that name opens one."""
    monkeypatch.setattr(lane_mod, "CLOSED_RETRY_S", 0.2)

    async def main() -> None:
        closed = LaneServer(NODE, Host(_ok))
        closed.close()
        restarted = LaneServer(NODE, Host(_ok))
        servers = [closed]

        async def address() -> LaneAddress | None:
            return await servers[-1].open()

        client = LaneClient(address, NODE)
        try:
            assert await client.step(_call("a")) is None  # over Ray
            servers.append(restarted)
            assert await client.step(_call("b")) is None  # not asked again yet
            await asyncio.sleep(0.25)
            outcome = await client.step(_call("c"))
            assert outcome is not None and outcome.reply == "c"
        finally:
            await client.close()
            restarted.close()

    asyncio.run(main())
