"""Who may read and hear of what in the workspace pools hosted on a shard (WA-1, WA-2).

A pool the caller may not read is "not found"; a change is announced to no one beyond who may
read it: a project's members, the account itself for user memory, the users of a bot in its org
for bot memory. A bot pool's records are read under the bot's entry visibility rule.
"""

from __future__ import annotations

from actors.contracts import WorkspaceAccess
from actors.runtime.peers import Peers
from actors.workspace.pools import WorkspacePool, WorkspacePools
from actors.workspace.projects import Projects
from engine import memory_union as bm
from engine import projects as projmod
from engine import scoped_memory as sm
from engine import tags as tagmod
from engine.errors import NotFound
from engine.events import NOBODY, Audience
from engine.memory_entries import Reader, Scope
from engine.scoped_memory import WorkspaceEntry

TAG_AUDIENCES = 4_096  # bot records' audiences kept, by pool and tags


class WorkspaceRules:
    def __init__(
        self, *, pools: WorkspacePools, projects: Projects, peers: Peers, index: int
    ) -> None:
        self.pools = pools
        self.projects = projects
        self.peers = peers
        self.index = index  # this shard's
        self._by_tags: dict[tuple[str, tuple[str, ...]], Audience] = {}  # (`audience`)

    def readable(self, pool_id: str, access: WorkspaceAccess) -> bool:
        scope, owner = sm.scope_of(pool_id), sm.pool_owner(pool_id)
        if scope == Scope.PROJECT:
            project = self.projects.known().get(owner)
            return project is not None and projmod.can_read(project, access.account)
        if scope == Scope.USER and self.peers.index_of(owner) != self.index:
            return False  # not hosted here: the gateway routed it wrong
        return sm.may_access(pool_id, account=access.account, bots=access.bots, projects=())

    def require(self, pool_id: str, access: WorkspaceAccess) -> None:
        if not self.readable(pool_id, access):
            raise NotFound("no such memory", code="memory_not_found")

    def audience(self, pool_id: str, entry: WorkspaceEntry | None = None) -> Audience:
        """Who may hear of a change in `pool_id` (never more than who may read it): for a bot
        record, users of the bot in the org its `org:` tag names (a shared bot's record
        written in another org is heard of there only)."""
        if entry is not None:
            # A bot record's tags decide alone, and a pool's records share few tag sets: the
            # answer is kept (every write asks).
            known = self._by_tags.get((pool_id, entry.tags))
            if known is not None:
                return known
        scope, owner = sm.scope_of(pool_id), sm.pool_owner(pool_id)
        if scope == Scope.BOT:
            orgs = tagmod.orgs_of(entry.tags) if entry is not None else set()
            if orgs and entry is not None:
                if len(self._by_tags) >= TAG_AUDIENCES:
                    self._by_tags.clear()
                audience = NOBODY if len(orgs) > 1 else Audience(org=orgs.pop(), bot=owner)
                self._by_tags[(pool_id, entry.tags)] = audience
                return audience
            # The records' `org:` tag (engine/memory_union.py): users of the bot in its org.
            pool = self.pools.get(pool_id)
            org = pool.bot_org if pool is not None else None
            return Audience(bot=owner) if org is None else Audience(org=org, bot=owner)
        if scope == Scope.USER:
            return Audience(users=(owner,))
        project = self.projects.known().get(owner)
        if project is None:
            return NOBODY
        return Audience(org=project.org, users=project.members)

    def sees(self, pool: WorkspacePool, access: WorkspaceAccess, entry: WorkspaceEntry) -> bool:
        """A bot record is the caller's to read or change only when its tags admit them."""
        if entry.scope != Scope.BOT:
            return True
        return bm.record_visible(self.bot_reader(pool, access), entry)

    def bot_reader(self, pool: WorkspacePool, access: WorkspaceAccess) -> Reader:
        """The entry reader of a bot pool for a workspace caller: in the org the caller works
        in with the bot (`bot_orgs`, from the directory: a shared bot's records of another org
        stay out); without it, in the bot's home org when the caller belongs to it (else the
        org the request named)."""
        org = self.bot_org(pool, access)
        return Reader(user=access.account, org=org, channels=access.channels, uses_bot=True)

    @staticmethod
    def bot_org(pool: WorkspacePool, access: WorkspaceAccess) -> str:
        """`bot_reader`'s org alone (what a new bot record is tagged with)."""
        if access.bot_orgs is not None:
            return access.bot_orgs.get(sm.pool_owner(pool.id)) or NOBODY.org
        if pool.bot_org in access.orgs or not access.orgs:
            return pool.bot_org or ""
        return access.orgs[0]
