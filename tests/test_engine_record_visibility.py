"""The one check of a workspace record in a bot's memory (engine/memory_union.py `record_visible`,
and `record_check`, its form for many records of one reader), against the independent oracle of
tests/test_engine_visibility_oracle.py: listing, search and context of a bot's memory
(actors/shard/memory_reader.py), the workspace's listing and search (actors/workspace/search.py)
and its changes (actors/workspace/access.py) all ask it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine import memory_union as bm
from engine import tags as tagmod
from engine.memory_entries import Reader, Scope, Tier
from engine.scoped_memory import WorkspaceEntry, WorkspaceStatus
from tests.test_engine_visibility_oracle import (
    CHANNELS,
    GRANTS,
    ORGS,
    OTHER_TAGS,
    USERS,
    oracle_visible,
)

TOPICS = ("tea", "topic-a", "b2", "for-bot", "org-o1")  # valid topics, some look like grants

readers = st.builds(
    Reader,
    user=st.sampled_from(USERS),
    org=st.sampled_from(ORGS),
    channels=st.frozensets(st.sampled_from(CHANNELS)),
    uses_bot=st.booleans(),
)
tag_sets = st.builds(
    lambda orgs, grants, other: (*orgs, *grants, *other),
    st.lists(st.sampled_from([f"org:{o}" for o in ORGS]), max_size=2),
    st.lists(st.sampled_from(GRANTS), max_size=3),
    st.lists(st.sampled_from([t for t in OTHER_TAGS if ":" in t]), max_size=2),
)


@st.composite
def pools(draw) -> list[WorkspaceEntry]:
    """Records of one bot pool: a few tag sets shared among them (as a real pool's are), each
    with topics of its own."""
    shared = draw(st.lists(tag_sets, min_size=1, max_size=4))
    out = []
    for k in range(draw(st.integers(0, 12))):
        out.append(
            WorkspaceEntry(
                id=f"r{k}",
                scope=Scope.BOT,
                pool="bot:b",
                contributor="b",
                tier=Tier.NOTE,
                content_fp="fp",
                created_at=k,
                updated_at=k,
                topics=tuple(draw(st.lists(st.sampled_from(TOPICS), max_size=2, unique=True))),
                status=draw(st.sampled_from([WorkspaceStatus.ACTIVE, WorkspaceStatus.FORGOTTEN])),
                tags=draw(st.sampled_from(shared)),
            )
        )
    return out


def test_the_topics_drawn_are_topics():
    assert tagmod.validate_topics(TOPICS) == TOPICS


@settings(max_examples=400, deadline=None)
@given(reader=readers, records=pools())
def test_a_record_is_seen_exactly_when_the_oracle_lets_the_reader_see_it(reader, records):
    check = bm.record_check(reader)  # one check for the pool's records, as a read makes
    for record in records:
        expected = oracle_visible(reader, {record.id: bm.as_meta(record)}, record.id)
        assert bm.record_visible(reader, record) == expected, record
        assert check(record) == expected, record
