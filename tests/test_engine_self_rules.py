"""A bot's own rules (WS-2) and a new member's first rules (WS-3)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.directory import Bot, BotRules, Permission
from engine.errors import Conflict, Forbidden, InvalidInput
from engine.self_rules import (
    MAX_FIELD,
    RULE_FIELDS,
    Editor,
    RulesUpdate,
    new_member,
    parse_update,
    rules_view,
    update_rules,
)

HAS_CREATOR = "creator" in Bot.__struct_fields__


class _BotWithCreator(Bot, frozen=True, kw_only=True):
    """Stands in for Bot until its `creator` field lands in engine/directory.py."""

    creator: str | None = None


_BotClass = Bot if HAS_CREATOR else _BotWithCreator


def make_bot(**kw) -> Bot:
    base = dict(
        id="b1",
        name="Ann",
        org="o1",
        owner="u_owner",
        model="local",
        rules=BotRules(name="Ann", prompt="Be kind.", tone="warm"),
        revision=3,
        grants={"u_reader": Permission.READ, "u_writer": Permission.WRITE},
    )
    return _BotClass(**{**base, **kw})


SELF = Editor(kind="self", id="b1")
OWNER = Editor(kind="user", id="u_owner")


# ---- rules_view ----------------------------------------------------------------------------


def test_rules_view() -> None:
    view = rules_view(make_bot())
    assert view == {
        "id": "b1",
        "name": "Ann",
        "kind": "persistent",
        "rules": {
            "name": "Ann",
            "description": "",
            "prompt": "Be kind.",
            "duties": "",
            "boundaries": "",
            "tone": "warm",
            "preferences": "",
        },
        "revision": 3,
    }
    assert tuple(view["rules"]) == RULE_FIELDS
    msgspec.json.encode(view)  # it is what a tool returns


def test_rules_view_falls_back_to_the_bot_name() -> None:
    assert rules_view(make_bot(rules=BotRules()))["rules"]["name"] == "Ann"


# ---- update_rules: who ---------------------------------------------------------------------


def test_self_update() -> None:
    bot = make_bot()
    new = update_rules(bot, RulesUpdate(expectedRevision=3, duties="Review code", tone=""), SELF)
    assert new.revision == 4
    assert new.rules == BotRules(name="Ann", prompt="Be kind.", duties="Review code", tone="")
    assert bot.revision == 3  # the input is untouched


@pytest.mark.parametrize("user", ["u_owner", "u_writer"])
def test_users_with_write_may_edit(user: str) -> None:
    new = update_rules(
        make_bot(), RulesUpdate(expectedRevision=3, prompt="x"), Editor(kind="user", id=user)
    )
    assert new.rules.prompt == "x"


@pytest.mark.parametrize("user", ["u_reader", "u_stranger"])
def test_users_without_write_may_not(user: str) -> None:
    with pytest.raises(Forbidden) as e:
        update_rules(
            make_bot(), RulesUpdate(expectedRevision=3, prompt="x"), Editor(kind="user", id=user)
        )
    assert e.value.code == "no_write"


def test_self_must_be_this_bot() -> None:
    with pytest.raises(Forbidden) as e:
        update_rules(make_bot(), RulesUpdate(expectedRevision=3), Editor(kind="self", id="b2"))
    assert e.value.code == "not_self"


def test_temporary_bot_cannot_edit_itself() -> None:
    bot = make_bot(kind="temporary")
    for editor in (SELF, Editor(kind="bot", id="b1")):
        with pytest.raises(Forbidden) as e:
            update_rules(bot, RulesUpdate(expectedRevision=3, prompt="x"), editor)
        assert e.value.code == "temporary_bot"
    # …but its owner can (WS-3: users keep editing in the client).
    assert update_rules(bot, RulesUpdate(expectedRevision=3, prompt="x"), OWNER).rules.prompt == "x"


def test_creator_is_locked_out_after_creation() -> None:
    bot = make_bot(creator="b_boss")
    with pytest.raises(Forbidden) as e:
        update_rules(
            bot, RulesUpdate(expectedRevision=3, prompt="x"), Editor(kind="bot", id="b_boss")
        )
    assert e.value.code == "creator_locked"


def test_other_bots_may_not_edit() -> None:
    with pytest.raises(Forbidden) as e:
        update_rules(
            make_bot(creator="b_boss"), RulesUpdate(expectedRevision=3), Editor(kind="bot", id="b9")
        )
    assert e.value.code == "not_your_bot"


def test_a_bot_editor_that_is_the_bot_itself_is_self() -> None:
    new = update_rules(
        make_bot(), RulesUpdate(expectedRevision=3, tone="dry"), Editor(kind="bot", id="b1")
    )
    assert new.rules.tone == "dry"


def test_member_may_edit_itself() -> None:
    bot = make_bot(creator="b_boss")
    assert update_rules(bot, RulesUpdate(expectedRevision=3, tone="dry"), SELF).rules.tone == "dry"


def test_unknown_editor_kind() -> None:
    with pytest.raises(InvalidInput) as e:
        update_rules(make_bot(), RulesUpdate(expectedRevision=3), Editor(kind="admin", id="x"))
    assert e.value.code == "invalid_editor"


def test_permission_is_checked_before_revision() -> None:
    with pytest.raises(Forbidden):
        update_rules(make_bot(), RulesUpdate(expectedRevision=1), Editor(kind="bot", id="b9"))


# ---- update_rules: revision and fields -----------------------------------------------------


@pytest.mark.parametrize("expected", [2, 4, 0])
def test_stale_revision(expected: int) -> None:
    with pytest.raises(Conflict) as e:
        update_rules(make_bot(), RulesUpdate(expectedRevision=expected, prompt="x"), SELF)
    assert e.value.code == "stale_revision"
    assert e.value.details == {"currentRevision": 3}


def test_expected_revision_must_be_an_int() -> None:
    with pytest.raises(InvalidInput) as e:
        update_rules(make_bot(), RulesUpdate(expectedRevision=True, prompt="x"), SELF)
    assert e.value.code == "invalid_revision"


def test_empty_update_changes_nothing_but_checks_revision() -> None:
    bot = make_bot()
    assert update_rules(bot, RulesUpdate(expectedRevision=3), SELF) is bot
    with pytest.raises(Conflict):
        update_rules(bot, RulesUpdate(expectedRevision=2), SELF)


def test_rename_changes_bot_and_rules_name() -> None:
    new = update_rules(make_bot(), RulesUpdate(expectedRevision=3, name="  Annie "), SELF)
    assert new.name == new.rules.name == "Annie"
    assert rules_view(new)["name"] == "Annie"


@pytest.mark.parametrize("name", ["", "   ", "\n"])
def test_blank_name(name: str) -> None:
    with pytest.raises(InvalidInput) as e:
        update_rules(make_bot(), RulesUpdate(expectedRevision=3, name=name), SELF)
    assert e.value.code == "invalid_name"


@pytest.mark.parametrize("field", RULE_FIELDS)
def test_field_too_long(field: str) -> None:
    at_limit = update_rules(
        make_bot(), RulesUpdate(expectedRevision=3, **{field: "x" * MAX_FIELD}), SELF
    )
    assert getattr(at_limit.rules, field) == "x" * MAX_FIELD
    with pytest.raises(InvalidInput) as e:
        update_rules(
            make_bot(), RulesUpdate(expectedRevision=3, **{field: "x" * (MAX_FIELD + 1)}), SELF
        )
    assert e.value.code == "field_too_long"
    assert e.value.details == {"field": field}


def test_non_string_field() -> None:
    with pytest.raises(InvalidInput) as e:
        update_rules(make_bot(), RulesUpdate(expectedRevision=3, tone=5), SELF)
    assert e.value.code == "invalid_rule"


@given(
    st.fixed_dictionaries(
        {}, optional={f: st.text(max_size=20).filter(str.strip) for f in RULE_FIELDS}
    )
)
def test_update_never_touches_the_base_profile(fields: dict[str, str]) -> None:
    bot = make_bot(creator="b_boss", linked=True)
    new = update_rules(bot, RulesUpdate(expectedRevision=3, **fields), OWNER)
    for attr in ("id", "org", "owner", "kind", "linked", "model", "grants"):
        assert getattr(new, attr) == getattr(bot, attr)
    assert getattr(new, "creator", None) == "b_boss"
    assert new.revision == (4 if fields else 3)
    for f in RULE_FIELDS:
        want = fields.get(f, getattr(bot.rules, f))
        assert getattr(new.rules, f) == (want.strip() if f == "name" else want)


# ---- parse_update --------------------------------------------------------------------------


def test_parse_update() -> None:
    assert parse_update({"expectedRevision": 2, "tone": "calm"}) == RulesUpdate(
        expectedRevision=2, tone="calm"
    )


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"expectedRevision": "2"},
        {"expectedRevision": True},
        {"expectedRevision": 2, "model": "gpt"},  # not a rule: the model is not the bot's to change
        {"expectedRevision": 2, "tone": 3},
        [],
    ],
)
def test_parse_update_rejects(args) -> None:
    with pytest.raises(InvalidInput) as e:
        parse_update(args)
    assert e.value.code == "invalid_update"


# ---- new_member ----------------------------------------------------------------------------


def test_new_member() -> None:
    creator = make_bot(id="b_boss", grants={"u_reader": Permission.READ})
    member = new_member(
        creator,
        bot_id="b_new",
        name="Scout",
        prompt="Find sources.",
        rules={"prompt": "ignored", "duties": "research", "tone": "brief"},
    )
    assert member.id == "b_new"
    assert member.name == "Scout"
    assert (member.org, member.owner, member.kind, member.revision) == (
        "o1",
        "u_owner",
        "persistent",
        1,
    )
    assert member.rules == BotRules(
        name="Scout", prompt="Find sources.", duties="research", tone="brief"
    )
    assert member.grants == {}
    assert member.model == creator.model
    assert not member.linked
    if HAS_CREATOR:
        assert member.creator == "b_boss"


def test_new_member_without_prompt_or_rules() -> None:
    member = new_member(make_bot(), bot_id="b_new", name="Scout", prompt=None, rules=None)
    assert member.rules == BotRules(name="Scout")
    keep = new_member(make_bot(), bot_id="b_new", name="Scout", prompt=None, rules={"prompt": "p"})
    assert keep.rules.prompt == "p"


def test_new_member_name_wins_over_rules_name() -> None:
    member = new_member(
        make_bot(), bot_id="b_new", name="Scout", prompt=None, rules={"name": "Other"}
    )
    assert member.name == member.rules.name == "Scout"


def test_new_member_then_creator_is_locked() -> None:
    if not HAS_CREATOR:
        pytest.skip("Bot has no creator field yet")
    member = new_member(make_bot(id="b_boss"), bot_id="b_new", name="Scout", prompt="p", rules=None)
    with pytest.raises(Forbidden) as e:
        update_rules(
            member, RulesUpdate(expectedRevision=1, prompt="q"), Editor(kind="bot", id="b_boss")
        )
    assert e.value.code == "creator_locked"
    assert (
        update_rules(
            member, RulesUpdate(expectedRevision=1, prompt="q"), Editor(kind="self", id="b_new")
        ).revision
        == 2
    )


def test_temporary_creator() -> None:
    with pytest.raises(Forbidden) as e:
        new_member(
            make_bot(kind="temporary"), bot_id="b_new", name="Scout", prompt=None, rules=None
        )
    assert e.value.code == "temporary_bot"


def test_unknown_rule() -> None:
    with pytest.raises(InvalidInput) as e:
        new_member(make_bot(), bot_id="b_new", name="Scout", prompt=None, rules={"model": "gpt"})
    assert e.value.code == "unknown_rule"
    assert e.value.details == {"field": "model"}


@pytest.mark.parametrize(
    ("kw", "code"),
    [
        ({"rules": {"tone": 3}}, "invalid_rule"),
        ({"rules": ["tone"]}, "invalid_rule"),
        ({"prompt": 7}, "invalid_rule"),
        ({"prompt": "x" * (MAX_FIELD + 1)}, "field_too_long"),
        ({"rules": {"duties": "x" * (MAX_FIELD + 1)}}, "field_too_long"),
        ({"name": " "}, "invalid_name"),
        ({"bot_id": "bad id!"}, "invalid_id"),
    ],
)
def test_new_member_rejects(kw: dict, code: str) -> None:
    args = {"bot_id": "b_new", "name": "Scout", "prompt": None, "rules": None, **kw}
    with pytest.raises(InvalidInput) as e:
        new_member(make_bot(), **args)
    assert e.value.code == code
