"""The Markdown export of workspace memory (`GET /api/app/workspace/memory-export`, FS-2 lines).

One document for the signed-in account, of what they may read: a `##` heading per pool (bot
memory of each bot they use, their own user memory, each project they are a member of), a `###`
heading per contributing bot, and one line per active record, `- (YYYY-MM-DD) content` — the
record's last update, in UTC. Inside a contributor, profile records come first, then logs, then
notes, each oldest first, so the text reads like the file tree FS-1 describes. A record's
line breaks become spaces: one record is one line.

Pure: the caller passes the records it already filtered to what the reader may see, with their
content, and display names for pools and bots.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping

from engine.scoped_memory import WorkspaceEntryView, WorkspaceStatus

_SCOPE_ORDER = {"bot": 0, "user": 1, "project": 2}
_TIER_ORDER = {"profile": 0, "log": 1, "note": 2}
_SCOPE_TITLE = {"bot": "Bot memory", "user": "User memory", "project": "Project memory"}
_BREAKS = re.compile(r"\s*[\r\n]+\s*")


def day(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).date().isoformat()


def memory_line(content: str, updated_at: int) -> str:
    """`- (YYYY-MM-DD) content` on one line (FS-2)."""
    return f"- ({day(updated_at)}) {_BREAKS.sub(' ', content).strip()}"


def _title(pool: str, names: Mapping[str, str]) -> str:
    scope, _, owner = pool.partition(":")
    name = names.get(pool)
    label = f"{name} ({owner})" if name else owner
    return f"{_SCOPE_TITLE.get(scope, scope)} · {label}"


def render(
    entries: Iterable[WorkspaceEntryView],
    *,
    account: str,
    pool_names: Mapping[str, str] | None = None,
    bot_names: Mapping[str, str] | None = None,
) -> str:
    """The Markdown document; forgotten records are left out."""
    pool_names = pool_names or {}
    bot_names = bot_names or {}
    active = [e for e in entries if e.status == WorkspaceStatus.ACTIVE]
    pools: dict[str, dict[str, list[WorkspaceEntryView]]] = {}
    for e in active:
        pools.setdefault(e.pool, {}).setdefault(e.contributor, []).append(e)
    out = [f"# Memory export for {account}", ""]
    if not pools:
        out += ["No memory yet.", ""]
    for pool in sorted(pools, key=lambda p: (_SCOPE_ORDER.get(p.partition(":")[0], 9), p)):
        out += [f"## {_title(pool, pool_names)}", ""]
        for contributor in sorted(pools[pool]):
            name = bot_names.get(contributor)
            out.append(f"### {name} ({contributor})" if name else f"### {contributor}")
            rows = sorted(
                pools[pool][contributor],
                key=lambda e: (_TIER_ORDER.get(e.tier, 9), e.updatedAt, e.id),
            )
            out += [memory_line(e.content, e.updatedAt) for e in rows]
            out.append("")
    return "\n".join(out)
