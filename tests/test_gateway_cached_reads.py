"""A memory read answered from a caching gateway's caches (gateway/cached_reads.py): the route's
own answer, logged and counted as the route, and never one the route would refuse or would
answer differently: another reader's page, a page of a changed pool, a page for a revoked
grant, an org the caller does not work in, a query or a request body."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from gateway import wire
from gateway.app import create_app
from gateway.live_server import LiveServer
from tests.conftest import ADMIN, count_gateway_calls
from tests.test_read_cache import write_elsewhere

REMEMBER = "Remember"


@pytest.fixture(scope="module")
def caching(engine):
    """A gateway that caches who may do what, as `openbot serve` does."""
    live = LiveServer(create_app(engine, ADMIN, cache_ttl=60.0))
    yield live
    live.stop()


@pytest.fixture
def counted(monkeypatch, engine):
    return count_gateway_calls(monkeypatch, engine)


def _client(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _remember(client: httpx.Client, bot: str, content: str) -> None:
    body = {"command": {"_tag": REMEMBER, "content": content}}
    r = client.post(f"/v1/bots/{bot}/memory", json=body)
    assert r.status_code == 201, r.text


def _warm(client: httpx.Client, url: str, counted) -> httpx.Response:
    """Read until a read asks no actor anything (the caller, the bot and the page are all in
    the gateway's caches, which it trusts): the reads after it take the shortcut."""
    for _ in range(100):
        counted.clear()
        r = client.get(url)
        assert r.status_code == 200, r.text
        if not counted:
            return r
    raise AssertionError(f"reads kept asking the actors: {dict(counted)}")


def _contents(r: httpx.Response) -> set[str]:
    assert r.status_code == 200, r.text
    return {e["content"] for e in r.json()["entries"]}


def _served(server: LiveServer) -> float:
    """GET memory answers with 200 so far, in the metrics (one registry per process)."""
    with httpx.Client(base_url=server.url, timeout=30) as c:
        text = c.get("/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
    series = re.search(
        r'openbot_http_requests_total\{method="GET",route="/v1/bots/\{bot\}/memory",'
        r'status="200"\} (\S+)',
        text,
    )
    return float(series.group(1)) if series else 0.0


def test_the_cached_answer_is_the_routes_and_is_counted_as_it(world, caching, counted):
    url = f"/v1/bots/{world.bot}/memory"
    with _client(caching, world.tokens["alice"]) as alice:
        _remember(alice, world.bot, "alice prefers tea")
        first = alice.get(url)  # the whole route (the page is read from the shard)
        _warm(alice, url, counted)
        before = _served(caching)
        cached = [alice.get(url, headers={"X-Request-Id": f"cached-{k}"}) for k in range(3)]
        assert _served(caching) - before == 3
    for k, r in enumerate(cached):
        assert r.status_code == 200
        assert r.content == first.content
        assert r.headers["content-type"] == first.headers["content-type"] == "application/json"
        assert r.headers["content-length"] == str(len(first.content))
        assert r.headers["x-request-id"] == f"cached-{k}"


def test_each_reader_gets_their_own_page(world, caching, counted):
    world.grant("bob", "read")
    url = f"/v1/bots/{world.bot}/memory"
    alice = _client(caching, world.tokens["alice"])
    bob = _client(caching, world.tokens["bob"])
    with alice, bob:
        _remember(alice, world.bot, "alice's own note")
        _remember(bob, world.bot, "bob's own note")
        _warm(alice, url, counted)
        _warm(bob, url, counted)
        for _ in range(3):
            assert _contents(alice.get(url)) == {"alice's own note"}
            assert _contents(bob.get(url)) == {"bob's own note"}


def test_a_write_through_the_gateway_is_read_at_once(world, caching, counted):
    url = f"/v1/bots/{world.bot}/memory"
    with _client(caching, world.tokens["alice"]) as alice:
        _remember(alice, world.bot, "first")
        _warm(alice, url, counted)
        _remember(alice, world.bot, "second")
        assert _contents(alice.get(url)) == {"first", "second"}


def test_a_change_made_elsewhere_replaces_the_cached_page(world, caching, counted, engine):
    """A change that does not go through this gateway (straight to the shard) reaches it by the
    event stream; the page read before it is not served once the gateway has seen it."""
    url = f"/v1/bots/{world.bot}/memory"
    with _client(caching, world.tokens["alice"]) as alice:
        _remember(alice, world.bot, "first")
        _warm(alice, url, counted)
        write_elsewhere(engine, world, "mem_cached_elsewhere", "2")
        deadline = time.monotonic() + 5
        while _contents(alice.get(url)) != {"first", "2"}:  # one long-poll return away
            assert time.monotonic() < deadline, "the change never reached the cached page"


def test_a_revoked_reader_is_refused_though_their_page_is_current(world, caching, counted, admin):
    """Revoking a grant leaves the pool (and so the reader's page) unchanged: the access check
    refuses the reader on every read after the revocation, the cached ones too."""
    world.grant("bob", "read")
    url = f"/v1/bots/{world.bot}/memory"
    with _client(caching, world.tokens["bob"]) as bob:
        _remember(bob, world.bot, "bob's note")
        _warm(bob, url, counted)
        r = admin.delete(f"/v1/admin/bots/{world.bot}/grants/{world.users['bob']}")
        assert r.status_code == 200, r.text
        for _ in range(5):  # the caller and the bot are cached again after the first refusal
            r = bob.get(url)
            assert r.status_code == 403 and r.json()["error"]["code"] == "no_access", r.text


@pytest.fixture
def alice_cached(world, caching, counted):
    """alice's client on the caching gateway and her memory's URL, a note of hers written and
    her page cached."""
    url = f"/v1/bots/{world.bot}/memory"
    with _client(caching, world.tokens["alice"]) as alice:
        _remember(alice, world.bot, "note")
        _warm(alice, url, counted)
        yield alice, url


def test_the_org_header_is_checked_on_every_read(alice_cached):
    alice, url = alice_cached
    for _ in range(3):
        r = alice.get(url, headers={"OpenBot-Org": "o_elsewhere"})
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_in_org", r.text


def test_a_query_or_a_body_takes_the_whole_route(alice_cached):
    alice, url = alice_cached
    assert _contents(alice.get(url, params={"tags": "no-such-tag"})) == set()
    r = alice.request("GET", url, content=b"[" * (wire.MAX_BODY + 1))
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large", r.text
    assert _contents(alice.get(url)) == {"note"}


def test_a_replaced_token_is_refused_though_its_page_is_current(
    alice_cached, world, caching, admin
):
    alice, url = alice_cached
    r = admin.post(f"/v1/admin/users/{world.users['alice']}/token")
    assert r.status_code == 200, r.text
    new = r.json()["token"]
    for _ in range(3):
        r = alice.get(url)
        assert r.status_code == 401 and r.json()["error"]["code"] == "bad_token", r.text
    with _client(caching, new) as again:
        assert _contents(again.get(url)) == {"note"}
