"""A step's enrichment or confessor context ranked inside its one read (a shard without semantic
search, actors/chats/step_memory.py `StepMemory.context`) is the context the one memory search's
listing gives (`StepMemory.ranked` of the bot's pool alone, then the read that takes its hits
first): the same parts in the same order, for random pools, readers' audiences, queries and
budgets, with and without workspace records in the bot's memory."""

from __future__ import annotations

import random

import pytest

from actors.chats.step_memory import StepMemory
from actors.chats.step_policy import reader_for
from actors.contracts import StepInput, WorkspaceAccess
from engine.memory_entries import EntryMeta, Layer
from engine.scoped_memory import Scope, WorkspaceMemoryCreate
from tests.shard_kit import BOT, CHAT, ORG, POOL

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("no_env_key")]

# Few words, so that many entries hold the same ones: ties in score, rankings deeper than a
# context takes, and queries that find nothing the reader may see.
WORDS = [
    "tea",
    "orchard",
    "pruning",
    "rota",
    "cups",
    "saucers",
    "march",
    "garden",
    "kettle",
    "ledger",
]
OTHERS = ("u_ann", "u_ben", "u_cy")  # u_ann is the chat's person: the reader


def _text(rng: random.Random) -> str:
    if rng.random() < 0.5:  # one of a few whole texts: the same score for many entries
        return rng.choice(["tea cups", "garden kettle tea", "march rota", "Ann: tea rota"])
    words = rng.choices(WORDS, k=rng.randint(1, 6))
    if rng.random() < 0.3:
        return f"{rng.choice(['Ann', 'Ben'])}: {' '.join(words)}"  # a label
    return " ".join(words) + rng.choice(["", " and more", f" note {rng.randint(0, 9)}"])


async def _seed(svc, rng: random.Random, count: int) -> None:
    batch = []
    for n in range(count):
        user = rng.choice(OTHERS)
        meta = EntryMeta(
            id=f"mem_t{n:04d}",
            pool=POOL,
            layer=Layer.PINNED,
            tags=(f"from:{user}", f"for:person:{user}", "org:o1"),
            created_at=rng.randint(1, 50),  # ties in memory order too
            updated_at=rng.randint(1, 50),
        )
        batch.append((meta, _text(rng)))
    await svc.add_entries(POOL, batch)


async def _add_records(svc, rng: random.Random, count: int) -> None:
    for n in range(count):
        who = rng.choice(OTHERS)
        body = WorkspaceMemoryCreate(
            requestId=f"rec-{n}", scope=Scope.BOT, bot=BOT.id, content=_text(rng)
        )
        await svc.workspace_create_memory(
            WorkspaceAccess(account=who, bots=frozenset({BOT.id})), body
        )


def _step(text: str) -> StepInput:
    return StepInput(chat=CHAT, bot=BOT, org=ORG, operator=CHAT.owner, turn="t1", text=text)


async def _compare(svc, rng: random.Random, rounds: int) -> int:
    """Asserts both ways agree `rounds` times; returns how often the ranking changed the
    context (a test whose rankings never mattered would prove nothing)."""
    inside = StepMemory(memory=svc.memory_reader, peers=svc.peers, keyword_only=True)
    listed = StepMemory(memory=svc.memory_reader, peers=svc.peers, keyword_only=False)
    ranked_mattered = 0
    for _ in range(rounds):
        words = rng.choices([*WORDS, "nothing", "absent", "Ann", "note", "3"], k=rng.randint(0, 4))
        step = _step(" ".join(words) + rng.choice(["", "?", ": and"]))
        reader = reader_for(step)
        limit = rng.choice([0, 15, 40, 90, 200, 400, 700, 1000, 1500, 2500, 20_000])
        got = await inside.context(step, reader, step.text, limit)
        want = await listed.context(step, reader, step.text, limit)
        assert got == want, (step.text, limit)
        plain = await svc.context_parts(POOL, reader, limit)
        ranked_mattered += got != plain
    return ranked_mattered


async def test_a_context_ranked_in_its_read_is_the_listed_rankings(shards):
    svc = shards(models={})
    assert svc.semantic is None  # what lets a context rank inside its read
    rng = random.Random(7)
    await _seed(svc, rng, 400)
    assert await _compare(svc, rng, 150) > 10


async def test_the_same_with_workspace_records_in_the_bots_memory(shards):
    # Records indexed with their own words alone, as learned entries are: the same text
    # scores the same in both, and ties between them meet where the ranking is cut.
    svc = shards(models={}, directory=True, search={"context_window_s": 0})
    d = svc.peers.directory()
    await d.create_org("Acme", "o1")
    for account in (*OTHERS, BOT.owner):
        await d.create_user(account, ["o1"], account)
    await d.create_bot(name=BOT.name, org="o1", owner=BOT.owner, id=BOT.id)
    rng = random.Random(11)
    await _seed(svc, rng, 200)
    await _add_records(svc, rng, 60)
    assert await _compare(svc, rng, 120) > 10
