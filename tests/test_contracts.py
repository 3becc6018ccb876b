"""The actors' boundary (actors/contracts.py, actors/ports.py, actors/runtime/): a gateway speaks
to the actors through their messages and typed ports only, only runtime/ touches Ray, and each
port's Ray proxy is derived from the port (actors/runtime/proxy.py)."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from actors.contracts import NodeInfo
from actors.models.node_hub import NodeHubService, NodeModel
from actors.ports import DirectoryPort, NodeHubPort, ShardPort
from engine.models import Completion, Message
from tests.python_source import parse_source

ROOT = Path(__file__).resolve().parent.parent
# The actors' implementation: a gateway process never needs it (the actors run elsewhere).
IMPLEMENTATION = (
    "actors.shard.",
    "actors.chats",
    "actors.workspace",
    "actors.learning",
    "actors.models",
    "actors.directory",
)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(parse_source(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.subprocess
def test_gateway_loads_no_actor_implementation():
    """In a fresh interpreter: importing the app loads the contracts and the ports, never numpy,
    Ray, the Ray runtime (a server hands the app an `EnginePort`) nor the shards', chats',
    workspace's or models' modules."""
    code = "import json, sys; import gateway.app; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert "actors.contracts" in loaded and "actors.ports" in loaded
    assert "numpy" not in loaded
    assert sorted(m for m in loaded if m == "ray" or m.startswith("ray.")) == []
    # actors/__init__.py sets Ray's environment (ray_env) for whoever imports Ray later.
    runtime = {m for m in loaded if m.startswith("actors.runtime")}
    assert runtime <= {"actors.runtime", "actors.runtime.ray_env"}, runtime
    leaked = sorted(m for m in loaded if m.startswith(IMPLEMENTATION))
    assert leaked == []


def test_gateway_names_only_contracts_ports_and_runtime():
    problems = []
    for path in (ROOT / "gateway").rglob("*.py"):
        for name in _imports(path):
            if name.startswith("actors") and not name.startswith(
                ("actors.contracts", "actors.ports", "actors.runtime")
            ):
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
    assert problems == []


def test_contracts_import_engine_and_msgspec_only():
    stdlib = set(sys.stdlib_module_names)
    names = {n.split(".")[0] for n in _imports(ROOT / "actors" / "contracts.py")}
    assert names - stdlib <= {"engine", "msgspec"}
    ports = _imports(ROOT / "actors" / "ports.py")
    assert {n.split(".")[0] for n in ports} - stdlib <= {"engine", "actors"}
    assert {n for n in ports if n.startswith("actors")} == {"actors.contracts"}


def test_only_runtime_touches_ray():
    problems = []
    for layer in ("actors", "gateway", "storage", "engine"):
        for path in (ROOT / layer).rglob("*.py"):
            if path.parent == ROOT / "actors" / "runtime":
                continue
            if any(n == "ray" or n.startswith("ray.") for n in _imports(path)):
                problems.append(str(path.relative_to(ROOT)))
    assert problems == []


async def _serve_one(hub: NodeHubPort, node: str, session: int, answer: str) -> None:
    work = None
    while work is None:
        work = await hub.next_work(node, session, 1.0)
    assert [m.content for m in work.messages] == ["hello"]
    assert await hub.complete(work.id, Completion(text=answer, model=node), None)


@pytest.mark.anyio
async def test_node_model_runs_against_a_local_hub():
    """The node hub's port with its local implementation, no Ray: a bot's model of kind `node`
    hands its work to the hub, a connected node answers it."""

    hub = NodeHubService()
    model = NodeModel("edge", "edge-1", hub)
    assert await model.isolation() == (False, False)  # not connected
    session = await hub.register("edge-1", True, False)
    assert await model.isolation() == (True, False)
    node = asyncio.create_task(_serve_one(hub, "edge-1", session, "hi there"))
    done = await model.complete([Message(role="user", content="hello")], timeout=5.0)
    await node
    assert done.text == "hi there"
    nodes = await hub.nodes()
    assert [n.id for n in nodes] == ["builtin", "edge-1"]
    assert isinstance(nodes[1], NodeInfo) and nodes[1].hint is not None


def _proxies_and_services():
    from actors.directory import DirectoryService
    from actors.runtime.directory_proxy import RayDirectory
    from actors.runtime.node_hub_proxy import RayNodeHub
    from actors.runtime.shard_proxy import RayShard
    from actors.shard.service import ShardService

    return [
        (ShardPort, ShardService, RayShard),
        (DirectoryPort, DirectoryService, RayDirectory),
        (NodeHubPort, NodeHubService, RayNodeHub),
    ]


def test_every_port_call_is_answered_locally_and_over_ray():
    """A port is the one declaration of an actor's calls: its Ray proxy is derived from it
    (actors/runtime/proxy.py) and its local service answers each of them, so a call that works
    in-process works across actors."""
    from actors.runtime.proxy import port_calls

    for port, local, ray_proxy in _proxies_and_services():
        calls = port_calls(port)
        assert calls, port
        for name in calls:
            for impl in (local, ray_proxy):
                assert inspect.iscoroutinefunction(getattr(impl, name, None)), (impl, name)
        assert port in ray_proxy.__mro__  # typed as the port


@pytest.mark.anyio
async def test_each_call_a_service_hands_on_meets_its_port(shard, directory):
    """A call a service's table hands on reaches a feature's method that takes the port's
    parameters (a caller may name them), so the port stays the call's one declaration."""

    def params(fn) -> list[tuple[str, object, object]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]

    for port, svc in ((ShardPort, shard), (DirectoryPort, directory)):
        answered = type(svc).answered_by
        assert answered, svc
        for call, (feature, method) in answered.items():
            target = getattr(getattr(svc, feature), method)
            assert inspect.iscoroutinefunction(target), (call, feature, method)
            declared = getattr(port, call, None)
            if declared is not None:
                assert params(target) == params(declared)[1:], call


class _Ref:
    """What `handle.method.remote(...)` gives: awaitable, with its outcome."""

    def __init__(self, outcome: object) -> None:
        self.outcome = outcome

    def __await__(self):
        if False:
            yield
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class _Handle:
    """An actor handle that records each call and answers it with `outcome`."""

    def __init__(self, outcome: object) -> None:
        self.outcome = outcome
        self.calls: list[tuple[str, tuple, dict]] = []

    def __getattr__(self, name: str):
        handle = self

        class _Method:
            @staticmethod
            def remote(*args, **kwargs):
                handle.calls.append((name, args, kwargs))
                return _Ref(handle.outcome)

        return _Method


@pytest.mark.anyio
async def test_a_derived_proxy_hands_each_call_on_and_maps_its_errors():
    """A call the proxy does not define goes to the actor's method of the same name with the
    caller's arguments; the engine's errors come back as themselves, Ray's as `Unavailable`."""
    import ray

    from actors.runtime.directory_proxy import RayDirectory
    from engine.errors import NotFound, Unavailable

    handle = _Handle("bot")
    port = RayDirectory("dir", "ns", handle)
    assert await port.get_bot("b_1") == "bot"
    assert await port.create_bot(name="Ada", org="o_1", owner="u_1") == "bot"
    assert handle.calls == [
        ("get_bot", ("b_1",), {}),
        ("create_bot", (), {"name": "Ada", "org": "o_1", "owner": "u_1"}),
    ]
    missing = NotFound("no bot", code="bot_not_found")
    handle.outcome = ray.exceptions.RayTaskError("get_bot", "trace", missing)
    with pytest.raises(NotFound) as raised:
        await port.get_bot("b_2")
    assert raised.value is missing
    handle.outcome = ray.exceptions.RayTaskError("get_bot", "trace", ValueError("bug"))
    with pytest.raises(Unavailable) as failed:
        await port.get_bot("b_3")
    assert failed.value.code == "engine_error"
    handle.outcome = ray.exceptions.RayActorError()
    with pytest.raises(Unavailable) as gone:
        await port.get_bot("b_4")
    assert gone.value.code == "engine_unavailable"


@pytest.mark.anyio
async def test_a_proxy_keeps_the_calls_it_defines_and_its_subclasses_override():
    """Only what a proxy leaves to the port is derived: a call it defines stays its own, and a
    subclass's override (the shard's lane) wins over the derived one."""
    from typing import Protocol

    from actors.runtime.proxy import NamedActor
    from actors.runtime.shard_proxy import RayShard

    class Port(Protocol):
        async def plain(self, x: int) -> int: ...
        async def special(self, x: int) -> int: ...

    class Proxy(NamedActor, Port):
        async def special(self, x: int) -> int:
            return -x

    class Laned(Proxy):
        async def plain(self, x: int) -> int:
            return x * 10

    handle = _Handle(7)
    assert await Proxy("p", "ns", handle).plain(1) == 7
    assert await Proxy("p", "ns", handle).special(2) == -2
    assert await Laned("p", "ns", handle).plain(3) == 30
    assert [c[0] for c in handle.calls] == ["plain"]
    assert str(inspect.signature(Proxy.plain)) == "(self, x: 'int') -> 'int'"
    assert RayShard.events_after.__module__ == "actors.runtime.shard_proxy"  # its own


@pytest.mark.anyio
async def test_a_service_table_builds_each_call_once():
    """actors/facade.py: each call of a service's table hands its arguments to the feature's
    method (after the `before` hook where asked); a call answered twice, or defined on the
    class and in the table, is refused when the class is built."""
    from actors.facade import answered_by

    class Feature:
        async def listing(self, user: str, limit: int = 5) -> tuple[str, int]:
            return user, limit

    class Service:
        def __init__(self) -> None:
            self.feature = Feature()
            self.started = 0

        async def own(self) -> str:
            return "own"

    def start(svc: Service) -> None:
        svc.started += 1

    answered_by(
        Service,
        {"feature": "listing items:listing"},
        before=start,
        before_calls=("items",),
    )
    svc = Service()
    assert await svc.listing("ann", limit=2) == ("ann", 2) and svc.started == 0
    assert await svc.items("bob") == ("bob", 5) and svc.started == 1
    with pytest.raises(TypeError, match="answered twice"):
        answered_by(Service, {"feature": "a:listing", "other": "a"})
    with pytest.raises(TypeError, match="defined and in the table"):
        answered_by(Service, {"feature": "own:listing"})


def test_the_engine_offers_every_member_of_the_port_a_gateway_holds():
    """`Engine` (the Ray runtime) is what `create_app` gets as an `EnginePort`; its ports wrap
    the handles it holds, one per shard, and route an account as `shard_index` does."""
    from actors.ports import EnginePort
    from actors.runtime.engine import Engine

    engine = Engine(object(), [object(), object(), object()], None, "x")  # handles: never called
    members = [n for n in vars(EnginePort) if not n.startswith("_")]
    assert {"directory_port", "shard_ports", "shard_port", "node_hub", "backup"} <= set(members)
    assert [n for n in members if not hasattr(engine, n)] == []
    assert len(engine.shard_ports) == 3
    for account in ("u_alice", "u_bob", "u_carol", "u_dan"):
        port = engine.shard_port(account)
        assert port is engine.shard_ports[engine.shard_index(account)]
        assert port.name == f"x-shard-{engine.shard_index(account)}"
