"""`engine.events.entry_audience` (who is told of a change) equals what it computed before its
fast path for pinned entries: one `Visibility` per grant, property-tested on the visibility
oracle's pools (every layer, tag, proof, forgetting and chain shape it draws)."""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import tags as tagmod
from engine.events import NOBODY, Audience, entry_audience
from engine.memory_entries import EntryMeta, Reader
from engine.visibility import Visibility
from tests.test_engine_visibility_oracle import cases


def old_entry_audience(
    bot_id: str | None, entry_id: str, entries: Mapping[str, EntryMeta]
) -> Audience:
    """The computation as it was (the reference)."""
    entry = entries.get(entry_id)
    orgs = set() if entry is None else tagmod.orgs_of(entry.tags)
    if entry is None or len(orgs) != 1:
        return NOBODY
    (org,) = orgs
    users: list[str] = []
    channels: list[str] = []
    bot = None
    for grant in tagmod.grants_of(entry.tags):
        if grant.startswith("for:person:"):
            user = grant[len("for:person:") :]
            if Visibility(Reader(user=user, org=org), entries).visible(entry.id):
                users.append(user)
        elif grant.startswith("for:channel:"):
            channel = grant[len("for:channel:") :]
            reader = Reader(user="\x00", org=org, channels=frozenset({channel}))
            if Visibility(reader, entries).visible(entry.id):
                channels.append(channel)
        elif grant == tagmod.FOR_BOT:
            reader = Reader(user="\x00", org=org, uses_bot=True)
            if bot_id is not None and Visibility(reader, entries).visible(entry.id):
                bot = bot_id
    return Audience(org=org, users=tuple(users), channels=tuple(channels), bot=bot)


@settings(max_examples=200, deadline=None)
@given(case=cases(), bot=st.sampled_from([None, "b1"]))
def test_the_audience_of_every_entry_is_what_it_was(case, bot):
    entries, _ = case
    for entry_id in [*entries, "missing"]:
        assert entry_audience(bot, entry_id, entries) == old_entry_audience(bot, entry_id, entries)


def test_pinned_entries_alike_but_for_who_forgot_them_have_their_own_audiences():
    """Pinned entries share an audience computed once per (bot, tags, forgotten_by): one that
    a person forgot does not tell them, whatever an entry with the same tags was told."""
    from engine.memory_entries import Layer

    tags = ("from:u_ann", "for:person:u_ann", "for:person:u_bob", "org:o1", "for:bot")

    def entry(i: str, gone: frozenset[str] = frozenset()) -> EntryMeta:
        return EntryMeta(
            id=i, pool="bot:b1", layer=Layer.PINNED, tags=tags, created_at=1, updated_at=1,
            forgotten_by=gone,
        )  # fmt: skip

    entries = {"a": entry("a"), "b": entry("b", frozenset({"u_bob"})), "c": entry("c")}
    got = {i: entry_audience("b1", i, entries) for i in ("a", "b", "c")}
    assert got["a"].users == ("u_ann", "u_bob") and got["a"].bot == "b1"
    assert got["b"].users == ("u_ann",)
    assert got["c"] == got["a"]
    for i in entries:
        assert got[i] == old_entry_audience("b1", i, entries)
    assert entry_audience("b2", "a", entries).bot == "b2"  # the bot is part of the key too
