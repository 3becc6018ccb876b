"""Coalesced writes end to end: real uvicorn, real Ray actors, real DuckDB files. A
burst of Remembers (and workspace memory creations) to one shard goes in few Ray calls
(actors/runtime/coalesce.py), and every request still gets its own answer: a bad body, a caller
without access or a reused requestId fails that request only; a requestId writes once; each
stored entry's `memory.changed` reaches its reader once."""

from __future__ import annotations

import asyncio
import contextlib
import secrets

import httpx

from gateway.client import EventClient
from storage.stats import STATS


def _coalesced() -> tuple[float, int]:
    """Requests and calls coalesced so far in this process (the gateway runs in a thread here)."""
    for h in STATS.snapshot()["histograms"]:
        if h[0] == "openbot_coalesced_requests":
            return h[-2], h[-1]
    return 0.0, 0


def _lane_writes() -> float:
    """Coalesced write calls this process (the gateway) sent over a shard's lane."""
    counters = STATS.snapshot()["counters"]
    return sum(v for n, _, v in counters if n == "openbot_lane_writes_total")


def _client(world, name: str) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {world.tokens[name]}"}
    return httpx.AsyncClient(base_url=world.server.url, headers=headers, timeout=30)


def test_30_concurrent_remembers_each_get_their_own_answer_and_events_come_once(world):
    world.grant("bob", "write")  # carol has no grant: 403
    url = f"/v1/bots/{world.bot}/memory"
    tag = secrets.token_hex(3)

    def remember(content: str, rid: str | None = None, tags=()) -> dict:
        body: dict = {"command": {"_tag": "Remember", "content": content, "tags": list(tags)}}
        if rid is not None:
            body["requestId"] = rid
        return body

    plan: list[tuple[str, dict, int, str | None]] = []  # who, body, status, error code
    for i in range(36):
        kind = i % 9
        if kind in (0, 1, 2):
            plan.append(("alice", remember(f"alice {i}", tags=("t",)), 201, None))
        elif kind == 3:
            plan.append(("bob", remember(f"bob {i}"), 201, None))
        elif kind == 4:
            plan.append(("carol", remember(f"carol {i}"), 403, "no_access"))
        elif kind == 5:
            plan.append(("alice", remember("   "), 400, "invalid_content"))
        elif kind == 6:
            plan.append(("alice", remember(f"bad {i}", tags=("Not A Tag",)), 400, "invalid_tag"))
        elif kind == 7:  # the same request four times in the burst: one entry
            plan.append(("alice", remember("once", f"{tag}-once"), 201, None))
        else:  # the same id for two requests: one of them is refused
            plan.append(("alice", remember(f"reused {i}", f"{tag}-reused"), 0, None))

    async def scenario():
        events = EventClient(world.server.url, world.tokens["alice"])
        stream = aiter(events)
        first = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.3)  # connected and live
        clients = {n: _client(world, n) for n in ("alice", "bob", "carol")}
        before, laned = _coalesced(), _lane_writes()
        try:
            responses = await asyncio.gather(
                *(clients[who].post(url, json=body) for who, body, _, _ in plan)
            )
            after, laned = _coalesced(), _lane_writes() - laned
            page = (await clients["alice"].get(url)).json()
            retried = await clients["alice"].post(url, json=remember("once", f"{tag}-once"))
            frames = [await asyncio.wait_for(first, 10)]
            created = {
                r.json()["id"]
                for (who, _, _, _), r in zip(plan, responses, strict=True)
                if who == "alice" and r.status_code == 201
            }
            while len(frames) < len(created):
                frames.append(await asyncio.wait_for(stream.__anext__(), 10))
            with contextlib.suppress(TimeoutError):  # nothing more: none twice, none of bob's
                frames.append(await asyncio.wait_for(stream.__anext__(), 0.5))
        finally:
            for c in clients.values():
                await c.aclose()
            await events.close()
        return responses, before, after, laned, page, retried, frames, created

    responses, before, after, laned, page, retried, frames, created = asyncio.run(scenario())
    reused = []
    for (who, body, status, code), r in zip(plan, responses, strict=True):
        if status == 0:
            reused.append(r)
            continue
        assert r.status_code == status, (who, body, r.text)
        if code is not None:
            assert r.json()["error"]["code"] == code, r.text
        else:
            assert r.json()["content"] == body["command"]["content"]
    assert sorted(r.status_code for r in reused) == [201, 409, 409, 409]
    assert {r.json()["error"]["code"] for r in reused if r.status_code == 409} == {
        "request_id_reused"
    }
    kept = {r.json()["content"] for r in reused if r.status_code == 201}
    assert len(kept) == 1  # whichever came first
    once = [r.json() for (_, b, _, _), r in zip(plan, responses, strict=True)
            if b.get("requestId", "").endswith("-once")]  # fmt: skip
    assert all(o == once[0] for o in once) and retried.json() == once[0]
    contents = sorted(e["content"] for e in page["entries"])
    want = sorted(
        [b["command"]["content"] for w, b, s, _ in plan if w == "alice" and s == 201 and
         "requestId" not in b] + ["once", *kept]
    )  # fmt: skip
    assert contents == want
    assert {f.data["entry"] for f in frames} == created == {e["id"] for e in page["entries"]}
    assert len(frames) == len(created) and all(f.type == "memory.changed" for f in frames)
    # The burst went in fewer calls than requests (the first alone, the rest as they queued).
    requests, calls = after[0] - before[0], after[1] - before[1]
    assert calls < requests, (requests, calls)
    assert laned == calls, (laned, calls)  # every call of the burst went over the shard's lane


def test_concurrent_workspace_memory_writes_each_get_their_own_answer(world):
    world.grant("bob", "write")  # carol may not use the bot
    url = "/api/app/workspace/memories"
    tag = secrets.token_hex(3)

    def create(content: str, rid: str, scope: str = "bot") -> dict:
        return {"requestId": rid, "scope": scope, "bot": world.bot, "content": content}

    plan: list[tuple[str, dict, int, str | None]] = []
    for i in range(32):
        kind = i % 8
        if kind in (0, 1):
            plan.append(("alice", create(f"alice bot {i}", f"{tag}-{i}"), 201, None))
        elif kind == 2:
            plan.append(("alice", create(f"alice own {i}", f"{tag}-{i}", "user"), 201, None))
        elif kind == 3:
            plan.append(("bob", create(f"bob {i}", f"{tag}-{i}"), 201, None))
        elif kind == 4:
            plan.append(("carol", create(f"carol {i}", f"{tag}-{i}"), 403, "no_access"))
        elif kind == 5:
            plan.append(("alice", create("bad id", "has spaces"), 400, "invalid_request_id"))
        elif kind == 6:  # the same request four times: one record, one answer
            plan.append(("alice", create("the same", f"{tag}-same"), 201, None))
        else:  # one id, four different requests: the first is kept, the others refused
            plan.append(("alice", create(f"reused {i}", f"{tag}-reused"), 0, None))

    async def scenario():
        clients = {n: _client(world, n) for n in ("alice", "bob", "carol")}
        before = _coalesced()
        try:
            responses = await asyncio.gather(
                *(clients[who].post(url, json=body) for who, body, _, _ in plan)
            )
            after = _coalesced()
            listed = await clients["alice"].get(url, params={"bot": world.bot, "limit": 200})
        finally:
            for c in clients.values():
                await c.aclose()
        return responses, before, after, listed.json()["entries"]

    responses, before, after, listed = asyncio.run(scenario())
    reused = []
    for (who, body, status, code), r in zip(plan, responses, strict=True):
        if status == 0:
            reused.append(r)
            continue
        assert r.status_code == status, (who, body, r.text)
        if code is not None:
            assert r.json()["error"]["code"] == code, r.text
        else:
            assert r.json()["content"] == body["content"]
    assert sorted(r.status_code for r in reused) == [201, 409, 409, 409]
    same = [r.json() for (_, b, _, _), r in zip(plan, responses, strict=True)
            if b["requestId"].endswith("-same")]  # fmt: skip
    assert all(s == same[0] for s in same)
    mine = sorted(e["content"] for e in listed if e["content"].startswith(("alice", "the", "re")))
    kept = [r.json()["content"] for r in reused if r.status_code == 201]
    want = [b["content"] for w, b, s, _ in plan if w == "alice" and s == 201 and
            not b["requestId"].endswith("-same")]  # fmt: skip
    assert mine == sorted([*want, "the same", *kept])
    requests, calls = after[0] - before[0], after[1] - before[1]
    assert calls < requests, (requests, calls)
