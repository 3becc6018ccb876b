"""`PATCH /v1/admin/bots/{id}` under concurrency: a bot's changes and its grants, made at the same
time, all survive (the directory's write lock)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.conftest import ADMIN, _ok

pytestmark = pytest.mark.ray


def test_concurrent_bot_changes_and_grants_lose_nothing(server, admin, world):
    users = [
        _ok(admin.post("/v1/admin/users", json={"name": f"g{k}", "orgs": [world.org]}))["id"]
        for k in range(12)
    ]

    async def go():
        headers = {"Authorization": f"Bearer {ADMIN}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as c:
            grants = [
                c.post("/v1/admin/grants", json={"bot": world.bot, "user": u, "permission": "read"})
                for u in users
            ]
            patches = [
                c.patch(f"/v1/admin/bots/{world.bot}", json={"avatar": f"a{k}.png", "model": "bot"})
                for k in range(12)
            ]
            return await asyncio.gather(*grants, *patches)

    answers = asyncio.run(go())
    assert all(r.status_code in (200, 201) for r in answers), [r.text for r in answers]
    final = _ok(admin.patch(f"/v1/admin/bots/{world.bot}", json={"name": "final"}))
    assert set(users) <= set(final["grants"])
    assert final["avatar"] in {f"a{k}.png" for k in range(12)} and final["model"] == "bot"
    assert final["name"] == "final" and final["rules"]["name"] in ("final", "")
