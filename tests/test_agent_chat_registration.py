"""A delivery's `agent` chat is made by the chain's home shard and registered with the directory
after the delivery is durable (actors/chats/agent_chats.py): off the hop's path, never lost
(a restart registers what the directory did not confirm) and never made twice (the directory's
check and write are one step, however many register the same chat at once)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from actors.contracts import TurnStart
from actors.directory import DirectoryService
from actors.models.registry import ScriptedModel
from actors.shard.service import ShardService
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


def test_an_agent_chat_the_directory_missed_is_registered_after_a_restart(tmp_path: Path):
    script = tmp_path / "chain.toml"
    script.write_text(PEER_SCRIPT)
    models = {"s": ScriptedModel.from_file("s", str(script))}

    async def before_crash() -> tuple[str, str, list[str], bool, tuple[int, int]]:
        svc = ShardService(tmp_path, 0, models=models)
        directory = DirectoryService(tmp_path)
        crashing = CrashingDirectory(directory)
        svc.peers.connect(directory=crashing)  # type: ignore[arg-type]
        try:
            org, asker, chat = await asker_and_peer(directory)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
            await svc.start_turn(start, True)
            await svc.chains_idle()
            [chain] = await svc.collaborations("u_ann", frozenset())
            agent = chain.links[0].agentChat
            assert agent is not None
            # The delivery is durable and listed in its chain; the directory never heard of it.
            items = [i.kind for i in await svc.chat_items(agent)]
            calls = (crashing.shown, crashing.refused)
            return chain.status, agent, items, agent in directory.chats, calls
        finally:  # the shard stops here with the registration still owed
            await svc.close()
            directory.store.db.close()

    status, agent, items, known, (shown, refused) = asyncio.run(before_crash())
    assert (status, items, known) == ("done", ["delivery", "bot"], False)
    assert shown == 1 and refused >= 1

    async def after_restart() -> tuple[Chat | None, Chat]:
        svc = ShardService(tmp_path, 0, models=models)
        directory = DirectoryService(tmp_path)
        svc.peers.connect(directory=directory)  # type: ignore[arg-type]
        try:
            await svc.kernel.started()  # recovery: chains, and the chats they still owe
            await svc.chains_idle()
            [chain] = await svc.collaborations("u_ann", frozenset())
            link = chain.links[0]
            root = directory.chats[chain.rootChat]
            # What the shard made before the crash (its time is the link's; not in the view).
            expected = agent_chat(root, link.toBot, chain.id, link.id, 0)
            return directory.chats.get(agent), expected
        finally:
            await svc.close()
            directory.store.db.close()

    registered, expected = asyncio.run(after_restart())
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
    directory = DirectoryService(tmp_path)
    try:
        assert directory.chats[agent] == registered
    finally:
        directory.store.db.close()

    async def third_start() -> int:
        """The chain's row no longer owes the chat: the next restart registers nothing."""
        svc = ShardService(tmp_path, 0, models=models)
        directory = DirectoryService(tmp_path)
        crashing = CrashingDirectory(directory)
        svc.peers.connect(directory=crashing)  # type: ignore[arg-type]
        try:
            await svc.kernel.started()
            await svc.chains_idle()
            return crashing.shown + crashing.refused
        finally:
            await svc.close()
            directory.store.db.close()

    assert asyncio.run(third_start()) == 0


def test_concurrent_registrations_of_the_same_chats_make_each_once(tmp_path: Path):
    """30 shards' worth of concurrent registrations (and the directory's own `agent_chat`) of
    overlapping agent chats: each chat is new for exactly one of them and keeps its first
    record."""

    async def scenario() -> tuple[list[int], dict[str, Chat], list[Chat], dict[str, Chat]]:
        directory = DirectoryService(tmp_path)
        try:
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
            await asyncio.gather(*directory._writing)
            kept = {c.id: c for c in directory.chats.values() if c.kind == "agent"}
        finally:
            directory.store.db.close()
        reopened = DirectoryService(tmp_path)
        try:
            stored = {c.id: c for c in reopened.chats.values() if c.kind == "agent"}
        finally:
            reopened.store.db.close()
        return counts, kept, made, stored

    counts, kept, made, stored = asyncio.run(scenario())
    assert len(kept) == 6
    assert sum(counts) + (1 if kept["chat_agent_dlv_0000"].created_at > 10**12 else 0) == 6
    assert all(m == kept["chat_agent_dlv_0000"] for m in made)  # every caller saw the one record
    assert stored == kept


def test_a_shown_chat_is_visible_at_once_and_written_soon(tmp_path: Path):
    """`durable=False` answers once the chat is visible (a delivery waits only for that) and
    writes it right after; `durable=True` answers once it is on disk."""

    async def scenario() -> tuple[bool, bool, bool, bool]:
        directory = DirectoryService(tmp_path)
        try:
            org = await ann_org(directory)
            bot = await directory.create_bot(name="Peer", org=org.id, owner="u_ann", model="s")
            root = await directory.create_chat("u_ann", None, bot=bot.id)
            shown = agent_chat(root, bot.id, "col_1", "dlv_shown", 1)
            assert await directory.register_chats([shown], False) == 1
            visible = (await directory.get_chat(shown.id)) == shown
            await asyncio.gather(*directory._writing)  # the write that follows
            kept = agent_chat(root, bot.id, "col_1", "dlv_kept", 2)
            await directory.register_chats([kept])
        finally:
            directory.store.db.close()
        reopened = DirectoryService(tmp_path)
        try:
            on_disk = shown.id in reopened.chats, kept.id in reopened.chats
        finally:
            reopened.store.db.close()
        return visible, not directory._unwritten, *on_disk

    assert asyncio.run(scenario()) == (True, True, True, True)


class SlowDirectory:
    """The directory, showing agent chats only once `release` is set (or after 5 s)."""

    def __init__(self, directory: DirectoryService) -> None:
        self.directory = directory
        self.release = asyncio.Event()

    def __getattr__(self, name: str):
        return getattr(self.directory, name)

    async def register_chats(self, chats: list[Chat], durable: bool = True) -> int:
        if not durable:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.release.wait(), 5.0)
        return await self.directory.register_chats(chats, durable)


def test_a_deliverys_items_are_announced_only_once_the_directory_shows_its_chat(tmp_path: Path):
    """Whoever reads an item a `chat.item.created` event announces must find its chat: no
    event of a delivery's agent chat is published before the directory shows the chat, however
    slowly it does, and the events behind it wait in order; the delivery itself does not wait
    (its rows are staged, and committed, while the directory is still showing the chat)."""
    script = tmp_path / "chain.toml"
    script.write_text(PEER_SCRIPT)

    async def scenario() -> tuple[list[str], list[str], list[str], list[int]]:
        svc = ShardService(tmp_path, 0, models={"s": ScriptedModel.from_file("s", str(script))})
        directory = DirectoryService(tmp_path)
        slow = SlowDirectory(directory)
        svc.peers.connect(directory=slow)  # type: ignore[arg-type]
        kernel, log = svc.kernel, svc.kernel.events
        stage, publish = kernel.stage, log.publish
        early, announced, unknown, seqs = [], [], [], []

        def agent_chats(items) -> list[str]:
            chats = [getattr(payload, "chat", "") for payload in items]
            return [c for c in chats if c.startswith("chat_agent_")]

        def staged(batch, pool=None):
            early.extend(
                c for c in agent_chats(p for p, _ in batch.events) if c not in directory.chats
            )
            if early:  # the delivery went on without the directory: let it show the chat now
                asyncio.get_running_loop().call_later(0.05, slow.release.set)
            return stage(batch, pool)

        def published(events) -> None:
            for chat in agent_chats(e.data for e in events if getattr(e.data, "item", None)):
                announced.append(chat)
                if chat not in directory.chats:
                    unknown.append(chat)
            seqs.extend(e.seq for e in events)
            publish(events)

        kernel.stage = staged  # type: ignore[method-assign]
        log.publish = published  # type: ignore[method-assign]
        try:
            org, asker, chat = await asker_and_peer(directory)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
            await svc.start_turn(start, True)
            await svc.chains_idle()
        finally:
            kernel.stage = stage  # type: ignore[method-assign]
            log.publish = publish  # type: ignore[method-assign]
            await svc.close()
            directory.store.db.close()
        return early, announced, unknown, seqs

    early, announced, unknown, seqs = asyncio.run(scenario())
    assert early  # staged before the directory showed the chat: the hop did not wait for it
    assert announced and unknown == []
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_shown_chats_are_written_together_and_none_is_left_behind(tmp_path: Path):
    """32 chats shown at once are written in one transaction, and a chat shown while that
    write runs is written by the same writer right after (no second writer, none left
    unwritten): all 33 are on disk when the directory opens again."""

    async def scenario() -> tuple[int, int, int]:
        directory = DirectoryService(tmp_path)
        put_many = directory.store.put_many
        writes: list[int] = []
        try:
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
            writers = len(directory._writing)
            while directory._writing:
                await asyncio.gather(*directory._writing)
        finally:
            directory.store.db.close()
        reopened = DirectoryService(tmp_path)
        try:
            on_disk = sum(c.id in reopened.chats for c in [*chats, late])
        finally:
            reopened.store.db.close()
        assert sum(shown) == 32 and writes == [32, 1], (shown, writes)
        return writers, on_disk, len(writes)

    assert asyncio.run(scenario()) == (1, 33, 2)


class HangingDirectory:
    """The directory, never answering a request to show an agent chat."""

    def __init__(self, directory: DirectoryService) -> None:
        self.directory = directory

    def __getattr__(self, name: str):
        return getattr(self.directory, name)

    async def register_chats(self, chats: list[Chat], durable: bool = True) -> int:
        if not durable:
            await asyncio.Event().wait()
        return await self.directory.register_chats(chats, durable)


def test_a_directory_that_never_shows_the_chat_holds_the_events_only_a_while(
    tmp_path: Path, monkeypatch
):
    """Events wait behind a delivery's gate, so a directory that never answers must not stop
    the shard's events for good: after SHOW_WAIT_S they go out, and the durable registration
    makes the chat known."""
    monkeypatch.setattr("actors.chats.agent_chats.SHOW_WAIT_S", 0.3)
    script = tmp_path / "chain.toml"
    script.write_text(PEER_SCRIPT)

    async def scenario() -> tuple[bool, bool]:
        svc = ShardService(tmp_path, 0, models={"s": ScriptedModel.from_file("s", str(script))})
        directory = DirectoryService(tmp_path)
        svc.peers.connect(directory=HangingDirectory(directory))  # type: ignore[arg-type]
        try:
            org, asker, chat = await asker_and_peer(directory)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
            await svc.start_turn(start, True)
            await svc.chains_idle()
            events = svc.kernel.events
            for _ in range(100):  # the gate gives up after 0.3 s
                if events.published == events.staged:
                    break
                await asyncio.sleep(0.02)
            [chain] = await svc.collaborations("u_ann", frozenset())
            agent = chain.links[0].agentChat
            return events.published == events.staged, agent in directory.chats
        finally:
            await svc.close()
            directory.store.db.close()

    assert asyncio.run(scenario()) == (True, True)


def test_chats_written_together_replace_what_was_stored_under_their_ids(tmp_path: Path):
    """`put_many` (two statements for any number of records) keeps one row per id: a record
    written again replaces the stored one, and every new one is added."""

    async def scenario() -> tuple[list[tuple[str, int]], dict[str, int]]:
        directory = DirectoryService(tmp_path)
        try:
            org = await ann_org(directory)
            bot = await directory.create_bot(name="Peer", org=org.id, owner="u_ann", model="s")
            root = await directory.create_chat("u_ann", None, bot=bot.id)
            first = [agent_chat(root, bot.id, "col_1", f"dlv_{k}", k) for k in range(3)]
            await directory.store.put_many("chats", first)
            again = [agent_chat(root, bot.id, "col_1", f"dlv_{k}", 100 + k) for k in (1, 2, 3)]
            await directory.store.put_many("chats", again)
            rows = directory.store.db.query(
                "SELECT id, count(*) FROM chats WHERE id LIKE 'chat_agent_%' "
                "GROUP BY id ORDER BY id"
            )
        finally:
            directory.store.db.close()
        reopened = DirectoryService(tmp_path)
        try:
            made = {c.id: c.created_at for c in reopened.chats.values() if c.kind == "agent"}
        finally:
            reopened.store.db.close()
        return rows, made

    rows, made = asyncio.run(scenario())
    assert rows == [(f"chat_agent_dlv_{k}", 1) for k in range(4)]
    assert made == {f"chat_agent_dlv_{k}": at for k, at in [(0, 0), (1, 101), (2, 102), (3, 103)]}
