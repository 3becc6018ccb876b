"""`ShardService.remember_packed`: a Remember as one packed `RememberCall`, answered with the HTTP
body (one bytes argument and one bytes reply cost Ray far less than five arguments and
a Struct). Same semantics as `remember`: the body is the wire JSON of the entry, a requestId
answers once however many ask at the same time, bad input changes nothing."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from actors.contracts import RememberCall
from engine.casing import to_wire
from engine.errors import Conflict, InvalidInput
from engine.memory_entries import Reader

pytestmark = pytest.mark.usefixtures("no_env_key")
POOL = "bot:b_packed"
ANN = Reader(user="u_ann", org="o_1", uses_bot=True)


def _packed(content: str, request_id: str | None = None) -> bytes:
    call = RememberCall(
        pool=POOL, reader=ANN, content=content, topics=("t",), request_id=request_id
    )
    return msgspec.msgpack.encode(call)


@pytest.mark.anyio
async def test_the_body_is_the_entry_as_the_gateway_would_send_it(shards):
    svc = shards(models={})
    body = await svc.remember_packed(_packed("packed note"))
    page = await svc.read_memory(POOL, ANN)
    await shards.close(svc)
    [entry] = page.entries
    assert body == msgspec.json.encode(to_wire(entry))  # what `json(entry, 201)` would send
    assert msgspec.json.decode(body)["content"] == "packed note"


@pytest.mark.anyio
async def test_a_request_id_answers_once_for_24_concurrent_callers_and_bad_input_changes_nothing(
    shards,
    tmp_path,
):
    svc = shards(models={})
    bodies = await asyncio.gather(
        *(svc.remember_packed(_packed("once", "req-1")) for _ in range(24))
    )
    with pytest.raises(Conflict) as reused:
        await svc.remember_packed(_packed("something else", "req-1"))
    with pytest.raises(InvalidInput):
        await svc.remember_packed(b"\x93not a call")
    with pytest.raises(InvalidInput):
        await svc.remember_packed(_packed(""))  # empty content: refused by the engine
    page = await svc.read_memory(POOL, ANN)
    await shards.close(svc)
    again = shards(models={})  # and after a restart
    later = await again.remember_packed(_packed("once", "req-1"))
    await shards.close(again)
    assert len(set(bodies)) == 1 and later == bodies[0]
    assert reused.value.code == "request_id_reused"
    assert [e.content for e in page.entries] == ["once"]
