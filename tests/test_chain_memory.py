"""Collaboration chains do not stay in memory for ever (actors/chats/chain_records.py,
chain_rows.py): a restart reads none of the chains that ended until one is asked for, the
listing route answers pages (`{items, nextCursor}`, newest first) that together hold every chain
once, memory holds a bounded number of ended chains however many ran, and whether a turn still
has a chain under way is answered from an index. In-process shard and directory on real DuckDB
files, the listing through the route's own handler over ASGI; no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from actors.chats import chain_records
from actors.contracts import TurnStart
from actors.directory import DirectoryService
from actors.models.registry import ScriptedModel
from actors.shard.service import ShardService
from gateway.auth import Auth
from gateway.workspace_routes import WorkspaceApi
from tests.chain_kit import PEER_SCRIPT, asker_and_peer, reopened
from tests.shard_kit import Shards

ADMIN = "admin-token-for-this-test"


def _models(tmp_path: Path) -> dict:
    script = tmp_path / "chain.toml"
    script.write_text(PEER_SCRIPT)
    return {"s": ScriptedModel.from_file("s", str(script))}


async def _run_chains(shards: Shards, models: dict, n: int) -> tuple[DirectoryService, str, dict]:
    """`n` turns of Ann's, each a chain (Asker asks Peer, Peer answers: done); Ann's token and
    the shard's stats after them (the shard closed, to be opened again)."""
    directory = shards.directory_service()
    svc = shards(models=models, directory=True)
    org, asker, chat = await asker_and_peer(directory)
    token = await directory.new_token("u_ann")
    for _ in range(n):
        start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
        await svc.start_turn(start, True)
        await svc.chains_idle()
    stats = await svc.stats()
    await shards.close(svc)
    return directory, token, stats


async def _pages(svc: ShardService, directory: DirectoryService, token: str, limit: int):
    """Every page of `GET /api/app/workspace/collaboration` as Ann, through its handler."""
    engine = SimpleNamespace(directory_port=directory, shard_ports=[svc])
    api = WorkspaceApi(engine, Auth(engine, ADMIN, ttl=0.0))  # type: ignore[arg-type]
    app = Starlette(routes=[Route("/c", api.collaborations)])
    pages = []
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        params = {"limit": str(limit)}
        for _ in range(100):  # (a cursor that does not move on would list for ever)
            r = await c.get("/c", params=params, headers=headers)
            assert r.status_code == 200, r.text
            pages.append(r.json())
            if r.json()["nextCursor"] is None:
                return pages
            params["cursor"] = r.json()["nextCursor"]
    raise AssertionError(f"no last page: {pages[-1]}")


@pytest.mark.anyio
async def test_a_restart_reads_no_ended_chain_and_the_listing_pages_through_all(
    shards, tmp_path: Path
):
    models = _models(tmp_path)
    n = 7

    directory, token, ran = await _run_chains(shards, models, n)
    async with reopened(shards, models) as svc:
        await svc.chains_idle()
        at_start = (await svc.stats())["chains_in_memory"]
        pages = await _pages(svc, directory, token, 3)
        after_listing = (await svc.stats())["chains_in_memory"]
        oldest = pages[-1]["items"][-1]
        stopped = await svc.stop_collaboration(oldest["id"], "u_ann", frozenset())
        asked = (await svc.stats())["chains_in_memory"]
    assert ran["chains_in_memory"] == n  # (fewer than RECENT: the recent ones stay)
    assert at_start == 0  # every chain ended: none is read at start
    assert [len(p["items"]) for p in pages] == [3, 3, 1]
    ids = [c["id"] for p in pages for c in p["items"]]
    assert len(set(ids)) == n == len(ids)  # every chain once
    keys = [(c["createdAt"], c["id"]) for p in pages for c in p["items"]]
    assert keys == sorted(keys, reverse=True)  # newest first
    assert oldest["status"] == "done" and oldest["links"][0]["request"] == "x"  # (unsealed)
    assert after_listing == 0  # a listing reads its page for the answer only
    assert stopped is not None and stopped.id == oldest["id"] and stopped.status == "done"
    assert asked == 1  # read when asked for


@pytest.mark.anyio
async def test_memory_keeps_a_bounded_number_of_ended_chains(shards, tmp_path: Path, monkeypatch):
    # A small bound: a memory that grows with every chain run shows past it as well as past 64.
    monkeypatch.setattr(chain_records, "RECENT", 4)
    models = _models(tmp_path)
    n = chain_records.RECENT + 4

    _, _, ran = await _run_chains(shards, models, n)
    assert ran["chains_in_memory"] == chain_records.RECENT


@pytest.mark.anyio
async def test_a_turn_with_a_chain_under_way_is_known_from_the_index(shards, tmp_path: Path):
    """While the peer works the turn's chain is under way; once it answered it is not; a
    turn that started no chain never is."""
    models = _models(tmp_path)

    directory = shards.directory_service()
    svc = shards(models=models, directory=True)
    records = svc.chains.records
    step = records.step
    release, stepping = asyncio.Event(), asyncio.Event()

    async def held_step(bot, step_input, *sent):
        stepping.set()
        await release.wait()
        return await step(bot, step_input, *sent)

    records.step = held_step  # type: ignore[method-assign]
    org, asker, chat = await asker_and_peer(directory)
    start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
    await svc.start_turn(start, True)
    await asyncio.wait_for(stepping.wait(), 10)
    (chain,) = await svc.collaborations("u_ann", frozenset())
    during = await svc.chains.running_for(chain.topic)
    other = await svc.chains.running_for("turn_that_started_nothing")
    release.set()
    await svc.chains_idle()
    after = await svc.chains.running_for(chain.topic)
    assert (during, other, after) == (True, False, False)
