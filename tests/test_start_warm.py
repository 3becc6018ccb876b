"""What a shard reads once at start rather than in its first turn (actors/workspace/projects.py
`_warm`): the projects, read by the recovery that the first call after a (re)start runs."""

from __future__ import annotations

import asyncio

import pytest

from actors.shard.service import ShardService
from storage.workspace_store import WorkspaceStore

pytestmark = pytest.mark.usefixtures("no_env_key")


def test_a_shard_reads_its_projects_at_start_and_not_again(tmp_path, monkeypatch):
    original = WorkspaceStore.load_projects
    reads = []

    async def counted(self, keyring):
        reads.append(1)
        return await original(self, keyring)

    monkeypatch.setattr(WorkspaceStore, "load_projects", counted)

    async def go() -> tuple[int, int]:
        svc = ShardService(tmp_path, 0)
        try:
            await svc.kernel.started()
            at_start = len(reads)
            await svc.workspace_projects("u1")  # the first use: already read
            return at_start, len(reads)
        finally:
            await svc.close()

    assert asyncio.run(go()) == (1, 1)
