"""A direct turn's step overlaps the commit of the person's item (actors/chats/conversations.py
`_start_turn`): the bot starts while that commit runs, what the turn stores goes `after` it
(never without it), and the turn is acknowledged only once the person's item is durable.
In-process shard and directory on real DuckDB files, no Ray."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from actors.chats.conversations import request_turn_id
from actors.contracts import TurnStart
from actors.directory import DirectoryService
from actors.models.registry import ScriptedModel
from actors.shard.service import ShardService
from engine.directory import Chat
from engine.errors import StorageError
from storage.group_commit import GroupCommitter
from tests.chain_kit import PEER_SCRIPT, asker_and_peer

PERSON_TEXT = "hello there"


def _held_person_commit(monkeypatch, *, fail: bool, marker: str = "") -> dict:
    """The journal append holding the person's item (the first with a turn row, or with one
    that mentions `marker`) waits 0.3 s (on the journal thread), then fails if `fail`; `seen`
    records when it ended."""
    original = GroupCommitter.append_record
    seen: dict = {}

    def append(self, batches):
        rows = [w for batch in batches for w in batch]
        turns = [w for w in rows if getattr(w, "table", "") == "turns"]
        mine = any(marker in repr(w.row) for w in turns) and "person" not in seen
        if mine:
            seen["person"] = True
            time.sleep(0.3)
            seen["person_done"] = time.monotonic()
            if fail:
                raise StorageError("disk full (simulated)")
        return original(self, batches)

    monkeypatch.setattr(GroupCommitter, "append_record", append)
    return seen


class TimedModel(ScriptedModel):
    """The scripted model, noting when it was first asked."""

    first: float | None = None

    async def complete(self, messages, tools=(), *, timeout: float = 60.0):
        if self.first is None:
            self.first = time.monotonic()
        return await super().complete(messages, tools, timeout=timeout)


def _service(tmp_path: Path) -> tuple[ShardService, DirectoryService, TimedModel]:
    script = tmp_path / "s.toml"
    script.write_text(PEER_SCRIPT)
    model = TimedModel.from_file("s", str(script))
    svc = ShardService(tmp_path, 0, models={"s": model})
    directory = DirectoryService(tmp_path)
    svc.peers.connect(directory=directory)
    return svc, directory, model  # type: ignore[return-value]


def test_the_bot_starts_while_the_persons_item_commits(tmp_path: Path, monkeypatch):
    seen = _held_person_commit(monkeypatch, fail=False)

    async def scenario():
        svc, directory, model = _service(tmp_path)
        try:
            org, asker, chat = await asker_and_peer(directory)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text=PERSON_TEXT)
            turn = await svc.start_turn(start)
            acked_at = time.monotonic()
            result = await svc.wait_turn(chat.id, turn.id)
            return model.first, acked_at, result
        finally:
            await svc.close()
            directory.store.db.close()

    first, acked_at, result = asyncio.run(scenario())
    assert first is not None and first < seen["person_done"]  # the step did not wait for it
    assert acked_at >= seen["person_done"]  # the turn was acknowledged once it was durable
    assert result.turn.status == "done"
    assert [i.kind for i in result.items][:2] == ["person", "bot"]


def test_a_failed_persons_commit_fails_the_turn_and_stores_nothing_of_it(
    tmp_path: Path, monkeypatch
):
    """The step ran meanwhile, but its reply and the turn's end were staged `after` the
    person's item: nothing of the turn is stored, and the caller gets the storage error."""
    _held_person_commit(monkeypatch, fail=True)

    async def scenario():
        svc, directory, _model = _service(tmp_path)
        try:
            org, asker, chat = await asker_and_peer(directory)
            start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="hello")
            with pytest.raises(StorageError):
                await svc.start_turn(start, True)
            await asyncio.sleep(0.3)  # whatever the cancelled turn staged has settled
            await svc.chains_idle()
        finally:
            await svc.close()
        again = ShardService(tmp_path, 0, models={})
        again.peers.connect(directory=directory)
        try:
            items = await again.chat_items(chat.id)
            chains = await again.collaborations("u_ann", frozenset())
            return items, chains
        finally:
            await again.close()
            directory.store.db.close()

    items, chains = asyncio.run(scenario())
    assert items == [] and chains == []


@pytest.mark.parametrize("fail", [False, True])
@pytest.mark.parametrize("loaded", [True, False])
def test_the_same_request_again_is_acknowledged_only_once_the_item_is_durable(
    tmp_path: Path, monkeypatch, fail: bool, loaded: bool
):
    """Two calls of one turn (same `requestId`) at once while the person's item commits. In a
    chat already in memory (`loaded`) the second finds the turn before the first's step takes
    the chat, and answers with it only once it is durable (the same error if it failed); in a
    new chat it finds the turn after that commit settled, and when it failed, tries again from
    what is stored instead of answering with the turn memory held."""
    seen = _held_person_commit(monkeypatch, fail=fail, marker=request_turn_id("chat_r", "r-1"))

    async def scenario():
        svc, directory, _model = _service(tmp_path)
        try:
            org, asker, _ = await asker_and_peer(directory)
            chat = Chat(id="chat_r", kind="direct", owner="u_ann", org=org.id, bot=asker.id)
            warm = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="hello")
            if loaded:
                await svc.start_turn(warm, True)  # the chat's log is in memory now
            start = msgspec.structs.replace(warm, text="hi", request_id="r-1")

            async def call() -> tuple[float, str]:
                try:
                    turn = await svc.start_turn(start)
                except StorageError as e:
                    return time.monotonic(), e.code
                return time.monotonic(), turn.id

            answers = await asyncio.gather(call(), call())
            await svc.chains_idle()
        finally:
            await svc.close()
        again = ShardService(tmp_path, 0, models={})
        again.peers.connect(directory=directory)
        try:
            items = await again.chat_items(chat.id)
            return answers, [i.kind for i in items]
        finally:
            await again.close()
            directory.store.db.close()

    answers, kinds = asyncio.run(scenario())
    assert all(t >= seen["person_done"] for t, _ in answers), (answers, seen)
    turns = {a for _, a in answers if a.startswith("turn_")}
    assert len(turns) <= 1 and kinds.count("person") == loaded + len(turns)
    if not fail:
        assert len(turns) == 1 and all(a in turns for _, a in answers)
    else:
        assert any(a == "storage_error" for _, a in answers)
