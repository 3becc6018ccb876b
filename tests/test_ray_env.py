"""The embedded Ray's environment (actors/runtime/ray_env.py): `start_ray` refuses to start a local
Ray that `ray` was imported for before `ray_env` could keep it on loopback, and says so from
public values only (no `ray._private` constant). Each case runs in a fresh interpreter: what
matters is what was imported first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess  # each case runs in a fresh interpreter

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "OPENBOT_RAY"))}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env | extra,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_ray_env_first_keeps_the_embedded_ray_on_loopback():
    code = (
        "import actors.runtime.engine\n"
        "from actors.runtime.ray_env import loopback_only\n"
        "import ray._private.ray_constants as c\n"
        "print(loopback_only(), c.ENABLE_RAY_CLUSTER)\n"
    )
    # Ray itself agrees: its private flag (read here only to check ours) is off.
    assert _run(code) == "True False"


def test_ray_imported_first_is_refused_before_anything_starts(tmp_path):
    code = (
        "import ray\n"
        "import actors.runtime.engine as e\n"
        "from engine.errors import Unavailable\n"
        "try:\n"
        f"    e.start_ray(None, tmp_dir={str(tmp_path)!r})\n"
        "except Unavailable as err:\n"
        "    print(err.code, ray.is_initialized())\n"
    )
    assert _run(code) == "ray_env False"


def test_ray_imported_first_with_the_switch_already_off_is_accepted():
    """A process that inherited the environment (a child of a server) imported Ray with the
    switch off: that Ray stays on loopback."""
    code = (
        "import ray\n"
        "from actors.runtime.ray_env import loopback_only\n"
        "import ray._private.ray_constants as c\n"
        "print(loopback_only(), c.ENABLE_RAY_CLUSTER)\n"
    )
    switch = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}
    assert _run(code, **switch) == "True False"
    assert _run(code, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1", RAY_AUTH_MODE="token") == "False True"


def test_the_embedded_ray_runs_its_actors_at_the_servers_priority(ray_tmp):
    """Ray nices its workers to 15 by default: the shards would then starve behind any busy
    process on the machine, while the gateway waiting on them does not."""
    code = (
        "import os\n"
        "import actors.runtime.engine as e\n"
        f"e.start_ray(None, tmp_dir={ray_tmp!r})\n"
        "import ray\n"
        "@ray.remote\n"
        "class Probe:\n"
        "    def nice(self):\n"
        "        return os.nice(0)\n"
        "print(ray.get(Probe.remote().nice.remote()), os.nice(0))\n"
    )
    worker, driver = _run(code).split()
    assert worker == driver
