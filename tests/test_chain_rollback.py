"""A collaboration chain whose first row never reached the disk (the person's turn's end, with
its send, failed to commit) is not kept in memory either (actors/chats/chain_records.py
`stage`): it is not listed and does not keep its chat busy. A waited turn's person item is
committed with the turn's end, so nothing of the failed attempt is stored: a retry with the same
requestId runs the turn once, with one chain, and a second retry gives that same turn. In
process, no Ray."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from actors.contracts import TurnStart
from actors.models.registry import ScriptedModel
from engine.errors import StorageError
from tests.chain_kit import PEER_SCRIPT, asker_and_peer, reopened


def _has_chain_row(batches) -> bool:
    return any(getattr(w, "table", "") == "chains" for writes in batches for w in writes)


@pytest.mark.parametrize(
    ("root_delay", "step_delay"),
    [(0.2, 0.0), (0.0, 0.3), (0.0, None)],
    ids=[
        "fails-after-the-peer-answered",
        "fails-while-the-peer-works",
        "the-peer-delivers-after-the-drop",
    ],
)
@pytest.mark.anyio
async def test_a_chain_whose_first_commit_failed_is_dropped_and_a_retry_does_not_duplicate(
    shards, tmp_path: Path, caplog, monkeypatch, root_delay: float, step_delay: float | None
):
    """`step_delay` None: the peer's delivery is held until the failed turn has returned (its
    chain dropped), then let go: it must not store the chain again."""
    script = tmp_path / "peer.toml"
    script.write_text(PEER_SCRIPT)
    models = {"s": ScriptedModel.from_file("s", str(script))}

    async def scenario():
        directory = shards.directory_service()
        org, asker, chat = await asker_and_peer(directory)
        svc = shards(models=models, directory=True)
        committer = svc.committer
        commit_group = committer.commit_group
        failed: list[str] = []

        async def failing_root(batches) -> None:
            """The first transaction with a chain's row (the turn's end and its send) takes a
            while (the peer's delivery overlaps it), then fails."""
            if not failed and _has_chain_row(batches):
                failed.append("root")
                await asyncio.sleep(root_delay)
                raise StorageError("disk full (simulated)")
            await commit_group(batches)

        step = svc.chains.records.step
        dropped = asyncio.Event()

        async def slow_step(bot, step_input, *sent):
            if step_delay is None:
                await dropped.wait()
            else:
                await asyncio.sleep(step_delay)
            return await step(bot, step_input, *sent)

        svc.chains.records.step = slow_step  # type: ignore[method-assign]
        with monkeypatch.context() as m:  # the shard closes with its own commits again
            m.setattr(committer, "commit_group", failing_root)
            start = TurnStart(
                chat=chat, bot=asker, org=org, operator="u_ann", text="start", request_id="r1"
            )
            with contextlib.suppress(StorageError):
                await svc.start_turn(start, True)
            dropped.set()
            await svc.chains_idle()
            after_failure = await svc.collaborations("u_ann", frozenset())
            busy = await svc.chat_busy(chat.id)
            # The same request again: the same turn, nothing run or stored twice.
            retried = [await svc.start_turn(start, True) for _ in range(2)]
            await svc.chains_idle()
            after_retry = await svc.collaborations("u_ann", frozenset())
            # The shard goes on: a new turn starts its chain and the chain completes.
            again = TurnStart(
                chat=chat, bot=asker, org=org, operator="u_ann", text="start", request_id="r2"
            )
            second = await svc.start_turn(again, True)
            for _ in range(200):
                await svc.chains_idle()
                chains = await svc.collaborations("u_ann", frozenset())
                if chains and all(c.status != "running" for c in chains):
                    break
                await asyncio.sleep(0.02)
            items = [i.kind for i in await svc.chat_items(chat.id)]
        await shards.close(svc)  # (while the log is watched)
        async with reopened(shards, models) as restarted:
            stored = await restarted.collaborations("u_ann", frozenset())
        return (failed, after_failure, busy, retried, after_retry, second, chains, items, stored)

    with caplog.at_level("WARNING"):
        (
            failed,
            after_failure,
            busy,
            retried,
            after_retry,
            second,
            chains,
            items,
            stored,
        ) = await scenario()
    # A delivery under way when the chain went fails as its commit does (its rows went after
    # the failed one, and its agent chat is dropped with them), never on a missing chain; one
    # that reaches the chain's texts only after the drop (a loaded host) ends quietly.
    errors = [r.exc_info[0] for r in caplog.records if r.exc_info]
    assert all(e is StorageError for e in errors), errors
    assert failed == ["root"]
    assert after_failure == []  # nothing of the chain is on disk: nothing of it in memory
    assert not busy  # no phantom chain keeps the chat busy (a mode switch would be refused)
    first_turn = retried[0].turn
    assert [r.turn.id for r in retried] == [first_turn.id] * 2
    assert all(r.turn.status == "done" for r in retried)
    assert [r.items[0].kind for r in retried] == ["person"] * 2
    assert [c.topic for c in after_retry] == [first_turn.id]  # one chain for the request
    assert second.turn.id != first_turn.id and second.turn.status == "done"
    assert len(chains) == 2 and all(c.status == "done" for c in chains)
    assert sorted(c.topic for c in chains) == sorted([first_turn.id, second.turn.id])
    # One person item per request, never one for the attempt that failed.
    assert items.count("person") == 2
    assert [c.id for c in stored] == [c.id for c in chains]  # memory matched the disk


@pytest.mark.anyio
async def test_24_turns_at_once_keep_exactly_the_chains_whose_first_commit_succeeded(
    shards, tmp_path: Path, monkeypatch
):
    """Half of 24 concurrent person turns (each in its own chat, each starting a chain) fail to
    commit their end: memory then holds exactly the other half's chains, as the disk does."""
    script = tmp_path / "peer.toml"
    script.write_text(PEER_SCRIPT)
    models = {"s": ScriptedModel.from_file("s", str(script))}

    async def scenario():
        directory = shards.directory_service()
        org, asker, first = await asker_and_peer(directory)
        chats = [first] + [
            await directory.create_chat("u_ann", None, bot=asker.id) for _ in range(23)
        ]
        doomed = {c.id for c in chats[::2]}
        svc = shards(models=models, directory=True)
        committer = svc.committer
        commit_group = committer.commit_group

        async def failing(batches) -> None:
            """A doomed chat's turn's end (a turn's row beside its chain's first row) fails
            (each batch of a failed group is retried alone, so only those fail)."""
            for writes in batches:
                tables = {getattr(w, "table", "") for w in writes}
                docs = [w.row[2] for w in writes if getattr(w, "table", "") == "chains"]
                root = "turns" in tables and any(
                    f'"root_chat":"{c}"' in d for d in docs for c in doomed
                )
                if root:
                    await asyncio.sleep(0.01)
                    raise StorageError("disk full (simulated)")
            await commit_group(batches)

        with monkeypatch.context() as m:  # the shard closes with its own commits again
            m.setattr(committer, "commit_group", failing)
            starts = [
                TurnStart(chat=c, bot=asker, org=org, operator="u_ann", text="start") for c in chats
            ]
            results = await asyncio.gather(
                *(svc.start_turn(s, True) for s in starts), return_exceptions=True
            )
            for _ in range(300):
                await svc.chains_idle()
                chains = await svc.collaborations("u_ann", frozenset())
                if all(c.status != "running" for c in chains):
                    break
                await asyncio.sleep(0.02)
            busy = [await svc.chat_busy(c.id) for c in chats]
        await shards.close(svc)
        async with reopened(shards, models) as restarted:
            stored = await restarted.collaborations("u_ann", frozenset())
        return doomed, chats, results, chains, busy, stored

    doomed, chats, results, chains, busy, stored = await scenario()
    kept = {c.id for c in chats} - doomed
    failed = {c.id for c, r in zip(chats, results, strict=True) if isinstance(r, Exception)}
    assert failed == doomed
    assert sorted(c.rootChat for c in chains) == sorted(kept)
    assert all(c.status == "done" for c in chains)
    assert not any(busy)
    assert sorted((c.id, c.status) for c in stored) == sorted((c.id, c.status) for c in chains)
