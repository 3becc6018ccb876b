"""The actors' boundary (actors/contracts.py, actors/ports.py, actors/runtime/): a gateway speaks
to the actors through their messages and typed ports only, and only runtime/ touches Ray."""

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
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_node_model_runs_against_a_local_hub():
    """The node hub's port with its local implementation, no Ray: a bot's model of kind `node`
    hands its work to the hub, a connected node answers it."""

    async def scenario() -> None:
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

    asyncio.run(scenario())


def _signature(fn) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)
    # Ray adds `_ray_trace_ctx` to an actor class's methods once the class is made an actor in
    # this process (an earlier test may have done it): not a parameter anyone passes.
    return [
        (p.name, p.kind, p.default) for p in sig.parameters.values() if p.name != "_ray_trace_ctx"
    ]


def test_every_port_has_the_same_methods_locally_and_over_ray():
    """A port's two implementations answer the same calls: the local service (what a test or
    the shard itself calls) and the Ray proxy (what another process calls) take the same
    parameters as the Protocol, so a call that works in-process works across actors."""
    from actors.directory import DirectoryService
    from actors.runtime.directory_port import RayDirectory
    from actors.runtime.node_hub_handle import RayNodeHub
    from actors.runtime.ports import RayShard
    from actors.shard.service import ShardService

    pairs = [
        (ShardPort, ShardService, RayShard),
        (DirectoryPort, DirectoryService, RayDirectory),
        (NodeHubPort, NodeHubService, RayNodeHub),
    ]
    for port, local, ray_proxy in pairs:
        names = [n for n in vars(port) if not n.startswith("_")]
        assert names, port
        for name in names:
            want = _signature(getattr(port, name))
            for impl in (local, ray_proxy):
                assert _signature(getattr(impl, name)) == want, (impl.__name__, name)
                assert inspect.iscoroutinefunction(getattr(impl, name)), (impl.__name__, name)


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
