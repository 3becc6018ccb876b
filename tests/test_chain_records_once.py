"""A shard's chain records (actors/chats/chain_records.py): the live rows and each chain asked for
read from the file once however many ask at once (recovery at start and the gateway's
find_agent_chat may), and an agent chat made here is found here while the directory does not
have it yet. In-process shard and directory on real DuckDB files, no Ray."""

from __future__ import annotations

import asyncio

import pytest

from actors.contracts import TurnStart
from actors.directory import DirectoryService
from actors.models.registry import ScriptedModel
from engine.errors import NotFound, Unavailable
from tests.chain_kit import PEER_SCRIPT, asker_and_peer
from tests.shard_kit import Shards


class UnregisteredAgentChats:
    """The directory, before it has heard of any agent chat (registration comes later)."""

    def __init__(self, directory: DirectoryService) -> None:
        self.directory = directory

    def __getattr__(self, name: str):
        return getattr(self.directory, name)

    async def get_chat(self, chat_id: str):
        if chat_id.startswith("chat_agent_"):
            raise NotFound(f"no chat {chat_id}", code="chat_not_found")
        return await self.directory.get_chat(chat_id)


class RegistersNothing:
    """The directory, unreachable for registrations: the chain's row keeps listing its agent
    chat as not registered (what a shard stopped before registering it leaves)."""

    def __init__(self, directory: DirectoryService) -> None:
        self.directory = directory

    def __getattr__(self, name: str):
        return getattr(self.directory, name)

    async def register_chats(self, chats, *args):
        raise Unavailable("the directory is restarting (simulated)")


async def _with_a_chain(shards: Shards, register: bool = True) -> tuple[dict, str, str]:
    """A chain stored on shard 0 (Asker sent to Peer); its id and its agent chat's. Without
    `register` its agent chat is never registered with the directory. The shard and the
    directory are closed after it, to be opened again."""
    script = shards.path / "chain.toml"
    script.write_text(PEER_SCRIPT)
    models = {"s": ScriptedModel.from_file("s", str(script))}
    svc = shards(models=models)
    directory = shards.directory_service()
    svc.peers.connect(directory=directory if register else RegistersNothing(directory))  # type: ignore[arg-type]
    org, asker, chat = await asker_and_peer(directory)
    start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
    await svc.start_turn(start, True)
    await svc.chains_idle()
    [chain] = await svc.collaborations("u_ann", frozenset())
    agent = chain.links[0].agentChat
    assert agent is not None
    # Found by its link (the chats this shard met are a bounded cache).
    svc.chains.records.chats.clear()
    found = await svc.find_agent_chat(agent)
    assert found is not None and found.id == agent and found.kind == "agent"
    assert await svc.find_agent_chat("chat_agent_dlv_nobody") is None
    await shards.close(svc)
    shards.close_directory()
    return models, chain.id, agent


@pytest.mark.anyio
async def test_concurrent_readers_load_the_chains_once(shards, monkeypatch):
    """24 readers at once after a restart: one read of the live rows and one of the chain
    asked for (it ended: not live), and what the first
    reader changed in memory (as staging a chain does) is not overwritten by a later read."""
    models, chain_id, _ = await _with_a_chain(shards)
    svc = shards(models=models, directory=True)
    records = svc.chains.records
    db = svc.kernel.db
    original, loads = db.run, []

    async def counting(fn, *args, **kwargs):
        code = getattr(fn, "__code__", None)
        consts = " ".join(str(c) for c in code.co_consts) if code is not None else ""
        for query in ("WHERE live", "WHERE id = ?"):
            if f"SELECT doc, texts FROM chains {query}" in consts:
                loads.append(query)
        return await original(fn, *args, **kwargs)

    changed: list[int] = []

    async def reader(i: int):
        chain = await records.get(chain_id)
        if not changed:  # the first to have it changes a text, as a hop would
            changed.append(i)
            records.texts[chain_id] = {"changed": {"by": str(i)}}
        return chain

    with monkeypatch.context() as m:  # the shard closes with its own reads again
        m.setattr(db, "run", counting)
        got = await asyncio.gather(*(reader(i) for i in range(24)))
        texts = records.texts[chain_id]
    # the live rows at start; the chain itself, unless live (an agent chat not confirmed)
    assert loads.count("WHERE live") == 1 and loads.count("WHERE id = ?") <= 1, loads
    assert all(g is got[0] and g.id == chain_id for g in got)
    assert texts == {"changed": {"by": str(changed[0])}}


@pytest.mark.anyio
async def test_an_agent_chat_made_here_is_found_before_the_directory_has_it(shards):
    """The chain records' chat lookup and a learning job's (its project) fall back to the
    agent chat this shard made when the directory does not have it yet (after a restart too:
    a chain whose agent chats are not registered is read at start)."""
    models, _, agent = await _with_a_chain(shards, register=False)
    svc = shards(models=models)
    svc.peers.connect(directory=UnregisteredAgentChats(shards.directory_service()))  # type: ignore[arg-type]
    made = await svc.chains.records.chat(agent)
    svc.chains.records.chats.clear()  # a bounded cache: it may have been dropped
    learned = await svc.learning.chat_of(agent)
    try:
        await svc.chains.records.chat("chat_agent_dlv_nothere")
        unknown = None
    except NotFound as e:
        unknown = e.code
    assert made.id == agent and made.kind == "agent"
    assert learned == made
    assert unknown == "chat_not_found"
