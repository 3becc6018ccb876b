"""Whom the lane trusts (actors/runtime/lane.py): no socket folder under a temp dir
another user could swap it out of (the shard's calls go over Ray, with one warning), and each
end drops a connection whose other end is another user (`SO_PEERCRED`): the shard before it
reads a call, the caller before it sends one (its calls then go over Ray). The uid check is
given to each end as a parameter, so one user can play another; as root the tests also run a
real peer as `nobody`."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile

import pytest

from actors.contracts import LaneAddress, StepCall, StepOutcome
from actors.runtime.lane import LaneClient, LaneServer
from engine.errors import Unavailable
from tests.test_shard_lane import NODE, Host, _call

NOBODY = 65534
ROOT = os.getuid() == 0
PYTHON = "/usr/bin/python3"


@pytest.fixture
def base(monkeypatch):
    """The lanes' temp dir, Ray's (RAY_TMPDIR, as in a shard's process) and the system's alike;
    short for socket paths."""
    folder = tempfile.mkdtemp(prefix="obt-", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", folder)
    monkeypatch.setattr(tempfile, "tempdir", folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


class _Steps:
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def __call__(self, call: StepCall) -> StepOutcome:
        self.ran.append(call.step.text)
        return StepOutcome(status="done", reply=call.step.text)


def _client(server: LaneServer, **kwargs) -> LaneClient:
    async def address() -> LaneAddress | None:
        return await server.open()

    return LaneClient(address, NODE, **kwargs)


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "openbot.lane" and r.levelno >= logging.WARNING
    ]


CASES = [
    (0o777, None, "writable by other users"),
    (0o770, None, "writable by other users"),
    (0o1777, None, None),  # sticky, like /tmp
    (0o755, None, None),
]
if ROOT:
    CASES.append((0o755, NOBODY, f"belongs to uid {NOBODY}"))


@pytest.mark.parametrize(("mode", "owner", "refused"), CASES)
def test_an_unsafe_runtime_folder_opens_no_lane_and_calls_go_over_ray(
    base, caplog, mode, owner, refused
):
    os.chmod(base, mode)
    if owner is not None:
        os.chown(base, owner, -1)
    steps = _Steps()

    async def main() -> None:
        server = LaneServer(NODE, Host(steps))
        client = _client(server)
        try:
            with caplog.at_level(logging.INFO, logger="openbot.lane"):
                address = await server.open()
                outcome = await client.step(_call("a"))
            if refused is None:
                assert address is not None and outcome is not None and outcome.reply == "a"
                assert steps.ran == ["a"]
                return
            assert address is None and outcome is None  # None: the caller asks over Ray
            assert steps.ran == [] and os.listdir(base) == []  # nothing made there
            (warning,) = _warnings(caplog)
            assert refused in warning
        finally:
            await client.close()
            server.close()

    asyncio.run(main())


def test_under_ray_s_0777_temp_dir_the_lane_goes_in_the_system_s(base, monkeypatch):
    """Ray makes its temp dir 0777: the folder goes in the system's temp dir (sticky) then."""
    ray_tmp = tempfile.mkdtemp(prefix="obr-", dir="/tmp")
    os.chmod(ray_tmp, 0o777)
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    os.chmod(base, 0o1777)
    steps = _Steps()

    async def main() -> None:
        server = LaneServer(NODE, Host(steps))
        client = _client(server)
        try:
            address = await server.open()
            assert address is not None and address.path.startswith(base + os.sep)
            outcome = await client.step(_call("a"))
            assert outcome is not None and outcome.reply == "a"
        finally:
            await client.close()
            server.close()

    try:
        asyncio.run(main())
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert steps.ran == ["a"]


def test_the_shard_drops_a_connection_from_another_uid(base, caplog):
    steps = _Steps()

    async def main() -> None:
        server = LaneServer(NODE, Host(steps), peer=lambda sock: os.getuid() + 1)
        client = _client(server)
        try:
            with caplog.at_level(logging.INFO, logger="openbot.lane"), pytest.raises(Unavailable):
                await client.step(_call("from someone else"))
        finally:
            await client.close()
            server.close()

    asyncio.run(main())
    assert steps.ran == []
    (warning,) = _warnings(caplog)
    assert f"refused a connection from uid {os.getuid() + 1}" in warning


def test_the_caller_sends_nothing_to_a_socket_of_another_uid(base, caplog):
    steps = _Steps()

    async def main() -> None:
        server = LaneServer(NODE, Host(steps))
        client = _client(server, peer=lambda sock: NOBODY)
        try:
            with caplog.at_level(logging.INFO, logger="openbot.lane"):
                assert await client.step(_call("secret")) is None  # over Ray
        finally:
            await client.close()
            server.close()

    asyncio.run(main())
    assert steps.ran == []
    (warning,) = _warnings(caplog)
    assert f"held by uid {NOBODY}" in warning


CONNECT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(b"\\x00\\x00\\x01\\x00")  # a frame header: the shard would wait for its body
    print("closed" if s.recv(1) == b"" else "answered")
except (BrokenPipeError, ConnectionResetError):
    print("closed")
except TimeoutError:
    print("kept open")
"""

LISTEN = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen()
print("ready", flush=True)
conn, _ = s.accept()
sys.stdin.read()
"""


@pytest.mark.skipif(not ROOT or not os.path.exists(PYTHON), reason="needs root to be nobody")
def test_a_real_peer_of_another_user_is_refused_by_both_ends(base, caplog):
    os.chmod(base, 0o711)  # nobody may pass through (not list, not write)
    steps = _Steps()

    async def main() -> None:
        server = LaneServer(NODE, Host(steps))
        address = await server.open()
        assert address is not None
        # Permissions loosened by mistake: the uid check still keeps nobody out.
        os.chmod(os.path.dirname(address.path), 0o711)
        os.chmod(address.path, 0o666)
        child = await asyncio.create_subprocess_exec(
            PYTHON, "-c", CONNECT, address.path, user=NOBODY, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await child.communicate()
        server.close()
        assert out.decode().strip() == "closed"

        theirs = os.path.join(base, "theirs")
        os.mkdir(theirs, 0o700)
        os.chown(theirs, NOBODY, -1)
        path = os.path.join(theirs, "s")
        listener = await asyncio.create_subprocess_exec(
            PYTHON, "-c", LISTEN, path, user=NOBODY,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert listener.stdout is not None and listener.stdin is not None
            assert (await listener.stdout.readline()).strip() == b"ready"

            async def at() -> LaneAddress:
                return LaneAddress(node=NODE, path=path)

            client = LaneClient(at, NODE)
            assert await client.step(_call("secret")) is None  # over Ray
            await client.close()
        finally:
            if listener.stdin is not None:
                listener.stdin.close()
            await listener.wait()

    with caplog.at_level(logging.INFO, logger="openbot.lane"):
        asyncio.run(main())
    assert steps.ran == []
    assert [w.split(" uid ")[0] for w in _warnings(caplog)] == [
        "the lane refused a connection from",
        f"the lane at {os.path.join(base, 'theirs', 's')} is held by",
    ]


def test_shards_under_an_unsafe_ray_tmpdir_run_a_cross_shard_chain_over_ray(
    ray_session, tmp_path, model_stubs, bot_model, monkeypatch
):
    """End to end: shards whose temp dirs (Ray's and the system's) anyone may write (no sticky
    bit) open no lane; the gateway's turn, its event polls and the peer's step on the other
    shard all go over Ray."""
    import secrets

    import httpx

    from actors.runtime import engine as engine_mod
    from actors.runtime.engine import Engine
    from gateway.app import create_app
    from tests.conftest import ADMIN, LiveServer, World
    from tests.test_lane_off import _chain

    unsafe = tempfile.mkdtemp(prefix="obu-", dir="/tmp")
    os.chmod(unsafe, 0o777)
    env = {"env_vars": {"RAY_TMPDIR": unsafe, "TMPDIR": unsafe}}
    real = engine_mod.actor_options
    monkeypatch.setattr(
        engine_mod, "actor_options", lambda *a, **k: {**real(*a, **k), "runtime_env": env}
    )
    models = {"bot": {"kind": "openai", "base_url": model_stubs["bot"].url, "model": "b"}}
    prefix = f"unsafe{secrets.token_hex(2)}"
    eng = Engine.start(tmp_path / "data", shards=2, prefix=prefix, models_config=models)
    live = LiveServer(create_app(eng, ADMIN, cache_ttl=0.0, listener_refresh=0.2))
    admin = httpx.Client(
        base_url=live.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    )
    try:
        _chain(World(admin, live), admin, bot_model, eng, lanes_off=False)
        assert os.listdir(unsafe) == []  # no socket folder was made there
    finally:
        admin.close()
        live.stop()
        eng.stop()
        shutil.rmtree(unsafe, ignore_errors=True)
