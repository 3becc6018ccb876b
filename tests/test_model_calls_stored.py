"""The encrypted call log (SEC-1) as stored: a record reads back as it was written, from the
running shard and after a restart, whatever its request holds; the request is stored as it is,
not escaped inside the record's JSON; a record with the request inside its JSON reads too."""

from __future__ import annotations

import msgspec
import pytest

from actors.shard.batch import Batch
from storage.chat_store import ModelCall
from storage.crypto import aad
from storage.group_commit import Put
from storage.shard_schema import MODEL_CALLS
from tests.shard_kit import ANN, POOL

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_env_key")]

JOB = "job_0123456789abcdef"
# A learning request is JSON; a logged call's request, the JSON of its messages (whose contents
# hold JSON again): quotes, backslashes, newlines, other scripts.
REQUEST = msgspec.json.encode(
    [
        {"role": "system", "content": 'Rewrite "this".\nKeep it \\ short. Ünïcødé 東京 🚆'},
        {"role": "user", "content": '{"input":"a\\nb","entries":[{"id":"mem_1"}]}'},
    ]
).decode()
CALLS = [
    ModelCall(
        step=1,
        attempt=1,
        request=REQUEST,
        response='{"text":"ok","tool_calls":[]}',
        cost_micros=7,
        entries=("mem_1", "mem_2"),
    ),
    ModelCall(step=2, attempt=1, request="", error="TimeoutError()"),
    ModelCall(step=2, attempt=2, request='line one\nline "two" \\\n\n', response="{}"),
]


async def _stored_pool(svc):
    await svc.remember(POOL, ANN, "Ann prefers trains")  # the pool and its key
    return (await svc.kernel.pool(POOL)).stored


async def _payloads(svc) -> dict[str, bytes]:
    rows = await svc.db.run(
        lambda con: con.execute(
            "SELECT key, payload FROM model_calls WHERE job = ?", [JOB]
        ).fetchall()
    )
    return {k: bytes(p) for k, p in rows}


async def test_call_records_read_back_as_written_before_and_after_a_restart(shards):
    svc = shards(models={})
    stored = await _stored_pool(svc)
    at = svc.kernel.clock()
    batch = Batch().key(stored)
    batch.extend(svc.chats.model_call_row(stored, JOB, c, at) for c in CALLS)
    await svc.kernel.commit(batch)
    assert [c for _, c in await svc.chats.model_calls(stored, JOB)] == CALLS
    await shards.close(svc)

    again = shards(models={})
    stored = (await again.kernel.pool(POOL)).stored
    assert [c for _, c in await again.chats.model_calls(stored, JOB)] == CALLS
    assert await again.chats.model_call(stored, JOB, 2) == CALLS[2]


async def test_a_call_records_request_is_stored_as_it_is(shards):
    """The request follows the record's JSON verbatim: no escaping of its quotes and
    backslashes on every write (the log's largest part, written with every turn)."""
    svc = shards(models={})
    stored = await _stored_pool(svc)
    batch = Batch().key(stored).add(svc.chats.model_call_row(stored, JOB, CALLS[0], 1))
    await svc.kernel.commit(batch)
    ((key, sealed),) = (await _payloads(svc)).items()
    plain = stored.cipher.open(sealed, aad(POOL, f"call\x00{key}"))
    assert plain.endswith(b"\n" + REQUEST.encode())
    assert plain.count(b'\\"') < REQUEST.count('"')  # the request's quotes are not escaped


async def test_a_record_with_its_request_inside_its_json_reads_back(shards):
    svc = shards(models={})
    stored = await _stored_pool(svc)
    for call in CALLS:
        key = f"{JOB}\x00{call.step}\x00{call.attempt}"
        whole = stored.cipher.seal(msgspec.json.encode(call), aad(POOL, f"call\x00{key}"))
        await svc.kernel.commit(
            Batch().key(stored).add(Put(MODEL_CALLS.name, (key, JOB, 1, whole)))
        )
    assert [c for _, c in await svc.chats.model_calls(stored, JOB)] == CALLS
