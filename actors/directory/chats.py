"""The directory's chats (records.py holds the records): a person's
direct or review chat with a bot, a channel's one group chat, and the `agent` chat of each
delivery of a collaboration chain. Each is made once however many ask at the same time: the
check for an existing chat and the write happen under the records' one write lock."""

from __future__ import annotations

import asyncio
import logging

import msgspec

from actors.directory.records import DirectoryRecords, new_id
from engine.directory import Bot, Chat, agent_chat_id, bot_org, require_use
from engine.directory import agent_chat as make_agent_chat
from engine.errors import Forbidden, InvalidInput, NotFound, Unprocessable

log = logging.getLogger("openbot.directory")
# Shown agent chats are written together after this long: a chain's hops show one every few
# milliseconds, and a transaction per hop cost this actor ~3 ms of CPU each (a shard lists them
# in its own rows until a durable registration confirms them, so waiting loses nothing).
WRITE_GATHER_S = 0.1


class ChatRegistry:
    def __init__(self, records: DirectoryRecords) -> None:
        self.records = records
        self._unwritten: dict[str, Chat] = {}  # agent chats visible here, not written yet
        self._writing: set[asyncio.Task] = set()

    def unwritten(self) -> int:
        """Agent chats shown (visible here) and not on disk yet."""
        return len(self._unwritten)

    def writers(self) -> int:
        """Background writers of shown chats in flight (at most one at a time)."""
        return len(self._writing)

    async def written(self) -> None:
        """Wait until the background writers of shown chats are done (a chat shown while one
        runs is its to write): everything shown so far is on disk, or stays waiting for a
        durable registration if the write failed."""
        while self._writing:
            await asyncio.gather(*self._writing)

    async def create_chat(
        self,
        user_id: str,
        org: str | None,
        *,
        bot: str | None = None,
        channel: str | None = None,
        project: str | None = None,
        kind: str | None = None,
        project_org: str | None = None,
    ) -> Chat:
        """A direct (or review) chat with a bot, or the group chat of a channel: a channel has
        one group chat, so every member who opens it gets the same conversation (opening it is
        idempotent: concurrent opens all get the one chat).

        A direct chat works in an org of the bot's (engine/directory.py `bot_org`: its home
        org, or one it is shared with); `org`, when given (the `OpenBot-Org` header), must be
        one of the user's orgs and one the bot works in. A selected project (whose membership the
        gateway checked) must be of the chat's org: its memory goes into the bot's prompt."""
        if (bot is None) == (channel is None):
            raise InvalidInput("a chat needs exactly one of bot or channel", code="invalid_chat")
        if kind not in (None, "review", "direct", "group"):
            raise InvalidInput("kind may only be review", code="invalid_chat")
        async with self.records.lock:
            return await self._create_chat(user_id, org, bot, channel, project, kind, project_org)

    async def _create_chat(
        self,
        user_id: str,
        org: str | None,
        bot: str | None,
        channel: str | None,
        project: str | None,
        kind: str | None,
        project_org: str | None = None,
    ) -> Chat:
        user = self.records.user(user_id)
        if bot is not None:
            b = self.records.bot(bot)
            require_use(b, user)
            if kind not in (None, "review", "direct"):
                raise InvalidInput("kind may only be review", code="invalid_chat")
            org = bot_org(b, user, org)
            chat_kind = "review" if kind == "review" else "direct"
            home = b.owner
        else:
            assert channel is not None
            ch = self.records.channels.get(channel)
            if ch is None or ch.org not in user.orgs:
                # Another org's channel answers as one that does not exist: a probe learns
                # nothing about other orgs' channel ids.
                raise NotFound(f"no channel {channel!r}", code="channel_not_found")
            if user_id not in ch.people:
                raise Forbidden("you are not a member of this channel", code="not_member")
            if kind not in (None, "group"):
                raise InvalidInput("a channel's chat is a group chat", code="invalid_chat")
            org, chat_kind, home = ch.org, "group", ch.id
            existing = self.records.group_chats.get(ch.id)
            if existing is not None:
                return self.records.chats[existing]
        if project is not None and project_org is not None and project_org != org:
            # As for a project you are not a member of: another org's project is not found.
            raise NotFound(f"no project {project}", code="project_not_found")
        chat = Chat(
            id=new_id("chat_"),
            kind=chat_kind,
            owner=user_id,
            org=org,
            bot=bot,
            channel=channel,
            project=project,
            created_at=self.records.clock(),
            home=home,
        )
        await self.records.put("chats", chat, self.records.chats)
        if channel is not None:
            self.records.group_chats[channel] = chat.id
        return chat

    async def set_project(
        self, chat_id: str, user_id: str, project: str | None, project_org: str | None
    ) -> Chat:
        """Set, change or clear (None) the current project of a person's direct or review chat
        (WS-7); the chat as stored now, its revision one higher (the same record when nothing
        changes). The gateway checked that the person is a member of `project` (of org
        `project_org`) where the project lives; here: the chat is the person's, they still
        use its bot, and the project is of the chat's org (its memory goes into the prompt).

        A gateway keeps chat records with what it caches of access, so the change bumps the
        access revision and answers once every live gateway dropped the old record: no turn
        that starts after this returned packs the old project's memory."""
        async with self.records.changing():
            chat = self.records.chat(chat_id)
            user = self.records.user(user_id)
            if chat.org not in user.orgs:
                raise NotFound(f"no chat {chat_id!r}", code="chat_not_found")
            if chat.owner != user_id:
                raise Forbidden("only the chat's owner may change it", code="not_chat_owner")
            if chat.kind not in ("direct", "review") or chat.bot is None:
                # A group works in the projects its channel is linked to (every person of it a
                # member); an agent chat keeps the project of the chat it serves.
                raise Unprocessable(
                    "only a direct or review chat selects a project; link a group's channel "
                    "to the project instead",
                    code="chat_kind_has_no_project",
                )
            require_use(self.records.bot(chat.bot), user, chat.org)
            if project is not None and project_org != chat.org:
                raise NotFound(f"no project {project}", code="project_not_found")
            if chat.project == project:
                return chat
            changed = msgspec.structs.replace(chat, project=project, revision=chat.revision + 1)
            await self.records.put("chats", changed, self.records.chats)
            self.records.access.bump()
            return changed

    async def agent_chat(self, root: Chat, peer: str, chain: str, link: str) -> Chat:
        """The `agent` chat in which `peer` works on one delivery of a collaboration chain (made
        on first use; engine/directory.py `agent_chat`)."""
        async with self.records.lock:
            self.records.bot(peer)
            existing = self.records.chats.get(agent_chat_id(link))
            if existing is not None:
                return existing
            chat = make_agent_chat(root, peer, chain, link, self.records.clock())
            await self.records.put("chats", chat, self.records.chats)
            return chat

    async def register_chats(self, chats: list[Chat], durable: bool = True) -> int:
        """Record `agent` chats a chain's home shard made itself; a chat already known is left
        as it is (a shard may register again after a restart). Returns how many were new.
        Only agent chats of a known org and bot, named after their link, are taken.

        With `durable`, answers once every one of them is on disk. Without, answers as soon as
        they are visible here (a delivery's items are announced only after that) and writes
        them soon after, in the background, with the others shown meanwhile (WRITE_GATHER_S):
        the shard lists the chats in its own stored rows until a durable registration
        confirms them (actors/chats/agent_chats.py), so a crash before the write loses
        nothing."""
        if not durable:  # no await between the check and the act: no lock to wait behind
            new = self._show(chats)
            if new and all(t.done() for t in self._writing):
                task = asyncio.get_running_loop().create_task(self._write_soon())
                self._writing.add(task)
                task.add_done_callback(self._writing.discard)
            return len(new)
        async with self.records.lock:
            new = self._show(chats)
            if any(c.id in self._unwritten for c in chats):
                await self._write_chats()
        return len(new)

    def _show(self, chats: list[Chat]) -> list[Chat]:
        """Check and take the chats into memory in one step (nothing awaited); the new ones."""
        for chat in chats:
            if chat.kind != "agent" or not chat.id.startswith(agent_chat_id("")):
                raise InvalidInput(f"{chat.id!r} is not an agent chat", code="invalid_chat")
            self.records.org(chat.org)
            self.records.bot(chat.bot or "")
        new: list[Chat] = []
        for chat in chats:
            if chat.id not in self.records.chats:
                self.records.chats[chat.id] = self._unwritten[chat.id] = chat
                new.append(chat)
        return new

    async def _write_chats(self) -> None:
        """Store the chats that are visible but not written yet, in one transaction (callers
        hold the write lock); on failure they stay waiting for the next write."""
        waiting = dict(self._unwritten)
        await self.records.store.put_many("chats", list(waiting.values()))
        for chat_id in waiting:
            self._unwritten.pop(chat_id, None)

    async def _write_soon(self) -> None:
        """Write what is shown and unwritten after WRITE_GATHER_S, until nothing is left (chats
        shown while this runs are its to write: no second writer is started meanwhile)."""
        try:
            while True:
                await asyncio.sleep(WRITE_GATHER_S)
                async with self.records.lock:
                    if not self._unwritten:
                        return
                    await self._write_chats()
        except Exception:  # they stay waiting; a durable registration writes them
            log.exception("writing agent chats failed")

    async def delivery_chat(
        self, root_id: str, peer: str, asker: str, chain: str, link: str
    ) -> tuple[Chat, Bot, Bot]:
        """One call per delivery of a collaboration chain: its `agent` chat (made on first
        use, as `agent_chat`), the peer bot that works in it and the bot that asked (the one
        the answer wakes), both read now."""
        root = self.records.chat(root_id)
        chat = await self.agent_chat(root, peer, chain, link)
        return (
            chat,
            self.records.bot(peer),
            self.records.bot(asker),
        )

    async def review_chat(self, request_id: str, user_id: str, org: str, bot_id: str) -> Chat:
        """The `review` chat in which `user_id` talks a request over with the bot (ENR-3): one
        per request and person, kept with the bot (its home is the bot owner's shard, where
        the request is)."""
        async with self.records.lock:  # check-then-create: one chat however many ask at once
            bot = self.records.bot(bot_id)
            require_use(bot, self.records.user(user_id), org)
            chat_id = f"chat_review_{request_id}_{user_id}"
            existing = self.records.chats.get(chat_id)
            if existing is not None:
                return existing
            chat = Chat(
                id=chat_id,
                kind="review",
                owner=user_id,
                org=org,
                bot=bot.id,
                created_at=self.records.clock(),
                home=bot.owner,
            )
            await self.records.put("chats", chat, self.records.chats)
            return chat

    async def group_chat(self, channel_id: str) -> Chat:
        """The channel's group chat, created (owned by its first person) when it has none yet."""
        ch = self.records.channel(channel_id)
        existing = self.records.group_chats.get(ch.id)
        if existing is not None:
            return self.records.chats[existing]
        if not ch.people:
            raise Unprocessable("the channel has no people", code="empty_channel")
        async with self.records.lock:
            return await self._create_chat(ch.people[0], None, None, ch.id, None, None)
