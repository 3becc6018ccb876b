"""`GET /metrics` (admin token, Prometheus text format) and the access log with request ids,
against the real server: the gateway's own figures and the shards' (fetched from their actor
processes at scrape time)."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.client import EventClient
from tests.conftest import ADMIN, _ok
from tests.waiting import until

pytestmark = pytest.mark.ray


def scrape(server) -> dict[tuple[str, tuple], float]:
    """Every sample as (name, sorted labels) → value; the text must parse as Prometheus."""
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"}) as c:
        r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum over every series of `name` whose labels include `labels` (any shard)."""
    want = set(labels.items())
    return sum(v for (n, lb), v in samples.items() if n == name and want <= set(lb))


def test_metrics_need_the_admin_token(server, world):
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    with world.client("alice") as alice:
        assert alice.get("/metrics").status_code == 403
    scrape(server)


def test_requests_by_route_template_and_status_with_latency(server, world):
    before = scrape(server)
    route = "/v1/bots/{bot}/memory"
    with world.client("alice") as alice:
        for _ in range(3):
            assert alice.get(f"/v1/bots/{world.bot}/memory").status_code == 200
        assert alice.get("/v1/bots/b_nosuch/memory").status_code == 404
    after = scrape(server)
    ok = {"method": "GET", "route": route, "status": "200"}
    assert (
        total(after, "openbot_http_requests_total", **ok)
        - total(before, "openbot_http_requests_total", **ok)
        == 3
    )
    missing = {"method": "GET", "route": route, "status": "404"}
    assert total(after, "openbot_http_requests_total", **missing) >= 1
    count = "openbot_http_request_seconds_count"
    assert total(after, count, route=route) - total(before, count, route=route) == 4
    # Raw paths never become series (ids would make one per request).
    assert not any(world.bot in str(labels) for _, labels in after)


def test_shard_figures_commits_locks_models_and_learning(server, admin, world):
    before = scrape(server)
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={
                "name": "metered",
                "org": world.org,
                "owner": world.users["alice"],
                "model": "bot",
            },
        )
    )["id"]
    with world.client("alice") as alice:
        cmd = {"command": {"_tag": "Remember", "content": "metered fact"}}
        assert alice.post(f"/v1/bots/{world.bot}/memory", json=cmd).status_code == 201
        chat = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        done = alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "hello"})
        assert done.status_code == 200
    after = scrape(server)

    def grew(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert grew("openbot_shard_commit_seconds_count") >= 2
    assert grew("openbot_shard_commit_batches_count") >= 2
    assert grew("openbot_pool_lock_wait_seconds_count", mode="exclusive") >= 1
    assert grew("openbot_model_calls_total", model="bot", outcome="ok") >= 1
    assert grew("openbot_model_call_seconds_count", model="bot") >= 1
    assert grew("openbot_model_tokens_total", model="bot", kind="input") >= 10
    assert any(n == "openbot_model_cost_micros_total" for n, _ in after)
    # Every shard series says which shard it came from.
    shards = {dict(lb).get("shard") for n, lb in after if n.startswith("openbot_shard_commit")}
    assert shards <= {"0", "1"} and shards


def test_learning_jobs_by_status(server, admin, world):
    _ok(admin.patch(f"/v1/admin/orgs/{world.org}", json={"settings": {"autoRecord": True}}))
    bot = _ok(
        admin.post(
            "/v1/admin/bots",
            json={
                "name": "learner",
                "org": world.org,
                "owner": world.users["alice"],
                "model": "bot",
            },
        )
    )["id"]
    before = scrape(server)
    with world.client("alice") as alice:
        chat = _ok(alice.post("/v1/chats", json={"bot": bot}))["id"]
        assert alice.post(f"/v1/chats/{chat}/turns?wait=true", json={"text": "hi"}).is_success
    after = scrape(server)
    grew = total(after, "openbot_learning_jobs_total", status="pending") - total(
        before, "openbot_learning_jobs_total", status="pending"
    )
    assert grew >= 1


@pytest.mark.anyio
async def test_websocket_clients_and_events_delivered(server, world):
    before = scrape(server)
    async with EventClient(server.url, world.tokens["alice"]) as events:
        stream = events.__aiter__()
        first = asyncio.ensure_future(stream.__anext__())
        await until(lambda: events.cursor is not None, "connected: its hello frame")
        during = await asyncio.to_thread(scrape, server)
        with world.client("alice") as alice:
            cmd = {"command": {"_tag": "Remember", "content": "for the stream"}}
            await asyncio.to_thread(alice.post, f"/v1/bots/{world.bot}/memory", json=cmd)
        frame = await asyncio.wait_for(first, 30)
    assert frame.type == "memory.changed"
    clients = "openbot_websocket_clients"
    assert total(during, clients, endpoint="events") >= 1
    after = scrape(server)
    delivered = "openbot_events_delivered_total"
    assert total(after, delivered) - total(before, delivered) >= 1
    assert total(after, clients, endpoint="events") == total(before, clients, endpoint="events")


@pytest.mark.anyio
async def test_a_full_client_queue_counts_dropped_events():
    from gateway.metrics import REGISTRY
    from gateway.subscriber import Outlet

    gate = asyncio.Event()

    async def slow_socket(message: dict) -> None:
        await gate.wait()

    outlet = Outlet(slow_socket, limit=1)
    before = REGISTRY.get_sample_value("openbot_events_dropped_total")
    outlet.deliver("one")  # waits in the send
    outlet.deliver("two")  # queued
    outlet.deliver("three")  # does not fit
    assert (
        REGISTRY.get_sample_value("openbot_events_dropped_total") - before == 1
        and outlet.ended.is_set()
    )
    outlet.close()


def test_access_log_line_and_request_id(server, world, caplog):
    caplog.set_level(logging.INFO, logger="openbot.access")
    with world.client("alice") as alice:
        r = alice.get(f"/v1/bots/{world.bot}/memory", headers={"X-Request-Id": "trace-42.a"})
        assert r.headers["x-request-id"] == "trace-42.a"
        made = alice.get("/v1/capabilities", headers={"X-Request-Id": "x" * 200})
        new_id = made.headers["x-request-id"]
        assert len(new_id) == 16 and new_id != "x" * 200  # an unusable id is replaced
        missing = alice.get("/v1/no/such/route")
        assert missing.status_code == 404 and missing.headers["x-request-id"]
        assert missing.headers["x-request-id"] != new_id  # each made id names one request
    lines = [r.getMessage() for r in caplog.records if r.name == "openbot.access"]
    mine = [line for line in lines if "rid=trace-42.a" in line]
    assert len(mine) == 1
    method, route, status, ms, _rid = mine[0].split(" ")
    assert (method, route, status) == ("GET", "/v1/bots/{bot}/memory", "200")
    assert ms.endswith("ms") and float(ms[:-2]) >= 0
    assert any(f"rid={new_id}" in line and "/v1/capabilities 200" in line for line in lines)
    assert any("GET unmatched 404" in line for line in lines)
