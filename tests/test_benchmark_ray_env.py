"""A benchmark that starts the embedded Ray must load `actors.runtime.ray_env` when it is
imported: `start_ray` refuses to start once `ray` was imported before it (the loopback-only
switch would come too late), so a benchmark importing `ray` first fails at run time, after its
data set is built (benchmarks.retrieval did)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.python_source import parse_source

pytestmark = pytest.mark.subprocess  # each case runs in a fresh interpreter

ROOT = Path(__file__).resolve().parent.parent


def _imports_ray(path: Path) -> bool:
    for node in ast.walk(parse_source(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name == "ray" for a in node.names):
            return True
    return False


def _entry_modules() -> list[str]:
    """The runnable benchmarks (`python -m benchmarks.<name>`) whose code imports ray."""
    out = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if not path.name.startswith("_") and _imports_ray(path):
            out.append(f"benchmarks.{path.stem}")
    for pkg in sorted(p for p in (ROOT / "benchmarks").iterdir() if (p / "__main__.py").exists()):
        if any(_imports_ray(f) for f in pkg.glob("*.py")):
            out.append(f"benchmarks.{pkg.name}._main")
    return out


def test_every_benchmark_that_starts_ray_sets_its_environment_on_import():
    modules = _entry_modules()
    assert "benchmarks.retrieval" in modules and "benchmarks.memory_ops" in modules
    script = (
        "import importlib, sys\n"
        "bad = []\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "    if 'actors.runtime.ray_env' not in sys.modules: bad.append(m)\n"
        "print(bad)\n"
    )
    # One process per module: what one imported must not hide what another lacks.
    for module in modules:
        one = script.replace(repr(modules), repr([module]))
        done = subprocess.run(
            [sys.executable, "-c", one], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip() == "[]", f"{module} imports ray before actors.runtime.ray_env"
