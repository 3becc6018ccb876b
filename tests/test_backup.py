"""Backups (FS-4): a consistent copy that runs as a data directory, with a new event epoch."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from pathlib import Path

import pytest

from engine.errors import StorageError
from engine.memory_entries import Reader
from storage.event_log import backup_offline
from tests.conftest import ADMIN, LiveServer


@pytest.mark.anyio
async def test_backup_while_serving_restores_data_and_resets_old_cursors(
    world, admin, tmp_path, data_dir
):
    from websockets.asyncio.client import connect

    from actors.runtime.engine import Engine
    from gateway.app import create_app

    url = f"/v1/bots/{world.bot}/memory"
    with world.client("alice") as alice:
        for n in range(3):
            alice.post(url, json={"command": {"_tag": "Remember", "content": f"keep {n}"}})
        before = alice.get(url).json()

    async def first_frame(server_url, cursor=None):
        ws_url = f"{server_url.replace('http', 'ws')}/v1/events"
        if cursor:
            ws_url += f"?cursor={cursor}"
        headers = {"Authorization": f"Bearer {world.tokens['alice']}"}
        async with connect(ws_url, additional_headers=headers) as ws:
            return json.loads(await ws.recv())

    cursor = (await first_frame(world.server.url))["cursor"]
    # By default the key stays out of the copy, and the copy will not start on a
    # key of its own: the entries would be unreadable.
    keyless = tmp_path / "keyless"
    r = admin.post("/v1/admin/backup", json={"dir": str(keyless)})
    assert r.status_code == 201, r.text
    names = {p.name for p in keyless.iterdir()}
    assert {"directory.duckdb", "shard-0.duckdb", "shard-1.duckdb"} <= names
    assert "master.key" not in names and all("master.key" not in f for f in r.json()["files"])
    with pytest.raises(StorageError) as refused:
        Engine.start(keyless, shards=2, prefix="keyless")
    assert refused.value.code == "no_master_key" and not (keyless / "master.key").exists()

    dest = tmp_path / "backup"
    old_umask = os.umask(0o022)  # the gateway makes the folder here, in this process
    try:
        r = admin.post("/v1/admin/backup", json={"dir": str(dest), "withKey": True})
    finally:
        os.umask(old_umask)
    assert r.status_code == 201, r.text
    _assert_private(dest)
    names = {p.name for p in dest.iterdir()}
    assert {"directory.duckdb", "shard-0.duckdb", "shard-1.duckdb", "master.key"} <= names
    assert stat.S_IMODE((dest / "master.key").stat().st_mode) == 0o600
    assert (dest / "master.key").read_text() == (data_dir / "master.key").read_text()
    assert admin.post("/v1/admin/backup", json={"dir": str(dest)}).status_code == 400

    restored = Engine.start(dest, shards=2, prefix="restored")
    server = LiveServer(create_app(restored, ADMIN, cache_ttl=0.0))
    try:
        world.server = server
        with world.client("alice") as alice:
            assert alice.get(url).json() == before
        assert (await first_frame(server.url, cursor))["type"] == "reset"
    finally:
        server.stop()
        restored.stop()


def _assert_private(folder: Path) -> None:
    """A backup is its owner's alone, whatever the umask it was made with."""
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    assert modes and set(modes.values()) == {0o600}, modes


@pytest.mark.anyio
async def test_offline_backup_of_a_stopped_data_directory(shards, tmp_path):
    reader = Reader(user="u1", org="o1", uses_bot=True)
    svc = shards(path=tmp_path / "data")
    await svc.remember("bot:b", reader, "offline copy")
    epoch = svc.events.epoch
    await shards.close(svc)
    # The offline backup is a command of its own (it runs its own loop): in a thread here.
    old_umask = os.umask(0o022)  # what most processes run with: new files 0644, folders 0755
    try:
        files = await asyncio.to_thread(backup_offline, tmp_path / "data", tmp_path / "keyless")
    finally:
        os.umask(old_umask)
    _assert_private(tmp_path / "keyless")
    assert {f.rsplit("/", 1)[1] for f in files} == {"shard-0.duckdb"}  # the key stays out
    files = await asyncio.to_thread(
        backup_offline, tmp_path / "data", tmp_path / "copy", with_key=True
    )
    assert {f.rsplit("/", 1)[1] for f in files} == {"shard-0.duckdb", "master.key"}

    svc = shards(path=tmp_path / "copy")
    page = await svc.read_memory("bot:b", reader)
    new_epoch = svc.events.epoch
    assert [e.content for e in page.entries] == ["offline copy"]
    assert new_epoch != epoch
