"""What a direct turn's overlapped step may do before its person's item is durable
(actors/chats/conversations.py `_start_turn`, actors/chats/bot_step.py `_workspace_tool`):
tools that write at once wait for that commit; a caller that goes away does not stop the turn;
a retry's task is not dropped by the failed attempt's. In-process shard and directory on real
DuckDB files, no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from actors.chats.conversations import request_turn_id
from actors.contracts import TurnStart
from actors.directory import DirectoryService
from actors.models.registry import ScriptedModel
from actors.shard.service import ShardService
from engine.directory import Chat
from engine.errors import StorageError
from tests.chain_kit import PEER_SCRIPT, asker_and_peer
from tests.test_turn_overlap import _held_person_commit

TOOLS_SCRIPT = """
default = "OK."
after_tool = "Done."
[[rules]]
match = '^make and ask$'
tool_calls = [
  { name = "workspace_create_agent", arguments = { name = "Minion", prompt = "Fetch." } },
  { name = "workspace_request_approval", arguments = { title = "Laptop", proposal = "Buy it." } },
]
"""


class SlowModel(ScriptedModel):
    """The scripted model, answering after `delay` s; cancelled, it lingers `linger` s more
    (as a model call being torn down does)."""

    delay = 0.0
    linger = 0.0

    async def complete(self, messages, tools=(), *, timeout: float = 60.0):
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            await asyncio.sleep(self.linger)
            raise
        return await super().complete(messages, tools, timeout=timeout)


def _service(tmp_path: Path, script: str, delay=0.0, linger=0.0):
    path = tmp_path / "s.toml"
    path.write_text(script)
    model = SlowModel.from_file("s", str(path))
    model.delay, model.linger = delay, linger
    svc = ShardService(tmp_path, 0, models={"s": model})
    directory = DirectoryService(tmp_path)
    svc.peers.connect(directory=directory)
    return svc, directory


async def _direct(directory: DirectoryService):
    org, asker, _ = await asker_and_peer(directory)
    chat = Chat(id="chat_r", kind="direct", owner="u_ann", org=org.id, bot=asker.id)
    return org, asker, chat


def test_tools_that_write_wait_for_the_persons_item_and_a_retry_runs_them_once(
    tmp_path: Path, monkeypatch
):
    """The person's commit fails while the bot's step (overlapping it) calls
    workspace_create_agent and workspace_request_approval: neither happens; the retry (same
    requestId) makes exactly one member and one request."""
    seen = _held_person_commit(monkeypatch, fail=True, marker=request_turn_id("chat_r", "r-1"))

    async def scenario():
        svc, directory = _service(tmp_path, TOOLS_SCRIPT)
        try:
            org, asker, chat = await _direct(directory)
            start = TurnStart(
                chat=chat,
                bot=asker,
                org=org,
                operator="u_ann",
                text="make and ask",
                request_id="r-1",
            )
            with pytest.raises(StorageError):
                await svc.start_turn(start, True)
            await asyncio.sleep(0.3)  # whatever the failed attempt would still do
            members_after_failure = [
                b for b in directory.records.bots.values() if b.name == "Minion"
            ]
            requests_after_failure = await svc.requests_of("u_ann", frozenset())
            result = await svc.start_turn(start, True)
            members = [b for b in directory.records.bots.values() if b.name == "Minion"]
            requests = await svc.requests_of("u_ann", frozenset())
            return members_after_failure, requests_after_failure, result, members, requests
        finally:
            await svc.close()
            directory.store.db.close()

    failed_members, failed_requests, result, members, requests = asyncio.run(scenario())
    assert seen.get("person")
    assert failed_members == [] and failed_requests == []
    assert result.turn.status == "done"
    assert len(members) == 1 and len(requests) == 1


def test_a_cancelled_caller_leaves_the_turn_to_end(tmp_path: Path, monkeypatch):
    """The caller goes away (cancelled) while the person's item commits and the bot's model
    runs: the commit succeeds, so the turn still ends (it never stays `running`)."""
    _held_person_commit(monkeypatch, fail=False, marker=request_turn_id("chat_r", "r-2"))

    async def scenario():
        svc, directory = _service(tmp_path, PEER_SCRIPT, delay=0.2)
        try:
            org, asker, chat = await _direct(directory)
            start = TurnStart(
                chat=chat, bot=asker, org=org, operator="u_ann", text="hello", request_id="r-2"
            )
            caller = asyncio.create_task(svc.start_turn(start))
            await asyncio.sleep(0.1)  # inside the held commit and the model call
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            await asyncio.sleep(0.5)
            result = await svc.wait_turn(chat.id, request_turn_id(chat.id, "r-2"))
            return result
        finally:
            await svc.close()
            directory.store.db.close()

    result = asyncio.run(scenario())
    assert result.turn.status == "done"
    assert [i.kind for i in result.items] == ["person", "bot"]


def test_a_failed_attempts_task_does_not_drop_its_retrys(tmp_path: Path, monkeypatch):
    """The failed attempt's step is cancelled but takes a while to end; by then its retry
    (same requestId) runs its own task under the same turn id. Waiting for the turn waits
    for the retry's task, not the turn as stored mid-way (`running`)."""
    _held_person_commit(monkeypatch, fail=True, marker=request_turn_id("chat_r", "r-3"))

    async def scenario():
        svc, directory = _service(tmp_path, PEER_SCRIPT, delay=1.0, linger=0.4)
        try:
            org, asker, chat = await _direct(directory)
            start = TurnStart(
                chat=chat, bot=asker, org=org, operator="u_ann", text="hello", request_id="r-3"
            )
            with pytest.raises(StorageError):
                await svc.start_turn(start)
            turn = await svc.start_turn(start)  # the retry, while the first task lingers
            await asyncio.sleep(0.6)  # the first task has ended; the retry's model still runs
            busy = await svc.chat_busy(chat.id)
            result = await svc.wait_turn(chat.id, turn.id)
            return busy, result
        finally:
            await svc.close()
            directory.store.db.close()

    busy, result = asyncio.run(scenario())
    assert busy is True
    assert result.turn.status == "done"
    assert [i.kind for i in result.items] == ["person", "bot"]
