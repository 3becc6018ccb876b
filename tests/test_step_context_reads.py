"""A step's enrichment or confessor context that does not all fit (actors/chats/step_memory.py):
what the input finds goes first; when the ranking finds nothing, the context is the memory-order
fill. On a shard without semantic search the ranking is made inside the context's one read."""

from __future__ import annotations

import pytest

from actors.chats.step_policy import reader_for
from actors.contracts import StepInput
from tests.shard_kit import ANN, BOT, CHAT, ORG, POOL

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_env_key")]

LIMIT = 200  # room for about four of the entries below


def _step(text: str) -> StepInput:
    return StepInput(chat=CHAT, bot=BOT, org=ORG, operator=CHAT.owner, turn="t1", text=text)


async def _counted_reads(svc, monkeypatch) -> list[tuple]:
    reads: list[tuple] = []
    context_for = svc.memory_reader.context_for

    async def counted(*args, **kwargs):
        reads.append(args[3:] or tuple(kwargs.get("first", ())))
        return await context_for(*args, **kwargs)

    monkeypatch.setattr(svc.memory_reader, "context_for", counted)
    return reads


async def test_a_context_the_ranking_finds_nothing_for_is_read_once(shards, monkeypatch):
    svc = shards(models={})
    for n in range(12):
        await svc.remember(POOL, ANN, f"Note {n}: the weekly tea rota, cups and saucers.")
    step = _step("When does the orchard need pruning?")
    plain, has = await svc.context_parts(POOL, ANN, LIMIT)  # memory order alone
    reads = await _counted_reads(svc, monkeypatch)
    scoped = svc.conversations.stepper.scoped
    assert await scoped.context(step, reader_for(step), step.text, LIMIT) == (plain, has)
    assert len(reads) == 1
    assert len("\n".join(t for _, t in plain)) <= LIMIT and len(plain) < 12


async def test_a_context_takes_what_the_input_finds_first(shards, monkeypatch):
    svc = shards(models={})
    wanted = await svc.remember(POOL, ANN, "The orchard needs pruning in March")
    for n in range(12):  # newer: first in memory order
        await svc.remember(POOL, ANN, f"Note {n}: the weekly tea rota, cups and saucers.")
    step = _step("When does the orchard need pruning?")
    plain, _ = await svc.context_parts(POOL, ANN, LIMIT)
    assert wanted.id not in {i for i, _ in plain}
    reads = await _counted_reads(svc, monkeypatch)
    scoped = svc.conversations.stepper.scoped
    parts, has = await scoped.context(step, reader_for(step), step.text, LIMIT)
    assert has and wanted.id in {i for i, _ in parts}
    assert len(reads) == 1
