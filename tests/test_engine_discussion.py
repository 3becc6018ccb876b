"""Who speaks in a group turn and for how many rounds (WS-5), and what the text asks for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.discussion import (
    DISCUSSION_ROUNDS,
    MAX_MEMBERS,
    MAX_ROUNDS,
    Plan,
    asks_for_discussion,
    mentioned,
    plan_turn,
    requested_rounds,
)
from engine.errors import InvalidInput, Unprocessable

MEMBERS = ("b1", "b2", "b3")
NAMES = {"b1": "Ann", "b2": "Ann Lee", "b3": "小明"}


def plan(text: str = "hello", **kw) -> Plan:
    kw.setdefault("members", MEMBERS)
    kw.setdefault("names", NAMES)
    return plan_turn(text=text, **kw)


# ---- rounds in the text --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rounds"),
    [
        ("discuss in 3 rounds", 3),
        ("3 rounds of discussion please", 3),
        ("three rounds", 3),
        ("Let's do Three Rounds on this", 3),
        ("a 4-round debate", 4),
        ("one round only", 1),
        ("twelve rounds", 12),
        ("discuss this for 10 rounds", 10),
        ("讨论3轮", 3),
        ("讨论三轮", 3),
        ("3轮讨论", 3),
        ("进行3轮讨论", 3),
        ("请大家讨论 5 轮", 5),
        ("讨论两轮", 2),
        ("讨论十轮", 10),
        ("讨论十二轮", 12),
        ("进行十一轮讨论", 11),
        ("讨论３轮", 3),  # full-width digit
        ("三个回合", 3),
        ("請討論四輪", 4),  # traditional characters
    ],
)
def test_requested_rounds(text: str, rounds: int) -> None:
    assert requested_rounds(text) == rounds


@pytest.mark.parametrize(
    ("text", "rounds"),
    [("discuss in 20 rounds", 20), ("0 rounds", 0), ("讨论二十轮", 20), ("讨论13轮", 13)],
)
def test_requested_rounds_out_of_range_are_returned_as_they_are(text: str, rounds: int) -> None:
    assert requested_rounds(text) == rounds


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "let's discuss",
        "round the corner",
        "第三轮的结论是什么",  # which round, not how many
        "下一轮讨论",
        "这一轮我们说到哪了",
        "每一轮都要总结",
        "someone rounds it up",
        "v3 rounds",
        "",
    ],
)
def test_no_rounds_requested(text: str) -> None:
    assert requested_rounds(text) is None


def test_first_stated_count_wins() -> None:
    assert requested_rounds("3 rounds, no wait, 5 rounds") == 3
    assert requested_rounds("讨论4轮 or 6 rounds") == 4


def test_absurdly_long_number_does_not_crash() -> None:
    assert requested_rounds("9" * 5000 + " rounds") > MAX_ROUNDS


@pytest.mark.parametrize(
    ("text", "asks"),
    [
        ("please discuss", True),
        ("a DISCUSSION about cats", True),
        ("they discussed it", True),
        ("debate this", True),
        ("debating", True),
        ("请大家讨论一下", True),
        ("我们来辩论", True),
        ("请discuss一下", True),  # no spaces around the English word
        ("hello", False),
        ("discussant", False),
        ("undebatable", False),
    ],
)
def test_asks_for_discussion(text: str, asks: bool) -> None:
    assert asks_for_discussion(text) is asks


# ---- @mentions -----------------------------------------------------------------------------


def test_mentions_by_name_and_id_in_names_order() -> None:
    names = {"b1": "Ann", "b2": "Bob", "b3": "Cy"}
    assert mentioned("@cy and @b1", names) == ("b1", "b3")
    assert mentioned("@BOB?", names) == ("b2",)
    assert mentioned("no one here", names) == ()


def test_a_short_name_does_not_match_a_longer_word() -> None:
    assert mentioned("@Anna", {"b1": "Ann"}) == ()
    assert mentioned("@Ann_x", {"b1": "Ann"}) == ()
    assert mentioned("@Ann, hi", {"b1": "Ann"}) == ("b1",)
    assert mentioned("@Ann.", {"b1": "Ann"}) == ("b1",)


def test_longest_name_wins() -> None:
    names = {"b1": "Ann", "b2": "Ann Lee", "b3": "Anna"}
    assert mentioned("@Ann Lee please", names) == ("b2",)
    assert mentioned("@ann   lee", names) == ("b2",)
    assert mentioned("@Ann Leeds", names) == ("b1",)
    assert mentioned("@Anna and @Ann", names) == ("b1", "b3")


def test_same_name_names_every_bot_with_it() -> None:
    assert mentioned("@Helper", {"b1": "Helper", "b2": "helper"}) == ("b1", "b2")


def test_chinese_mentions_need_no_space() -> None:
    names = {"b1": "小明", "b2": "小明明"}
    assert mentioned("@小明你好", names) == ("b1",)
    assert mentioned("\uff20小明明\uff0c你说呢", names) == ("b2",)
    assert mentioned("请@Ann回答", {"b1": "Ann"}) == ("b1",)


def test_email_addresses_are_not_mentions() -> None:
    assert mentioned("write to bob@ann.org", {"b1": "ann"}) == ()


def test_blank_names_are_ignored_but_ids_still_match() -> None:
    assert mentioned("@ hi @b1", {"b1": " ", "b2": ""}) == ("b1",)


# ---- plan_turn -----------------------------------------------------------------------------


def test_normal_message_is_one_round_with_everyone() -> None:
    assert plan("hello") == Plan(participants=MEMBERS, rounds=1)


def test_discussion_defaults_to_two_rounds() -> None:
    assert plan("please discuss").rounds == DISCUSSION_ROUNDS == 2
    assert plan("大家讨论一下").rounds == 2


def test_rounds_from_text_and_option() -> None:
    assert plan("discuss in 5 rounds").rounds == 5
    assert plan("讨论三轮").rounds == 3
    assert plan("3 rounds", rounds=7).rounds == 7  # the send option wins
    assert plan("discuss", rounds=1).rounds == 1
    assert plan(rounds=MAX_ROUNDS).rounds == 12


@pytest.mark.parametrize("rounds", [True, False, 2.0, "3", [1]])
def test_rounds_option_must_be_an_int(rounds) -> None:
    with pytest.raises(InvalidInput) as e:
        plan(rounds=rounds)
    assert e.value.code == "invalid_rounds"


@pytest.mark.parametrize("rounds", [0, -1, 13, 100])
def test_rounds_option_out_of_range(rounds: int) -> None:
    with pytest.raises(Unprocessable) as e:
        plan(rounds=rounds)
    assert e.value.code == "invalid_rounds"


@pytest.mark.parametrize("text", ["discuss in 13 rounds", "讨论二十轮", "0 rounds"])
def test_rounds_in_text_out_of_range(text: str) -> None:
    with pytest.raises(Unprocessable) as e:
        plan(text)
    assert e.value.code == "invalid_rounds"


def test_no_bots() -> None:
    with pytest.raises(Unprocessable) as e:
        plan(members=())
    assert e.value.code == "no_bots"


def test_too_many_members() -> None:
    members = tuple(f"b{i}" for i in range(MAX_MEMBERS + 1))
    with pytest.raises(Unprocessable) as e:
        plan(members=members, names={})
    assert e.value.code == "too_many_members"
    ok = plan(members=members[:MAX_MEMBERS], names={})
    assert ok.participants == members[:MAX_MEMBERS]


def test_duplicate_members_count_once() -> None:
    members = ("b1", "b2", "b1", *(f"x{i}" for i in range(6)))
    assert plan(members=members, names={}).participants == (
        "b1",
        "b2",
        *(f"x{i}" for i in range(6)),
    )


def test_mentions_option_picks_members_in_channel_order() -> None:
    assert plan(mentions=["b3", "b1", "b3"]).participants == ("b1", "b3")


def test_mentions_option_wins_over_text() -> None:
    assert plan("@Ann what do you think", mentions=["b3"]).participants == ("b3",)


def test_mentions_option_must_name_members() -> None:
    with pytest.raises(Unprocessable) as e:
        plan(mentions=["b1", "stranger"])
    assert e.value.code == "not_a_member"
    assert e.value.details == {"bot": "stranger"}


def test_empty_mentions_option_falls_back_to_text() -> None:
    assert plan("@小明 讨论一下", mentions=[]).participants == ("b3",)


def test_text_mentions_pick_members() -> None:
    assert plan("@Ann Lee and @小明, discuss").participants == ("b2", "b3")
    assert plan("@b1 hi").participants == ("b1",)


def test_text_mentions_of_non_members_are_ignored() -> None:
    names = {**NAMES, "outsider": "Zed"}
    assert plan("@Zed hello", names=names).participants == MEMBERS


def test_member_without_a_name_is_named_by_id() -> None:
    assert plan("@b2 hi", names={}).participants == ("b2",)


# ---- rotation ------------------------------------------------------------------------------


def test_order_rotates() -> None:
    p = Plan(participants=("a", "b", "c"), rounds=4)
    assert [p.order(r) for r in range(4)] == [
        ("a", "b", "c"),
        ("b", "c", "a"),
        ("c", "a", "b"),
        ("a", "b", "c"),
    ]


@pytest.mark.parametrize("index", [-1, 4, True, 1.0])
def test_order_outside_the_plan(index) -> None:
    with pytest.raises(InvalidInput) as e:
        Plan(participants=("a",), rounds=4).order(index)
    assert e.value.code == "invalid_round"


_ids = st.lists(
    st.text("abcdefgh", min_size=1, max_size=3), min_size=1, max_size=MAX_MEMBERS, unique=True
)


@given(_ids, st.integers(1, MAX_ROUNDS))
def test_every_round_is_a_permutation_in_channel_cycle(
    participants: list[str], rounds: int
) -> None:
    p = Plan(participants=tuple(participants), rounds=rounds)
    n = len(participants)
    for r in range(rounds):
        order = p.order(r)
        assert sorted(order) == sorted(participants)
        # A rotation keeps channel order, wrapping around once.
        start = participants.index(order[0])
        assert order == tuple(participants[(start + i) % n] for i in range(n))
        assert order[0] == participants[r % n]


@given(_ids)
def test_over_n_rounds_everyone_speaks_first_once(participants: list[str]) -> None:
    n = len(participants)
    if n > MAX_ROUNDS:
        return
    p = Plan(participants=tuple(participants), rounds=n)
    assert sorted(p.order(r)[0] for r in range(n)) == sorted(participants)


@given(_ids, st.integers(0, MAX_ROUNDS - 2))
def test_consecutive_rounds_start_differently(participants: list[str], r: int) -> None:
    p = Plan(participants=tuple(participants), rounds=MAX_ROUNDS)
    if len(participants) > 1:
        assert p.order(r)[0] != p.order(r + 1)[0]


@given(
    st.lists(st.sampled_from(["b1", "b2", "b3", "b4"]), max_size=6),
    st.text(max_size=40),
)
def test_plan_participants_are_members_in_channel_order(mentions: list[str], text: str) -> None:
    members = ("b1", "b2", "b3", "b4")
    try:
        p = plan_turn(members=members, names={"b1": "Ann"}, text=text, mentions=mentions)
    except Unprocessable as e:
        assert e.code == "invalid_rounds"
        return
    assert p.participants
    assert list(p.participants) == [m for m in members if m in p.participants]
    assert 1 <= p.rounds <= MAX_ROUNDS
