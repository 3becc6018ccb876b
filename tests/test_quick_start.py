"""The README's quick start on a real `openbot serve` started with no config: the built-in `local`
model chats and, as the memory bot, learns; the server prints no warning on the way."""

from __future__ import annotations

import os
import tempfile
import time

import httpx
import pytest

from tests.test_serve_restart import ADMIN, Serve


@pytest.mark.slow
def test_a_server_without_config_chats_and_learns_on_the_local_model(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBOT_CONFIG", "RAY_ADDRESS")}
    ray_tmp = tempfile.mkdtemp(prefix="obq", dir="/tmp")
    server = Serve(tmp_path / "data", ray_tmp, env=env)
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=server.url, headers=admin, timeout=60) as a:
            made = a.post("/v1/admin/orgs", json={"name": "Acme"})
            assert made.status_code == 201, made.text
            org = made.json()["id"]
            user = a.post("/v1/admin/users", json={"name": "Ada", "orgs": [org]}).json()
            body = {"name": "Helper", "org": org, "owner": user["id"], "model": "local"}
            bot = a.post("/v1/admin/bots", json=body).json()["id"]
            settings = {"settings": {"botMemoryModel": "local"}}
            assert a.patch(f"/v1/admin/orgs/{org}", json=settings).status_code == 200
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {user['token']}"}, timeout=60
        ) as c:
            chat = c.post("/v1/chats", json={"bot": bot}).json()["id"]
            turns = f"/v1/chats/{chat}/turns?wait=true"
            hello = c.post(turns, json={"text": "Hello there!"}).json()
            assert [i["text"] for i in hello["items"] if i["kind"] == "bot"] == [
                "You said: Hello there!"
            ]
            said = "I moved to Lisbon last month."
            assert c.post(turns, json={"text": said}).json()["turn"]["status"] == "done"
            deadline = time.monotonic() + 60
            # Learning runs after the turn inside the shard process: poll the public route.
            while True:
                jobs = c.get("/api/app/workspace/memory-jobs").json()["jobs"]
                if jobs and jobs[0]["status"] in ("done", "failed"):
                    break
                assert time.monotonic() < deadline, jobs
                time.sleep(0.1)
            assert jobs[0]["status"] == "done", jobs
            (fact,) = c.get(f"/v1/bots/{bot}/memory").json()["entries"]
            assert fact["content"] == said and fact["layer"] == "fact"
    finally:
        out = server.stop()
    noisy = [ln for ln in out.splitlines() if "Warning" in ln or "deprecated" in ln.lower()]
    assert not noisy, out
