"""What a bot's step reads of memory, all ranked by the one memory search (SC-5, SC-7).

The prompt's memory (the bot's, the person's and the project's scopes packed in one budget),
`workspace_memory_search`, and the enrichment and confessor context all rank through the same
function as the workspace and bot memory routes (actors/workspace/search.py): each shard's
listing is asked the step's query, and several shards' rankings are combined as the workspace
route combines them (`engine.workspace_search.combine`). So every path orders one query the same
way for the same reader and the same pools. An enrichment or confessor context asks the bot's own
pool alone; on a shard without semantic search it ranks inside the read that fills it, by the
same keyword walk and fusion (`actors.workspace.search.context_first`), and asks no listing.

Which scopes a step sees: in a person's direct chat, the person's own scope (when the bot is of
their account, SC-1) and the chat's project; in a group chat, the projects its channel is linked
to, under the project's membership rules (the person of the turn must be a member; every person
of a linked channel is one, engine/projects.py). A person's memory is never the room's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from actors.chats.step_policy import reader_for
from actors.contracts import StepInput, WorkspaceAccess, WorkspaceListing, WorkspaceQuery
from actors.runtime.peers import Peers
from actors.shard.memory_reader import CONTEXT_HITS, MemoryReader, Snapshot
from actors.workspace.search import context_first
from engine.directory import bot_pool
from engine.errors import OpenBotError
from engine.listing import MAX_LIMIT
from engine.memory_entries import Reader
from engine.memory_union import as_scoped
from engine.prompt_budget import Prepared, ScopedEntry
from engine.scoped_memory import WorkspaceEntryView
from engine.workspace_search import FUSION_WEIGHTS, combine

CHAT_HITS = 10  # items `workspace_chat_search` answers with
PACK_HITS = 64  # ranked entries the prompt offers first when not everything fits
LISTED = 200  # entries of a workspace scope read for the prompt


class StepMemory:
    def __init__(self, *, memory: MemoryReader, peers: Peers, keyword_only: bool = False) -> None:
        self.memory = memory
        self.peers = peers
        # No semantic search on this shard: a ranking awaits nothing, so a context of the bot's
        # own pool ranks inside its one read (`context`).
        self.keyword_only = keyword_only

    async def scopes(
        self, step: StepInput, q: str | None = None, limit: int = LISTED, *, bot: bool = False
    ) -> list[tuple[int, WorkspaceQuery]]:
        """Where the step's memory lives, one query per shard. With `bot`, the bot's own pool
        is asked too (a search ranks it with the rest); else it is read apart, as the prompt
        reads the bot's whole usable memory."""
        peers = self.peers
        pools: dict[int, list[str]] = {}
        projects: dict[int, tuple[str, ...] | None] = {}
        linked: str | None = None
        if bot:
            pools.setdefault(peers.index_of(step.bot.owner), []).append(bot_pool(step.bot.id))
        if step.chat.kind in ("direct", "review"):
            if step.bot.owner == step.operator:
                pools.setdefault(peers.index_of(step.operator), []).append(f"user:{step.operator}")
            if step.chat.project:
                owner = await peers.directory().project_owner(step.chat.project)
                if owner is not None:
                    projects[peers.index_of(owner)] = (step.chat.project,)
        elif step.chat.kind == "group" and step.channel:
            # SC-5: the projects the channel is linked to, wherever they live; each shard
            # names only projects the person of the turn is a member of.
            linked = step.channel
            projects = dict.fromkeys(range(peers.count))
        return [
            (
                index,
                WorkspaceQuery(
                    pools=tuple(pools.get(index, ())),
                    projects=projects.get(index, ()),
                    linked=linked if index in projects else None,
                    q=q,
                    limit=limit,
                ),
            )
            for index in sorted(set(pools) | set(projects))
        ]

    @staticmethod
    def access(step: StepInput, reader: Reader) -> WorkspaceAccess:
        return WorkspaceAccess(
            account=step.operator,
            bots=frozenset({step.bot.id}),
            orgs=(step.chat.org,),
            channels=reader.channels,
        )

    async def _listings(
        self, step: StepInput, reader: Reader, wanted: list[tuple[int, WorkspaceQuery]]
    ) -> list[WorkspaceListing]:
        access = self.access(step, reader)

        async def one(index: int, query: WorkspaceQuery) -> WorkspaceListing | None:
            try:
                return await self.peers.shard(index).workspace_entries(access, query, reader)
            except OpenBotError:  # a scope that cannot be read now is left out, not guessed
                return None

        if len(wanted) == 1:  # (awaited as it is: no task, no turn of the loop)
            found = [await one(*wanted[0])]
        else:
            found = await asyncio.gather(*(one(i, q) for i, q in wanted))
        return [x for x in found if x is not None]

    async def ranked(
        self, step: StepInput, reader: Reader, q: str, limit: int, *, scopes: bool = True
    ) -> list[WorkspaceEntryView]:
        """The step's memory ranked for `q` by the one memory search, best first: the bot's
        own pool as `reader` may use it, and with `scopes` the person's and the projects'."""
        if not q.strip():
            return []
        if scopes:
            wanted = await self.scopes(step, q, limit, bot=True)
        else:
            own = WorkspaceQuery(pools=(bot_pool(step.bot.id),), projects=(), q=q, limit=limit)
            wanted = [(self.peers.index_of(step.bot.owner), own)]
        listings = await self._listings(step, reader, wanted)
        views = {e.id: e for listing in listings for e in listing.entries}
        hits = combine([(x.hits, x.semantic, x.fused) for x in listings], limit)
        return [views[h.id] for h in hits if h.id in views]

    async def packed(self, step: StepInput, reader: Reader, instructions: str) -> str:
        """SC-5: the bot's, the person's and the project's memory in one budget; when it does
        not all fit, what the input finds is offered first (`engine.prompt_budget.pack`)."""
        async with self.memory.read(bot_pool(step.bot.id), reader) as snap:
            scoped: list[ScopedEntry] = snap.usable_made("prompt", as_scoped)
        for listing in await self._listings(step, reader, await self.scopes(step)):
            scoped.extend(
                ScopedEntry(
                    id=e.id,
                    scope=str(e.scope),
                    tier=str(e.tier),
                    content=e.content,
                    updated_at=e.updatedAt,
                    source=e.pool
                    if e.pool == f"bot:{e.contributor}"
                    else f"{e.pool} · {e.contributor}",
                )
                for e in listing.entries
            )
        if not scoped:
            return ""
        prepared = Prepared(scoped)
        if step.wake != "person" or not prepared.overflows(instructions=instructions):
            return prepared.pack(instructions=instructions).text
        first = [e.id for e in await self.ranked(step, reader, step.text, PACK_HITS)]
        return prepared.pack(instructions=instructions, first=first).text

    async def context(
        self, step: StepInput, reader: Reader, text: str, limit: int
    ) -> tuple[list[tuple[str, str]], bool]:
        """The enrichment or confessor context of the bot's memory for `text`: in memory order
        when it all fits; else what the one memory search finds for `text` first."""
        pool = bot_pool(step.bot.id)
        if self.keyword_only and self.peers.index_of(step.bot.owner) == self.peers.index:
            # The ranking `ranked(..., scopes=False)` makes, found in the read that fills the
            # context, and only when not all fits: no listing, no second read.
            analyzer = self.memory.kernel.analyzer(pool)

            def rank(snap: Snapshot, usable: Callable[[str], bool] | None) -> list[str]:
                keys = analyzer.query(text) if text.strip() else []
                return context_first(snap, keys, CONTEXT_HITS, FUSION_WEIGHTS, usable)

            parts, has, _ = await self.memory.context_for(pool, reader, limit, rank=rank)
            return parts, has
        # The memory-order fill costs the read little more than asking whether all fits, and
        # it is the context whenever the ranking finds nothing: then it is not read again.
        parts, has, whole = await self.memory.context_for(pool, reader, limit)
        if whole or not text.strip():
            return parts, has
        first = [e.id for e in await self.ranked(step, reader, text, CONTEXT_HITS, scopes=False)]
        if not first:
            return parts, has
        parts, has, _ = await self.memory.context_for(pool, reader, limit, first)
        return parts, has

    async def chats_readable(self, step: StepInput) -> list[tuple[str, str]]:
        """(chat id, home key) of the chats whose history `workspace_chat_search` searches:
        in a group, the group's own chat; in a person's direct chat, the chats of that person
        (by the chat routes' listing rule) in the chat's org that this bot takes part in. A
        person's other chats are never the room's; a delivery between bots searches none."""
        if reader_for(step) is None:
            return []
        chat = step.chat
        if chat.kind == "group":
            return [(chat.id, chat.home or (chat.channel or ""))]
        if chat.kind != "direct":
            return []
        directory, bot = self.peers.directory(), step.bot.id
        found: list[tuple[str, str]] = []
        cursor: str | None = None
        while True:
            page = await directory.list_chats(step.operator, cursor, MAX_LIMIT)
            for c in page.items:
                if c.org != chat.org:
                    continue
                if c.kind in ("direct", "review") and c.bot == bot:
                    found.append((c.id, step.bot.owner))  # its home: the bot's owner
                elif c.kind == "group" and c.channel and any(m.id == bot for m in c.bots):
                    found.append((c.id, c.channel))  # its home: the channel
            cursor = page.nextCursor
            if cursor is None:
                return found

    async def search_chats(self, step: StepInput, query: str) -> list[dict]:
        """`workspace_chat_search`: the history of `chats_readable`, ranked by each home
        shard as `GET /v1/search` ranks it, best first."""
        if not query.strip():
            return []
        homes: dict[int, list[str]] = {}
        for chat_id, key in await self.chats_readable(step):
            homes.setdefault(self.peers.index_of(key), []).append(chat_id)
        found = await asyncio.gather(
            *(self.peers.shard(i).search_chats(c, query, CHAT_HITS) for i, c in homes.items())
        )
        hits = {h.chat + "/" + h.item.id: h for part in found for h in part.items}
        ranked = combine([(x.hits, x.semantic, x.fused) for x in found], CHAT_HITS)
        return [
            {
                "chat": hits[h.id].chat,
                "item": hits[h.id].item.id,
                "author": hits[h.id].item.author,
                "text": hits[h.id].item.text,
            }
            for h in ranked
            if h.id in hits
        ]
