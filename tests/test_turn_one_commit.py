"""A direct turn whose caller waits for its end (`start_turn(..., wait=True)`, `?wait=true`)
stores the person's item with the turn's end: one group commit (actors/chats/conversations.py
`_run_held`). In-process shard and directory on real DuckDB files, no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from actors.chats.chat_logs import ChatLogs
from actors.contracts import TurnStart
from tests.chain_kit import PEER_SCRIPT, asker_and_peer
from tests.test_turn_overlap import _service
from tests.test_turn_overlap_tools import _service as _slow_service


def test_a_waited_turn_is_one_commit_and_an_acknowledged_one_two(tmp_path: Path):
    """The model takes a while, so an acknowledged turn's person item is stored before the
    step ends; a waited turn's is held for its end."""

    async def scenario():
        svc, directory = _slow_service(tmp_path, PEER_SCRIPT, delay=0.1)
        try:
            org, asker, chat = await asker_and_peer(directory)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="hello")
            await svc.start_turn(start, True)  # the chat and the bot's pool are loaded
            counts = []
            for wait in (True, False, True):
                await svc.committer.drain()
                before = svc.committer.transactions
                if wait:
                    result = await svc.start_turn(start, True)
                else:
                    turn = await svc.start_turn(start)
                    result = await svc.wait_turn(chat.id, turn.id)
                await svc.committer.drain()
                counts.append((svc.committer.transactions - before, result.turn.status))
            items = await svc.chat_items(chat.id)
            return counts, [i.kind for i in items]
        finally:
            await svc.close()
            directory.store.db.close()

    counts, kinds = asyncio.run(scenario())
    assert counts == [(1, "done"), (2, "done"), (1, "done")]
    assert kinds == ["person", "bot"] * 4


def test_a_waited_turn_that_stops_before_storing_fails_its_caller(tmp_path: Path, monkeypatch):
    """Whatever ends the turn before its commit reaches the caller: it is never left waiting
    for a person's item that was held back and never stored."""
    original = ChatLogs.commit

    async def scenario():
        svc, directory, _model = _service(tmp_path)
        try:
            org, asker, chat = await asker_and_peer(directory)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="hello")
            await svc.start_turn(start, True)
            monkeypatch.setattr(ChatLogs, "commit", _failing)
            with pytest.raises(RuntimeError):
                await asyncio.wait_for(
                    svc.start_turn(msgspec.structs.replace(start, text="again"), True), 30
                )
            monkeypatch.setattr(ChatLogs, "commit", original)
            items = await svc.chat_items(chat.id)
            return [i.kind for i in items]
        finally:
            await svc.close()
            directory.store.db.close()

    async def _failing(self, chat, batch):
        raise RuntimeError("stopped before storing")

    kinds = asyncio.run(scenario())
    assert kinds == ["person", "bot"]  # nothing of the stopped turn was stored
