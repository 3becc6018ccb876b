"""A delivery's `agent` chat is made by the chain's home shard and registered with the directory
after the delivery is durable (actors/chats/agent_chats.py): off the hop's path, never lost
(a restart registers what the directory did not confirm) and never made twice (the directory's
check and write are one step, however many register the same chat at once)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.contracts import TurnStart
from actors.directory import DirectoryService
from actors.models.registry import ScriptedModel
from engine.directory import Chat, agent_chat
from engine.errors import Unavailable
from tests.chain_kit import PEER_SCRIPT, ann_org, asker_and_peer


class CrashingDirectory:
    """The directory, except that it shows agent chats and then loses them (as a directory
    that crashed before writing them would), and cannot register them durably (restarting)."""

    def __init__(self, directory: DirectoryService) -> None:
        self.directory = directory
        self.shown = 0
        self.refused = 0

    def __getattr__(self, name: str):
        return getattr(self.directory, name)

    async def register_chats(self, chats: list[Chat], durable: bool = True) -> int:
        if not durable:
            self.shown += 1
            return len(chats)
        self.refused += 1
        raise Unavailable("the directory is restarting", code="engine_unavailable")


@pytest.mark.anyio
async def test_an_agent_chat_the_directory_missed_is_registered_after_a_restart(
    shards, tmp_path: Path
):
    script = tmp_path / "chain.toml"
    script.write_text(PEER_SCRIPT)
    models = {"s": ScriptedModel.from_file("s", str(script))}

    svc = shards(models=models)
    directory = shards.directory_service()
    crashing = CrashingDirectory(directory)
    svc.peers.connect(directory=crashing)  # type: ignore[arg-type]
    org, asker, chat = await asker_and_peer(directory)
    start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
    await svc.start_turn(start, True)
    await svc.chains_idle()
    [chain] = await svc.collaborations("u_ann", frozenset())
    agent = chain.links[0].agentChat
    assert agent is not None
    # The delivery is durable and listed in its chain; the directory never heard of it.
    items = [i.kind for i in await svc.chat_items(agent)]
    shown, refused = crashing.shown, crashing.refused
    status, known = chain.status, agent in directory.records.chats
    # The shard stops here with the registration still owed.
    await shards.close(svc)
    shards.close_directory()
    assert (status, items, known) == ("done", ["delivery", "bot"], False)
    assert shown == 0 and refused >= 1  # the hop showed nothing; the registration failed

    svc = shards(models=models, directory=True)
    directory = shards.directory_service()
    await svc.kernel.started()  # recovery: chains, and the chats they still owe
    await svc.chains_idle()
    [chain] = await svc.collaborations("u_ann", frozenset())
    link = chain.links[0]
    root = directory.records.chats[chain.rootChat]
    # What the shard made before the crash (its time is the link's; not in the view).
    expected = agent_chat(root, link.toBot, chain.id, link.id, 0)
    registered = directory.records.chats.get(agent)
    await shards.close(svc)
    shards.close_directory()
    assert registered is not None, "the restart did not register the agent chat"
    assert (registered.id, registered.kind, registered.owner, registered.org) == (
        expected.id,
        "agent",
        "u_ann",
        expected.org,
    )
    assert (registered.bot, registered.chain, registered.home) == (
        expected.bot,
        expected.chain,
        expected.home,
    )
    # Stored, not only in memory: a directory opened afresh has it.
    assert shards.directory_service().records.chats[agent] == registered
    shards.close_directory()

    # The chain's row no longer owes the chat: the next restart registers nothing.
    svc = shards(models=models)
    crashing = CrashingDirectory(shards.directory_service())
    svc.peers.connect(directory=crashing)  # type: ignore[arg-type]
    await svc.kernel.started()
    await svc.chains_idle()
    assert crashing.shown + crashing.refused == 0


@pytest.mark.anyio
async def test_concurrent_registrations_of_the_same_chats_make_each_once(shards, directory):
    """30 shards' worth of concurrent registrations (and the directory's own `agent_chat`) of
    overlapping agent chats: each chat is new for exactly one of them and keeps its first
    record."""
    org = await ann_org(directory)
    bot = await directory.create_bot(name="Peer", org=org.id, owner="u_ann", model="s")
    root = await directory.create_chat("u_ann", None, bot=bot.id)
    links = [f"dlv_{k:04d}" for k in range(6)]

    def chats(at: int) -> list[Chat]:  # the same ids, a different record each caller
        return [agent_chat(root, bot.id, "col_1", link, at) for link in links]

    calls = [directory.register_chats(chats(1000 + k), k % 2 == 0) for k in range(30)]
    makes = [directory.agent_chat(root, bot.id, "col_1", links[0]) for _ in range(6)]
    out = await asyncio.gather(*calls, *makes)
    counts, made = list(out[:30]), list(out[30:])
    await directory.chat_registry.written()
    kept = {c.id: c for c in directory.records.chats.values() if c.kind == "agent"}
    shards.close_directory()
    reopened = shards.directory_service()
    stored = {c.id: c for c in reopened.records.chats.values() if c.kind == "agent"}
    assert len(kept) == 6
    assert sum(counts) + (1 if kept["chat_agent_dlv_0000"].created_at > 10**12 else 0) == 6
    assert all(m == kept["chat_agent_dlv_0000"] for m in made)  # every caller saw the one record
    assert stored == kept


@pytest.mark.anyio
async def test_a_shown_chat_is_visible_at_once_and_written_soon(shards, directory):
    """`durable=False` answers once the chat is visible (a delivery waits only for that) and
    writes it right after; `durable=True` answers once it is on disk."""
    org = await ann_org(directory)
    bot = await directory.create_bot(name="Peer", org=org.id, owner="u_ann", model="s")
    root = await directory.create_chat("u_ann", None, bot=bot.id)
    shown = agent_chat(root, bot.id, "col_1", "dlv_shown", 1)
    assert await directory.register_chats([shown], False) == 1
    visible = (await directory.get_chat(shown.id)) == shown
    await directory.chat_registry.written()  # the write that follows
    kept = agent_chat(root, bot.id, "col_1", "dlv_kept", 2)
    await directory.register_chats([kept])
    shards.close_directory()
    reopened = shards.directory_service()
    on_disk = shown.id in reopened.records.chats, kept.id in reopened.records.chats
    written = directory.chat_registry.unwritten() == 0
    assert (visible, written, *on_disk) == (True, True, True, True)


class CountingDirectory:
    """The directory, counting registrations (durable or not)."""

    def __init__(self, directory: DirectoryService) -> None:
        self.directory = directory
        self.calls: list[bool] = []

    def __getattr__(self, name: str):
        return getattr(self.directory, name)

    async def register_chats(self, chats: list[Chat], durable: bool = True) -> int:
        self.calls.append(durable)
        return await self.directory.register_chats(chats, durable)


@pytest.mark.anyio
async def test_a_delivery_asks_the_directory_nothing_and_its_shard_finds_its_chat(
    shards, tmp_path: Path, monkeypatch
):
    """A hop asks the directory nothing: its agent chat is made on the chain's shard, its events
    go out as it commits, and from then on that shard finds the chat for whoever reads an item
    they announce (the gateway shows it in the directory then: gateway/auth.py); the durable
    registration follows, once for the chain's chats."""
    script = tmp_path / "chain.toml"
    script.write_text(PEER_SCRIPT)
    svc = shards(models={"s": ScriptedModel.from_file("s", str(script))})
    directory = shards.directory_service()
    counting = CountingDirectory(directory)
    svc.peers.connect(directory=counting)  # type: ignore[arg-type]
    log = svc.kernel.events
    publish = log.publish
    announced: list[str] = []
    asked_before: list = []
    found_then: list = []

    def published(events) -> None:
        for e in events:
            chat = getattr(e.data, "chat", "")
            if chat.startswith("chat_agent_") and getattr(e.data, "item", None):
                if not announced:  # what the directory was asked before the hop went out
                    asked_before.extend(counting.calls)
                announced.append(chat)
                found_then.append(asyncio.ensure_future(svc.find_agent_chat(chat)))
        publish(events)

    # Put back before the shard closes (monkeypatch, set up after `shards`, is undone first).
    monkeypatch.setattr(log, "publish", published)
    org, asker, chat = await asker_and_peer(directory)
    start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
    await svc.start_turn(start, True)
    await svc.chains_idle()
    found = await asyncio.gather(*found_then)
    unknown = await svc.find_agent_chat("chat_agent_dlv_nobody")
    [chain] = await svc.collaborations("u_ann", frozenset())

    # One durable registration, after the chain.
    assert asked_before == [] and counting.calls == [True]
    agent = chain.links[0].agentChat
    assert announced and set(announced) == {agent}
    assert all(c is not None and c.id == agent and c.kind == "agent" for c in found)
    assert found[0].owner == "u_ann" and found[0].chain == chain.id
    assert unknown is None
    assert agent in directory.records.chats


@pytest.mark.anyio
async def test_shown_chats_are_written_together_and_none_is_left_behind(shards, directory):
    """32 chats shown at once are written in one transaction, and a chat shown while that
    write runs is written by the same writer right after (no second writer, none left
    unwritten): all 33 are on disk when the directory opens again."""
    put_many = directory.store.put_many
    writes: list[int] = []
    org = await ann_org(directory)
    bot = await directory.create_bot(name="Peer", org=org.id, owner="u_ann", model="s")
    root = await directory.create_chat("u_ann", None, bot=bot.id)
    late = agent_chat(root, bot.id, "col_1", "dlv_late", 99)

    async def counted(table, records):
        writes.append(len(records))
        if len(writes) == 1:  # shown while the first write runs
            assert await directory.register_chats([late], False) == 1
        await put_many(table, records)

    directory.store.put_many = counted  # type: ignore[method-assign]
    chats = [agent_chat(root, bot.id, "col_1", f"dlv_{k}", k) for k in range(32)]
    shown = await asyncio.gather(
        *(directory.register_chats([c], False) for c in [*chats, *chats[:8]])
    )
    writers = directory.chat_registry.writers()
    await directory.chat_registry.written()
    shards.close_directory()
    reopened = shards.directory_service()
    on_disk = sum(c.id in reopened.records.chats for c in [*chats, late])
    assert sum(shown) == 32 and writes == [32, 1], (shown, writes)
    assert (writers, on_disk, len(writes)) == (1, 33, 2)


@pytest.mark.anyio
async def test_chats_written_together_replace_what_was_stored_under_their_ids(shards, directory):
    """`put_many` (two statements for any number of records) keeps one row per id: a record
    written again replaces the stored one, and every new one is added."""
    org = await ann_org(directory)
    bot = await directory.create_bot(name="Peer", org=org.id, owner="u_ann", model="s")
    root = await directory.create_chat("u_ann", None, bot=bot.id)
    first = [agent_chat(root, bot.id, "col_1", f"dlv_{k}", k) for k in range(3)]
    await directory.store.put_many("chats", first)
    again = [agent_chat(root, bot.id, "col_1", f"dlv_{k}", 100 + k) for k in (1, 2, 3)]
    await directory.store.put_many("chats", again)
    rows = directory.store.db.query(
        "SELECT id, count(*) FROM chats WHERE id LIKE 'chat_agent_%' GROUP BY id ORDER BY id"
    )
    shards.close_directory()
    reopened = shards.directory_service()
    made = {c.id: c.created_at for c in reopened.records.chats.values() if c.kind == "agent"}
    assert rows == [(f"chat_agent_dlv_{k}", 1) for k in range(4)]
    assert made == {f"chat_agent_dlv_{k}": at for k, at in [(0, 0), (1, 101), (2, 102), (3, 103)]}
