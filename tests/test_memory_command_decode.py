"""A memory command (`POST /v1/bots/:botId/memory`) reads the same through the one-pass decoder
as through the general one (`wire.decode`): old snake_case names, numbers and errors included."""

from __future__ import annotations

import json

import pytest

from engine.errors import InvalidInput, OpenBotError
from gateway import wire

REMEMBER = {"_tag": "Remember", "content": "prefers short answers", "tags": ["style"]}

BODIES = [
    {"command": REMEMBER, "requestId": "r-1"},
    {"command": REMEMBER},
    {"command": {"_tag": "Forget", "id": "mem_1"}, "requestId": "r-2"},
    # Old spellings: only the general decoder maps them.
    {"command": REMEMBER, "request_id": "r-3"},
    {"command": {**REMEMBER, "tags": []}, "requestId": None},
]

REFUSED = [
    b"",
    b"[]",
    b'{"command": {"_tag": "Remember", "content": "x", "tags": [1e400]}}',  # not finite
    b'{"command": {"_tag": "Remember", "content": "x", "tags": [9007199254740993]}}',
    b'{"command": {"_tag": "Remember", "content": "x"}, "requestId": "r", "extra": 1}',
    b'{"command": {"_tag": "Shout", "content": "x"}}',
    b'{"command": {"_tag": "Remember", "content": 5}}',
]


@pytest.mark.parametrize("body", BODIES)
def test_a_command_reads_as_the_general_decoder_reads_it(body):
    raw = json.dumps(body).encode()
    assert wire.decode_memory_command(raw) == wire.decode(raw, wire.MemoryCommand)


def test_old_snake_case_names_keep_their_value():
    raw = json.dumps({"command": REMEMBER, "request_id": "r-old"}).encode()
    assert wire.decode_memory_command(raw).requestId == "r-old"


@pytest.mark.parametrize("raw", REFUSED)
def test_a_bad_command_fails_as_with_the_general_decoder(raw):
    with pytest.raises(OpenBotError) as general:
        wire.decode(raw, wire.MemoryCommand)
    with pytest.raises(OpenBotError) as fast:
        wire.decode_memory_command(raw)
    assert type(fast.value) is type(general.value)
    assert (fast.value.code, fast.value.message) == (general.value.code, general.value.message)


def test_an_empty_body_is_refused_by_name():
    with pytest.raises(InvalidInput) as e:
        wire.decode_memory_command(b"  ")
    assert e.value.code == "invalid_json"
