"""The README's memory-bot walk-through with `examples/openbot.toml`, step by step as a person
types it (the `openbot admin` CLI, then HTTP): the memory bot learns a visible fact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from gateway.demo import embedded_server

pytestmark = pytest.mark.ray


def test_the_memory_bot_learns_a_visible_fact_with_the_example_config(ray_session):
    with embedded_server() as (url, token):  # examples/openbot.toml's models, a fresh data dir
        env = {**os.environ, "OPENBOT_URL": url, "OPENBOT_ADMIN_TOKEN": token}

        def admin(*args: str) -> dict:
            out = subprocess.run(
                [sys.executable, "-m", "gateway.cli", "admin", *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        org = admin("org", "create", "--name", "Acme")["id"]
        ada = admin("user", "create", "--name", "Ada", "--org", org)
        bot = admin("bot", "create", "--name", "Helper", "--org", org, "--owner", ada["id"],
                    "--model", "demo")["id"]  # fmt: skip
        admin("org", "set", org, "botMemoryModel=demo")
        headers = {"Authorization": f"Bearer {ada['token']}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            chat = c.post("/v1/chats", json={"bot": bot}).json()["id"]
            said = "I moved to Lisbon last month."
            turn = c.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": said}).json()
            assert turn["turn"]["status"] == "done"
            deadline = time.monotonic() + 30
            # Learning runs after the turn, in the shard actor: poll the public route.
            while True:
                jobs = c.get("/api/app/workspace/memory-jobs").json()["jobs"]
                if jobs and jobs[0]["status"] in ("done", "failed"):
                    break
                assert time.monotonic() < deadline, jobs
                time.sleep(0.1)
            (job,) = jobs
            assert (job["status"], job["error"], job["rejections"]) == ("done", None, [])
            entries = c.get(f"/v1/bots/{bot}/memory").json()["entries"]
    (fact,) = entries
    assert fact["layer"] == "fact" and fact["content"] == said
    assert fact["sources"] == [{"chat": chat, "item": "i-1"}] and "about-me" in fact["tags"]
