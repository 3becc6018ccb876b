"""SC-5: one 16,000-character budget over three scopes, whole entries, profiles first."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.prompt_budget import BUDGET, ScopedEntry, candidate_order, line, overflows, pack

entry_st = st.builds(
    ScopedEntry,
    id=st.uuids().map(lambda u: f"mem_{u.hex[:8]}"),
    scope=st.sampled_from(["bot", "user", "project"]),
    tier=st.sampled_from(["profile", "log", "note"]),
    content=st.text(alphabet="abc xyz", min_size=1, max_size=3000),
    updated_at=st.integers(1_700_000_000_000, 1_800_000_000_000),
    source=st.sampled_from(["", "bot:b_1", "project:p_1 · b_2"]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(entry_st, max_size=40, unique_by=lambda e: e.id), st.text(max_size=2000))
def test_never_over_budget_whole_entries_profiles_first(entries, instructions):
    packed = pack(entries, instructions=instructions)
    assert len(packed.text) <= BUDGET
    by_id = {e.id: e for e in entries}
    for entry_id in packed.included:
        assert line(by_id[entry_id]) in packed.text  # whole, never cut
        assert by_id[entry_id].tier != "note"
    assert set(packed.included) | set(packed.omitted) == set(by_id)
    # Every scope that has a profile entry that could fit gets one before any log entry goes in.
    included = [by_id[i] for i in packed.included]
    first_log = next((k for k, e in enumerate(included) if e.tier == "log"), len(included))
    profiles_before = {e.scope for e in included[:first_log] if e.tier == "profile"}
    for scope in ("bot", "user", "project"):
        if any(e.scope == scope and e.tier == "profile" for e in included):
            assert scope in profiles_before


def test_round_robin_then_logs_by_latest_scope_and_leftovers_stay_out():
    day = 86_400_000
    t = 1_790_000_000_000
    entries = [
        ScopedEntry(id="bp1", scope="bot", tier="profile", content="b" * 50, updated_at=t),
        ScopedEntry(id="bp2", scope="bot", tier="profile", content="b" * 50, updated_at=t + 1),
        ScopedEntry(id="up1", scope="user", tier="profile", content="u" * 50, updated_at=t),
        ScopedEntry(
            id="pl1", scope="project", tier="log", content="p" * 50, updated_at=t + 5 * day
        ),
        ScopedEntry(id="bl1", scope="bot", tier="log", content="l" * 50, updated_at=t + day),
        ScopedEntry(id="note", scope="bot", tier="note", content="n", updated_at=t + 9 * day),
        ScopedEntry(id="huge", scope="user", tier="log", content="h" * 20_000, updated_at=t),
    ]
    packed = pack(entries, instructions="Use what helps.")
    assert packed.included == ("bp2", "up1", "bp1", "pl1", "bl1")
    assert set(packed.omitted) == {"note", "huge"}
    assert packed.text.startswith("Use what helps.\n## Bot memory\n- (")
    tight = pack(entries, budget=len("\n## Bot memory\n") + len(line(entries[1])) + 1)
    assert tight.included == ("bp2",)


def _order_by_passes(entries):
    """Rules 1-3 as separate passes per scope and tier: the oracle of `candidate_order`."""
    from engine.prompt_budget import SCOPES

    def newest(es):
        return sorted(es, key=lambda e: (-e.updated_at, e.id))

    profiles = {
        s: newest(e for e in entries if e.scope == s and e.tier == "profile") for s in SCOPES
    }
    order = []
    while any(profiles.values()):
        for scope in SCOPES:
            if profiles[scope]:
                order.append(profiles[scope].pop(0))
    logs = {s: newest(e for e in entries if e.scope == s and e.tier == "log") for s in SCOPES}
    latest = {
        s: max((e.updated_at for e in entries if e.scope == s and e.tier != "note"), default=0)
        for s in SCOPES
    }
    for scope in sorted(SCOPES, key=lambda s: (-latest[s], SCOPES.index(s))):
        order.extend(logs[scope])
    return order


def test_candidate_order_in_one_pass_is_the_order_of_the_rules():
    import random

    from engine.prompt_budget import ScopedEntry, candidate_order

    rng = random.Random(5)
    for _ in range(300):
        entries = [
            ScopedEntry(
                id=f"e{k}",
                scope=rng.choice(["bot", "user", "project", "other"]),
                tier=rng.choice(["profile", "log", "note", "odd"]),
                content="x",
                updated_at=rng.randint(-5, 5),
            )
            for k in range(rng.randint(0, 12))
        ]
        assert candidate_order(entries) == _order_by_passes(entries)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(entry_st, max_size=40, unique_by=lambda e: e.id),
    st.text(max_size=2000),
    st.integers(2_000, 20_000),
    st.lists(st.integers(0, 39), max_size=10),
)
def test_overflows_is_the_packs_own_verdict_and_first_changes_only_an_overflow(
    entries, instructions, budget, picks
):
    """The prompt asks `overflows` before it ranks, and `pack` with ranked ids skips its
    unranked pass on it: both stand for packing, so they must agree with it exactly."""
    plain = pack(entries, instructions=instructions, budget=budget)
    assert overflows(entries, instructions=instructions, budget=budget) == plain.overflow
    first = [entries[k].id for k in picks if k < len(entries)]
    ranked = pack(entries, instructions=instructions, budget=budget, first=first)
    if not plain.overflow or not first:
        assert ranked == plain
    else:  # the ranked ids are offered before the rules' order, and only they move
        offered = [i for i in dict.fromkeys(first) if i in ranked.included]
        assert list(ranked.included[: len(offered)]) == offered


def test_an_entry_s_prompt_line_is_its_line_made_once():
    entry = ScopedEntry(
        id="m1", scope="bot", tier="log", content="tea", updated_at=0, source="bot:b1"
    )
    assert entry.prompt_line == line(entry) == "- (1970-01-01) tea [bot:b1]"
    assert entry.prompt_line is entry.prompt_line


def test_overflows_at_the_edge_counts_headings_and_newlines():
    entries = [
        ScopedEntry(id="b", scope="bot", tier="log", content="bb", updated_at=0),
        ScopedEntry(id="u", scope="user", tier="profile", content="uu", updated_at=0),
        ScopedEntry(id="n", scope="bot", tier="note", content="n" * 100, updated_at=0),
    ]
    whole = len(pack(entries, instructions="hi").text)
    for budget in (whole - 1, whole, whole + 1):
        plain = pack(entries, instructions="hi", budget=budget)
        assert plain.overflow == (budget < whole)
        assert overflows(entries, instructions="hi", budget=budget) == plain.overflow


@settings(max_examples=300, deadline=None)
@given(
    st.lists(entry_st, max_size=40, unique_by=lambda e: e.id),
    st.text(max_size=200),
    st.integers(2_000, 200_000),
)
def test_what_all_fits_is_packed_as_the_entry_by_entry_walk_packs_it(entries, instructions, budget):
    """When everything fits, the pack is made from the groups at once: the same pack as
    offering each entry in the rules' order."""
    from engine.prompt_budget import _pack  # private: the entry-by-entry walk it stands for

    walked = _pack(entries, candidate_order(entries), instructions, budget)
    assert pack(entries, instructions=instructions, budget=budget) == walked
