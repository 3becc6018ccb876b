"""Bad input never gives a 5xx. Every route that takes a body (found from the running
app), with real ids in its path where the route names a bot or an org, gets odd JSON (lone
surrogates, NUL, huge numbers, NaN, wrong shapes, invalid UTF-8) and random JSON values from
hypothesis, with the admin token and a user token; every answer is below 500 and the same
connection goes on."""

from __future__ import annotations

import json
import re

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route

from tests.conftest import ADMIN

ODD = [
    b'{"name": "\\ud800"}',
    b'{"name": "x\\u0000y"}',
    b'{"name": 1e999999}',
    b'{"name": ' + b"9" * 5000 + b"}",
    b'{"command": {"_tag": "Remember", "content": "\\udfff"}}',
    b'{"text": "\\ud83d", "rounds": -1, "mentions": ["\\ud800"]}',
    b"\xff\xfe",
    b'{"a": NaN}',
    b'{"requestId": "\\ud800", "name": "p\\ud800", "expectedRevision": -5}',
    b'{"settings": {"\\ud800": 1}}',
    b"[]",
    b"null",
    b'"x"',
    b'{"id": "\\ud800", "name": "a", "orgs": ["\\ud800"]}',
    b'{"bot": "\\ud800", "channel": "\\ud800", "project": "\\u0000"}',
    b'{"command": {"_tag": "Forget", "id": "\\ud800"}}',
    b'{"tag": "\\ud800"}',
    b'{"scope": "bot", "bot": "\\ud800", "content": "x", "requestId": "r"}',
    b'{"mode": "\\ud800", "leader": 5}',
    b'{"dir": "\\u0000"}',
]


def _calls(server, world) -> list[tuple[str, str]]:
    calls = []
    for route in server.server.config.app.routes:
        if isinstance(route, Route):
            path = route.path.replace("{bot}", world.bot).replace("{id}", world.org)
            path = re.sub(r"\{[^}]+\}", "x1", path)
            for method in sorted((route.methods or set()) & {"POST", "PUT", "PATCH", "DELETE"}):
                calls.append((method, path))
    return calls


def test_odd_json_on_every_body_route_never_gives_a_5xx(server, world):
    calls = _calls(server, world)
    assert len(calls) >= 20
    for token in (ADMIN, world.tokens["alice"]):
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=30) as c:
            for method, path in calls:
                for body in ODD:
                    r = c.request(method, path, content=body)
                    assert r.status_code < 500, (method, path, body[:40], r.text[:200])
            assert c.get("/healthz").status_code == 200


_value = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["b_x", "o_x", "u_x", "Remember", "Forget", "bot", "user", "project"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "id",
                    "command",
                    "_tag",
                    "content",
                    "text",
                    "settings",
                    "scope",
                    "bot",
                    "requestId",
                    "expectedRevision",
                    "tags",
                    "mode",
                    "permission",
                    "org",
                    "orgs",
                ]
            )
            | st.text(max_size=5),
            inner,
            max_size=5,
        )
    ),
    max_leaves=20,
)


def test_random_json_on_every_body_route_never_gives_a_5xx(server, world):
    calls = _calls(server, world)
    alice = httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {world.tokens['alice']}"}
    )
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {ADMIN}"})

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(calls), _value, st.booleans())
    def check(call, value, as_admin):
        method, path = call
        if path == "/v1/admin/backup":
            return  # would write wherever the fuzzer says; covered by the odd bodies above
        c = admin if as_admin else alice
        r = c.request(method, path, content=json.dumps(value).encode())
        assert r.status_code < 500, (method, path, value, r.text[:200])

    try:
        check()
    finally:
        alice.close()
        admin.close()
