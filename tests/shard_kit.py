"""A `ShardService` in this process (no Ray) on the two loopback model stubs of the `stubs`
fixture (tests/conftest.py), with the org, bot, direct chat and reader most of its tests use,
and a turn run to its end (learning included)."""

from __future__ import annotations

from actors.models.registry import OpenAIModel
from actors.shard.service import ShardService, TurnStart
from engine.directory import Bot, Chat, Org, OrgSettings
from engine.memory_entries import Reader

ORG = Org(id="o1", name="o", settings=OrgSettings(botMemory=True, botMemoryModel="mem"))
BOT = Bot(id="b1", name="Helper", org="o1", owner="u_owner", model="bot")
CHAT = Chat(id="chat_1", kind="direct", owner="u_ann", org="o1", bot="b1")
ANN = Reader(user="u_ann", org="o1", uses_bot=True)
POOL = "bot:b1"


def shard_service(path, stubs, **kw) -> ShardService:
    bot, mem = stubs
    models = kw.pop("models", None) or {
        "bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"),
        "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model"),
    }
    return ShardService(path, 0, models=models, answer_wait=kw.pop("answer_wait", 2.0), **kw)


async def run_turn(svc, text, chat=CHAT, org=ORG):
    turn = await svc.start_turn(
        TurnStart(chat=chat, bot=BOT, org=org, operator=chat.owner, text=text)
    )
    result = await svc.wait_turn(chat.id, turn.id)
    await svc.learning_idle()
    return result
