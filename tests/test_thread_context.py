"""A threaded record's keyword context comes from its thread's order, not from when or in
what order it was written (engine/write_context.py `Thread`)."""

from __future__ import annotations

import asyncio
import random
import secrets
from pathlib import Path

import msgspec
import pytest

from actors.contracts import WorkspaceAccess, WorkspaceCreateCall, WorkspaceQuery
from actors.directory import DirectoryService
from actors.shard.service import ShardService
from engine import write_context as wc
from engine.errors import InvalidInput
from engine.memory_entries import Scope
from engine.scoped_memory import WorkspaceMemoryChange, WorkspaceMemoryCreate

ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}), orgs=("o_1",))
USER = ("user:u_ann",)

pytestmark = pytest.mark.usefixtures("no_env_key")

TALKS = {
    "a": [
        "Did you go to the pottery workshop on Sunday?",
        "Yes! I made a bowl and a mug.",
        "That sounds lovely, what colour was the glaze?",
        "A deep blue, like the sea in Lisbon.",
        "You should sell them at the market.",
    ],
    "b": [
        "How is the new puppy doing?",
        "He chewed my slippers and the sofa.",
        "Have you signed him up for training classes?",
        "Twice a week, at the park by the river.",
        "Bring him to the picnic next month.",
    ],
    "c": [
        "Are you still learning the violin?",
        "Every evening, my neighbours are patient.",
        "Which piece are you practising?",
        "A slow movement by Dvorak, very hard.",
        "Play it for us at the picnic.",
    ],
}
QUERIES = [
    "pottery workshop",
    "bowl",
    "glaze colour",
    "puppy training",
    "slippers",
    "violin piece",
    "picnic",
    "Lisbon sea",
    "river park",
]


async def _open(data: Path) -> ShardService:
    svc = ShardService(data, 0, search={"context_window_s": 120})
    svc.peers.connect(directory=DirectoryService(data))
    d = svc.peers.directory()
    if not await _exists(d):
        await d.create_org("Acme", "o_1")
        await d.create_user("Ann", ["o_1"], "u_ann")
        await d.create_bot(name="Bo", org="o_1", owner="u_ann", id="b_1")
    return svc


async def _exists(d) -> bool:
    try:
        await d.get_bot("b_1")
    except Exception:
        return False
    return True


async def _close(svc: ShardService) -> None:
    await svc.close()
    svc.peers.directory().store.db.close()


def _body(thread: str, position: int, content: str, **kw) -> WorkspaceMemoryCreate:
    kw.setdefault("scope", Scope.USER)
    return WorkspaceMemoryCreate(
        requestId="r-" + secrets.token_hex(4),
        bot="b_1",
        content=content,
        thread=thread,
        position=position,
        **kw,
    )


def _turns() -> list[tuple[str, int, str]]:
    return [(t, n, text) for t, texts in TALKS.items() for n, text in enumerate(texts)]


async def _ranking(svc: ShardService, label: dict[str, str]) -> list[list[tuple[str, float]]]:
    out = []
    for q in QUERIES:
        page = await svc.workspace_entries(ANN, WorkspaceQuery(pools=USER, q=q, using="keyword"))
        hits = [(label[h.id], round(h.score, 4)) for h in page.hits]
        # Equal scores may come in either order (ties go by index row): compare as sets.
        out.append(sorted(hits, key=lambda h: (-h[1], h[0])))
    return out


async def _written(data: Path, order: str) -> list[list[tuple[str, float]]]:
    svc = await _open(data)
    turns = _turns()
    label: dict[str, str] = {}
    if order == "in-order":
        for t, n, text in turns:
            label[(await svc.workspace_create_memory(ANN, _body(t, n, text))).id] = f"{t}{n}"
    elif order == "round-robin":
        for t, n, text in sorted(turns, key=lambda x: (x[1], x[0])):
            label[(await svc.workspace_create_memory(ANN, _body(t, n, text))).id] = f"{t}{n}"
    elif order == "reversed":
        for t, n, text in reversed(turns):
            label[(await svc.workspace_create_memory(ANN, _body(t, n, text))).id] = f"{t}{n}"
    elif order == "coalesced":  # shuffled, five to a call: one commit per call
        shuffled = random.Random(5).sample(turns, len(turns))
        for at in range(0, len(shuffled), 5):
            chunk = shuffled[at : at + 5]
            calls = [
                msgspec.msgpack.encode(WorkspaceCreateCall(access=ANN, body=_body(t, n, text)))
                for t, n, text in chunk
            ]
            replies = msgspec.msgpack.decode(
                await svc.workspace_create_memory_many(msgspec.msgpack.encode(calls))
            )
            for (t, n, _), reply in zip(chunk, replies, strict=True):
                label[msgspec.json.decode(reply)["id"]] = f"{t}{n}"
    else:  # all at once, in a shuffled order: concurrent writes

        async def one(t: str, n: int, text: str) -> None:
            view = await svc.workspace_create_memory(ANN, _body(t, n, text))
            label[view.id] = f"{t}{n}"

        shuffled = random.Random(3).sample(turns, len(turns))
        await asyncio.gather(*(one(*x) for x in shuffled))
    ranking = await _ranking(svc, label)
    await _close(svc)
    return ranking


def test_same_hits_for_in_order_and_interleaved_writes(tmp_path: Path):
    """Three conversations written in order, round-robin, backwards, all at once and in
    shuffled coalesced calls: every query finds the same records with the same scores."""

    async def main() -> None:
        ref = await _written(tmp_path / "in-order", "in-order")
        # Context at work: the answer found by its question's words.
        assert ("a1", ref[0][1][1]) in ref[0]
        for order in ("round-robin", "reversed", "concurrent", "coalesced"):
            assert await _written(tmp_path / order, order) == ref, order

    asyncio.run(main())


def test_a_thread_keeps_its_order_across_a_reload_and_an_edit(tmp_path: Path):
    """A turn written after the shard reopened slots in between stored ones; an edited turn
    lends its new words to its neighbours."""

    async def main() -> None:
        svc = await _open(tmp_path)
        q = await svc.workspace_create_memory(ANN, _body("t", 10, "Where did you hike?"))
        far = await svc.workspace_create_memory(ANN, _body("t", 30, "Later: the weather."))
        await _close(svc)
        svc = await _open(tmp_path)
        ans = await svc.workspace_create_memory(ANN, _body("t", 20, "Up the Matterhorn trail."))

        async def found(text: str) -> list[str]:
            query = WorkspaceQuery(pools=USER, q=text, using="keyword")
            return [h.id for h in (await svc.workspace_entries(ANN, query)).fused]

        assert await found("Matterhorn") == [ans.id, q.id, far.id]
        # `far` reads the second record before it too.
        assert await found("hike") == [q.id, ans.id, far.id]
        change = WorkspaceMemoryChange(
            requestId="r-" + secrets.token_hex(4),
            id=q.id,
            expectedRevision=q.revision,
            content="Where did you go climbing?",
        )
        await svc.workspace_change_memory(ANN, change)
        assert await found("climbing") == [q.id, ans.id, far.id]
        assert await found("hike") == []
        await _close(svc)

    asyncio.run(main())


def test_thread_order_is_by_position_then_arrival():
    t = wc.Thread()
    assert t.insert("x", 5, 1) == []
    assert t.insert("z", 9, 2) == ["x"]
    # Between them: x gets a new next, z a new previous.
    assert t.insert("y", 7, 3) == ["x", "z"]
    assert t.around("y") == ("x", "z", None)
    assert t.around("z") == ("y", None, "x")
    # Before all: the next two read it (as previous and second previous).
    assert t.insert("w", 1, 4) == ["x", "y"]
    assert t.around("x") == ("w", "y", None)


def test_a_bad_thread_is_refused():
    with pytest.raises(InvalidInput):
        from engine.scoped_memory import validate_thread

        validate_thread(" ")


def test_a_forgotten_turn_lends_no_words_and_threads_are_per_writer(tmp_path: Path):
    """A turn written next to a forgotten one is not found by the forgotten words; in a bot
    pool, Ann's and Ben's turns of one thread name are two threads (different readers)."""
    from engine.scoped_memory import WorkspaceForget

    ben = WorkspaceAccess(account="u_ben", bots=frozenset({"b_1"}), orgs=("o_1",))

    async def main() -> None:
        svc = await _open(tmp_path)
        await svc.peers.directory().create_user("Ben", ["o_1"], "u_ben")
        gone = await svc.workspace_create_memory(ANN, _body("t", 1, "The secret walrus plan."))
        forget = WorkspaceForget(
            requestId="r-" + secrets.token_hex(4), id=gone.id, expectedRevision=gone.revision
        )
        await svc.workspace_change_memory(ANN, forget)
        after = await svc.workspace_create_memory(ANN, _body("t", 2, "Sounds good to me."))

        async def found(who, pools, text: str) -> list[str]:
            query = WorkspaceQuery(pools=pools, q=text, using="keyword")
            return [h.id for h in (await svc.workspace_entries(who, query)).fused]

        assert after.id not in await found(ANN, USER, "walrus")
        bot = ("bot:b_1",)
        a = await svc.workspace_create_memory(
            ANN, _body("shared", 1, "Ann: the marmot ate my lunch.", **{"scope": Scope.BOT})
        )
        b = await svc.workspace_create_memory(
            ben, _body("shared", 2, "Ben: what a day.", **{"scope": Scope.BOT})
        )
        assert a.id in await found(ANN, bot, "marmot")
        assert b.id not in await found(ben, bot, "marmot")
        assert b.id not in await found(ANN, bot, "marmot")
        await _close(svc)

    asyncio.run(main())


def test_a_record_learned_from_a_chat_is_in_that_chats_thread():
    from engine.memory_entries import Tier
    from engine.scoped_memory import Origin, WorkspaceEntry

    def entry(**kw) -> WorkspaceEntry:
        return WorkspaceEntry(
            id="m",
            scope=Scope.USER,
            pool="user:u_ann",
            contributor="b_1",
            tier=Tier.LOG,
            content_fp="fp",
            created_at=50,
            updated_at=50,
            **kw,
        )

    assert wc.placed(entry(evidence=("c_1/i_9", "c_2/i_1"))) == ("chat:c_1", 50)
    assert wc.placed(entry(thread="talk", position=3, evidence=("c_1/i_9",))) == ("talk", 3)
    assert wc.placed(entry()) is None
    assert wc.placed(entry(evidence=("c_1/i_9",), origin=Origin.EXPLICIT)) is None


def test_the_same_hits_when_few_records_keys_are_kept(tmp_path: Path, monkeypatch):
    """Neighbours' keys are a bounded cache: records read again when it was cleared rank the
    same."""
    from actors.workspace import pools

    async def main() -> None:
        ref = await _written(tmp_path / "all-kept", "round-robin")
        monkeypatch.setattr(pools, "THREAD_KEYS_CACHED", 2)
        assert await _written(tmp_path / "two-kept", "round-robin") == ref

    asyncio.run(main())
