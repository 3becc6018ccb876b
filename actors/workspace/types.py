"""What crosses the workspace's RPCs: who asks, what to list, what comes back."""

from __future__ import annotations

import msgspec

from engine.scoped_memory import WsEntryView
from engine.workspace_search import Hit

USING = ("all", "keyword", "semantic")


class WsAccess(msgspec.Struct, frozen=True, kw_only=True):
    """Who is asking: the signed-in account and the bots it uses (owner or grant).

    `orgs` (the org the request names first) and `channels` make the seed-000 reader of a bot's
    one memory (engine/bot_memory.py): a bot pool's entries are listed under its visibility rule.
    """

    account: str
    bots: frozenset[str] = frozenset()
    orgs: tuple[str, ...] = ()
    channels: frozenset[str] = frozenset()


class WsQuery(msgspec.Struct, frozen=True, kw_only=True):
    """What to list on one shard. `pools` are bot and user pools the gateway routed here;
    `projects` names projects to include, or None for every project here the account is a
    member of. `contributor` keeps one bot's contributions; `q` searches the bodies."""

    pools: tuple[str, ...] = ()
    projects: tuple[str, ...] | None = ()
    contributor: str | None = None
    q: str | None = None
    status: str = "active"  # active | forgotten | all
    limit: int = 200
    using: str = "all"  # with q: all (hybrid when semantic search is on) | keyword | semantic


class WsListing(msgspec.Struct, frozen=True, kw_only=True):
    """Records found on one shard; with a query, `hits` rank them. `names` are display names
    of the project pools listed (for the export's headings)."""

    entries: list[WsEntryView]
    hits: list[Hit] = []  # keyword hits among `fused` (with their BM25 scores)
    semantic: list[Hit] = []  # semantic hits among `fused` (with their cosines)
    fused: list[Hit] = []  # the ranking, best first; `entries` are in this order
    names: dict[str, str] = {}


class RevisionView(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `GET /memories/:id/revisions`: who (a user or a bot), when, before/after."""

    entry: str
    revision: int
    operator: str
    at: int
    change: str
    before: str | None = None
    after: str | None = None
