"""Fan-out across processes: a second `openbot serve` joined to the same Ray instance, and the
`openbot events` CLI as its client."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest
import ray

from tests.conftest import ADMIN


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def second_gateway(engine, data_dir):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env |= {
        "OPENBOT_ADMIN_TOKEN": ADMIN,
        "OPENBOT_ACTOR_PREFIX": "test",
        # The test's Ray is a local one on loopback with token auth: join it as a cluster
        # user would, with Ray's own variables (actors/runtime/ray_env.py leaves them to a joiner).
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": os.environ["RAY_AUTH_TOKEN_PATH"],
    }
    address = ray.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--ray-address", address]
    cmd += ["--data-dir", str(data_dir), "--port", str(port), "--shards", str(len(engine.shards))]
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:  # another process: poll until it answers
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "second gateway did not start"
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(30)


def test_events_reach_clients_of_either_gateway(world, second_gateway):
    tail = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "events", "--url", second_gateway, "--count", "2"],
        env={**os.environ, "OPENBOT_TOKEN": world.tokens["alice"]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The CLI needs a moment to connect; changes made before it is live would be missed (it
    # starts at the present), so make changes until two have arrived.
    made = []
    with (
        world.client("alice") as alice,
        httpx.Client(
            base_url=second_gateway, headers={"Authorization": f"Bearer {world.tokens['alice']}"}
        ) as alice_b,
    ):
        deadline = time.monotonic() + 30
        while tail.poll() is None and time.monotonic() < deadline:
            client = alice if len(made) % 2 == 0 else alice_b  # writes through both gateways
            r = client.post(
                f"/v1/bots/{world.bot}/memory",
                json={"command": {"_tag": "Remember", "content": f"n{len(made)}"}},
            )
            assert r.status_code == 201, r.text
            made.append(r.json()["id"])
            time.sleep(0.3)
    out, err = tail.communicate(timeout=30)
    assert tail.returncode == 0, err
    frames = [json.loads(line) for line in out.splitlines()]
    assert [f["type"] for f in frames] == ["memory.changed", "memory.changed"]
    got = [f["data"]["entry"] for f in frames]
    assert got == made[made.index(got[0]) : made.index(got[0]) + 2]  # consecutive, in order
