"""`openbot` as a person runs it, in subprocesses: one-line errors and exit codes, options after
subcommands, `--help`, `serve` refusing a busy port or a data directory in use at once and
leaving nothing behind, `admin bot create --model` / `bot update`, `events` status lines."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

import pytest

from gateway.cli import build_parser
from tests.conftest import ADMIN
from tests.test_repo_hygiene import OUTSIDE

CLI = [sys.executable, "-m", "gateway.cli"]


def run(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nobody listens there


def one_line_error(out: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


@pytest.mark.subprocess
def test_an_unreachable_server_is_one_line_and_exit_1():
    url = f"http://127.0.0.1:{closed_port()}"
    # --url and --token after the subcommand.
    out = run("admin", "org", "create", "--name", "A", "--url", url, "--token", "t")
    assert out.returncode == 1 and out.stdout == ""
    line = one_line_error(out)
    assert line.startswith(f"openbot: cannot reach {url}") and "openbot serve" in line
    out = run("backup", "/tmp/never-made-by-this-test", "--url", url, "--token", "t")
    assert out.returncode == 1 and "cannot reach" in one_line_error(out)


def test_options_before_and_after_admin_subcommands():
    parse = build_parser().parse_args
    before = parse(["admin", "--url", "U", "--token", "T", "bot", "create", "--name", "n",
                    "--org", "o", "--owner", "u"])  # fmt: skip
    after = parse(["admin", "bot", "create", "--name", "n", "--org", "o", "--owner", "u",
                   "--url", "U", "--token", "T", "--model", "m"])  # fmt: skip
    assert (before.url, before.token) == (after.url, after.token) == ("U", "T")
    assert after.model == "m" and before.model is None
    default = parse(["admin", "grant", "--bot", "b", "--user", "u", "--permission", "read"])
    assert default.url.startswith("http://") and default.token is None


def _commands(parser: argparse.ArgumentParser, path=()):
    yield path, parser
    # private: argparse has no public walk over a parser's options
    for action in parser._actions:
        # private: argparse has no public walk over subcommands
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


@pytest.mark.subprocess
def test_help_describes_every_command_and_option():
    commands = list(_commands(build_parser()))
    assert len(commands) > 15
    for path, parser in commands:
        assert parser.description, path
        # private: argparse has no public walk over a parser's options
        for action in parser._actions:
            # private: argparse has no public walk over a parser's options
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (path, action.dest)
    out = run("admin", "bot", "create", "--help")
    assert out.returncode == 0
    assert "--model MODEL" in out.stdout and "a model named in the server's config" in out.stdout
    assert "(default: demo-bots)" in run("demo", "--help").stdout
    assert "(default: info)" in run("serve", "--help").stdout
    # Help names only what a user of this repository has: no outside documents.
    for path, parser in commands:
        text = parser.format_help()
        assert not OUTSIDE.search(text), (path, text)


@pytest.mark.subprocess
def test_serve_on_a_busy_port_fails_at_once_and_leaves_nothing(tmp_path):
    data = tmp_path / "new-data"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # At once: a server that went on (or hung) would be stopped by the timeout, and fail.
        out = run("serve", "--data-dir", str(data), "--port", str(port), timeout=60)
    assert out.returncode == 1 and "openbot: serving" not in out.stdout
    assert one_line_error(out) == (
        f"openbot: cannot listen on 127.0.0.1:{port}: Address already in use"
    )
    assert not data.exists()  # no master.key, no admin.token, no directory


@pytest.mark.subprocess
def test_serve_on_a_data_dir_in_use_fails_at_once(tmp_path):
    from gateway.server import LOCK_FILE, DataDirLock

    data = tmp_path / "data"
    data.mkdir()
    (data / "keep.txt").write_text("mine")
    holder = DataDirLock(data)  # as a running `openbot serve` holds it
    try:
        # At once: a server that went on (or hung) would be stopped by the timeout, and fail.
        out = run("serve", "--data-dir", str(data), "--port", str(closed_port()), timeout=60)
    finally:
        os.close(holder.fd)
    assert out.returncode == 1
    assert one_line_error(out) == (
        f"openbot: data directory {data} is in use by another openbot serve (pid {os.getpid()})"
    )
    assert sorted(p.name for p in data.iterdir()) == sorted(["keep.txt", LOCK_FILE])


@pytest.mark.ray
def test_admin_bot_model_create_update_and_refusals(server, world):
    def admin(*args: str) -> subprocess.CompletedProcess:
        return run("admin", *args, "--url", server.url, "--token", ADMIN)

    owner = world.users["alice"]
    made = admin("bot", "create", "--name", "M", "--org", world.org, "--owner", owner,
                 "--model", "bot")  # fmt: skip
    assert made.returncode == 0, made.stderr
    bot = json.loads(made.stdout)
    assert bot["model"] == "bot"
    refused = admin("bot", "create", "--name", "N", "--org", world.org, "--owner", owner,
                    "--model", "nosuch")  # fmt: skip
    assert refused.returncode == 1 and refused.stdout == ""
    assert one_line_error(refused) == (
        "openbot: POST /v1/admin/bots: HTTP 422: unknown model 'nosuch' "
        "(models: bot, edge, emb, mem) (unknown_model)"
    )
    changed = admin("bot", "update", bot["id"], "--model", "mem", "--name", "Mo")
    assert changed.returncode == 0, changed.stderr
    assert {k: json.loads(changed.stdout)[k] for k in ("model", "name")} == {
        "model": "mem",
        "name": "Mo",
    }
    cleared = json.loads(admin("bot", "update", bot["id"], "--model", "").stdout)
    assert cleared["model"] is None and cleared["name"] == "Mo"
    bad = admin("bot", "update", bot["id"], "--model", "nosuch")
    assert bad.returncode == 1 and "HTTP 422" in one_line_error(bad)
    assert admin("org", "set", world.org, "botMemoryModel=nosuch").returncode == 1
    missing = admin("bot", "update", "b_nosuchbot", "--name", "x")
    assert missing.returncode == 1 and "HTTP 404" in one_line_error(missing)


@pytest.mark.ray
def test_events_says_when_connected_and_when_retrying(server, world):
    proc = subprocess.Popen(
        [*CLI, "events", "--url", server.url, "--count", "1"],
        env={**os.environ, "OPENBOT_TOKEN": world.tokens["alice"]},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stderr.readline()  # blocks until the CLI said it is connected
        assert first == f"openbot events: connected to ws://{server.url[7:]}/v1/events\n"
        with world.client("alice") as alice:
            cmd = {"command": {"_tag": "Remember", "content": "x"}}
            assert alice.post(f"/v1/bots/{world.bot}/memory", json=cmd).status_code == 201
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and json.loads(out)["type"] == "memory.changed"

    gone = f"http://127.0.0.1:{closed_port()}"
    proc = subprocess.Popen(
        [*CLI, "events", "--url", gone, "--token", "t"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
    finally:
        proc.kill()
        proc.communicate()
    assert line.startswith("openbot events: cannot connect") and "retrying in" in line, line


@pytest.mark.subprocess
def test_demo_with_an_unknown_model_exits_non_zero():
    """Against a server that refuses the model: exit 1 (tests/test_demo.py runs the embedded
    variant); here the server is absent, which is a failure too."""
    out = run("demo", "--url", f"http://127.0.0.1:{closed_port()}", "--token", "t",
              "--model", "nosuch")  # fmt: skip
    assert out.returncode == 1 and "cannot reach" in one_line_error(out)


@pytest.mark.subprocess
def test_demo_port_is_for_the_embedded_server_and_a_taken_one_fails_at_once():
    out = run("demo", "--url", "http://127.0.0.1:1", "--token", "t", "--port", "8999")
    assert out.returncode == 1 and "--port is for the embedded server" in one_line_error(out)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run("demo", "--port", str(port), timeout=60)
    line = one_line_error(out)
    assert out.returncode == 1 and f"port {port} on 127.0.0.1 is not free" in line, line


@pytest.mark.slow
def test_a_failed_start_removes_what_it_made(tmp_path):
    """Past the port and the lock (Ray started, admin.token made), the engine refuses the data
    directory: what this start added is removed again, what was there stays."""
    import shutil
    import tempfile

    data = tmp_path / "data"
    data.mkdir()
    for name in ("shard-0.duckdb", "shard-1.duckdb"):  # made with 2 shards; started with 1
        (data / name).write_bytes(b"")
    from storage.crypto import load_master_key

    load_master_key(data)  # its key is there: the start gets past the key check
    before = sorted(p.name for p in data.iterdir())
    ray_tmp = tempfile.mkdtemp(prefix="obf", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBOT_ADMIN_TOKEN", "RAY_ADDRESS")}
    try:
        out = subprocess.run(
            [*CLI, "serve", "--data-dir", str(data), "--port", str(closed_port()), "--shards", "1"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "RAY_TMPDIR": ray_tmp},
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert out.returncode == 2 and "openbot: serving" not in out.stdout
    assert "it was made with more than 1 shards" in out.stderr and "Traceback" not in out.stderr
    assert sorted(p.name for p in data.iterdir()) == before  # no admin.token, no serve.lock
