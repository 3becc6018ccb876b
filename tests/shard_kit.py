"""A `ShardService` in this process (no Ray) on the two loopback model stubs of the `stubs`
fixture (tests/conftest.py), with the org, bot, direct chat and reader most of its tests use,
and a turn run to its end (learning included)."""

from __future__ import annotations

from actors.directory import DirectoryService
from actors.models.registry import OpenAIModel
from actors.shard.service import ShardService, TurnStart
from engine.directory import Bot, Chat, Org, OrgSettings
from engine.memory_entries import Reader

ORG = Org(id="o1", name="o", settings=OrgSettings(botMemory=True, botMemoryModel="mem"))
BOT = Bot(id="b1", name="Helper", org="o1", owner="u_owner", model="bot")
CHAT = Chat(id="chat_1", kind="direct", owner="u_ann", org="o1", bot="b1")
ANN = Reader(user="u_ann", org="o1", uses_bot=True)
POOL = "bot:b1"


def shard_service(path, stubs, index: int = 0, **kw) -> ShardService:
    bot, mem = stubs
    models = kw.pop("models", None) or {
        "bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"),
        "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model"),
    }
    return ShardService(path, index, models=models, answer_wait=kw.pop("answer_wait", 2.0), **kw)


async def run_turn(svc, text, chat=CHAT, org=ORG):
    turn = await svc.start_turn(
        TurnStart(chat=chat, bot=BOT, org=org, operator=chat.owner, text=text)
    )
    result = await svc.wait_turn(chat.id, turn.id)
    await svc.learning_idle()
    return result


class Shards:
    """Shard services on one test's folder, each closed after the test unless the test closed it
    (`await shards.close(svc)`, before reading its files or opening it again)."""

    def __init__(self, path) -> None:
        self.path = path
        self.open: list[ShardService] = []
        self.directory: DirectoryService | None = None

    def __call__(
        self, *, stubs=None, directory: bool = False, index: int = 0, path=None, **kw
    ) -> ShardService:
        """The folder's shard `index` (of `shard_count`, one by default), or one on `path` (a
        copy of the folder): on the `stubs` models when given; connected to the folder's one
        DirectoryService when `directory`."""
        path = self.path if path is None else path
        svc = shard_service(path, stubs, index, **kw) if stubs else ShardService(path, index, **kw)
        if directory:
            svc.peers.connect(directory=self.directory_service())
        self.open.append(svc)
        return svc

    def directory_service(self) -> DirectoryService:
        """The folder's one DirectoryService, opened on first use."""
        if self.directory is None:
            self.directory = DirectoryService(self.path)
        return self.directory

    def close_directory(self) -> None:
        """Closes the folder's DirectoryService: the next `directory_service()` opens it again
        from its files, as after a restart (close the shards connected to it first)."""
        if self.directory is not None:
            self.directory.store.db.close()
            self.directory = None

    async def close(self, svc: ShardService) -> None:
        self.open.remove(svc)
        await svc.close()

    async def close_all(self) -> None:
        while self.open:
            await self.close(self.open[-1])
        self.close_directory()
