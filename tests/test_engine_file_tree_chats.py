"""Chats in the file tree, pure: paths, the transcript, camelCase keys, and
`parse(render(s)) == canonical(s)` for chats with items, turns and read positions."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.directory import Bot, Channel, Chat, Org, User
from engine.errors import InvalidInput
from engine.file_tree import (
    AccountSnapshot,
    ChatItem,
    ChatSnapshot,
    ChatTurn,
    PoolSnapshot,
    ReadPosition,
    canonical,
    parse,
    render,
)

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
BASE = "bot-workspace/u_1/"


def _sample(text: str = "Hello\nthere") -> AccountSnapshot:
    group = Chat(id="chat_g", kind="group", owner="u_1", org="o_1", channel="c_1", home="c_1")
    direct = Chat(id="chat_d", kind="direct", owner="u_2", org="o_1", bot="b_1", home="u_1")
    return AccountSnapshot(
        account=User(id="u_1", name="Ada", orgs=("o_1",)),
        orgs=(Org(id="o_1", name="Acme"),),
        users=(User(id="u_2", name="Bo", orgs=("o_1",)),),
        bots=(Bot(id="b_1", name="Ada bot", org="o_1", owner="u_1"),),
        channels=(Channel(id="c_1", org="o_1", people=("u_1", "u_2"), bots=("b_1", "b_9")),),
        pools=(PoolSnapshot(pool="bot:b_1", positions=(ReadPosition(chat="chat_d", seq=2),)),),
        chats=(
            ChatSnapshot(
                chat=group,
                last_seq=5,
                items=(
                    ChatItem(seq=2, kind="person", author="u_1", at=T0, text=text, turn="t_1"),
                    ChatItem(seq=3, kind="bot", author="b_1", at=T0 + 5, text="", turn="t_1"),
                    ChatItem(
                        seq=4,
                        kind="delivery",
                        author="b_9",
                        at=T0 + 9,
                        text=" spaced ",
                        turn="topic",
                        direction="received",
                        peer="b_9",
                    ),
                ),
                turns=(
                    ChatTurn(
                        id="t_1",
                        operator="u_1",
                        status="done",
                        at=T0,
                        rounds=2,
                        goal="accepted",
                        verdict_by="u_1",
                        verdict_note="fine",
                    ),
                ),
            ),
            ChatSnapshot(
                chat=direct,
                last_seq=2,
                items=(
                    ChatItem(seq=1, kind="person", author="u_2", at=T0, text="hi", turn="t_2"),
                    ChatItem(seq=2, kind="bot", author="b_1", at=T0 + 1, text="yo", turn="t_2"),
                ),
                turns=(ChatTurn(id="t_2", operator="u_2", status="failed", at=T0, error="x"),),
            ),
        ),
    )


def test_chat_paths_and_transcript():
    files = render(_sample())
    paths = {p.removeprefix(BASE) for p in files}
    for chat in ("chat_g", "chat_d"):
        for name in ("chat.json", "items.md", "items.json", "turns.json"):
            assert f"chats/{chat}/{name}" in paths
    assert "agents/b_1/memory/.dreaming/read-positions.json" in paths
    assert files[BASE + "chats/chat_g/items.md"].decode() == (
        "# group chat chat_g in c_1\n\n"
        "- (2026-01-01) i-2 u_1: Hello\\nthere\n"
        "- (2026-01-01) i-3 b_1:\n"
        "- (2026-01-01) i-4 b_9: \\u0020spaced\\u0020\n"
    )
    doc = json.loads(files[BASE + "chats/chat_g/chat.json"])
    assert doc["lastSeq"] == 5 and doc["channel"]["id"] == "c_1"
    assert doc["members"] == {"people": ["u_1", "u_2"], "bots": ["b_1", "b_9"]}
    items = json.loads(files[BASE + "chats/chat_g/items.json"])["items"]
    assert items[2]["communication"] == {"direction": "received", "peer": "b_9"}
    turns = json.loads(files[BASE + "chats/chat_g/turns.json"])["turns"]
    assert turns[0]["verdictBy"] == "u_1" and turns[0]["rounds"] == 2
    direct = json.loads(files[BASE + "chats/chat_d/chat.json"])
    assert direct["members"] == {"people": ["u_2"], "bots": ["b_1"]}
    assert direct["chat"]["createdAt"] == 0
    for path, data in files.items():  # camelCase keys in every JSON file of the chats
        if path.endswith(".json"):
            _no_snake(json.loads(data), path)


def _no_snake(value, where):
    if isinstance(value, dict):
        for k, v in value.items():
            assert not (k.islower() and "_" in k.strip("_")), (where, k)
            _no_snake(v, where)
    elif isinstance(value, list):
        for v in value:
            _no_snake(v, where)


def test_chats_round_trip():
    s = _sample()
    assert parse(render(s)) == [canonical(s)]
    assert render(parse(render(s))[0]) == render(s)


def test_an_edited_line_is_taken_and_a_mismatch_refused():
    files = render(_sample())
    path = BASE + "chats/chat_d/items.md"
    edited = dict(files)
    edited[path] = files[path].replace(b"b_1: yo", b"b_1: hello again")
    (snap,) = parse(edited)
    (chat,) = [c for c in snap.chats if c.chat.id == "chat_d"]
    assert [i.text for i in chat.items] == ["hi", "hello again"]
    for bad in (
        files[path].replace(b"i-2 b_1", b"i-2 u_2"),  # another author
        files[path].replace(b"i-2 b_1", b"i-7 b_1"),  # another item
        files[path].replace(b"- (2026-01-01) i-2 b_1: yo\n", b""),  # a line missing
        files[path] + b"not a line\n",
    ):
        with pytest.raises(InvalidInput) as e:
            parse({**files, path: bad})
        assert e.value.code == "invalid_tree" and "chat_d" in e.value.message
    extra = {**files, BASE + "chats/chat_d/notes.txt": b"x"}
    with pytest.raises(InvalidInput):
        parse(extra)
    missing = {p: d for p, d in files.items() if p != BASE + "chats/chat_d/turns.json"}
    with pytest.raises(InvalidInput):
        parse(missing)


def test_a_group_chat_needs_its_channel_and_an_item_past_the_last_number_is_refused():
    s = _sample()
    with pytest.raises(InvalidInput):
        render(msgspec.structs.replace(s, channels=()))
    chat = msgspec.structs.replace(s.chats[1], last_seq=1)
    with pytest.raises(InvalidInput):
        render(msgspec.structs.replace(s, chats=(s.chats[0], chat)))


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_any_item_text_survives_the_transcript(text):
    s = _sample(text)
    (back,) = parse(render(s))
    assert back.chats[1].items[0].text == text  # chat_g sorts after chat_d


def test_entries_kept_for_this_account_by_another_accounts_bot():
    from engine.file_tree import MemoryBotState, MemoryRecord, entry_keeper
    from engine.memory_entries import EntryMeta, Layer, LogRow, Tier

    meta = EntryMeta(
        id="mem_1",
        pool="bot:b_9",
        layer=Layer.PINNED,
        tags=("from:u_1", "for:person:u_1"),
        created_at=T0,
        updated_at=T0,
    )
    record = MemoryRecord(
        id="mem_1",
        scope="bot",
        pool="bot:b_9",
        contributor="b_9",
        tier=Tier.PROFILE,
        content="Ada keeps bees",
        created_at=T0,
        updated_at=T0,
        memory=meta,
    )
    log = (LogRow(version=3, at=T0, who="person", entry="mem_1", change="created"),)
    kept = PoolSnapshot(pool="bot:b_9", records=(record,), seed=MemoryBotState(log=log))
    s = msgspec.structs.replace(_sample(), pools=(*_sample().pools, kept))
    files = render(s)
    assert files[BASE + "other-agents/b_9/memory/profile.md"] == b"- (2026-01-01) Ada keeps bees\n"
    assert parse(files) == [canonical(s)]
    # Only learned entries and their log: never another account's settings or records.
    for wrong in (
        msgspec.structs.replace(kept, seed=MemoryBotState(version=4)),
        msgspec.structs.replace(kept, records=(msgspec.structs.replace(record, memory=None),)),
    ):
        with pytest.raises(InvalidInput):
            render(msgspec.structs.replace(s, pools=(*_sample().pools, wrong)))
    # Whose tree: the person it is for, else the first person of a channel it is for.
    assert entry_keeper(("for:person:u_2", "for:person:u_1"), {}) == "u_1"
    assert entry_keeper(("for:channel:c_1",), {"c_1": ("u_3", "u_2")}) == "u_2"
    assert entry_keeper(("for:bot",), {}) is None


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_author_survives_the_transcript(author):
    s = _sample()
    chat = s.chats[1]
    items = (msgspec.structs.replace(chat.items[0], author=author), *chat.items[1:])
    s = msgspec.structs.replace(s, chats=(s.chats[0], msgspec.structs.replace(chat, items=items)))
    (back,) = parse(render(s))
    assert back == canonical(s)


def _with_records() -> AccountSnapshot:
    from engine.chat_records import Confession, Enrichment
    from engine.collaboration import Chain, Link
    from engine.file_tree import ChainRecord, LinkTexts, RequestRecord
    from engine.requests import ApprovalRequest

    s = _sample()
    direct = s.chats[1]
    link = Link(
        id="dl_1", parent=None, from_bot="b_1", to_bot="b_9", depth=1, fingerprint="ab" * 16,
        status="answered", result_fingerprint="cd" * 16, sent_at=T0, answered_at=T0 + 3,
    )  # fmt: skip
    chain = Chain(
        id="col_1", org="o_1", owner="u_2", root_chat="chat_d", topic="t_2", root_bot="b_1",
        status="done", deliveries=1, links=(link,), created_at=T0, updated_at=T0 + 3,
    )  # fmt: skip
    request = ApprovalRequest(
        id="req_1", bot="b_1", org="o_1", chat="chat_d", turn="t_2", owner="u_2",
        title="Laptop", status="approved", revision=2, createdAt=T0, updatedAt=T0 + 4,
        decidedBy="u_2", note="go", reviewChats=("chat_r",),
    )  # fmt: skip
    direct = msgspec.structs.replace(
        direct,
        confessions=(
            Confession(turn="t_2", text="unsure\nabout it", answer="fine", calm=False, at=T0 + 1),
            Confession(turn="t_2", text="again", answer="ok", calm=True, at=T0 + 1),
        ),
        enrichments=(
            Enrichment(turn="t_2", text="hi (budget)", original="hi", entries=["m_1"], at=T0),
        ),
        chains=(
            ChainRecord(
                chain=chain,
                channel=None,
                learn=("job_1",),
                unregistered=("dl_1",),
                texts=(LinkTexts(link="dl_1", request="Green?", result="green"),),
            ),
        ),
        requests=(RequestRecord(request=request, proposal="Buy the X1."),),
    )
    return msgspec.structs.replace(s, chats=(s.chats[0], direct))


def test_fs1_a_chats_confessions_enrichments_chains_and_requests_round_trip():
    """FS-1/FS-2: the records of a chat's turns are files of the chat, camelCase, texts in the
    clear (the owner's copy), and parse back to the same snapshot."""
    s = _with_records()
    files = render(s)
    root = f"{BASE}chats/chat_d/"
    names = sorted(p.removeprefix(root) for p in files if p.startswith(root))
    assert names == [
        "chains.json",
        "chat.json",
        "confessions.json",
        "enrichments.json",
        "items.json",
        "items.md",
        "requests.json",
        "turns.json",
    ]
    group = sorted(p.rsplit("/", 1)[1] for p in files if p.startswith(f"{BASE}chats/chat_g/"))
    assert group == ["chat.json", "items.json", "items.md", "turns.json"]  # none: no file
    chains = json.loads(files[root + "chains.json"])
    assert chains["chains"][0]["chain"]["rootChat"] == "chat_d"
    assert json.loads(files[root + "requests.json"])["requests"][0]["proposal"] == "Buy the X1."
    assert parse(files) == [canonical(s)]


def test_fs1_a_chain_or_request_of_another_chat_is_refused():
    s = _with_records()
    direct = s.chats[1]
    (record,) = direct.chains
    moved = msgspec.structs.replace(
        record, chain=msgspec.structs.replace(record.chain, root_chat="chat_g")
    )
    bad = msgspec.structs.replace(
        s, chats=(s.chats[0], msgspec.structs.replace(direct, chains=(moved,)))
    )
    with pytest.raises(InvalidInput, match="rooted in chat_g"):
        render(bad)
    files = render(s)
    path = f"{BASE}chats/chat_d/requests.json"
    files[path] = files[path].replace(b'"chat": "chat_d"', b'"chat": "chat_g"', 1)
    with pytest.raises(InvalidInput) as refused:
        parse(files)
    assert refused.value.code == "invalid_tree"
