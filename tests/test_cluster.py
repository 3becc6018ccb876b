"""Cluster mode on a 2-node `ray.cluster_utils` cluster: accounts on both shards served
through one gateway; killing the node that holds one shard and bringing a node back loses no
acknowledged write, and resuming event clients see every event once.

The scenario runs in a process of its own (tests/cluster_scenario.py): Ray allows one session per
process and this test session already has its local one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.cluster
@pytest.mark.slow
def test_node_failure_loses_no_acknowledged_write_and_no_event():
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "OPENBOT_RAY_ADDRESS")}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "tests.cluster_scenario"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,  # ~30-60 s on 2 idle cores; generous for a loaded CI machine
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the cluster scenario did not finish in 300 s: {(e.stderr or '')[-3000:]}")
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output (exit {proc.returncode}): {proc.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert result["failed_checks"] == [], json.dumps(result, indent=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # What the figures say, beyond the checks: the lost shard came back and clients saw it all.
    assert result["placement"]["mode"] == "spread"
    assert result["failover"]["victim_restarted"] is True
    for name, seen in result["events"].items():
        if isinstance(seen, dict):
            assert seen["dup"] == 0 and seen["missing"] == 0, name


# --- the pieces, without a cluster -----------------------------------------------------------


def test_a_restarted_store_refuses_to_start_without_its_file(tmp_path):
    from actors.runtime.hosting import guard_store
    from engine.errors import StorageError

    (tmp_path / "master.key").write_text("x")
    file = tmp_path / "shard-0.duckdb"
    guard_store(tmp_path, file, restarted=False, needs_key=True)  # first start: made here
    with pytest.raises(StorageError) as e:
        guard_store(tmp_path, file, restarted=True, needs_key=True)
    assert e.value.code == "data_dir_unreachable"


def test_a_shard_refuses_to_start_without_the_master_key(tmp_path, monkeypatch):
    from actors.runtime.hosting import guard_store
    from engine.errors import StorageError

    monkeypatch.delenv("OPENBOT_MASTER_KEY", raising=False)
    with pytest.raises(StorageError) as e:
        guard_store(tmp_path, tmp_path / "shard-0.duckdb", restarted=False, needs_key=True)
    assert e.value.code == "data_dir_unreachable"
    guard_store(tmp_path, tmp_path / "directory.duckdb", restarted=False, needs_key=False)


@pytest.mark.subprocess
def test_a_store_waits_for_another_process_to_let_go_of_its_file(tmp_path):
    from actors.runtime.hosting import guard_store
    from engine.errors import StorageError

    (tmp_path / "master.key").write_text("x")
    file = tmp_path / "shard-0.duckdb"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('open', flush=True); "
            "sys.stdin.read()",
            str(file),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(StorageError) as e:
            guard_store(tmp_path, file, restarted=True, needs_key=True, lock_wait=0.3)
        assert e.value.code == "store_locked"
    finally:
        holder.stdin.close()
        holder.wait(30)
    guard_store(tmp_path, file, restarted=True, needs_key=True, lock_wait=0.3)  # let go: fine


def test_a_data_directory_keeps_its_shard_count(tmp_path):
    from actors.runtime.engine import check_shard_files
    from engine.errors import InvalidInput

    for k in range(3):
        (tmp_path / f"shard-{k}.duckdb").write_bytes(b"")
    check_shard_files(tmp_path, 3)
    with pytest.raises(InvalidInput) as e:
        check_shard_files(tmp_path, 2)
    assert e.value.code == "shard_count"


def test_placement_options():
    from actors.runtime.engine import HEAD_RESOURCE, actor_options, resolve_placement
    from engine.errors import InvalidInput

    assert actor_options("pinned", "openbot-shard-1") == {"resources": {"openbot-shard-1": 0.001}}
    assert actor_options("head", "openbot-directory") == {"resources": {HEAD_RESOURCE: 0.001}}
    assert actor_options("local", "openbot-shard-0") == {}
    assert actor_options("spread", "openbot-shard-0", None) == {}
    with pytest.raises(InvalidInput):
        resolve_placement("everywhere")


def test_serve_joins_the_cluster_named_by_ray_address(monkeypatch):
    from gateway.server import load_settings

    for name in ("OPENBOT_RAY_ADDRESS", "RAY_ADDRESS", "OPENBOT_PLACEMENT", "OPENBOT_SHARDS"):
        monkeypatch.delenv(name, raising=False)
    assert load_settings().ray_address is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("OPENBOT_SHARDS", "4")
    s = load_settings()
    assert (s.ray_address, s.shards, s.placement) == ("10.0.0.1:6379", 4, "auto")
    monkeypatch.setenv("OPENBOT_RAY_ADDRESS", "10.0.0.2:6379")
    assert load_settings().ray_address == "10.0.0.2:6379"  # ours wins over Ray's
    s = load_settings(ray_address="10.0.0.3:6379", placement="pinned", shards=8)
    assert (s.ray_address, s.placement, s.shards) == ("10.0.0.3:6379", "pinned", 8)


def test_where_is_unavailable_while_an_actor_is_gone(ray_session, tmp_path):
    """`Engine.where` answers with the engine's own error, not Ray's, when an actor is down
    (the cluster scenario polls it while a shard restarts)."""
    import secrets

    from actors.runtime.engine import Engine
    from engine.errors import Unavailable

    eng = Engine.start(tmp_path / "data", shards=1, prefix="where-" + secrets.token_hex(3))
    assert len(eng.where()["shards"]) == 1
    eng.stop()  # the actors are killed without restart
    with pytest.raises(Unavailable):
        eng.where(timeout=10)
