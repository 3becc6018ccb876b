"""What runs before a request is authorized is linear in the request's size and bounded in time,
and every number a request carries is bounded.

The body check (`check_json`) runs on every HTTP body before routing and on the events socket's
first message before its token is read, so an adversarial body must cost no more than its length:
a quadratic check would let one unauthenticated request hold the event loop, and every route and
socket of that gateway with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from engine.errors import InvalidInput, TooLarge
from gateway.wire import check_json

SIZES = (16 * 1024, 64 * 1024, 256 * 1024, 1024 * 1024)
OPEN = b"[" * 40  # more openers than the depth limit, so the string scan runs


def _fill(head: bytes, unit: bytes, size: int, tail: bytes = b"") -> bytes:
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


SHAPES = {
    "unclosed escaped quotes": lambda n: _fill(OPEN + b'"', b'\\"', n),
    "unclosed plain string": lambda n: _fill(OPEN + b'"', b"a", n),
    "backslash run": lambda n: _fill(OPEN + b'"', b"\\", n),
    "closed escape runs": lambda n: _fill(OPEN + b'"', b'\\\\\\"', n, b'"'),
    "many short strings": lambda n: _fill(OPEN, b'"a",', n),
    "unicode escapes": lambda n: _fill(OPEN + b'"', b"\\u00e9", n),
    "deep nesting": lambda n: b"[" * n,
    "huge flat object": lambda n: _fill(b"{", b'"k":[1],', n, b'"z":1}'),
    "brackets in strings": lambda n: _fill(b"[", b'"[[[[{{{{",', n, b"1]"),
}


def _check_seconds(body: bytes) -> float:
    """The least CPU time of a few checks (the least is the one least disturbed by others)."""
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        with contextlib.suppress(InvalidInput, TooLarge):
            check_json(body)
        best = min(best, time.process_time() - start)
    return best


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_body_check_is_linear_in_the_body(shape):
    small, large = SHAPES[shape](64 * 1024), SHAPES[shape](1024 * 1024)
    assert len(large) <= 1024 * 1024
    ratio = _check_seconds(large) / max(_check_seconds(small), 1e-5)
    # 16 times the bytes: a linear check stays near 16 (caches and a busy host move it some), a
    # quadratic one near 256.
    assert ratio <= 48, (shape, ratio)


def _reference_depth(text: bytes) -> int:
    """The same rule, one byte at a time: a quote after an even run of backslashes opens or
    closes a string; brackets outside strings count."""
    deepest = level = run = 0
    inside = False
    for byte in text:
        if byte == 0x5C:
            run += 1
            continue
        if byte == 0x22 and run % 2 == 0:
            inside = not inside
        elif not inside and byte in b"[{":
            level += 1
            deepest = max(deepest, level)
        elif not inside and byte in b"]}":
            level -= 1
        run = 0
    return deepest


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from([b"[", b"]", b"{", b"}", b'"', b"\\", b"a", b",", b"\\" * 3]), max_size=400
    ),
    st.integers(min_value=0, max_value=40_000),
)
def test_the_sliced_scan_agrees_with_a_byte_loop(parts, pad):
    """Slice edges fall anywhere: padding moves the same text across them."""
    text = b" " * pad + b"".join(parts)
    want = _reference_depth(text)
    check_json(text, depth=want)  # as deep as it is: taken
    if want:
        with pytest.raises(InvalidInput) as deeper:  # one level less: refused
            check_json(text, depth=want - 1)
        assert deeper.value.code == "too_deep"


def test_the_body_check_measures_depth_as_a_parser_would():
    with pytest.raises(InvalidInput):  # an unclosed string after 40 openers: 40 deep
        check_json(SHAPES["unclosed escaped quotes"](1024))
    check_json(b'["' + b"[" * 100 + b'"]')  # brackets inside a string do not count
    check_json(b'["\\\\", ' + b"[" * 20 + b"]" * 20 + b"]")  # an escaped backslash closes nothing
    check_json(b'["\\"' + b"[" * 40)  # an escaped quote does not close the string...
    with pytest.raises(InvalidInput):
        check_json(b'["\\\\"' + b"[" * 40)  # ...but a quote after an escaped backslash does


async def _probe(url: str, stop: asyncio.Event, waits: list[float]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        while not stop.is_set():
            start = time.perf_counter()
            r = await c.get("/healthz")
            waits.append(time.perf_counter() - start)
            assert r.status_code == 200


async def _post(url: str, path: str, body: bytes, token: str | None) -> tuple[int, float]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        start = time.perf_counter()
        r = await c.post(path, content=body, headers=headers)
        return r.status_code, time.perf_counter() - start


async def _first_frame(ws_url: str, body: bytes) -> tuple[int | None, float]:
    start = time.perf_counter()
    async with connect(ws_url, max_size=None) as ws:
        await ws.send(body.decode("utf-8", errors="replace"))
        try:
            while True:
                await asyncio.wait_for(ws.recv(), 60)
        except ConnectionClosed as e:
            return (e.rcvd.code if e.rcvd else None), time.perf_counter() - start


# Ordinary JSON of the same sizes: what the gateway's answers and the prober's waits look like
# on this machine at this moment, so that the bounds below hold on a busy host as on an idle one.
PLAIN = {"plain string": lambda n: _fill(b'{"text":"', b"a", n, b'"}')}


def test_adversarial_bodies_never_stall_the_gateway(server, world):
    """Every shape at every size, to a public path, a token route and the events socket's first
    message, while a prober reads /healthz: each answer, and each of the prober's waits, within
    a few times what ordinary bodies of the same sizes take in the same run (and within 1 s and
    0.5 s on an idle machine). A check that stalls on a shape takes seconds at 1 MiB."""
    ws_url = server.url.replace("http://", "ws://") + "/v1/events"
    token_path = f"/v1/bots/{world.bot}/memory"

    async def scenario(shapes: dict) -> tuple[list[float], list[tuple]]:
        stop, waits, answers = asyncio.Event(), [], []
        prober = asyncio.create_task(_probe(server.url, stop, waits))
        try:
            for name, make in shapes.items():
                for size in SIZES:
                    body = make(size)
                    for path, token in (("/healthz", None), (token_path, world.tokens["alice"])):
                        status, took = await _post(server.url, path, body, token)
                        answers.append((name, size, path, status, took))
                    code, took = await _first_frame(ws_url, body)
                    answers.append((name, size, "/v1/events", code, took))
        finally:
            stop.set()
            await prober
        return waits, answers

    plain_waits, plain = asyncio.run(scenario(PLAIN))
    waits, answers = asyncio.run(scenario(SHAPES))
    answer_bound = max(1.0, 5 * max(a[-1] for a in plain))
    wait_bound = max(0.5, 5 * max(plain_waits))
    for name, size, path, status, took in answers:
        assert took <= answer_bound, (name, size, path, took, answer_bound)
        assert status is not None and not 500 <= status < 600, (name, size, path, status)
        if path == "/v1/events":  # refused as a frame: too deep (4400) or over 64 KiB (1009)
            assert status in (4400, 1009), (name, size, status)
    assert len(waits) >= 10 and max(waits) <= wait_bound, (max(waits), wait_bound)


# ---- numbers ---------------------------------------------------------------------------------


def _resolve(doc: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _integer_fields(doc: dict, schema: dict) -> dict[str, dict]:
    """The integer and number properties of a body schema (its alternatives included)."""
    schema = _resolve(doc, schema)
    found: dict[str, dict] = {}
    for alt in schema.get("oneOf", []) + schema.get("anyOf", []):
        found |= _integer_fields(doc, alt)
    for name, prop in schema.get("properties", {}).items():
        prop = _resolve(doc, prop)
        kinds = [prop] + [_resolve(doc, p) for p in prop.get("anyOf", [])]
        for kind in kinds:
            if kind.get("type") in ("integer", "number"):
                found[name] = kind
    return found


def test_every_number_in_a_body_or_query_is_bounded(server, world, admin):
    """Over the OpenAPI document: a huge, negative or non-finite number in any body field or
    query parameter is refused with 4xx, never 5xx; one outside its bounds is 422 naming it."""
    with world.client("alice") as alice:
        chat_id = alice.post("/v1/chats", json={"bot": world.bot}).json()["id"]
        doc = alice.get("/openapi.json").json()
        ids = {
            "bot": world.bot,
            "botId": world.bot,
            "org": world.org,
            "chat": chat_id,
            "user": world.users["alice"],
        }

        def path_of(template: str) -> str:
            return re.sub(r"\{([^}]+)\}", lambda m: ids.get(m.group(1), "x1"), template)

        named = set()
        for template, ops in doc["paths"].items():
            for method, op in ops.items():
                client = admin if template.startswith("/v1/admin") else alice
                url = path_of(template)
                for param in op.get("parameters", []):
                    if param["in"] != "query" or param["schema"].get("type") != "integer":
                        continue
                    for bad in (str(2**70), "-1", "NaN", "Infinity", "1e3", "²"):
                        r = client.request(method.upper(), url, params={param["name"]: bad})
                        assert r.status_code == 422, (method, template, bad, r.text)
                        assert r.json()["error"]["field"] == param["name"]
                        named.add((template, param["name"]))
                body = op.get("requestBody", {}).get("content", {}).get("application/json")
                if not body:
                    continue
                for field, kind in _integer_fields(doc, body["schema"]).items():
                    for bad in (2**70, -(2**70), 1e400):
                        raw = json.dumps({field: bad}).replace("inf", "1e400")
                        r = client.request(method.upper(), url, content=raw)
                        assert r.status_code < 500, (method, template, field, bad, r.text)
                        if r.status_code == 422 and r.json()["error"]["code"] == "out_of_range":
                            assert r.json()["error"]["field"] == field
                            named.add((template, field))
                    for bad in (b"NaN", b"Infinity", b"-Infinity"):
                        raw = b'{"' + field.encode() + b'": ' + bad + b"}"
                        r = client.request(method.upper(), url, content=raw)
                        assert 400 <= r.status_code < 500, (method, template, field, bad)
                    if "minimum" in kind:
                        r = client.request(method.upper(), url, json={field: kind["minimum"] - 1})
                        assert r.status_code < 500, (method, template, field, r.text)
        # The routes of the report are among those refused with their field named.
        assert ("/v1/chats/{chat}/turns", "rounds") in named
        assert ("/v1/bots", "limit") in named
        turns = f"/v1/chats/{chat_id}/turns"
        for rounds in (1180591620717411303424, 0, -1, 13):
            r = alice.post(turns, json={"text": "x", "rounds": rounds})
            assert r.status_code == 422, (rounds, r.text)
            assert r.json()["error"] | {"message": ""} == {
                "code": "out_of_range",
                "field": "rounds",
                "message": "",
            }
        assert alice.get(f"/v1/chats/{chat_id}/items").json()["items"] == []  # nothing changed
