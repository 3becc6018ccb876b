"""A shared bot's memory bot (MB-1, MB-2, MB-6): the model of each call comes from the org of
the chat, its cost counts against the one budget of every org, and the spend is shown per org
as well as in total (the `GET /v1/bots/:botId/memory/bot` body). A shard in this process on the
loopback model stubs, its spend read again after a restart."""

from __future__ import annotations

import asyncio

import msgspec

from actors.models.registry import OpenAIModel
from actors.shard.service import TurnStart
from engine.directory import Bot, Chat, Org, OrgSettings
from engine.memory_bot_settings import Budget, SettingsPatch
from engine.models import Price
from tests.openai_stub import completion

HOME = Org(id="o1", name="home", settings=OrgSettings(botMemoryModel="mem"))
THERE = Org(id="o2", name="there", settings=OrgSettings(botMemoryModel="mem"))
NONE = Org(id="o3", name="no model", settings=OrgSettings(botMemoryModel=None))
BOT = Bot(id="b1", name="Helper", org="o1", owner="u_owner", model="bot", sharedOrgs=("o2", "o3"))
POOL = "bot:b1"


def _chat(n: int, org: Org, owner: str) -> Chat:
    return Chat(id=f"chat_{n}", kind="direct", owner=owner, org=org.id, bot=BOT.id, home="u_owner")


async def _confide(svc, chat: Chat, org: Org, bot_stub) -> None:
    bot_stub.answer(
        completion(None, tool_calls=[("confide", {"text": "I hope I got it right"})]),
        completion("Noted."),
    )
    start = TurnStart(chat=chat, bot=BOT, org=org, operator=chat.owner, text="hi")
    turn = await svc.start_turn(start)
    await svc.wait_turn(chat.id, turn.id)
    await svc.learning_idle()


def _confessor_calls(mem) -> int:
    return len([r for r in mem.requests if not r.get("tools")])


def test_mb1_one_budget_for_every_org_and_the_spend_of_each(tmp_path, fresh):
    """A confession in the shared org spends the whole month's budget (10 micros): the home
    org's next confession gets the calm answer without asking the model. The month shows 10
    micros, all of them the shared org's; an org without a memory model asks none at all."""
    from tests.shard_kit import shard_service

    bot_stub, mem = fresh
    # The confessor's call reports usage (10 micros); a learning step's reports none.
    mem.routes.append(
        lambda body: completion("OK.", usage=None) if body.get("tools") else completion("I hear.")
    )
    price = Price(input_micros_per_mtok=1_000_000)
    models = {
        "bot": OpenAIModel("bot", base_url=bot_stub.url, model="bot-model"),
        "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model", price=price),
    }

    async def go():
        svc = shard_service(tmp_path, fresh, models=models)
        try:
            await _confide(svc, _chat(3, NONE, "u_cy"), NONE, bot_stub)
            calls_without_model = _confessor_calls(mem)
            patch = SettingsPatch(expected=0, budget=Budget(period="month", limitMicros=10))
            await svc.patch_memory_bot_settings(POOL, patch)
            await _confide(svc, _chat(2, THERE, "u_dan"), THERE, bot_stub)
            await _confide(svc, _chat(1, HOME, "u_ann"), HOME, bot_stub)
            view = await svc.memory_bot_view(POOL, ("o1", "o2", "o3"))
        finally:
            await svc.close()
        again = shard_service(tmp_path, fresh, models=models)
        try:
            return calls_without_model, view, await again.memory_bot_view(POOL, ("o1", "o2"))
        finally:
            await again.close()

    calls_without_model, view, after = asyncio.run(go())
    assert calls_without_model == 0  # MB-1: the chat's org has no memory model
    assert _confessor_calls(mem) == 1  # the home org's confession found the budget spent
    month = [s for s in view.spend if s.period.startswith("month")]
    assert [(s.micros, s.orgs) for s in month] == [(10, {"o1": 0, "o2": 10, "o3": 0})]
    (month_after,) = [s for s in after.spend if s.period.startswith("month")]
    assert (month_after.micros, month_after.orgs) == (10, {"o1": 0, "o2": 10})
    assert msgspec.json.decode(msgspec.json.encode(month_after))["orgs"] == {"o1": 0, "o2": 10}
