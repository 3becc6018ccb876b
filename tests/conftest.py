"""Shared fixtures: one local Ray per test run, one engine on real DuckDB files, and a real
uvicorn server on loopback serving the real app."""

from __future__ import annotations

import collections
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import hypothesis
import pytest

# The suite runs the same whatever the caller's shell holds: a user's RAY_TMPDIR, RAY_ADDRESS or
# OPENBOT_* settings (meant for their own server) would move Ray's files, join their cluster or
# change the engine under test. Cleared before actors.runtime.ray_env reads them at import.
for _name in [n for n in os.environ if n.startswith(("RAY_", "OPENBOT_"))]:
    del os.environ[_name]

# The pool-lock guard (actors/runtime/lock_guard.py): a pool lock held across an actor or model
# call fails at once, here and in the actors (they inherit the environment at Ray's start).
os.environ["OPENBOT_LOCK_GUARD"] = "1"

# Tests' folders (tmp_path) in memory where the host has room: every commit syncs its journal
# and DuckDB syncs its files, which a disk makes waits and a tmpfs makes free; what the files
# hold is the same. A root the caller chose (or a small or missing /dev/shm) is left as it is.
_SHM = Path("/dev/shm")
if "PYTEST_DEBUG_TEMPROOT" not in os.environ and _SHM.is_dir() and os.access(_SHM, os.W_OK):
    _free = shutil.disk_usage(_SHM).free
    if _free >= 2 << 30:
        os.environ["PYTEST_DEBUG_TEMPROOT"] = str(_SHM)

import actors.runtime.engine  # noqa: E402, F401  (sets Ray's environment before anything imports ray)
from actors.runtime import lock_guard  # noqa: E402
from gateway.live_server import LiveServer  # noqa: E402

ADMIN = "test-admin-" + secrets.token_hex(8)
# Learning retries (CO-3) wait seconds in production; the actors inherit this at Ray's start.
os.environ.setdefault("OPENBOT_LEARNING_RETRY_DELAY", "0.05")


# Markers by what a test needs, from its fixtures (their whole closure): `-m unit` is the inner
# loop, pure and in-process tests only. A test that starts processes in its own body (a
# subprocess, a Ray of its own) says so with a module or test marker, and the guard below fails
# any `unit` test that starts one anyway.
NEEDS = {
    "ray_session": "ray",
    "server": "server",
    "browser": "browser",
}
NOT_UNIT = {"ray", "server", "browser", "subprocess", "slow", "cluster", "property"}


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the markers set here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marker in NEEDS.items():
            if fixture in names:
                item.add_marker(marker)
        # Hypothesis searches of hundreds of examples: in-process, but most of its CPU. One
        # that needs Ray, a server or a process keeps that marker only (it runs with those).
        if hypothesis.is_hypothesis_test(getattr(item, "obj", None)) and not any(
            item.get_closest_marker(name) for name in NOT_UNIT
        ):
            item.add_marker("property")
        if not any(item.get_closest_marker(name) for name in NOT_UNIT):
            item.add_marker("unit")


class StartedAProcess(BaseException):
    """Raised where a `unit` test starts Ray or a process: a BaseException, so that code under
    test that catches Exception cannot hide it."""


@pytest.fixture(autouse=True)
def _unit_stays_in_process(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """In a `unit` test, starting Ray, a subprocess or a process raises at once; what was
    refused is listed (and fails the test at teardown, should the code under test catch it)."""
    started: list[str] = []
    if request.node.get_closest_marker("unit") is None:
        yield started
        return
    import multiprocessing.process
    import subprocess

    import ray

    def refuse(what: str):
        def refused(*args, **kwargs):
            started.append(what)
            raise StartedAProcess(
                f"a `unit` test started {what}: mark it (ray, subprocess, slow) in its module"
            )

        return refused

    mp = pytest.MonkeyPatch()
    mp.setattr(ray, "init", refuse("Ray"))
    mp.setattr(subprocess.Popen, "_execute_child", refuse("a subprocess"))
    mp.setattr(multiprocessing.process.BaseProcess, "start", refuse("a process"))
    try:
        yield started
    finally:
        mp.undo()
    assert not started, f"a `unit` test started {started}"


@pytest.fixture(scope="session")
def ray_session() -> Iterator[Path]:
    """The session's local Ray; its temporary folder (logs under session_*/logs)."""
    import ray

    from actors.runtime.engine import start_ray

    # Ray's unix socket paths must stay short, so not under pytest's long tmp paths.
    tmp = tempfile.mkdtemp(prefix="obr", dir="/tmp")
    os.environ["RAY_TMPDIR"] = tmp  # lane sockets and anything else started later go there too
    start_ray(tmp_dir=tmp)
    yield Path(tmp)
    ray.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def ray_tmp() -> Iterator[str]:
    """A folder for the Ray of a server a test starts (short: Ray's socket paths), removed
    after the test."""
    tmp = tempfile.mkdtemp(prefix="obt", dir="/tmp")
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="session")
def model_stubs():
    """OpenAI-compatible servers on loopback: the bots' model, the memory bot's, embeddings."""
    from tests.openai_stub import OpenAIStub

    stubs = {"bot": OpenAIStub(), "mem": OpenAIStub(), "emb": OpenAIStub()}  # emb: embeddings
    servers = [LiveServer(s.app) for s in stubs.values()]
    for stub, live in zip(stubs.values(), servers, strict=True):
        stub.url = live.url + "/v1"
    yield stubs
    for live in servers:
        live.stop()


@pytest.fixture(scope="module")
def stubs():
    """Two OpenAI-compatible servers on loopback, the bots' model and the memory model, for a
    module's in-process shards (tests/shard_kit.py); `fresh` empties them for each test."""
    from tests.openai_stub import OpenAIStub

    bot, mem = OpenAIStub(), OpenAIStub()
    servers = [LiveServer(bot.app), LiveServer(mem.app)]
    bot.url, mem.url = servers[0].url + "/v1", servers[1].url + "/v1"
    yield bot, mem
    for s in servers:
        s.stop()


@pytest.fixture
def fresh(stubs):
    for s in stubs:
        s.queue.clear()
        s.requests.clear()
        s.routes.clear()
    return stubs


@pytest.fixture
def bot_model(model_stubs):
    """The bots' model stub, its scripted routes cleared after the test."""
    stub = model_stubs["bot"]
    yield stub
    stub.routes.clear()


@pytest.fixture
def no_env_key(monkeypatch) -> None:
    """No master key from the environment: a data directory's own key file is used (or made).
    Modules of in-process shards take it with `pytestmark = pytest.mark.usefixtures(...)`."""
    monkeypatch.delenv("OPENBOT_MASTER_KEY", raising=False)


@pytest.fixture(scope="session")
def engine(ray_session, data_dir, model_stubs):
    from actors.runtime.engine import Engine

    models = {
        name: {"kind": "openai", "base_url": stub.url, "model": f"{name}-model"}
        for name, stub in model_stubs.items()
    }
    models["edge"] = {"kind": "node", "node": "edge-1"}  # served by a test's execution node
    # Semantic search on (SC-7; tests/openai_stub.py); no keyword context between records
    # written in a row, so that each test's records are found by their own words only.
    search = {"embedding_model": "emb", "context_window_s": 0}
    eng = Engine.start(
        data_dir, shards=2, prefix="test", models_config=models, search_config=search
    )
    yield eng
    import ray

    caught = ray.get([s.lock_violations.remote() for s in eng.shards], timeout=30)
    eng.stop()
    # Every turn, learning run, group round, chain and extraction of the session ran with the
    # guard on: none may have held a pool lock across an actor or model call.
    assert caught == [[] for _ in eng.shards], caught


class CountingPort:
    """A port that counts the calls made through it, by method name."""

    def __init__(self, port, seen: collections.Counter[str]) -> None:
        self.port = port
        self.seen = seen

    def __getattr__(self, name: str):
        method = getattr(self.port, name)

        async def counted(*args, **kwargs):
            self.seen[name] += 1
            return await method(*args, **kwargs)

        return counted


def count_gateway_calls(monkeypatch, engine) -> collections.Counter[str]:
    """The actor methods every gateway on `engine` calls through its ports, by name, until the
    test ends (event pumps already running keep the ports they took and are not counted)."""
    seen: collections.Counter[str] = collections.Counter()
    monkeypatch.setattr(engine, "directory_port", CountingPort(engine.directory_port, seen))
    monkeypatch.setattr(engine, "shard_ports", [CountingPort(p, seen) for p in engine.shard_ports])
    return seen


@pytest.fixture(scope="session", autouse=True)
def _no_pool_lock_across_calls() -> Iterator[None]:
    assert lock_guard.GUARD  # the guard is on in this process (in-process shards)
    yield
    assert lock_guard.violations == [], lock_guard.violations


@pytest.fixture(scope="session")
def server(engine) -> Iterator[LiveServer]:
    from gateway.app import create_app

    live = LiveServer(create_app(engine, ADMIN, cache_ttl=0.0, listener_refresh=0.2))
    yield live
    live.stop()


@pytest.fixture
def admin(server) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    ) as c:
        yield c


def user_client(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


class World:
    """A fresh org with people and a bot, created through the admin API."""

    def __init__(self, admin: httpx.Client, server: LiveServer) -> None:
        tag = secrets.token_hex(4)
        self.org = _ok(admin.post("/v1/admin/orgs", json={"name": f"org {tag}"}))["id"]
        self.tokens: dict[str, str] = {}
        self.users: dict[str, str] = {}
        for name in ("alice", "bob", "carol"):
            u = _ok(admin.post("/v1/admin/users", json={"name": name, "orgs": [self.org]}))
            self.users[name] = u["id"]
            self.tokens[name] = u["token"]
        self.bot = _ok(
            admin.post(
                "/v1/admin/bots",
                json={"name": f"bot {tag}", "org": self.org, "owner": self.users["alice"]},
            )
        )["id"]
        self.server = server
        self.admin = admin

    def client(self, name: str) -> httpx.Client:
        return user_client(self.server, self.tokens[name])

    def grant(self, name: str, permission: str) -> None:
        _ok(
            self.admin.post(
                "/v1/admin/grants",
                json={"bot": self.bot, "user": self.users[name], "permission": permission},
            )
        )


def _ok(resp: httpx.Response) -> dict:
    assert resp.is_success, (resp.status_code, resp.text)
    return resp.json()


@pytest.fixture
def world(admin, server) -> World:
    return World(admin, server)


def learning_bot(world, admin: httpx.Client, prefix: str) -> tuple[str, str]:
    """A bot of alice's on the `bot` model, in an org whose memory bot (`mem`) learns after
    every person turn; its (id, name), the name unique per call."""
    r = admin.patch(
        f"/v1/admin/orgs/{world.org}",
        json={"settings": {"botMemoryModel": "mem", "autoRecord": True}},
    )
    assert r.status_code == 200, r.text
    name = f"{prefix}{secrets.token_hex(3)}"
    r = admin.post(
        "/v1/admin/bots",
        json={"name": name, "org": world.org, "owner": world.users["alice"], "model": "bot"},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"], name


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """`@pytest.mark.anyio` tests run on asyncio (the engine's loop), each in a loop of its own."""
    return "asyncio"


@pytest.fixture
async def shards(tmp_path: Path, anyio_backend: str):
    """Opens shard services on `tmp_path` (tests/shard_kit.py `Shards`) and closes them after."""
    from tests.shard_kit import Shards

    opened = Shards(tmp_path)
    yield opened
    await opened.close_all()


@pytest.fixture
def shard(shards):
    """A shard service on `tmp_path` without models, connected to a directory service there."""
    return shards(models={}, directory=True)


@pytest.fixture
def directory(shards):
    """The directory service on `tmp_path` (the one `shard` is connected to)."""
    return shards.directory_service()
