"""Guards of execution nodes (ND-2): memory reaches a bot only on a node that isolates it, and
extraction runs only where the node offers it."""

from __future__ import annotations

import pytest

from actors.models.registry import OpenAIModel
from engine.models import Completion, Price
from tests.guards.kit import CONFIDE, route_rewrite
from tests.openai_stub import completion
from tests.shard_kit import ANN, POOL, run_turn

# --- ND-2: memory only on nodes that isolate it; extraction only where offered ---------------


class NodeStub:
    """A model served by an execution node that reports its memory flags (the `isolation()` of
    actors/node_hub.NodeModel), recording what it was asked."""

    def __init__(self, name: str, isolation: bool, extraction: bool, answer: str) -> None:
        self.name = name
        self.price = Price()
        self.flags = (isolation, extraction)
        self.answer = answer
        self.calls: list[list] = []

    async def isolation(self) -> tuple[bool, bool]:
        return self.flags

    async def complete(self, messages, tools=(), *, timeout: float = 60.0) -> Completion:
        self.calls.append([m.content for m in messages] + [t.name for t in tools])
        if any(t.name == "learn_fact" for t in tools):
            return Completion(text="nothing new")
        return Completion(text=self.answer)


@pytest.mark.anyio
async def test_ND_2_extraction_runs_only_on_a_node_reporting_memory_extraction(shards, fresh):
    """The memory model on a node with `memory_extraction: false` never gets a learning
    request (the job ends with a clear error); with it true, learning runs.

    Break tried: in `LearningRunner._execute`, `if isolation is not None and not (await
    isolation())[1]:` → `if False:` → the node gets the extraction request."""
    bot, _ = fresh
    bot.answer(
        completion(None, tool_calls=[CONFIDE]),
        completion("Sorry."),
        completion(None, tool_calls=[CONFIDE]),
        completion("Sorry again."),
    )
    node = NodeStub("mem", isolation=True, extraction=False, answer="I hear you.")
    models = {"bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"), "mem": node}

    svc = shards(stubs=fresh, models=models)
    await run_turn(svc, "I moved to Oslo")
    jobs, calls = await svc.learning_jobs(POOL), list(node.calls)
    node.flags = (True, True)
    await run_turn(svc, "and I like trains")
    jobs2, calls2 = await svc.learning_jobs(POOL), list(node.calls)
    assert [(j.status, j.error) for j in jobs] == [
        ("failed", "the memory model's node cannot run extraction")
    ]
    assert not any("learn_fact" in c for c in calls), "extraction ran on a node without it"
    assert any("learn_fact" in c for c in calls2) and "done" in [j.status for j in jobs2]


@pytest.mark.anyio
async def test_ND_2_memory_reaches_a_bot_only_on_a_node_reporting_memory_isolation(shards, fresh):
    """A bot whose model runs on a node without `memory_isolation` gets no enrichment and no
    memory in its prompt; the same bot on an isolating node does.

    Break tried: in `BotStepper.memory_allowed`, `return (await isolation())[0]` →
    `return True` → the non-isolating node receives the rewritten input."""
    _, mem = fresh
    node = NodeStub("bot", isolation=False, extraction=False, answer="Sure.")
    models = {"bot": node, "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model")}

    svc = shards(stubs=fresh, models=models)
    mine = await svc.remember(POOL, ANN, "Ann prefers trains")
    mem.routes.append(route_rewrite("Plan my trip to Oslo by train", [mine.id]))
    await run_turn(svc, "Plan my trip to Oslo")
    first = list(node.calls)
    node.flags = (True, False)
    node.calls.clear()
    await run_turn(svc, "Plan my trip to Oslo")
    second = list(node.calls)
    seen = "\n".join(str(x) for x in first[0])
    assert "Plan my trip to Oslo by train" not in seen and "trains" not in seen
    assert "Plan my trip to Oslo by train" in "\n".join(str(x) for x in second[0])
