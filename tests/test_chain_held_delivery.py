"""Two edges of a delivery (actors/chats/chains.py): a held delivery batch (the peer's reply with
its request, waiting to go up with the answer) whose answer failed to go up is still written even
when the chain's first row is not yet stored (`_submit_held`, `Batch.staged`), and a delivery of
a chain dropped before it began (its first row failed at once) returns quietly (`_deliver`).
In-process shard and directory on real DuckDB files, no Ray."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from actors.contracts import TurnStart
from actors.models.registry import ScriptedModel
from engine.errors import StorageError
from tests.chain_kit import PEER_SCRIPT, asker_and_peer, reopened


def _has_chain_row(writes) -> bool:
    return any(getattr(w, "table", "") == "chains" for w in writes)


def _models(tmp_path: Path) -> dict:
    script = tmp_path / "peer.toml"
    script.write_text(PEER_SCRIPT)
    return {"s": ScriptedModel.from_file("s", str(script))}


@pytest.mark.anyio
async def test_a_held_delivery_whose_answer_failed_is_written_after_the_pending_root(
    shards, tmp_path: Path, caplog, monkeypatch
):
    """The root send's commit is held; the peer answers (its reply held for the answer's
    transaction, the chain restaged into it while its first row is unstored: a failure hook);
    the answer going up fails (reading the root chat). The held batch still commits after the
    root: the delivery item, the reply and the chain's row with the agent chat are stored."""
    models = _models(tmp_path)

    async def scenario():
        directory = shards.directory_service()
        org, asker, chat = await asker_and_peer(directory)
        svc = shards(models=models, directory=True)
        committer = svc.committer
        commit_group = committer.commit_group
        release = asyncio.Event()
        failed = asyncio.Event()
        held: list[str] = []

        async def holding_root(batches) -> None:
            if not held and any(_has_chain_row(writes) for writes in batches):
                held.append("root")
                await release.wait()
            await commit_group(batches)

        records = svc.chains.records
        step, chat_of = records.step, records.chat
        stepped: list[str] = []

        async def noting_step(bot, step_input, *sent):
            outcome = await step(bot, step_input, *sent)
            stepped.append(bot.name)
            return outcome

        async def failing_chat(chat_id):
            """The first chat read after the peer's step (the answer's target in `_result`)."""
            if stepped and not failed.is_set():
                failed.set()
                raise StorageError("read failed (simulated)")
            return await chat_of(chat_id)

        records.step = noting_step  # type: ignore[method-assign]
        records.chat = failing_chat  # type: ignore[method-assign]
        with monkeypatch.context() as m:  # the shard closes with its own commits again
            m.setattr(committer, "commit_group", holding_root)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
            turn = asyncio.create_task(svc.start_turn(start, True))
            await asyncio.wait_for(failed.wait(), 10)
            await asyncio.sleep(0.1)  # the held batch is (or is not) submitted meanwhile
            assert held == ["root"] and not release.is_set()
            release.set()
            await asyncio.wait_for(turn, 10)
            await svc.chains_idle()
            (chain,) = await svc.collaborations("u_ann", frozenset())
            (link,) = chain.links
            achat = link.agentChat
            live = [(i.kind, i.text) for i in await svc.chat_items(achat)] if achat else []
        await shards.close(svc)
        # After a restart (its recovery sends the stored answer up): the delivery and its reply
        # are there once each, the chain's row names the agent chat.
        async with reopened(shards, models) as restarted:
            await restarted.chains_idle()
            (stored,) = await restarted.collaborations("u_ann", frozenset())
            again = [(i.kind, i.text) for i in await restarted.chat_items(achat)] if achat else []
        return stepped, achat, live, stored, again

    with caplog.at_level("ERROR"):
        stepped, achat, live, stored, again = await scenario()
    assert stepped == ["Peer"]
    assert achat is not None
    kinds = [k for k, _ in live]
    assert kinds == ["delivery", "bot"], live  # the request and the peer's reply, stored
    assert live[1][1] == "Result received and merged into my work."
    assert [link.agentChat for link in stored.links] == [achat]
    assert [k for k, _ in again][:2] == ["delivery", "bot"]
    assert [k for k, _ in again].count("delivery") == 1  # not delivered twice


@pytest.mark.anyio
async def test_a_delivery_of_a_chain_dropped_before_it_began_returns(
    shards, tmp_path: Path, caplog, monkeypatch
):
    """The root send's commit fails at once (as when the shard is closing): its failure hooks
    drop the chain before the delivery task first runs; the delivery returns, no error."""
    models = _models(tmp_path)

    async def scenario():
        directory = shards.directory_service()
        org, asker, chat = await asker_and_peer(directory)
        svc = shards(models=models, directory=True)
        committer = svc.committer
        submit = committer.submit
        failed: list[str] = []

        def failing_submit(writes, *args):
            if not failed and _has_chain_row(writes):
                failed.append("root")
                fut = asyncio.get_running_loop().create_future()
                fut.set_exception(StorageError("closing (simulated)", code="closing"))
                return fut
            return submit(writes, *args)

        # private: wraps the delivery step: that it ran and returned has no public trace
        deliver = svc.chains._deliver
        outcomes: list[BaseException | None] = []

        async def noting_deliver(*args, **kw):
            try:
                await deliver(*args, **kw)
            except BaseException as e:
                outcomes.append(e)
                raise
            outcomes.append(None)

        # private: wraps the delivery step: that it ran and returned has no public trace
        svc.chains._deliver = noting_deliver  # type: ignore[method-assign]
        with monkeypatch.context() as m:  # the shard closes with its own commits again
            m.setattr(committer, "submit", failing_submit)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
            with contextlib.suppress(StorageError):
                await svc.start_turn(start, True)
            await svc.chains_idle()
            busy = await svc.chat_busy(chat.id)
            chains = await svc.collaborations("u_ann", frozenset())
        await shards.close(svc)  # (while the log is watched)
        return failed, outcomes, busy, chains

    with caplog.at_level("ERROR"):
        failed, outcomes, busy, chains = await scenario()
    assert failed == ["root"]
    assert outcomes == [None]  # the delivery ran and returned: nothing escaped its task
    assert not [r for r in caplog.records if "delivery" in r.getMessage()]
    assert not busy
    assert chains == []
