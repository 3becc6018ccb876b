"""The suite's own plumbing (tests/conftest.py): markers follow what a test needs, a `unit` test
cannot start Ray or a process, and the caller's Ray and OpenBot variables do not reach the
tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from tests.conftest import StartedAProcess

ROOT = Path(__file__).resolve().parent.parent
CALLER_TMP = "/nonexistent/caller-ray-tmp"


def test_a_unit_test_that_starts_ray_or_a_process_is_stopped(_unit_stays_in_process):
    with pytest.raises(StartedAProcess):
        subprocess.run(["true"], check=False)
    with pytest.raises(StartedAProcess):
        ray.init()
    assert _unit_stays_in_process == ["a subprocess", "Ray"]
    _unit_stays_in_process.clear()  # refused on purpose: the teardown check is for real ones


def test_the_callers_ray_and_openbot_variables_are_gone():
    """Run by the test below with the caller's variables set."""
    assert os.environ.get("RAY_TMPDIR") != CALLER_TMP
    assert "RAY_ADDRESS" not in os.environ
    assert "OPENBOT_RAY_ADDRESS" not in os.environ
    assert "OPENBOT_SHARDS" not in os.environ


def _pytest(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def markers() -> dict[str, set[str]]:
    """The markers of a few tests that need different things, from one collection in a fresh
    interpreter (as `./run test` collects)."""
    out = _pytest(
        "--collect-only",
        "-p",
        "tests.marker_listing",
        "tests/test_failure_logs.py",  # the session's gateway and Ray
        "tests/test_events_restart.py",  # the session's Ray, no gateway of the session
        "tests/test_ray_env.py",  # a fresh interpreter per case
        "tests/test_engine_file_tree_chats.py",  # pure: examples and Hypothesis searches
        "tests/test_openapi.py",  # Hypothesis searches against the session's server
    )
    listed = [line.split(" ", 2) for line in out.stdout.splitlines() if line.startswith("MARKERS ")]
    assert listed, out.stdout + out.stderr
    return {nodeid: set(names.split()) for _, nodeid, names in listed}


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


@pytest.mark.subprocess
def test_markers_follow_the_fixtures_and_unit_selects_in_process_tests(markers):
    unit = {nodeid for nodeid, names in markers.items() if "unit" in names}
    assert unit and {_file(nodeid) for nodeid in unit} == {"tests/test_engine_file_tree_chats.py"}
    searches = {nodeid for nodeid, names in markers.items() if "property" in names}
    assert searches and not searches & unit, (searches, unit)
    assert {_file(nodeid) for nodeid in searches} == {"tests/test_engine_file_tree_chats.py"}


@pytest.mark.subprocess
def test_a_search_against_the_server_stays_out_of_the_parallel_tier(markers):
    """`./run test` spreads `unit or property` over workers, each a process of its own: a
    Hypothesis search that needs the session's Ray and gateway must run with the others."""
    openapi = {n: names for n, names in markers.items() if _file(n) == "tests/test_openapi.py"}
    assert "server" in openapi["tests/test_openapi.py::test_no_server_error"], openapi
    assert not [n for n, names in openapi.items() if names & {"unit", "property"}], openapi


@pytest.mark.subprocess
def test_the_suite_ignores_the_callers_ray_and_openbot_variables():
    out = _pytest(
        "tests/test_suite_markers.py::test_the_callers_ray_and_openbot_variables_are_gone",
        RAY_TMPDIR=CALLER_TMP,
        RAY_ADDRESS="127.0.0.1:1",
        OPENBOT_RAY_ADDRESS="127.0.0.1:1",
        OPENBOT_SHARDS="7",
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.anyio
async def test_the_shard_fixture_is_connected_to_the_directory_fixture(shard, directory, tmp_path):
    org = await directory.create_org("Acme", id="o_acme")
    assert shard.peers.directory() is directory and org.id == "o_acme"
    assert await shard.ping() == 0
    assert {"directory.duckdb", "shard-0.duckdb"} <= {p.name for p in tmp_path.glob("*.duckdb")}
