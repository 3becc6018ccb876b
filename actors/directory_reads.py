"""The directory's reads (actors/directory.py holds the records and the writes): who a token is,
single records, a chat with its whole context, the access revision gateways watch, and the
cursor pages of the listing routes. Reads take no lock: records change in memory only after
their write committed."""

from __future__ import annotations

from typing import Any

from actors.access_watch import POLL_WAIT, AccessWatch
from actors.directory_index import AccessIndex
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
)
from engine.errors import NotFound
from engine.listing import Page, bot_entry, channel_entry, chat_entry, chat_sees, page


def _id_key(record) -> str:
    return record.id


def _chat_key(chat: Chat) -> str:
    return f"{chat.created_at:015d}/{chat.id}"


class DirectoryReads:
    orgs: dict[str, Org]
    users: dict[str, User]
    bots: dict[str, Bot]
    channels: dict[str, Channel]
    chats: dict[str, Chat]
    _tokens: dict[str, str]
    access: AccessWatch
    access_index: AccessIndex

    def _get(self, table: dict, key: str, what: str) -> Any:
        record = table.get(key)
        if record is None:
            raise NotFound(f"no {what} {key!r}", code=f"{what}_not_found")
        return record

    async def authenticate(self, token_hash: str) -> Principal | None:
        user_id = self._tokens.get(token_hash)
        if user_id is None:
            return None
        user = self.users[user_id]
        # The person's own records (directory_index.py), not every bot and channel.
        channels = frozenset(self.access_index.channels_of(user_id))
        bots = frozenset(
            b for b in self.access_index.bots_of(user_id) if may_use(self.bots[b], user)
        )
        return Principal(user=user, channels=channels, bots=bots)

    async def get_bot(self, bot_id: str) -> Bot:
        return self._get(self.bots, bot_id, "bot")

    async def find_bot(self, org: str, name_or_id: str) -> Bot:
        """A bot of `org` by id, or by its name (case-insensitive) when that is unique."""
        bot = self.bots.get(name_or_id)
        if bot is not None and bot.org == org:
            return bot
        folded = name_or_id.strip().casefold()
        found = [b for b in self.bots.values() if b.org == org and b.name.casefold() == folded]
        if len(found) != 1:
            raise NotFound(f"no bot {name_or_id!r} in this org", code="bot_not_found")
        return found[0]

    async def get_org(self, org_id: str) -> Org:
        return self._get(self.orgs, org_id, "org")

    async def get_chat(self, chat_id: str) -> Chat:
        return self._get(self.chats, chat_id, "chat")

    async def chat_context(self, chat_id: str) -> ChatContext:
        """The chat, its org and its bot or its channel with the channel's bots, in one call:
        a turn's whole context (bots read now, so rules a bot changed apply from the next
        turn, WS-2)."""
        chat = self._get(self.chats, chat_id, "chat")
        channel = None
        members: tuple[Bot, ...] = ()
        if chat.channel is not None:
            channel = self._get(self.channels, chat.channel, "channel")
            members = tuple(self._get(self.bots, b, "bot") for b in channel.bots)
        bot = None if chat.bot is None else self._get(self.bots, chat.bot, "bot")
        org = self._get(self.orgs, chat.org, "org")
        return ChatContext(chat=chat, org=org, bot=bot, channel=channel, members=members)

    async def get_user(self, user_id: str) -> User:
        return self._get(self.users, user_id, "user")

    async def get_channel(self, channel_id: str) -> Channel:
        return self._get(self.channels, channel_id, "channel")

    async def watch_access(
        self, watcher: str, since: int, wait: float = POLL_WAIT
    ) -> tuple[int, tuple[str, ...] | None]:
        """The access revision once it is past `since` (or `wait` passed), with the keys
        changed since (None: drop everything; access_watch.py)."""
        return await self.access.watch_changes(watcher, since, wait)

    async def authenticate_at(self, token_hash: str) -> tuple[int, Principal | None]:
        """`authenticate` with the access revision it reflects (gateway caches keep it)."""
        return self.access.revision, await self.authenticate(token_hash)

    async def bot_at(self, bot_id: str) -> tuple[int, Bot]:
        return self.access.revision, self._get(self.bots, bot_id, "bot")

    async def chat_context_at(self, chat_id: str) -> tuple[int, ChatContext]:
        """`chat_context` with the access revision it reflects: a gateway caches its parts
        (gateway/auth.py), so later turns of the chat, and new chats with the same bot, ask
        nothing until the revision moves."""
        return self.access.revision, await self.chat_context(chat_id)

    # --- listing (cursor pages; engine/listing.py) ---

    async def list_chats(
        self, user_id: str, cursor: str | None, limit: int, kind: str | None = None
    ) -> Page:
        """The person's chats (their own, and their channels' group chats), oldest first."""
        channels = frozenset(self.access_index.channels_of(user_id))
        mine = (
            c
            for c in self.chats.values()
            if chat_sees(c, user_id, channels) and (kind is None or c.kind == kind)
        )
        got = page(mine, _chat_key, cursor, limit)
        entries = [chat_entry(c, self.bots, self.channels, self.users) for c in got.items]
        return Page(items=entries, nextCursor=got.nextCursor)

    async def list_user_bots(self, user_id: str, cursor: str | None, limit: int) -> Page:
        user = self._get(self.users, user_id, "user")
        usable = (
            b
            for b in map(self.bots.__getitem__, self.access_index.bots_of(user_id))
            if may_use(b, user)
        )
        got = page(usable, _id_key, cursor, limit)
        entries = [bot_entry(b, permission(b, user_id)) for b in got.items]  # type: ignore[arg-type]
        return Page(items=entries, nextCursor=got.nextCursor)

    async def list_user_channels(self, user_id: str, cursor: str | None, limit: int) -> Page:
        mine = (self.channels[c] for c in self.access_index.channels_of(user_id))
        got = page(mine, _id_key, cursor, limit)
        entries = [channel_entry(c, self.bots, self.users) for c in got.items]
        return Page(items=entries, nextCursor=got.nextCursor)

    async def list_records(
        self, table: str, cursor: str | None, limit: int, org: str | None = None
    ) -> Page:
        """Admin lists of orgs, users, bots or channels, optionally of one org."""
        records = {
            "orgs": self.orgs,
            "users": self.users,
            "bots": self.bots,
            "channels": self.channels,
        }[table]
        if org is None:
            chosen = records.values()
        elif table == "orgs":
            chosen = [records[org]] if org in records else []
        elif table == "users":
            chosen = [u for u in self.users.values() if org in u.orgs]
        else:
            chosen = [r for r in records.values() if r.org == org]
        return page(chosen, _id_key, cursor, limit)
