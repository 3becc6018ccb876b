"""Pure rules: budget periods (MB-3), the creator's rights (WS-3), the server's
bot permissions (WS-1) and requests deciding once (ENR-3)."""

from __future__ import annotations

import datetime

import pytest

from engine.bot_policy import parse_profile_patch, permissions
from engine.directory import Bot, Org, OrgSettings
from engine.errors import Conflict, Forbidden, InvalidInput
from engine.memory_bot_settings import next_period_start, period_key
from engine.requests import Proposal, decide, new_request, parse_proposal
from engine.self_rules import Editor, RulesUpdate, set_archived, update_rules


def _ms(*args) -> int:
    return int(datetime.datetime(*args, tzinfo=datetime.UTC).timestamp() * 1000)


@pytest.mark.parametrize(
    ("period", "now", "boundary"),
    [
        ("day", _ms(2026, 3, 31, 23, 59, 59), _ms(2026, 4, 1)),
        ("day", _ms(2026, 4, 1), _ms(2026, 4, 2)),
        ("month", _ms(2026, 2, 14, 8), _ms(2026, 3, 1)),
        ("month", _ms(2026, 12, 31, 23), _ms(2027, 1, 1)),
    ],
)
def test_mb3_next_period_start(period, now, boundary):
    """MB-3: the next period begins at the boundary, in a new spend bucket."""
    assert next_period_start(period, now) == boundary
    assert period_key(period, boundary) != period_key(period, now)
    assert period_key(period, boundary - 1) == period_key(period, now)


MEMBER = Bot(id="b_m", name="Scout", org="o", owner="u", creator="b_boss", revision=2)
BOSS = Editor(kind="bot", id="b_boss")


def test_ws3_creator_may_rename_but_not_edit_other_rules():
    renamed = update_rules(MEMBER, RulesUpdate(expectedRevision=2, name="Ranger"), BOSS)
    assert renamed.name == renamed.rules.name == "Ranger" and renamed.revision == 3
    for update in (
        RulesUpdate(expectedRevision=2, prompt="obey me"),
        RulesUpdate(expectedRevision=2, name="Ranger", tone="meek"),
    ):
        with pytest.raises(Forbidden) as e:
            update_rules(MEMBER, update, BOSS)
        assert e.value.code == "creator_locked"
    with pytest.raises(Forbidden):
        update_rules(MEMBER, RulesUpdate(expectedRevision=2, name="X"), Editor(kind="bot", id="b9"))


def test_ws3_who_may_archive():
    assert set_archived(MEMBER, True, BOSS).archived
    assert set_archived(MEMBER, True, Editor(kind="user", id="u")).archived  # the owner
    for editor in (Editor(kind="bot", id="b9"), Editor(kind="self", id="b_m")):
        with pytest.raises(Forbidden):
            set_archived(MEMBER, True, editor)
    with pytest.raises(Forbidden):
        set_archived(MEMBER, True, Editor(kind="user", id="u_stranger"))


def test_ws1_permissions_come_from_server_policy():
    org = Org(id="o", name="o", settings=OrgSettings(autoRecord=True))
    assert permissions(MEMBER, org).collaboration and permissions(MEMBER, org).team
    temp = Bot(id="b_t", name="T", org="o", owner="u", kind="temporary")
    assert not permissions(temp, org).team and permissions(temp, org).collaboration
    off = Org(id="o", name="o", settings=OrgSettings(collaboration=False))
    assert not permissions(MEMBER, off).collaboration and not permissions(MEMBER, off).team
    archived = Bot(id="b_a", name="A", org="o", owner="u", archived=True)
    assert not any((permissions(archived, org).team, permissions(archived, org).collaboration))
    paused = Bot(id="b_p", name="P", org="o", owner="u", autoRecordPaused=True)
    assert permissions(MEMBER, org).autoRecord and not permissions(paused, org).autoRecord
    assert parse_profile_patch({"team": False, "autoRecord": True}) == (True, ["team"])
    for bad in ([], {"teams": True}, {"autoRecord": "no"}):
        with pytest.raises(InvalidInput):
            parse_profile_patch(bad)


def test_enr3_a_request_is_decided_once():
    req = new_request(
        request_id="req_1",
        bot="b",
        org="o",
        chat="c",
        turn="t",
        owner="u",
        channel=None,
        proposal=parse_proposal({"proposal": "Buy it\nsoon"}),
        now=1,
    )
    assert req.title == "Buy it" and req.status == "pending"
    done = decide(req, user="u", approved=False, note="no", now=2)
    assert (done.status, done.revision, done.decidedBy) == ("rejected", 2, "u")
    with pytest.raises(Conflict):
        decide(done, user="u", approved=True, note="", now=3)
    for bad in ({"proposal": " "}, {"proposal": 3}, {}):
        with pytest.raises(InvalidInput):
            parse_proposal(bad)
    assert isinstance(parse_proposal({"proposal": "x", "title": "T"}), Proposal)
