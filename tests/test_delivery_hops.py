"""What a collaboration delivery costs on its shard, in this process (no Ray): a new
agent chat is made without reading the database (a read made the shard apply its whole commit
journal first), and the delivery's writes go in few transactions, with one directory call."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from pathlib import Path

import pytest

from actors.contracts import TurnStart
from actors.directory import DirectoryService
from actors.models.registry import ScriptedModel
from engine.errors import StorageError
from engine.events import CollaborationChanged
from tests.chain_kit import PEER_SCRIPT, ann_org, asker_and_peer


class CountingDirectory:
    """The directory, its calls counted by method name."""

    def __init__(self, directory: DirectoryService) -> None:
        self.directory = directory
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str):
        method = getattr(self.directory, name)

        async def counted(*args):
            self.calls[name] += 1
            return await method(*args)

        return counted


@pytest.mark.anyio
async def test_a_delivery_reads_nothing_and_writes_in_few_transactions(
    shards, tmp_path: Path, monkeypatch
):
    script = tmp_path / "chain.toml"
    script.write_text(PEER_SCRIPT)
    svc = shards(models={"s": ScriptedModel.from_file("s", str(script))})
    directory = shards.directory_service()
    counting = CountingDirectory(directory)
    svc.peers.connect(directory=counting)  # type: ignore[arg-type]
    org, asker, chat = await asker_and_peer(directory)

    async def chain() -> tuple[int, int, collections.Counter]:
        reads, tx = [0], svc.committer.transactions
        counting.calls.clear()
        run = svc.db.run

        async def counted_read(fn, scope=None):
            reads[0] += 1
            return await run(fn, scope)

        with monkeypatch.context() as m:
            m.setattr(svc.db, "run", counted_read)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
            await svc.start_turn(start, True)
            await svc.chains_idle()
        return reads[0], svc.committer.transactions - tx, counting.calls

    await chain()  # the first: the chat, pools, settings and chains are read once
    reads, transactions, calls = await chain()
    listing = await svc.collaborations("u_ann", frozenset())
    # The peer's chat rode in its answer's transaction: once durable, it is listed.
    agent = [i.kind for i in await svc.chat_items(listing[-1].links[0].agentChat)]
    assert agent == ["delivery", "bot"]
    assert [c.deliveries for c in listing] == [2, 2]  # the request and its result
    assert [k.status for k in listing[-1].links] == ["answered"]
    assert reads == 0  # the agent chat was made in memory, not read
    # The person's item, the turn's end with its send (one transaction); the request, the
    # peer's reply and its result with the delivery item in the asker's chat (one); the
    # asker's reply.
    assert transactions <= 4, transactions
    # The peer and the asker came with the send and the agent chat was made here: one call
    # registers it once the delivery is durable (off the hop's path; nothing before).
    assert dict(calls) == {"register_chats": 1}


def linear_script(bots: int) -> str:
    """Bot0 sends "hop 1"; whoever gets "hop k" sends "hop k+1" on, until the ninth send is
    refused (depth 8) and the chain is capped."""
    rules = [
        "[[rules]]\nmatch = '^start$'\ntool_calls = [{ name = \"workspace_send_to_agent\", "
        'arguments = { agent = "L1", message = "hop 1" } }]'
    ]
    for k in range(1, 10):
        rules.append(
            f"[[rules]]\nmatch = '\\] hop {k}$'\ntool_calls = [{{ name = "
            f'"workspace_send_to_agent", arguments = {{ agent = "L{(k + 1) % bots}", '
            f'message = "hop {k + 1}" }} }}]'
        )
    return 'default = "Merged."\nafter_tool = "Handed on."\n' + "\n".join(rules) + "\n"


@pytest.mark.anyio
async def test_a_capped_linear_chain_costs_one_transaction_a_hop(shards, tmp_path: Path):
    """Each hop down is one transaction (the request rides with the peer's reply); after the
    cap the answers go up recorded with the last reply, not one transaction each."""
    script = tmp_path / "linear.toml"
    script.write_text(linear_script(3))
    svc = shards(models={"s": ScriptedModel.from_file("s", str(script))})
    directory = shards.directory_service()
    counting = CountingDirectory(directory)
    svc.peers.connect(directory=counting)  # type: ignore[arg-type]
    org = await ann_org(directory)
    bots = [
        await directory.create_bot(name=f"L{k}", org=org.id, owner="u_ann", model="s")
        for k in range(3)
    ]
    out = []
    stage = svc.kernel.stage
    announced: list[int] = []  # per staged batch: collaboration.changed per chain

    def counted_stage(batch, pool=None):
        chains = collections.Counter(
            p.collaboration for p, _ in batch.events if isinstance(p, CollaborationChanged)
        )
        announced.append(max(chains.values(), default=0))
        return stage(batch, pool)

    svc.kernel.stage = counted_stage  # type: ignore[method-assign]
    for _ in range(2):  # the second: nothing left to read or cache
        chat = await directory.create_chat("u_ann", None, bot=bots[0].id)
        tx = svc.committer.transactions
        counting.calls.clear()
        start = TurnStart(chat=chat, bot=bots[0], org=org, operator="u_ann", text="start")
        await svc.start_turn(start, True)
        await svc.chains_idle()
        out.append((svc.committer.transactions - tx, dict(counting.calls)))
    listing = await svc.collaborations("u_ann", frozenset())
    registered = [k.agentChat in directory.records.chats for k in listing[-1].links[:8]]
    assert announced and max(announced) == 1, announced  # once per chain and batch
    (transactions, calls), chain = out[-1], listing[-1]
    assert (chain.status, chain.deliveries, len(chain.links)) == ("capped", 8, 9)
    assert [k.status for k in chain.links].count("answered") == 8
    assert all(k.result for k in chain.links[:8])  # every answer went up and is recorded
    # The person's item, the turn's end with its send; at most one per hop (8), the last
    # carrying the 8 answers that go up after the cap. A hop does not wait for the commit of
    # the send that made it, so hops that follow each other fast share a journal record.
    assert transactions <= 10, transactions
    # No directory call on a hop's path: the agent chats are registered after their hops are
    # durable, gathered (one or a few calls for the chain, never one per hop); the directory
    # has every one of them.
    assert set(calls) == {"register_chats"} and 1 <= calls["register_chats"] <= 3, calls
    assert registered == [True] * 8


@pytest.mark.anyio
async def test_a_delivery_overlaps_its_sends_commit_but_stores_nothing_if_it_fails(
    shards, tmp_path: Path, monkeypatch
):
    """The next peer's step starts while the send that made its link commits, and its own
    transaction is submitted without waiting for the send's, but it is stored only with or
    after it: when the send's transaction fails, the delivery stores nothing (whether its rows
    were in the same group commit or a later one), and a restart delivers again from what is
    stored (each agent chat asked once and answered once, every answer up)."""
    script = tmp_path / "linear.toml"
    script.write_text(linear_script(3))
    models = {"s": ScriptedModel.from_file("s", str(script))}

    svc = shards(models=models, directory=True)
    directory = shards.directory_service()
    committer = svc.committer
    commit_group = committer.commit_group
    doomed: list[list] = []
    org = await ann_org(directory)
    bots = [
        await directory.create_bot(name=f"L{k}", org=org.id, owner="u_ann", model="s")
        for k in range(3)
    ]

    async def slow_failing(batches) -> None:
        """The first hop's transaction (L1's reply and its send to L2) takes a while,
        then fails, alone or with others; everything else commits."""
        for writes in batches:
            sent_to_l2 = any(
                getattr(w, "table", "") == "communications" and w.row[3:] == ("sent", bots[2].id)
                for w in writes
            )
            if sent_to_l2 and not doomed:
                doomed.append(writes)
        if any(writes is d for writes in batches for d in doomed):
            await asyncio.sleep(0.2)  # the next hop's step runs meanwhile
            raise StorageError("disk full (simulated)")
        await commit_group(batches)

    with monkeypatch.context() as m:  # the shard closes with its own commits again
        m.setattr(committer, "commit_group", slow_failing)
        chat = await directory.create_chat("u_ann", None, bot=bots[0].id)
        start = TurnStart(chat=chat, bot=bots[0], org=org, operator="u_ann", text="start")
        await svc.start_turn(start, True)
        await svc.chains_idle()
        [chain] = await svc.collaborations("u_ann", frozenset())
        # In memory the second link was sent (its peer even ran); nothing of it is stored.
        sent = [k for k in chain.links if k.toBot == bots[2].id]
        stored = [[i.kind for i in await svc.chat_items(f"chat_agent_{k.id}")] for k in sent]
        second, chain_id = [k.id for k in sent], chain.id
    await shards.close(svc)
    shards.close_directory()
    assert second and stored == [[] for _ in second]

    svc = shards(models=models, directory=True)
    await svc.kernel.started()  # resumes the first delivery: it left nothing stored
    for _ in range(200):
        await svc.chains_idle()
        [chain] = await svc.collaborations("u_ann", frozenset())
        if chain.status != "running":
            break
        await asyncio.sleep(0.02)
    agents = [
        [i.kind for i in await svc.chat_items(k.agentChat)] for k in chain.links if k.agentChat
    ]
    assert chain.id == chain_id
    assert all(k.id not in second for k in chain.links)  # the failed hop's link never existed
    assert (chain.status, chain.deliveries, len(chain.links)) == ("capped", 8, 9)
    # Each peer asked once, answered once, and (but the last) sent on once.
    assert agents == [["delivery", "bot", "delivery"]] * 7 + [["delivery", "bot"]]
    assert [k.status for k in chain.links].count("answered") == 8


@pytest.mark.anyio
async def test_a_person_turns_first_delivery_starts_while_its_commit_runs(
    shards, tmp_path: Path, monkeypatch
):
    """The turn's end with its send is one transaction; the first peer's step does not wait
    for it (as a hop's next step does not), and what the delivery stores goes after it."""
    script = tmp_path / "linear.toml"
    script.write_text(linear_script(3))

    svc = shards(models={"s": ScriptedModel.from_file("s", str(script))}, directory=True)
    directory = shards.directory_service()
    committer = svc.committer
    commit_group = committer.commit_group
    seen: list[str] = []
    run_step = svc.conversations.run_step

    async def noted_step(step, *args):
        seen.append(f"step {step.bot.name}")
        return await run_step(step, *args)

    async def slow_root(batches) -> None:
        """The first transaction with a chain's row: the person's turn's end and send."""
        root = not any(s.startswith("root") for s in seen) and any(
            getattr(w, "table", "") == "chains" for writes in batches for w in writes
        )
        if root:
            seen.append("root commit begins")
            await asyncio.sleep(0.3)
        await commit_group(batches)
        if root:
            seen.append("root commit ends")

    svc.conversations.run_step = noted_step  # type: ignore[method-assign]
    with monkeypatch.context() as m:  # the shard closes with its own commits again
        m.setattr(committer, "commit_group", slow_root)
        org = await ann_org(directory)
        bots = [
            await directory.create_bot(name=f"L{k}", org=org.id, owner="u_ann", model="s")
            for k in range(3)
        ]
        chat = await directory.create_chat("u_ann", None, bot=bots[0].id)
        start = TurnStart(chat=chat, bot=bots[0], org=org, operator="u_ann", text="start")
        await svc.start_turn(start, True)
        await svc.chains_idle()
        [chain] = await svc.collaborations("u_ann", frozenset())
        status, deliveries = chain.status, chain.deliveries
    assert (status, deliveries) == ("capped", 8)
    begins, ends = seen.index("root commit begins"), seen.index("root commit ends")
    assert seen.index("step L1") < ends, seen  # the first peer ran while the turn committed
    assert begins < ends


@pytest.mark.anyio
async def test_a_peer_posts_nothing_for_a_person_turn_that_was_never_stored(
    shards, directory, tmp_path: Path, monkeypatch
):
    """The first peer's step runs while the person's turn commits; a post it asks for is a
    commit of its own in the group's chat, so it waits for the turn's: when that fails, the
    group never shows a post for a turn that does not exist."""
    script = tmp_path / "post.toml"
    org = await ann_org(directory)
    bots = [
        await directory.create_bot(name=f"L{k}", org=org.id, owner="u_ann", model="s")
        for k in range(2)
    ]
    group = await directory.create_channel(org=org.id, people=["u_ann"], bots=[bots[1].id])
    script.write_text(
        'default = "Merged."\nafter_tool = "Handed on."\n'
        "[[rules]]\nmatch = '^start$'\ntool_calls = [{ name = \"workspace_send_to_agent\", "
        'arguments = { agent = "L1", message = "hop 1" } }]\n'
        "[[rules]]\nmatch = '\\] hop 1$'\ntool_calls = [{ name = "
        f'"workspace_post_to_group", arguments = {{ group = "{group.id}", '
        'message = "posted" } }]\n'
    )
    svc = shards(models={"s": ScriptedModel.from_file("s", str(script))}, directory=True)
    committer = svc.committer
    commit_group = committer.commit_group
    seen: list[str] = []
    posted: list[str] = []

    async def failing_root(batches) -> None:
        """The person's turn's end and send (the first transaction with a chain's row)
        take a while, then fail."""
        if not seen and any(
            getattr(w, "table", "") == "chains" for writes in batches for w in writes
        ):
            seen.append("root commit begins")
            await asyncio.sleep(0.3)  # the first peer's step runs meanwhile
            seen.append("root commit fails")
            raise StorageError("disk full (simulated)")
        await commit_group(batches)

    async def noted_post(effect, bot, org_) -> None:
        posted.append(effect.message)

    svc.chains.records.post = noted_post  # type: ignore[method-assign]
    with monkeypatch.context() as m:  # the shard closes with its own commits again
        m.setattr(committer, "commit_group", failing_root)
        chat = await directory.create_chat("u_ann", None, bot=bots[0].id)
        start = TurnStart(chat=chat, bot=bots[0], org=org, operator="u_ann", text="start")
        with contextlib.suppress(StorageError):
            await svc.start_turn(start, True)
        await svc.chains_idle()
    assert seen == ["root commit begins", "root commit fails"]
    assert posted == []
