"""The directory's reads (records.py holds the records): who a token is,
single records, a chat with its whole context, the access revision gateways watch, and the
cursor pages of the listing routes. Reads take no lock: records change in memory only after
their write committed."""

from __future__ import annotations

from actors.access_watch import POLL_WAIT
from actors.directory.records import DirectoryRecords
from engine.directory import (
    Bot,
    Channel,
    Chat,
    ChatContext,
    Org,
    Principal,
    User,
    may_use,
    permission,
    works_in,
)
from engine.errors import NotFound
from engine.listing import Page, bot_entry, channel_entry, chat_entry, chat_sees, page


def _id_key(record) -> str:
    return record.id


def _chat_key(chat: Chat) -> str:
    return f"{chat.created_at:015d}/{chat.id}"


class DirectoryReads:
    def __init__(self, records: DirectoryRecords) -> None:
        self.records = records

    async def authenticate(self, token_hash: str) -> Principal | None:
        user_id = self.records.tokens.get(token_hash)
        if user_id is None:
            return None
        user = self.records.users[user_id]
        # The person's own records (index.py), not every bot and channel.
        channels = frozenset(self.records.index.channels_of(user_id))
        bots = frozenset(
            b for b in self.records.index.bots_of(user_id) if may_use(self.records.bots[b], user)
        )
        unshared = frozenset(
            f"{b}\x00{o}" for b in bots for o in user.orgs if not works_in(self.records.bots[b], o)
        )
        return Principal(user=user, channels=channels, bots=bots, unshared=unshared)

    async def get_bot(self, bot_id: str) -> Bot:
        return self.records.bot(bot_id)

    async def find_bot(self, org: str, name_or_id: str) -> Bot:
        """A bot of `org` by id, or by its name (case-insensitive) when that is unique."""
        bot = self.records.bots.get(name_or_id)
        if bot is not None and bot.org == org:
            return bot
        folded = name_or_id.strip().casefold()
        found = [
            b for b in self.records.bots.values() if b.org == org and b.name.casefold() == folded
        ]
        if len(found) != 1:
            raise NotFound(f"no bot {name_or_id!r} in this org", code="bot_not_found")
        return found[0]

    async def get_org(self, org_id: str) -> Org:
        return self.records.org(org_id)

    async def get_chat(self, chat_id: str) -> Chat:
        return self.records.chat(chat_id)

    async def chat_context(self, chat_id: str) -> ChatContext:
        """The chat, its org and its bot or its channel with the channel's bots, in one call:
        a turn's whole context (bots read now, so rules a bot changed apply from the next
        turn, WS-2)."""
        chat = self.records.chat(chat_id)
        channel = None
        members: tuple[Bot, ...] = ()
        if chat.channel is not None:
            channel = self.records.channel(chat.channel)
            members = tuple(self.records.bot(b) for b in channel.bots)
        bot = None if chat.bot is None else self.records.bot(chat.bot)
        org = self.records.org(chat.org)
        return ChatContext(chat=chat, org=org, bot=bot, channel=channel, members=members)

    async def get_user(self, user_id: str) -> User:
        return self.records.user(user_id)

    async def get_channel(self, channel_id: str) -> Channel:
        return self.records.channel(channel_id)

    async def watch_access(
        self, watcher: str, since: int, wait: float = POLL_WAIT
    ) -> tuple[int, tuple[str, ...] | None]:
        """The access revision once it is past `since` (or `wait` passed), with the keys
        changed since (None: drop everything; access_watch.py)."""
        return await self.records.access.watch_changes(watcher, since, wait)

    async def unwatch_access(self, watcher: str) -> None:
        """A gateway that stops watching: revocations no longer wait for it."""
        self.records.access.leave(watcher)

    async def authenticate_at(self, token_hash: str) -> tuple[int, Principal | None]:
        """`authenticate` with the access revision it reflects (gateway caches keep it)."""
        return self.records.access.revision, await self.authenticate(token_hash)

    async def bot_at(self, bot_id: str) -> tuple[int, Bot]:
        return self.records.access.revision, self.records.bot(bot_id)

    async def chat_context_at(self, chat_id: str) -> tuple[int, ChatContext]:
        """`chat_context` with the access revision it reflects: a gateway caches its parts
        (gateway/auth.py), so later turns of the chat, and new chats with the same bot, ask
        nothing until the revision moves."""
        return self.records.access.revision, await self.chat_context(chat_id)

    # --- listing (cursor pages; engine/listing.py) ---

    async def list_chats(
        self, user_id: str, cursor: str | None, limit: int, kind: str | None = None
    ) -> Page:
        """The person's chats (their own, and their channels' group chats), oldest first."""
        channels = frozenset(self.records.index.channels_of(user_id))
        mine = (
            c
            for c in self.records.chats.values()
            if chat_sees(c, user_id, channels) and (kind is None or c.kind == kind)
        )
        got = page(mine, _chat_key, cursor, limit)
        entries = [
            chat_entry(c, self.records.bots, self.records.channels, self.records.users)
            for c in got.items
        ]
        return Page(items=entries, nextCursor=got.nextCursor)

    async def list_user_bots(self, user_id: str, cursor: str | None, limit: int) -> Page:
        user = self.records.user(user_id)
        usable = (
            b
            for b in map(self.records.bots.__getitem__, self.records.index.bots_of(user_id))
            if may_use(b, user)
        )
        got = page(usable, _id_key, cursor, limit)
        entries = [bot_entry(b, permission(b, user_id)) for b in got.items]  # type: ignore[arg-type]
        return Page(items=entries, nextCursor=got.nextCursor)

    async def list_user_channels(self, user_id: str, cursor: str | None, limit: int) -> Page:
        mine = (self.records.channels[c] for c in self.records.index.channels_of(user_id))
        got = page(mine, _id_key, cursor, limit)
        entries = [channel_entry(c, self.records.bots, self.records.users) for c in got.items]
        return Page(items=entries, nextCursor=got.nextCursor)

    async def list_records(
        self, table: str, cursor: str | None, limit: int, org: str | None = None
    ) -> Page:
        """Admin lists of orgs, users, bots or channels, optionally of one org."""
        records = {
            "orgs": self.records.orgs,
            "users": self.records.users,
            "bots": self.records.bots,
            "channels": self.records.channels,
        }[table]
        if org is None:
            chosen = records.values()
        elif table == "orgs":
            chosen = [records[org]] if org in records else []
        elif table == "users":
            chosen = [u for u in self.records.users.values() if org in u.orgs]
        elif table == "bots":  # its own and those shared with it
            chosen = [b for b in self.records.bots.values() if works_in(b, org)]
        else:
            chosen = [r for r in records.values() if r.org == org]
        return page(chosen, _id_key, cursor, limit)
