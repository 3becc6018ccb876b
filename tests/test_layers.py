"""Dependencies point one way: gateway → actors → storage → engine; engine is pure."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["engine", "storage", "actors", "gateway"]  # each may import only those before it
PURE_THIRD_PARTY = {"msgspec"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


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
