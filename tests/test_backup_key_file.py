"""Keys live outside the data. A real `openbot serve` with `OPENBOT_MASTER_KEY_FILE`
outside its data directory; `openbot backup` leaves the key out unless `--with-key`; the key-less
copy refuses to start without its key (rather than seal with a new one) and serves everything
once the key is supplied."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import httpx
import pytest

from tests.test_serve_restart import ADMIN, Serve

MARKER = "ibis-3307-keyed-note"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "OPENBOT_"))}
    return env | extra


def _backup(url: str, dest, *flags: str) -> dict:
    cmd = [sys.executable, "-m", "gateway.cli", "backup", str(dest), "--url", url]
    out = subprocess.run(
        [*cmd, "--token", ADMIN, *flags], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


@pytest.mark.slow
def test_key_file_outside_the_data_and_key_less_backups(tmp_path, ray_tmp):
    data, key = tmp_path / "data", tmp_path / "keys" / "master.key"
    server = Serve(data, ray_tmp, env=_env(OPENBOT_MASTER_KEY_FILE=str(key)))
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=server.url, headers=admin, timeout=30) as a:
            org = a.post("/v1/admin/orgs", json={"name": "acme"}).json()["id"]
            user = a.post("/v1/admin/users", json={"name": "ada", "orgs": [org]}).json()
            bot = a.post("/v1/admin/bots", json={"name": "b", "org": org, "owner": user["id"]})
        mem = f"/v1/bots/{bot.json()['id']}/memory"
        h = {"Authorization": f"Bearer {user['token']}"}
        with httpx.Client(base_url=server.url, headers=h, timeout=30) as c:
            cmd = {"_tag": "Remember", "content": MARKER}
            assert c.post(mem, json={"command": cmd}).status_code == 201
            before = c.get(mem).json()
        keyless = _backup(server.url, tmp_path / "keyless")
        keyed = _backup(server.url, tmp_path / "keyed", "--with-key")
    finally:
        server.stop()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert not (data / "master.key").exists()  # the key was made where it was asked to be
    assert not any(f.endswith("master.key") for f in keyless["files"])
    assert not (tmp_path / "keyless" / "master.key").exists()
    assert any(f.endswith("master.key") for f in keyed["files"])
    assert (tmp_path / "keyed" / "master.key").read_text() == key.read_text()
    for path in (tmp_path / "keyless").rglob("*"):
        assert MARKER.encode() not in path.read_bytes(), path

    # Without its key the copy does not start (a new key would leave every entry unreadable).
    with pytest.raises(AssertionError) as refused:
        Serve(tmp_path / "keyless", ray_tmp, env=_env())
    assert "master key" in str(refused.value)
    assert not (tmp_path / "keyless" / "master.key").exists()

    server = Serve(tmp_path / "keyless", ray_tmp, env=_env(OPENBOT_MASTER_KEY_FILE=str(key)))
    try:
        with httpx.Client(base_url=server.url, headers=h, timeout=30) as c:
            assert c.get(mem).json() == before
    finally:
        server.stop()
