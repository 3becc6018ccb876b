"""Projects (WS-7): members, linked channels, revisions (WA-2), who reads and who changes."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import Conflict, Forbidden, InvalidInput, NotFound
from engine.projects import (
    MAX_NAME_CHARS,
    Project,
    ProjectChange,
    ProjectCreate,
    can_read,
    change_project,
    create_project,
    decode_request,
    missing_members,
    require_read,
    view,
)

T0 = 1_790_000_000_000
CHANNELS = {"c_team": ["u_ann", "u_bob"], "c_big": ["u_ann", "u_bob", "u_cat", "u_dan"]}


def make(**kw) -> Project:
    req = ProjectCreate(requestId="r1", name=kw.pop("name", "Launch"), **kw)
    return create_project(
        req, new_id="p_1", org="o_1", owner="u_ann", channel_people=CHANNELS, now=T0
    )


def change(project: Project, actor: str = "u_ann", **fields) -> Project:
    fields.setdefault("expectedRevision", project.revision)
    req = ProjectChange(requestId="r2", id=project.id, **fields)
    return change_project(project, req, actor=actor, channel_people=CHANNELS, now=T0 + 1)


# --- creating -------------------------------------------------------------------------------------


def test_create_makes_the_owner_a_member_and_keeps_order():
    p = make(members=["u_bob", "u_ann", "u_bob"], metadata={"z": "1", "a": "2"})
    assert p.id == "p_1" and p.org == "o_1" and p.owner == "u_ann"
    assert p.members == ("u_ann", "u_bob")
    assert list(p.metadata) == ["a", "z"]
    assert (p.revision, p.created_at, p.updated_at) == (1, T0, T0)


def test_create_takes_the_requested_id_and_strips_the_name():
    p = make(id="p_chosen", name="  Launch  ")
    assert (p.id, p.name) == ("p_chosen", "Launch")
    with pytest.raises(InvalidInput):
        make(id="bad id!")


@pytest.mark.parametrize("name", ["", "   ", "x" * (MAX_NAME_CHARS + 1)])
def test_name_is_1_to_200_characters(name):
    with pytest.raises(InvalidInput) as e:
        make(name=name)
    assert e.value.code == "invalid_name"
    assert make(name="x" * MAX_NAME_CHARS).name == "x" * MAX_NAME_CHARS


def test_bad_request_id_and_member_ids_are_invalid_input():
    with pytest.raises(InvalidInput):
        create_project(
            ProjectCreate(requestId="has space", name="n"),
            new_id="p_1",
            org="o",
            owner="u_ann",
            channel_people={},
            now=T0,
        )
    with pytest.raises(InvalidInput):
        make(members=["not ok"])
    with pytest.raises(InvalidInput):
        make(metadata={"": "empty key"})


def test_create_links_a_channel_only_when_all_its_people_are_members():
    with pytest.raises(Conflict) as e:
        make(channels=["c_team"])
    assert e.value.code == "channel_members_not_in_project"
    assert "u_bob" in e.value.message and "u_ann" not in e.value.message
    assert e.value.details["people"] == ["u_bob"]
    p = make(members=["u_bob"], channels=["c_team"])
    assert p.channels == ("c_team",)


def test_create_with_an_unknown_channel_is_not_found():
    with pytest.raises(NotFound):
        make(channels=["c_nowhere"])


# --- changing -------------------------------------------------------------------------------------


def test_rename_keeps_the_id_and_bumps_the_revision():
    p = make()
    q = change(p, name="Launch v2")
    assert (q.id, q.name, q.revision, q.updated_at, q.created_at) == (
        "p_1",
        "Launch v2",
        2,
        T0 + 1,
        T0,
    )


def test_a_stale_revision_changes_nothing():
    p = change(make(), name="second")
    assert p.revision == 2
    with pytest.raises(Conflict) as e:
        change(p, name="from an old draft", expectedRevision=1)
    assert e.value.code == "stale_revision"
    assert e.value.details == {"currentRevision": 2}
    assert p.name == "second" and p.revision == 2


def test_only_members_change_a_project():
    p = make(members=["u_bob"])
    with pytest.raises(Forbidden):
        change(p, actor="u_eve", name="mine now")
    assert change(p, actor="u_bob", name="bob renamed").name == "bob renamed"


def test_a_non_member_is_refused_before_learning_the_revision():
    p = make()
    with pytest.raises(Forbidden):
        change(p, actor="u_eve", name="x", expectedRevision=99)


def test_nothing_changed_returns_the_same_project():
    p = make(members=["u_bob"], metadata={"k": "v"})
    assert change(p, name="Launch", members=["u_ann", "u_bob"], metadata={"k": "v"}) is p


def test_the_owner_cannot_be_removed():
    p = make(members=["u_bob"])
    with pytest.raises(InvalidInput) as e:
        change(p, actor="u_bob", members=["u_bob"])
    assert e.value.code == "owner_is_member"


def test_linking_a_channel_needs_its_people_in_the_project_first():
    p = make(members=["u_bob"])
    with pytest.raises(Conflict) as e:
        change(p, channels=["c_big"])
    assert e.value.code == "channel_members_not_in_project"
    assert "u_cat" in e.value.message and "u_dan" in e.value.message
    # Members and the link in one change: the rule holds for the project as it will be.
    q = change(p, members=["u_ann", "u_bob", "u_cat", "u_dan"], channels=["c_big"])
    assert q.channels == ("c_big",) and q.revision == 2


def test_a_member_of_a_linked_channel_cannot_leave_the_project():
    p = make(members=["u_bob", "u_cat"], channels=["c_team"])
    with pytest.raises(Conflict) as e:
        change(p, members=["u_ann", "u_cat"])
    assert e.value.code == "member_in_linked_channel"
    assert "u_bob" in e.value.message
    # Someone outside every linked channel may leave; unlinking first frees the rest.
    assert change(p, members=["u_ann", "u_bob"]).members == ("u_ann", "u_bob")
    q = change(p, channels=[], members=["u_ann"])
    assert (q.members, q.channels) == (("u_ann",), ())


def test_an_existing_link_does_not_block_other_changes():
    # Someone joined the channel after it was linked: that is the channel side's business, and
    # renaming the project must still work.
    p = make(members=["u_bob"], channels=["c_team"])
    grown = {"c_team": ["u_ann", "u_bob", "u_zed"]}
    req = ProjectChange(requestId="r", id=p.id, expectedRevision=1, name="renamed")
    assert change_project(p, req, actor="u_ann", channel_people=grown, now=T0).name == "renamed"


def test_a_change_for_another_project_is_invalid():
    p = make()
    req = ProjectChange(requestId="r", id="p_other", expectedRevision=1, name="x")
    with pytest.raises(InvalidInput):
        change_project(p, req, actor="u_ann", channel_people={}, now=T0)


# --- reading --------------------------------------------------------------------------------------


def test_members_read_and_non_members_do_not():
    p = make(members=["u_bob"])
    assert can_read(p, "u_ann") and can_read(p, "u_bob")
    assert not can_read(p, "u_cat")
    assert require_read(p, "u_bob") is p
    with pytest.raises(NotFound):
        require_read(p, "u_cat")
    with pytest.raises(NotFound):
        require_read(None, "u_ann")


def test_leaving_a_group_does_not_leave_the_project():
    # Project membership is the project's own list; channel people are only consulted on links.
    p = make(members=["u_bob"], channels=["c_team"])
    assert can_read(p, "u_bob")
    req = ProjectChange(requestId="r", id=p.id, expectedRevision=1, name="after bob left")
    q = change_project(p, req, actor="u_bob", channel_people={"c_team": ["u_ann"]}, now=T0)
    assert can_read(q, "u_bob")


def test_missing_members():
    assert missing_members(["a", "b"], ["b", "c", "a", "c"]) == ("c",)
    assert missing_members(["a"], []) == ()


# --- wire -----------------------------------------------------------------------------------------


def test_decode_tells_create_from_change():
    create = decode_request(b'{"requestId": "r1", "name": "n", "members": ["u_b"]}')
    assert isinstance(create, ProjectCreate) and create.members == ["u_b"]
    ch = decode_request(b'{"requestId": "r2", "id": "p_1", "expectedRevision": 3, "name": "m"}')
    assert isinstance(ch, ProjectChange) and ch.expectedRevision == 3 and ch.members is None
    for bad in (b"not json", b"[1]", b'{"requestId": "r", "name": "n", "owner": "u_x"}'):
        with pytest.raises(InvalidInput):
            decode_request(bad)
    with pytest.raises(InvalidInput):
        decode_request(b'{"requestId": "r", "id": "p", "expectedRevision": "1"}')


def test_view_is_camel_case():
    body = msgspec.json.decode(msgspec.json.encode(view(make())))
    assert body == {
        "id": "p_1",
        "org": "o_1",
        "owner": "u_ann",
        "name": "Launch",
        "metadata": {},
        "members": ["u_ann"],
        "channels": [],
        "revision": 1,
        "createdAt": T0,
        "updatedAt": T0,
    }


# --- properties -----------------------------------------------------------------------------------

PEOPLE = ["u_ann", "u_bob", "u_cat", "u_dan", "u_eve"]
people_st = st.lists(st.sampled_from(PEOPLE), unique=True, max_size=5)
channels_st = st.dictionaries(st.sampled_from(["c_1", "c_2", "c_3"]), people_st, min_size=3)
step_st = st.tuples(
    st.sampled_from(PEOPLE),  # actor
    st.one_of(st.none(), people_st),  # members
    st.one_of(st.none(), st.lists(st.sampled_from(["c_1", "c_2", "c_3"]), unique=True)),
    st.one_of(st.none(), st.text(min_size=1, max_size=10)),
    st.booleans(),  # stale
)


@settings(max_examples=300, deadline=None)
@given(channels_st, st.lists(step_st, max_size=12))
def test_invariants_hold_over_any_sequence_of_changes(channel_people, steps):
    p = create_project(
        ProjectCreate(requestId="r", name="P"),
        new_id="p_1",
        org="o",
        owner="u_ann",
        channel_people=channel_people,
        now=0,
    )
    for n, (actor, members, channels, name, stale) in enumerate(steps, start=1):
        req = ProjectChange(
            requestId=f"r{n}",
            id="p_1",
            expectedRevision=p.revision - 1 if stale else p.revision,
            members=members,
            channels=channels,
            name=name,
        )
        before = p
        try:
            p = change_project(p, req, actor=actor, channel_people=channel_people, now=n)
        except (Conflict, Forbidden, InvalidInput, NotFound):
            continue
        assert actor in before.members
        assert not stale
        assert p.id == "p_1" and p.owner in p.members
        assert p.revision in (before.revision, before.revision + 1)
        for channel in set(p.channels) - set(before.channels):
            assert set(channel_people[channel]) <= set(p.members)
        for gone in set(before.members) - set(p.members):
            assert all(gone not in channel_people[c] for c in p.channels)


@settings(max_examples=200, deadline=None)
@given(people_st, people_st)
def test_linking_succeeds_exactly_when_the_channel_people_are_members(members, people):
    p = make(members=members)
    try:
        q = change_project(
            p,
            ProjectChange(requestId="r", id=p.id, expectedRevision=1, channels=["c_x"]),
            actor="u_ann",
            channel_people={"c_x": people},
            now=T0,
        )
    except Conflict as e:
        assert e.code == "channel_members_not_in_project"
        assert set(e.details["people"]) == set(people) - set(p.members)
        assert not set(people) <= set(p.members)
    else:
        assert set(people) <= set(p.members) and q.channels == ("c_x",)
