"""The shape of the code, checked from its source (ast, nothing imported):

- dependencies point one way: gateway → actors → storage → engine; engine is pure;
- no import cycle inside actors/, counting `TYPE_CHECKING` and function-level imports;
- no `other._private` access in actors/ and gateway/: a single-underscore attribute is read or
  written only on `self`/`cls` (or `super()`), and no module imports another's `_name`;
- tests/ reaches at most TEST_PRIVATE_MAX private names of other objects or modules, each with
  a `# private: <why>` comment;
- only actors/runtime/ imports `ray` (in actors/, gateway/, storage/ and engine/);
- gateway/ reaches actors only through typed ports: no `.remote`, no `call(handle.method, ...)`,
  no `Engine` handle attributes, no actors/runtime/ import outside the composition roots;
- features are composed, not mixed in: outside actors/runtime/ (Ray's hosts and proxies) a class
  in actors/ or gateway/ derives from no class of the project but a port or an exception;
- one concept per module: a module past 600 lines gets a warning (is it still one concept?), a
  module past 900 lines fails.

Where a rule still has violations in actors/, it names the violations still allowed (the
ALLOWED_* lists below) and a second test checks that every entry is still a real violation:
the lists can only shrink. When a test says an entry is fixed, delete it.
"""

from __future__ import annotations

import ast
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from tests.python_source import parse_source

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["engine", "storage", "actors", "gateway"]  # each may import only those before it
PURE_THIRD_PARTY = {"msgspec"}
SKIP_DIRS = {"node_modules", "build", "dist", "__pycache__"}  # and every dot-directory (.venv)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(parse_source(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def test_layers_point_one_way():
    problems = []
    for i, layer in enumerate(LAYERS):
        forbidden = set(LAYERS[i + 1 :])
        for path in (ROOT / layer).rglob("*.py"):
            bad = _imports(path) & forbidden
            if bad:
                problems.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert problems == []


def test_engine_is_pure():
    stdlib = set(sys.stdlib_module_names)
    problems = []
    for path in (ROOT / "engine").rglob("*.py"):
        for name in _imports(path):
            if name not in stdlib and name not in PURE_THIRD_PARTY and name != "engine":
                problems.append(f"{path.relative_to(ROOT)} imports {name}")
            if name in {"time", "random", "secrets", "socket", "asyncio", "threading", "os"}:
                problems.append(f"{path.relative_to(ROOT)} imports {name} (clock/IO/randomness)")
    assert problems == []


# --- no import cycle inside actors/ ------------------------------------------------------------

# Strongly connected components of actors/'s import graph allowed today (none since the shard
# kernel: features are built with the kernel and the collaborators they name).
ALLOWED_CYCLES: list[frozenset[str]] = []


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of `package` it imports, from every import statement in the file:
    top level, under `if TYPE_CHECKING:`, inside functions. `from a.b import c` points at a.b.c
    when that is a module, else at a.b. A parent package's `__init__`, run implicitly by Python,
    is not an edge (they hold no code here)."""
    files = {_module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(parse_source(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    module = ".".join([*base, node.module] if node.module else base)
                else:
                    module = node.module or ""
                for a in node.names:
                    sub = f"{module}.{a.name}"
                    targets.add(sub if sub in files else module)
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(frozenset(component))
    return out


def cycle_problems(cycles: list[frozenset[str]], allowed: list[frozenset[str]]) -> list[str]:
    return [
        f"import cycle: {' ↔ '.join(sorted(c))}"
        for c in cycles
        if not any(c <= ok for ok in allowed)
    ]


def test_no_import_cycle_inside_actors():
    cycles = import_cycles(import_graph(ROOT, "actors"))
    assert cycle_problems(cycles, ALLOWED_CYCLES) == []


def test_allowed_cycles_are_still_cycles():
    cycles = set(import_cycles(import_graph(ROOT, "actors")))
    stale = [sorted(ok) for ok in ALLOWED_CYCLES if ok not in cycles]
    assert stale == [], (
        f"these cycles changed or are gone: {stale}; now {sorted(map(sorted, cycles))}. "
        "Replace ALLOWED_CYCLES' entries with the cycles that are left."
    )


# --- no other._private access in actors/ and gateway/ -----------------------------------------

# (module, attribute) pairs allowed today (none: the shard kernel's pipeline is public).
ALLOWED_PRIVATE: set[tuple[str, str]] = set()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(receiver: ast.expr) -> bool:
    """`self`, `cls` or `super()`: the object's own attributes."""
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", "cls")
    return (
        isinstance(receiver, ast.Call)
        and isinstance(receiver.func, ast.Name)
        and receiver.func.id == "super"
    )


def private_access(source: str) -> Iterator[tuple[int, str, str]]:
    """(line, what, attribute) for each `x._name` on anything but self/cls/super(), read or
    written, also spelled `getattr(x, "_name")`, and each `from m import _name` (a
    module-private name taken across modules)."""
    for node in ast.walk(parse_source(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            yield node.lineno, ast.unparse(node), node.attr
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and not _own(node.args[0])
        ):
            yield node.lineno, ast.unparse(node), node.args[1].value
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if _private(a.name):
                    yield node.lineno, f"from {node.module} import {a.name}", a.name


def private_problems(root: Path, packages: tuple[str, ...]) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = _rel(path, root)
            for line, what, attr in private_access(path.read_text()):
                found.setdefault((rel, attr), []).append(f"{rel}:{line} {what}")
    return found


def test_no_private_access_across_modules():
    found = private_problems(ROOT, ("actors", "gateway"))
    new = [where for key, lines in found.items() if key not in ALLOWED_PRIVATE for where in lines]
    assert new == [], "use (or add) a public method instead of another object's private one"


def test_allowed_private_access_is_still_used():
    found = private_problems(ROOT, ("actors", "gateway"))
    assert sorted(ALLOWED_PRIVATE - set(found)) == [], "fixed: delete from ALLOWED_PRIVATE"


# --- few private reaches in tests/, each explained ---------------------------------------------

# A test checks behaviour through public seams (a method, a view, an injected clock). Where none
# fits, the reach says why on its line or in the comment right above it (`# private: <why>`).
# A test module's own helpers (`from tests.x import _helper`) are the suite's, not a reach.
TEST_PRIVATE_MAX = 20
WHY = "# private:"


def reaches_in_test(source: str) -> Iterator[tuple[int, str, bool]]:
    """(line, what, explained) for each private reach of a test module's source."""
    lines = source.splitlines()
    for line, what, _ in sorted(private_access(source)):
        if what.startswith(("from tests.", "from tests import ")):
            continue
        explained = WHY in lines[line - 1]
        above = line - 2
        while not explained and above >= 0 and lines[above].strip().startswith("#"):
            explained = WHY in lines[above]
            above -= 1
        yield line, what, explained


def private_reaches_in_tests(root: Path) -> list[tuple[str, bool]]:
    out = []
    for path in sorted((root / "tests").rglob("*.py")):
        rel = _rel(path, root)
        for line, what, explained in reaches_in_test(path.read_text()):
            out.append((f"{rel}:{line} {what}", explained))
    return out


def test_tests_reach_few_private_names_and_say_why():
    found = private_reaches_in_tests(ROOT)
    listing = "\n".join(where for where, _ in found)
    assert len(found) <= TEST_PRIVATE_MAX, (
        f"{len(found)} private reaches in tests/ (at most {TEST_PRIVATE_MAX}): test through a "
        f"public seam (add one to the product if it is worth having)\n{listing}"
    )
    assert [where for where, explained in found if not explained] == [], (
        f"say why on the line or right above it: {WHY} <why>"
    )


# --- only actors/runtime/ touches Ray ----------------------------------------------------------

RAY_SCOPE = ("actors", "gateway", "storage", "engine")
RAY_HOME = "actors/runtime/"
# Modules outside runtime/ that may import ray: none.
ALLOWED_RAY: set[str] = set()


def imports_ray(source: str) -> bool:
    for node in ast.walk(parse_source(source)):
        if isinstance(node, ast.Import) and any(
            a.name == "ray" or a.name.startswith("ray.") for a in node.names
        ):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module == "ray" or (node.module or "").startswith("ray."))
        ):
            return True
    return False


def ray_users(root: Path) -> set[str]:
    out = set()
    for package in RAY_SCOPE:
        for path in (root / package).rglob("*.py"):
            rel = _rel(path, root)
            if not rel.startswith(RAY_HOME) and imports_ray(path.read_text()):
                out.add(rel)
    return out


def test_only_runtime_imports_ray():
    assert sorted(ray_users(ROOT) - ALLOWED_RAY) == [], "Ray calls belong in actors/runtime/"


def test_allowed_ray_users_still_import_ray():
    assert sorted(ALLOWED_RAY - ray_users(ROOT)) == [], "fixed: delete from ALLOWED_RAY"


# --- the gateway calls actors through typed ports only -----------------------------------------

# A gateway holds an `EnginePort` (actors/ports.py) and awaits typed port methods. What would bring
# actor handles back: Ray's `.remote`, the runtime's untyped helpers (`call(handle.method, ...)`)
# and `Engine`'s raw handle attributes. Only the composition roots (they start Ray and build the
# `Engine` they hand to the app) import actors/runtime/.
ENGINE_HANDLES = {"shards", "directory", "shard_for"}
UNTYPED_CALLS = {"call", "remote"}
GATEWAY_ROOTS = {"gateway/server.py", "gateway/demo.py"}


def _is_engine(node: ast.expr) -> bool:
    """`engine`, `self.engine`, `app.engine`, ...: what names the engine."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name == "engine" or name.endswith("_engine")


def handle_uses(source: str, *, root: bool = False) -> Iterator[tuple[int, str]]:
    """(line, what) for each way `source` reaches an actor other than through a typed port."""
    for node in ast.walk(parse_source(source)):
        if isinstance(node, ast.Attribute):
            if node.attr == "remote" or (node.attr in ENGINE_HANDLES and _is_engine(node.value)):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id in UNTYPED_CALLS:
                yield node.lineno, ast.unparse(node)
        elif not root and isinstance(node, ast.ImportFrom | ast.Import):
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                modules = [a.name for a in node.names]
            for module in modules:
                if module == "actors.runtime" or module.startswith("actors.runtime."):
                    yield node.lineno, f"import of {module}"


def gateway_handle_uses(root: Path) -> list[str]:
    out = []
    for path in sorted((root / "gateway").rglob("*.py")):
        rel = _rel(path, root)
        for line, what in handle_uses(path.read_text(), root=rel in GATEWAY_ROOTS):
            out.append(f"{rel}:{line} {what}")
    return out


def test_gateway_reaches_actors_only_through_typed_ports():
    assert gateway_handle_uses(ROOT) == [], (
        "await a port method (engine.shard_port(account).x(...), engine.directory_port.x(...)); "
        "add the method to the port in actors/ports.py and its Ray proxy if it is missing"
    )


# --- composed, not mixed in --------------------------------------------------------------------

COMPOSED = ("actors/", "gateway/")
MAY_SUBCLASS = "actors/runtime/"  # Ray hosts a service by subclassing it; proxies share a base


def _classes(root: Path, prefixes: tuple[str, ...]) -> Iterator[tuple[str, ast.ClassDef]]:
    for path in python_files(root):
        rel = _rel(path, root)
        if rel.startswith(prefixes):
            for node in ast.walk(parse_source(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    yield rel, node


VALUE_BASES = {"Exception", "BaseException", "Struct", "Enum", "StrEnum", "IntEnum", "NamedTuple"}


def mixin_problems(root: Path) -> list[str]:
    """Classes outside actors/runtime/ that derive from a class of the project other than a
    port (a Protocol), an exception or a value (a Struct, an enum): a feature holds its
    collaborators, it is not one."""
    bases_of: dict[str, list[str]] = {}
    for _, node in _classes(root, LAYERS_PREFIXES):
        bases_of[node.name] = [ast.unparse(b).split(".")[-1] for b in node.bases]

    def allowed(name: str, seen: frozenset = frozenset()) -> bool:
        if name in VALUE_BASES or name == "Protocol":
            return True
        if name in seen or name not in bases_of:
            return False
        return any(allowed(b, seen | {name}) for b in bases_of[name])

    problems = []
    for rel, node in _classes(root, COMPOSED):
        if rel.startswith(MAY_SUBCLASS):
            continue
        for base in (ast.unparse(b).split(".")[-1] for b in node.bases):
            if base in bases_of and not allowed(base):
                problems.append(f"{rel}: {node.name}({base})")
    return problems


LAYERS_PREFIXES = tuple(f"{layer}/" for layer in LAYERS)


def test_features_are_composed_not_mixed_in():
    assert mixin_problems(ROOT) == [], "build the feature in __init__ and hold it"


# --- module sizes ------------------------------------------------------------------------------

# One concept per module. Size is only a hint that a module holds two: past SOFT lines the test
# warns, past HARD it fails. A module is never split by line count alone.
SOFT, HARD = 600, 900


def python_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*.py")):  # (a directory lists in its own order)
        parts = path.relative_to(root).parts[:-1]
        if not any(p.startswith(".") or p in SKIP_DIRS for p in parts):
            yield path


def sizes_over(root: Path, limit: int) -> dict[str, int]:
    """Modules longer than `limit` lines, with their line counts."""
    out = {}
    for path in python_files(root):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out[_rel(path, root)] = lines
    return out


def size_verdict(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(modules past HARD: they fail, modules past SOFT only: a note each)."""
    long = sizes_over(root, SOFT)
    too_long = {rel: n for rel, n in long.items() if n > HARD}
    return too_long, {rel: n for rel, n in long.items() if rel not in too_long}


def test_modules_hold_one_concept():
    too_long, long = size_verdict(ROOT)
    assert too_long == {}, f"past {HARD} lines: split by concept"
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # a note in the summary, never an error
        for rel, n in sorted(long.items()):
            warnings.warn(f"{rel}: {n} lines (past {SOFT}): still one concept?", stacklevel=1)


# --- the checkers themselves, on a small made-up tree ------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_cycles_count_type_checking_and_function_level_imports(tmp_path):
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n"
            ),
            "pkg/b.py": "def f():\n    from pkg.c import thing\n",
            "pkg/c.py": "from . import a\n",  # relative
            "pkg/d.py": "import pkg.a\n",  # imports into the cycle, not part of it
        },
    )
    cycles = import_cycles(import_graph(root, "pkg"))
    assert cycles == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]
    assert cycle_problems(cycles, []) != []
    assert cycle_problems(cycles, [frozenset({"pkg.a", "pkg.b", "pkg.c", "pkg.x"})]) == []


def test_private_access_flags_other_objects_and_private_imports():
    source = (
        "from m import _helper, public\n"
        "class A:\n"
        "    def f(self, shard):\n"
        "        self._mine = 1\n"
        "        cls = type(self)\n"
        "        cls._count = 2\n"
        "        super()._hook()\n"
        "        self.__class__.__name__\n"
        "        shard._submit()\n"
        "        self.ws._pool\n"
        "        shard.x._y = 3\n"
        "        getattr(shard, '_queue')\n"
        "        getattr(self, '_mine')\n"
    )
    found = {(what, attr) for _, what, attr in private_access(source)}
    assert found == {
        ("from m import _helper", "_helper"),
        ("shard._submit", "_submit"),
        ("self.ws._pool", "_pool"),
        ("shard.x._y", "_y"),
        ("getattr(shard, '_queue')", "_queue"),
    }


def test_private_reaches_in_tests_skip_test_helpers_and_need_a_why():
    source = (
        "from tests.conftest import _ok\n"
        "from storage.x import _enc, public\n"
        "# private: the ring is the only way to a file read\n"
        "log._ring = []\n"
        "# a comment that says nothing about it\n"
        "\n"
        "shard._pool.clear()\n"
        "x = shard._queue  # private: the queue has no view\n"
    )
    assert list(reaches_in_test(source)) == [
        (2, "from storage.x import _enc", False),
        (4, "log._ring", True),
        (7, "shard._pool", False),
        (8, "shard._queue", True),
    ]


def test_ray_imports_are_found_wherever_they_are():
    assert imports_ray("def f():\n    import ray\n")
    assert imports_ray("from ray.util import get_placement_group\n")
    assert imports_ray("import os, ray.cluster_utils\n")
    assert not imports_ray("from actors.runtime import ray_env\nimport rayon\n")


def test_handle_uses_flag_handles_untyped_calls_and_runtime_imports():
    source = (
        "from actors.runtime.engine import Engine, call\n"
        "import actors.runtime.shard_proxy\n"
        "from actors.ports import EnginePort\n"
        "async def f(self, engine, shard):\n"
        "    await call(self.engine.directory.get_bot, 'b')\n"
        "    await shard.ping.remote()\n"
        "    engine.shard_for('a')\n"
        "    for s in self.engine.shards: pass\n"
        "    await self.engine.directory_port.get_bot('b')\n"
        "    await self.engine.shard_port('a').ping()\n"
        "    self.directory = None\n"
    )
    found = {what for _, what in handle_uses(source)}
    assert found == {
        "import of actors.runtime.engine",
        "import of actors.runtime.shard_proxy",
        "call(self.engine.directory.get_bot, 'b')",
        "self.engine.directory",
        "shard.ping.remote",
        "engine.shard_for",
        "self.engine.shards",
    }
    assert {what for _, what in handle_uses(source, root=True)} == found - {
        "import of actors.runtime.engine",
        "import of actors.runtime.shard_proxy",
    }


def test_mixins_are_found_outside_runtime(tmp_path):
    root = _tree(
        tmp_path,
        {
            "actors/ports.py": "from typing import Protocol\nclass Port(Protocol): ...\n",
            "actors/a.py": "class Reads: ...\nclass Failed(Exception): ...\n",
            "actors/b.py": "from actors import a, ports\n"
            "class Service(a.Reads): ...\n"
            "class Local(ports.Port): ...\n"
            "class Worse(a.Failed): ...\n"
            "class Mixed(Service): ...\n",
            "actors/runtime/c.py": "from actors.b import Service\nclass Hosted(Service): ...\n",
            "gateway/d.py": "from actors.a import Reads\nclass Routes(Reads): ...\n",
        },
    )
    assert mixin_problems(root) == [
        "actors/b.py: Service(Reads)",
        "actors/b.py: Mixed(Service)",
        "gateway/d.py: Routes(Reads)",
    ]


def test_sizes_warn_then_fail_and_skip_environments(tmp_path):
    root = _tree(
        tmp_path,
        {
            "actors/long.py": "x = 1\n" * (SOFT + 1),
            "storage/ok.py": "x = 1\n" * SOFT,
            "tests/big.py": "x = 1\n" * (HARD + 1),
            ".venv/lib/huge.py": "x = 1\n" * 5000,
        },
    )
    assert size_verdict(root) == ({"tests/big.py": HARD + 1}, {"actors/long.py": SOFT + 1})


# --- every package is installed ----------------------------------------------------------------


def test_every_package_below_an_installed_one_is_listed_in_pyproject():
    """A non-editable install (each node of a cluster) holds only the packages pyproject lists:
    a new subpackage left out imports fine here and fails there."""
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    tops = {name.split(".")[0] for name in listed}
    found = {
        _module_name(init, ROOT)
        for top in tops
        for init in (ROOT / top).rglob("__init__.py")
        if not any(p.startswith(".") or p in SKIP_DIRS for p in init.relative_to(ROOT).parts)
    }
    assert sorted(found - listed) == []
