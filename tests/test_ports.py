"""Actor ports (actors/ports.py) with their local implementations: shards and a directory in
one process, wired through `Peers.connect`, run the same features as over Ray, without Ray and
without patching anything."""

from __future__ import annotations

import pytest

from actors.contracts import TurnStart
from actors.models.registry import ScriptedModel
from actors.runtime.peers import Peers
from actors.runtime.placement import shard_of
from engine.errors import Unavailable
from tests.shard_kit import Shards


def _account_on(shard: int, stem: str) -> str:
    return next(f"{stem}{n}" for n in range(100) if shard_of(f"{stem}{n}", 2) == shard)


async def _group_turn(opened: Shards, *, wire_sibling: bool) -> tuple[int, dict[str, str]]:
    """A group of two bots whose owners live on different shards; each shard's model says
    which shard it runs on. Returns the home shard of the group's chat and the turn's bot
    replies by their owner."""
    shards = []
    for k in range(2):
        script = opened.path / f"script-{k}.toml"
        script.write_text(f'default = "from shard {k}"\n')
        model = {"talk": ScriptedModel.from_file("talk", script)}
        shards.append(opened(index=k, shard_count=2, models=model))
    d = opened.directory_service()
    for svc in shards:
        svc.peers.connect(directory=d, shards=dict(enumerate(shards)) if wire_sibling else None)
    org = await d.create_org("o")
    ann, _ = await d.create_user("Ann", [org.id], _account_on(0, "u_ann"))
    ben, _ = await d.create_user("Ben", [org.id], _account_on(1, "u_ben"))
    mine = await d.create_bot(name="Mine", org=org.id, owner=ann.id, model="talk")
    theirs = await d.create_bot(name="Theirs", org=org.id, owner=ben.id, model="talk")
    channel = await d.create_channel(org=org.id, people=[ann.id, ben.id], bots=[mine.id, theirs.id])
    chat = await d.group_chat(channel.id)
    start = TurnStart(
        chat=chat,
        bot=None,
        org=org,
        operator=ann.id,
        text="hello both",
        channel=channel,
        members=(mine, theirs),
    )
    home = shards[shard_of(chat.home, 2)]  # the group's chat lives with its channel
    turn = await home.start_turn(start)
    result = await home.wait_turn(chat.id, turn.id)
    names = {mine.id: "Ann's", theirs.id: "Ben's"}
    return home.index, {names[i.author]: i.text for i in result.items if i.kind == "bot"}


@pytest.mark.anyio
async def test_a_group_step_runs_on_the_bot_owners_shard_through_its_port(shards):
    _, replies = await _group_turn(shards, wire_sibling=True)
    assert replies == {"Ann's": "from shard 0", "Ben's": "from shard 1"}


@pytest.mark.anyio
async def test_an_unreachable_sibling_fails_that_bots_step_only(shards):
    home, replies = await _group_turn(shards, wire_sibling=False)
    # Only the bot whose owner's shard is the home answered: the other shard is not reachable.
    assert replies == {("Ann's", "Ben's")[home]: f"from shard {home}"}


@pytest.mark.anyio
async def test_peers_without_actors_say_so():
    own = object()
    peers = Peers(own, 0, prefix=None, count=2, namespace="openbot")  # type: ignore[arg-type]
    assert peers.shard(0) is own  # itself: always local
    for ask in (lambda: peers.shard(1), peers.directory):
        with pytest.raises(Unavailable) as caught:
            ask()
        assert caught.value.code == "no_peers"
