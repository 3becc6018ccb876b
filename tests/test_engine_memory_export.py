"""The Markdown export's shape (FS-2 lines, headings per pool and contributor), pure."""

from __future__ import annotations

from engine.memory_entries import Scope, Tier
from engine.memory_export import memory_line, render
from engine.scoped_memory import Origin, WorkspaceEntryView, WorkspaceStatus

DAY = 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _e(id, pool, contributor, content, at, tier=Tier.LOG, status=WorkspaceStatus.ACTIVE):
    return WorkspaceEntryView(
        id=id,
        scope=Scope(pool.partition(":")[0]),
        pool=pool,
        contributor=contributor,
        tier=tier,
        topics=(),
        content=content,
        evidence=(),
        origin=Origin.EXPLICIT,
        protected=True,
        review=False,
        status=status,
        revision=1,
        createdAt=at,
        updatedAt=at,
    )


def test_line_is_dated_in_utc_and_one_line():
    assert memory_line("Lives in\r\n  Lyon. ", T0 - 1) == "- (2025-12-31) Lives in Lyon."
    assert memory_line("x", T0) == "- (2026-01-01) x"


def test_render_groups_by_pool_then_contributor_and_leaves_out_forgotten():
    entries = [
        _e("m3", "project:p_1", "b_2", "Ship in May.", T0 + 2 * DAY),
        _e("m2", "user:u_1", "b_1", "Log line.", T0 + DAY),
        _e("m1", "user:u_1", "b_1", "Profile line.", T0 + 5 * DAY, tier=Tier.PROFILE),
        _e("m0", "bot:b_1", "b_1", "Gone.", T0, status=WorkspaceStatus.FORGOTTEN),
        _e("m4", "bot:b_1", "b_1", "Short answers.", T0),
    ]
    text = render(
        entries,
        account="u_1",
        pool_names={"project:p_1": "Launch", "bot:b_1": "Ada"},
        bot_names={"b_1": "Ada"},
    )
    assert text.splitlines() == [
        "# Memory export for u_1",
        "",
        "## Bot memory · Ada (b_1)",
        "",
        "### Ada (b_1)",
        "- (2026-01-01) Short answers.",
        "",
        "## User memory · u_1",
        "",
        "### Ada (b_1)",
        "- (2026-01-06) Profile line.",
        "- (2026-01-02) Log line.",
        "",
        "## Project memory · Launch (p_1)",
        "",
        "### b_2",
        "- (2026-01-03) Ship in May.",
    ]
    assert render([], account="u_1").splitlines()[2] == "No memory yet."
