"""What a shard reads once at start rather than in its first turn (actors/workspace/projects.py
`_warm`): the projects, read by the recovery that the first call after a (re)start runs."""

from __future__ import annotations

import pytest

from storage.workspace_store import WorkspaceStore

pytestmark = pytest.mark.usefixtures("no_env_key")


@pytest.mark.anyio
async def test_a_shard_reads_its_projects_at_start_and_not_again(shards, monkeypatch):
    original = WorkspaceStore.load_projects
    reads = []

    async def counted(self, keyring):
        reads.append(1)
        return await original(self, keyring)

    monkeypatch.setattr(WorkspaceStore, "load_projects", counted)

    svc = shards()
    await svc.kernel.started()
    at_start = len(reads)
    await svc.workspace_projects("u1")  # the first use: already read
    assert (at_start, len(reads)) == (1, 1)
