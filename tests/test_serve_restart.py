"""A real `openbot serve` process: data survive a stop and start, and nothing readable leaks to
disk. Starts its own local Ray, so it is the slowest test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

MARKER = "zebra-7781-private-note"
SETTINGS_MARKER = "okapi-5512-sharing-rule"
ADMIN = "serve-test-admin-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    def __init__(self, data_dir: Path, ray_tmp: str, env: dict[str, str] | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if env is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
        env = env | {"OPENBOT_ADMIN_TOKEN": ADMIN, "RAY_TMPDIR": ray_tmp}
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--data-dir", str(data_dir)]
        cmd += ["--port", str(self.port), "--shards", "1"]
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 90
        # Waiting on another process to come up: there is no event to await across processes.
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"openbot serve exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError("openbot serve did not come up in 90 s")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out or ""


@pytest.mark.slow
def test_serve_keeps_everything_across_restart_and_encrypts_at_rest(tmp_path, ray_tmp):
    data = tmp_path / "data"
    admin = {"Authorization": f"Bearer {ADMIN}"}
    server = Serve(data, ray_tmp)
    try:
        with httpx.Client(base_url=server.url, headers=admin, timeout=30) as a:
            org = a.post("/v1/admin/orgs", json={"name": "acme"}).json()["id"]
            user = a.post("/v1/admin/users", json={"name": "ada", "orgs": [org]}).json()
            bot = a.post("/v1/admin/bots", json={"name": "b", "org": org, "owner": user["id"]})
            bot_id = bot.json()["id"]
        h = {"Authorization": f"Bearer {user['token']}"}
        with httpx.Client(base_url=server.url, headers=h, timeout=30) as c:
            mem = f"/v1/bots/{bot_id}/memory"
            ids = []
            for n in range(3):
                cmd = {"_tag": "Remember", "content": f"{MARKER} {n}", "tags": ["notes"]}
                ids.append(c.post(mem, json={"command": cmd}).json()["id"])
            c.post(mem, json={"command": {"_tag": "Forget", "id": ids[0]}})
            patch = {"expected": 0, "instructions": SETTINGS_MARKER, "concurrency": 1}
            assert c.patch(f"{mem}/bot", json=patch).status_code == 200
            before = (c.get(mem).json(), c.get(f"{mem}/log").json(), c.get(f"{mem}/bot").json())
    finally:
        out = server.stop()
    assert before[0]["version"] == 4 and len(before[1]["changes"]) == 4

    for path in data.rglob("*"):
        if path.is_file():
            raw = path.read_bytes()
            assert MARKER.encode() not in raw, path
            assert SETTINGS_MARKER.encode() not in raw, path
            assert user["token"].encode() not in raw, path
    assert MARKER not in out

    server = Serve(data, ray_tmp)
    try:
        with httpx.Client(base_url=server.url, headers=h, timeout=30) as c:
            after = (c.get(mem).json(), c.get(f"{mem}/log").json(), c.get(f"{mem}/bot").json())
    finally:
        server.stop()
    assert after == before
