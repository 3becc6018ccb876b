"""A collaboration peer's writing tools take effect only once the send it answers is durable
(nothing is ever a side effect of a failed write).

The peer's step starts while the send that made its link commits (actors/chats/chains.py) and
runs on the peer's own shard: its rules, the members it creates and its confessions must wait
for that commit, and never happen if it fails. Two shards and a directory in one process on
real DuckDB files (no Ray): Ann's chat, its chain and the Asker live on shard 0, the Peer
(Ben's bot) steps on shard 1."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import msgspec
import pytest

from actors.chats.sent_gate import RETRY_PAUSES, StepWrites
from actors.contracts import SentRef, TurnStart
from actors.directory import DirectoryService
from actors.models.registry import ScriptedModel
from actors.runtime.placement import shard_of
from actors.shard.service import ShardService
from engine.directory import OrgSettings
from engine.errors import Conflict, StorageError, Unavailable
from engine.self_rules import Editor, parse_update
from tests.shard_kit import Shards

# The Asker hands "start N" on to the Peer; the Peer, asked to "make N", reads its rules,
# creates "Helper N", changes its rules (revision 1: one such change can ever succeed) and
# confides; asked to "look N", it only reads (its rules, its memory) and asks for an approval
# (not here: a delivery has no person to ask).
SCRIPT = """
default = "OK."
after_tool = "Done."

[bots.Asker]
default = "Thanks."
after_tool = "Handed on."
[[bots.Asker.rules]]
match = '^start (?P<n>\\d+)$'
[[bots.Asker.rules.tool_calls]]
name = "workspace_send_to_agent"
arguments = { agent = "Peer", message = "make {n}" }
[[bots.Asker.rules]]
match = '^peek (?P<n>\\d+)$'
[[bots.Asker.rules.tool_calls]]
name = "workspace_send_to_agent"
arguments = { agent = "Peer", message = "look {n}" }

[bots.Peer]
default = "Looked."
after_tool = "Made it."
[[bots.Peer.rules]]
match = 'make (?P<n>\\d+)$'
[[bots.Peer.rules.tool_calls]]
name = "workspace_get_self_rules"
[[bots.Peer.rules.tool_calls]]
name = "workspace_create_agent"
arguments = { name = "Helper {n}" }
[[bots.Peer.rules.tool_calls]]
name = "workspace_update_self_rules"
arguments = { expectedRevision = 1, description = "changed by {n}" }
[[bots.Peer.rules.tool_calls]]
name = "confide"
arguments = { text = "made helper {n}" }
[[bots.Peer.rules]]
match = 'look (?P<n>\\d+)$'
tool_calls = [
  { name = "workspace_get_self_rules", arguments = {} },
  { name = "workspace_memory_search", arguments = { query = "helper {n}" } },
  { name = "workspace_request_approval", arguments = {} },
]
"""


def _account_on(shard: int, stem: str) -> str:
    return next(f"{stem}{n}" for n in range(100) if shard_of(f"{stem}{n}", 2) == shard)


def _models(tmp_path: Path, text: str) -> dict:
    script = tmp_path / "script.toml"
    script.write_text(text)
    return {"s": ScriptedModel.from_file("s", str(script))}


class World:
    """Shard 0 (Ann: her chats, the chains) and shard 1 (Ben: the Peer's steps)."""

    def __init__(self, opened: Shards, script: str = SCRIPT) -> None:
        self.opened = opened
        self.models = _models(opened.path, script)
        self.directory = opened.directory_service()
        self.shards = [opened(index=k, shard_count=2, models=self.models) for k in range(2)]
        for svc in self.shards:
            svc.peers.connect(directory=self.directory, shards=dict(enumerate(self.shards)))

    async def setup(self, chats: int = 1) -> None:
        d = self.directory
        org = self.org = await d.create_org("o", "o_1", OrgSettings(botMemory=False))
        ann, _ = await d.create_user("Ann", [org.id], _account_on(0, "u_ann"))
        ben, _ = await d.create_user("Ben", [org.id], _account_on(1, "u_ben"))
        self.ann = ann.id
        self.asker = await d.create_bot(name="Asker", org=org.id, owner=ann.id, model="s")
        self.peer = await d.create_bot(name="Peer", org=org.id, owner=ben.id, model="s")
        self.chats = [await d.create_chat(ann.id, None, bot=self.asker.id) for _ in range(chats)]
        assert {shard_of(c.home, 2) for c in self.chats} == {0}

    def start(self, n: int, text: str = "start") -> TurnStart:
        return TurnStart(
            chat=self.chats[n],
            bot=self.asker,
            org=self.org,
            operator=self.ann,
            text=f"{text} {n}",
            request_id=f"r{n}",
        )

    def helpers(self, directory: DirectoryService | None = None) -> list[str]:
        bots = (directory or self.directory).records.bots.values()
        return sorted(b.name for b in bots if b.creator == self.peer.id)

    def peer_rules(self, directory: DirectoryService | None = None) -> str:
        return (directory or self.directory).records.bots[self.peer.id].rules.description

    async def confessions(self, shard: ShardService) -> list[str]:
        """The chats of the confessions stored on `shard` (their text is sealed)."""
        rows = await shard.db.run(
            lambda con: con.execute("SELECT chat FROM confessions").fetchall()
        )
        return [r[0] for r in rows]

    async def settle(self, home: ShardService) -> list:
        for _ in range(300):
            await home.chains_idle()
            chains = await home.collaborations(self.ann, frozenset())
            if all(c.status != "running" for c in chains):
                return chains
            await asyncio.sleep(0.02)
        raise AssertionError("chains still running")

    async def close(self) -> None:
        """Both shards and the directory closed, to open them again from their files."""
        for svc in self.shards:
            await self.opened.close(svc)
        self.opened.close_directory()


def _fail_roots(shard: ShardService, doomed: set[str], delay: float, failed: list[str]):
    """Shard 0's commits: a doomed chat's root transaction (its turn's end with its chain's
    first row) takes `delay` (the peer's step overlaps it), then fails."""
    commit_group = shard.committer.commit_group

    async def failing(batches) -> None:
        for writes in batches:
            tables = {getattr(w, "table", "") for w in writes}
            docs = [w.row[2] for w in writes if getattr(w, "table", "") == "chains"]
            for chat in doomed:
                if "turns" in tables and any(f'"root_chat":"{chat}"' in d for d in docs):
                    failed.append(chat)
                    await asyncio.sleep(delay)
                    raise StorageError("disk full (simulated)")
        await commit_group(batches)

    shard.committer.commit_group = failing  # type: ignore[method-assign]


@pytest.mark.parametrize(
    ("root_delay", "step_delay"),
    [(0.3, 0.0), (0.0, 0.3)],
    ids=["fails-while-the-peer-works", "fails-before-the-peer-steps"],
)
@pytest.mark.anyio
async def test_a_failed_send_leaves_nothing_of_the_peers_writing_tools(
    shards, root_delay: float, step_delay: float
):
    w = World(shards)
    await w.setup()
    home, peer_shard = w.shards
    failed: list[str] = []
    _fail_roots(home, {w.chats[0].id}, root_delay, failed)
    step = home.chains.records.step
    stepped: list[str] = []

    async def slow_step(bot, step_input, *sent):
        await asyncio.sleep(step_delay)
        outcome = await step(bot, step_input, *sent)
        stepped.append(bot.name)
        return outcome

    home.chains.records.step = slow_step  # type: ignore[method-assign]
    with contextlib.suppress(StorageError):
        await home.start_turn(w.start(0), True)
    await w.settle(home)
    await asyncio.sleep(0.1)
    chains = await home.collaborations(w.ann, frozenset())
    helpers, rules = w.helpers(), w.peer_rules()
    confessed, confessed_home = await w.confessions(peer_shard), await w.confessions(home)
    assert failed == [failed[0]]
    assert stepped == ["Peer"]  # the peer did work on the delivery (its writes were refused)
    assert chains == []
    assert helpers == []  # no member created in the directory
    assert rules == ""  # its rules unchanged
    assert confessed == [] and confessed_home == []  # no confession on its shard


@pytest.mark.anyio
async def test_a_stored_send_applies_the_peers_writing_tools_once_also_after_a_restart(shards):
    w = World(shards)
    await w.setup()
    home, peer_shard = w.shards
    turn = await home.start_turn(w.start(0), True)
    chains = await w.settle(home)
    seen = (w.helpers(), w.peer_rules(), len(await w.confessions(peer_shard)))
    sent = SentRef(shard=0, chain=chains[0].id, link=chains[0].links[0].id)
    on_disk = await _asked_from_the_file(home, sent)  # the delivery's step is over
    await w.close()
    # Both shards and the directory again, from their files: recovery asks nothing twice.
    again = World(shards)
    again.peer, again.ann = w.peer, w.ann
    for svc in again.shards:
        await svc.kernel.started()
    restarted = await again.settle(again.shards[0])
    after = (
        again.helpers(),
        again.peer_rules(),
        len(await again.confessions(again.shards[1])),
    )
    on_disk = (on_disk, await _asked_from_the_file(again.shards[0], sent))
    assert turn.turn.status == "done"
    assert [(c.status, [k.status for k in c.links]) for c in chains] == [("done", ["answered"])]
    assert seen == (["Helper 0"], "changed by 0", 1)
    assert [(c.id, c.status) for c in restarted] == [(c.id, c.status) for c in chains]
    assert after == seen
    # The stored link is stored; an unknown link of the chain, or an unknown chain, is not.
    assert on_disk == ([True, False, False], [True, False, False])


async def _asked_from_the_file(home: ShardService, sent: SentRef) -> list[bool]:
    """`send_stored` for the stored send, another link of its chain and another chain, with no
    commit future left to wait for (the file answers: SendGate._on_disk)."""
    assert home.chains.records.gate.pending() == []
    asks = (
        sent,
        msgspec.structs.replace(sent, link="dlv_0000000000000000"),
        msgspec.structs.replace(sent, chain="ch_none"),
    )
    return [await home.send_stored(ref) for ref in asks]


@pytest.mark.anyio
async def test_read_only_tools_do_not_wait_for_the_send(shards, monkeypatch):
    """The root send's commit is held: a peer that only reads answers meanwhile, asking the
    home shard nothing; a peer that writes waits for the commit, then writes."""

    w = World(shards)
    await w.setup(chats=2)
    home = w.shards[0]
    commit_group = home.committer.commit_group
    release = asyncio.Event()

    async def holding(batches) -> None:
        rows = any(getattr(x, "table", "") == "chains" for b in batches for x in b)
        if rows and not release.is_set():
            await release.wait()
        await commit_group(batches)

    asked: list[str] = []
    was_asked, was_stepped = asyncio.Event(), asyncio.Event()
    send_stored = home.send_stored

    async def noting(ref):
        asked.append(ref.link)
        was_asked.set()
        return await send_stored(ref)

    home.send_stored = noting  # type: ignore[method-assign]
    step = home.chains.records.step
    stepped: list[str] = []
    tools: list[tuple[str, str]] = []

    async def noting_step(bot, step_input, *sent):
        outcome = await step(bot, step_input, *sent)
        stepped.append(step_input.text.rsplit(" ", 2)[-2])
        tools.extend((t.tool, t.result) for t in outcome.tools)
        was_stepped.set()
        return outcome

    home.chains.records.step = noting_step  # type: ignore[method-assign]
    with monkeypatch.context() as m:  # the shard closes with its own commits again
        m.setattr(home.committer, "commit_group", holding)
        try:
            reading = asyncio.create_task(home.start_turn(w.start(0, "peek"), True))
            await asyncio.wait_for(was_stepped.wait(), 30)
            read_while_held = (list(stepped), list(asked), release.is_set(), list(tools))
            release.set()
            await reading
            await w.settle(home)
            release.clear()
            before = len(stepped)
            writing = asyncio.create_task(home.start_turn(w.start(1), True))
            # The peer's first writing tool asks; the answer waits for the held commit.
            await asyncio.wait_for(was_asked.wait(), 30)
            write_while_held = (stepped[before:], w.helpers(), list(asked))
            release.set()
            await writing
            await w.settle(home)
        finally:
            release.set()  # (a held commit never outlives the test)
    helpers = w.helpers()
    # Answered, nothing asked (an approval is not_here before the gate), root still held.
    assert read_while_held[:3] == (["look"], [], False)
    approval = [r for t, r in read_while_held[3] if t == "workspace_request_approval"]
    assert [json.loads(r)["error"] for r in approval] == ["not_here"]
    assert write_while_held[:2] == ([], [])  # the peer's step waits to write
    assert len(write_while_held[2]) == 1  # it asked the home shard once (then waited)
    assert helpers == ["Helper 1"]
    assert len(asked) == 1  # one question per step, however many tools write


@pytest.mark.anyio
async def test_24_concurrent_sends_half_failing_leave_exactly_the_stored_halfs_writes(shards):
    """24 of Ann's chats each start a chain at once; every other root send fails to commit.
    Exactly the stored half's peers created their helpers (once each), the rules change that
    won came from a stored send, and the peer's shard holds only their confessions."""
    w = World(shards)
    await w.setup(chats=24)
    home, peer_shard = w.shards
    doomed = {c.id for c in w.chats[::2]}
    failed: list[str] = []
    _fail_roots(home, doomed, 0.05, failed)
    results = await asyncio.gather(
        *(home.start_turn(w.start(n), True) for n in range(24)), return_exceptions=True
    )
    chains = await w.settle(home)
    await asyncio.sleep(0.1)
    helpers, rules, confessed = w.helpers(), w.peer_rules(), await w.confessions(peer_shard)
    stored = [n for n in range(24) if n % 2]
    assert [isinstance(r, Exception) for r in results] == [n % 2 == 0 for n in range(24)]
    assert len(chains) == 12 and all(c.status == "done" for c in chains)
    assert helpers == sorted(f"Helper {n}" for n in stored)
    assert rules.startswith("changed by ") and int(rules.split()[-1]) in stored
    assert sorted(confessed) == sorted(k.agentChat for c in chains for k in c.links)


@pytest.mark.anyio
async def test_a_delivery_asked_again_after_a_restart_does_not_write_twice(shards):
    """The send is stored and the peer's tools ran, but the hop's own transaction (its reply
    and answer) failed, as if shard 0 stopped then: after a restart the delivery is asked again
    (nothing of it is stored) and the peer's writes are not made a second time."""

    w = World(shards)
    await w.setup()
    home = w.shards[0]
    commit_group = home.committer.commit_group
    failed: list[str] = []

    async def failing_hop(batches) -> None:
        for writes in batches:
            tables = {getattr(x, "table", "") for x in writes}
            if not failed and "chains" in tables and "turns" not in tables:
                failed.append("hop")
                raise StorageError("disk full (simulated)")
        await commit_group(batches)

    home.committer.commit_group = failing_hop  # type: ignore[method-assign]
    await home.start_turn(w.start(0), True)
    for _ in range(100):
        await home.chains_idle()
        if failed:
            break
        await asyncio.sleep(0.02)
    first = (w.helpers(), w.peer_rules(), len(await w.confessions(w.shards[1])))
    await w.close()
    again = World(shards)
    again.peer, again.ann = w.peer, w.ann
    for svc in again.shards:
        await svc.kernel.started()
    chains = await again.settle(again.shards[0])
    after = (
        again.helpers(),
        again.peer_rules(),
        len(await again.confessions(again.shards[1])),
    )
    assert failed == ["hop"]
    assert first == (["Helper 0"], "changed by 0", 1)
    assert [(c.status, [k.status for k in c.links]) for c in chains] == [("done", ["answered"])]
    assert after == first


@pytest.mark.anyio
async def test_24_concurrent_creates_under_one_id_make_one_member_and_return_it(shards):
    """A member asked for again under the id a delivery derives from its link (as 24 copies
    of the delivery asked at once would) is made once; later asks return it as it is now (a
    rename since is kept, not overwritten); another creator may not take the id."""
    w = World(shards)
    await w.setup()
    d = w.directory
    first = await d.create_member(w.peer.id, "Helper", None, None, "b_from_link")
    renamed = await d.update_rules(
        first.id,
        parse_update({"expectedRevision": first.revision, "name": "Renamed"}),
        Editor(kind="bot", id=w.peer.id),
    )
    again = await asyncio.gather(
        *(d.create_member(w.peer.id, "Helper", None, None, "b_from_link") for _ in range(24))
    )
    with pytest.raises(Conflict):
        await d.create_member(w.asker.id, "Other", None, None, "b_from_link")
    helpers = w.helpers()
    assert renamed.revision == 2
    assert {(b.id, b.name, b.revision) for b in again} == {("b_from_link", "Renamed", 2)}
    assert helpers == ["Renamed"]


@pytest.mark.parametrize("failures", [1, len(RETRY_PAUSES) + 1], ids=["once", "every-time"])
@pytest.mark.anyio
async def test_a_home_shard_that_fails_to_answer_is_asked_again_then_fails_the_step(
    shards, failures: int
):
    """The root send IS stored, but the home shard's `send_stored` fails (the engine's
    `engine_error`) `failures` times. Asked again, it answers: the peer's writes are all made.
    Failing every time, the step fails with `send_unconfirmed` (a failure the delivery records,
    not an answer believing "not stored") and nothing is written."""

    w = World(shards)
    await w.setup()
    home, peer_shard = w.shards
    commit_group = home.committer.commit_group
    release = asyncio.Event()

    async def holding(batches) -> None:  # the delivery begins before the send is durable
        if any(getattr(x, "table", "") == "chains" for b in batches for x in b):
            await release.wait()
        await commit_group(batches)

    asked: list[str] = []
    send_stored = home.send_stored

    async def failing(ref):
        asked.append(ref.link)
        release.set()  # the send commits (it is stored): only the answer fails
        if len(asked) <= failures:
            raise Unavailable("the engine failed to handle the request", code="engine_error")
        return await send_stored(ref)

    step = home.chains.records.step
    outcomes: list = []

    async def noting_step(bot, step_input, *sent):
        outcome = await step(bot, step_input, *sent)
        if bot.name == "Peer":  # (not the Asker woken by its answer)
            outcomes.append(outcome)
        return outcome

    home.committer.commit_group = holding  # type: ignore[method-assign]
    home.send_stored = failing  # type: ignore[method-assign]
    home.chains.records.step = noting_step  # type: ignore[method-assign]
    await home.start_turn(w.start(0), True)
    chains = await w.settle(home)
    helpers, rules, confessed = w.helpers(), w.peer_rules(), await w.confessions(peer_shard)

    assert [(c.status, [k.status for k in c.links]) for c in chains] == [("done", ["answered"])]
    if failures == 1:  # asked again (not cached as "not stored"): every write made
        assert [o.status for o in outcomes] == ["done"]
        assert len(asked) == 2
        assert helpers == ["Helper 0"] and rules == "changed by 0"
        assert len(confessed) == 1
    else:
        assert [(o.status, (o.error or "").split(":")[0]) for o in outcomes] == [
            ("failed", "send_unconfirmed")
        ]
        assert len(asked) == len(RETRY_PAUSES) + 1  # then no tool asks again
        assert chains[0].links[0].result.startswith("Peer could not answer")
        assert (helpers, rules, confessed) == ([], "", [])


@pytest.mark.anyio
async def test_a_delivery_asked_again_that_asks_for_another_member_gets_it(shards):
    """As test_a_delivery_asked_again_after_a_restart_does_not_write_twice, but the model asked
    again creates "Other 0" where it first created "Helper 0": it gets a member of its own
    (not "Helper 0" under the id of the delivery's first member)."""

    w = World(shards)
    await w.setup()
    home = w.shards[0]
    commit_group = home.committer.commit_group
    failed: list[str] = []

    async def failing_hop(batches) -> None:
        for writes in batches:
            tables = {getattr(x, "table", "") for x in writes}
            if not failed and "chains" in tables and "turns" not in tables:
                failed.append("hop")
                raise StorageError("disk full (simulated)")
        await commit_group(batches)

    home.committer.commit_group = failing_hop  # type: ignore[method-assign]
    await home.start_turn(w.start(0), True)
    for _ in range(100):
        await home.chains_idle()
        if failed:
            break
        await asyncio.sleep(0.02)
    first = w.helpers()
    await w.close()
    again = World(shards, SCRIPT.replace('name = "Helper {n}"', 'name = "Other {n}"'))
    again.peer, again.ann = w.peer, w.ann
    for svc in again.shards:
        await svc.kernel.started()
    chains = await again.settle(again.shards[0])
    after = again.helpers()

    assert failed == ["hop"] and first == ["Helper 0"]
    assert [(c.status, [k.status for k in c.links]) for c in chains] == [("done", ["answered"])]
    # Where the peer's reply was stored before the hop's commit failed, the delivery asked again
    # is answered with it and the model is not asked again; otherwise the model's new member is
    # one of its own. Never "Helper 0" twice, never a member under another's id.
    assert after in (["Helper 0"], ["Helper 0", "Other 0"])


def test_a_members_id_is_derived_from_the_link_and_the_request():
    ref = SentRef(shard=0, chain="ch_1", link="dlv_1")

    def ids(*asks) -> list[str | None]:
        writes = StepWrites(None, ref)  # one step
        return [writes.member_id(*a) for a in asks]

    alice, bob = ("Alice", None, None), ("Bob", "helps", {"description": "x"})
    first = ids(alice, bob, alice)
    assert len(set(first)) == 3  # the same request twice in a step: two members
    assert ids(alice, bob, alice) == first  # the step asked again: the same three
    assert ids(bob, alice)[0] == first[1]  # in another order: still Bob's
    assert ids(("Bob", "helps", {"description": "y"}))[0] not in first
    other = StepWrites(None, msgspec.structs.replace(ref, link="dlv_2"))
    assert other.member_id(*alice) not in first
    assert StepWrites(None, None).member_id(*alice) is None  # not a delivery: a fresh id
