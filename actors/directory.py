"""The directory actor: orgs, users and tokens, bots and grants, channels, chats
(actors/directory_chats.py).

Held in memory, stored in `directory.duckdb`. Admin routes change it; every request reads it
(through the gateway's short cache) to learn who is asking and what they may use.

Writes are compare-and-set (issue 12): every change checks what it depends on (an id is free, a
revision is current, a channel has no group chat yet) and stores its record under one write lock,
so no other change slips in at the store's `await` between the check and the write. The lock
guards only the directory's memory and its one DuckDB thread (where writes are serial anyway);
no other actor is awaited while it is held. Reads take no lock: memory changes after a commit.

Org boundaries: a bot's owner and grantees, and a channel's people and bots, belong to the org
of the bot or channel (422 `not_in_org`, `bot_not_in_org`); a direct chat works in its bot's org.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec

from actors.access_watch import AccessWatch
from actors.contracts import access_key
from actors.directory_chats import DirectoryChats, new_id
from actors.directory_index import AccessIndex
from engine.bot_policy import require_team
from engine.directory import (
    MAX_CHANNEL_BOTS,
    Bot,
    BotRules,
    Channel,
    Chat,
    Org,
    OrgSettings,
    Permission,
    User,
    check_id,
    permission,
)
from engine.errors import Conflict, Forbidden, InvalidInput, NotFound, Unprocessable
from engine.self_rules import Editor, RulesUpdate, new_member, set_archived, update_rules
from storage.crypto import Keyring, load_master_key
from storage.database import Database
from storage.directory_store import MIGRATIONS, DirectoryStore, hash_token


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DirectoryService(DirectoryChats):
    def __init__(
        self,
        data_dir: str | Path,
        *,
        clock: Callable[[], int] = _now_ms,
        db_path: str | None = None,
    ) -> None:
        self.store = DirectoryStore(
            Database(db_path or Path(data_dir) / "directory.duckdb", MIGRATIONS),
            Keyring(load_master_key(Path(data_dir))),
        )
        records, self._tokens = self.store.load()
        self.orgs: dict[str, Org] = records["orgs"]
        self.users: dict[str, User] = records["users"]
        self.bots: dict[str, Bot] = records["bots"]
        self.channels: dict[str, Channel] = records["channels"]
        self.chats: dict[str, Chat] = records["chats"]
        self._group_chats = {c.channel: c.id for c in self.chats.values() if c.kind == "group"}
        self.project_owners: dict[str, str] = self.store.load_project_owners()
        self.clock = clock
        # One writer at a time: a change's checks and its write with nothing in between.
        self._write = asyncio.Lock()
        self._unwritten: dict[str, Chat] = {}  # agent chats visible, not yet written
        self._writing: set[asyncio.Task] = set()
        self.access = AccessWatch()  # what gateways cache of who may do what (access_watch.py)
        self.access_index = AccessIndex(self.bots, self.channels)  # (directory_index.py)

    @contextlib.asynccontextmanager
    async def _changing(self) -> AsyncIterator[None]:
        """The write lock for a change to a record gateways may hold (an org's settings, a
        bot's rules, model, archive or pause flag, a channel's mode): answered once every live
        gateway has applied it (access_watch.py `settled`), as a revocation is. Gateways cache
        turn contexts (gateway/auth.py), so no turn that starts after the change returned
        runs with the record as it was (WS-2, WS-3)."""
        async with self._write:
            before = self.access.revision
            yield
            revision = self.access.revision
        if revision != before:
            await self.access.settled(revision)

    def _fresh_id(self, table: dict, given: str | None, prefix: str, what: str) -> str:
        if given is None:
            return new_id(prefix)
        check_id(given, what)
        if given in table:
            raise Conflict(f"{what} {given!r} already exists", code="exists")
        return given

    def _require_in_org(self, user_id: str, org: str, role: str) -> User:
        """A bot's owner or grantee, or a channel's person, is a person of that org."""
        user = self._get(self.users, user_id, "user")
        if org not in user.orgs:
            raise Unprocessable(
                f"{role} {user_id!r} is not a member of org {org!r}",
                code="not_in_org",
                details={"user": user_id, "org": org},
            )
        return user

    # --- admin ---

    async def create_org(
        self, name: str, id: str | None = None, settings: OrgSettings | None = None
    ) -> Org:
        async with self._write:
            org = Org(
                id=self._fresh_id(self.orgs, id, "o_", "org"),
                name=name,
                settings=settings or OrgSettings(),
            )
            await self._put("orgs", org, self.orgs)
            return org

    async def patch_org(self, org_id: str, settings: dict) -> Org:
        async with self._changing():
            org = self._get(self.orgs, org_id, "org")
            merged = msgspec.structs.asdict(org.settings) | settings
            try:
                new_settings = msgspec.convert(merged, OrgSettings)
            except msgspec.ValidationError as e:
                raise InvalidInput(f"settings: {e}", code="invalid_settings") from e
            org = msgspec.structs.replace(org, settings=new_settings)
            await self._put("orgs", org, self.orgs)
            return org

    async def create_user(
        self, name: str, orgs: list[str], id: str | None = None
    ) -> tuple[User, str]:
        # Answered once every gateway applied it: none answers the new token from a miss it
        # cached while a request with it was on its way (gateway/auth.py `_Misses`).
        async with self._changing():
            for o in orgs:
                self._get(self.orgs, o, "org")
            user = User(
                id=self._fresh_id(self.users, id, "u_", "user"), name=name, orgs=tuple(orgs)
            )
            token = "obt_" + secrets.token_urlsafe(32)
            await self._put(
                "users", user, self.users, token=(hash_token(token), user.id, self.clock())
            )
            self._tokens[hash_token(token)] = user.id
            return user, token

    async def create_bot(
        self,
        *,
        name: str,
        org: str,
        owner: str,
        id: str | None = None,
        kind: str = "persistent",
        linked: bool = False,
        model: str | None = None,
        rules: BotRules | None = None,
        avatar: str | None = None,
    ) -> Bot:
        if kind not in ("persistent", "temporary"):
            raise InvalidInput("kind must be persistent or temporary", code="invalid_kind")
        async with self._write:
            self._get(self.orgs, org, "org")
            self._require_in_org(owner, org, "owner")
            bot = Bot(
                id=self._fresh_id(self.bots, id, "b_", "bot"),
                name=name,
                org=org,
                owner=owner,
                kind=kind,
                linked=linked,
                model=model,
                rules=rules or BotRules(name=name),
                avatar=avatar,
            )
            await self._put("bots", bot, self.bots)
            return bot

    async def patch_bot(self, bot_id: str, changes: dict) -> Bot:
        """An admin's change of a bot's `name`, `model` or `avatar` (the gateway checked the
        model's name). Rules that carried the old name follow a rename. Under the write lock:
        a grant or rules change made meanwhile is kept."""
        if "name" in changes and not changes["name"].strip():
            raise InvalidInput("a bot needs a name", code="invalid_name")
        async with self._changing():
            bot = self._get(self.bots, bot_id, "bot")
            rules = bot.rules
            if "name" in changes and rules.name in ("", bot.name):
                rules = msgspec.structs.replace(rules, name=changes["name"])
            bot = msgspec.structs.replace(bot, rules=rules, **changes)
            await self._put("bots", bot, self.bots)
            return bot

    async def grant(self, bot_id: str, user_id: str, permission: Permission) -> Bot:
        async with self._write:
            bot = self._get(self.bots, bot_id, "bot")
            self._require_in_org(user_id, bot.org, "grantee")
            bot = msgspec.structs.replace(bot, grants={**bot.grants, user_id: permission})
            await self._put("bots", bot, self.bots)
            return bot

    async def create_channel(
        self,
        *,
        org: str,
        people: list[str],
        bots: list[str],
        id: str | None = None,
        name: str = "",
        mode: str = "discussion",
        leader: str | None = None,
    ) -> Channel:
        if len(set(bots)) > MAX_CHANNEL_BOTS:
            raise Unprocessable(
                f"a channel has at most {MAX_CHANNEL_BOTS} bots", code="too_many_bots"
            )
        if mode not in ("discussion", "delivery"):
            raise InvalidInput("mode must be discussion or delivery", code="invalid_mode")
        if mode == "delivery" and (leader is None or leader not in bots):
            raise InvalidInput("a delivery channel needs a leader among its bots", code="no_leader")
        async with self._write:
            self._get(self.orgs, org, "org")
            for u in people:
                self._require_in_org(u, org, "person")
            for b in bots:
                if self._get(self.bots, b, "bot").org != org:
                    raise Unprocessable(
                        f"bot {b!r} is not a bot of org {org!r}",
                        code="bot_not_in_org",
                        details={"bot": b, "org": org},
                    )
            if mode == "delivery":  # WS-6: a leader with team permission
                require_team(self.bots[leader], self.orgs[org])
            channel = Channel(
                id=self._fresh_id(self.channels, id, "c_", "channel"),
                org=org,
                name=name,
                people=tuple(dict.fromkeys(people)),
                bots=tuple(dict.fromkeys(bots)),
                mode=mode,
                leader=leader,
            )
            await self._put("channels", channel, self.channels)
            return channel

    async def set_mode(self, channel_id: str, mode: str, leader: str | None) -> Channel:
        """Switch a group between equal discussion and a delivery goal (WS-6). Only the shard
        that keeps the group's chat calls this, holding the chat's turn lock after finding the
        group idle (ShardService.switch_group_mode): no turn starts in between."""
        if mode not in ("discussion", "delivery"):
            raise InvalidInput("mode must be discussion or delivery", code="invalid_mode")
        async with self._changing():
            ch = self._get(self.channels, channel_id, "channel")
            if mode == "delivery" and (leader is None or leader not in ch.bots):
                raise Unprocessable(
                    "a delivery group needs a leader among its bots", code="no_leader"
                )
            if mode == "delivery":
                require_team(self._get(self.bots, leader, "bot"), self.orgs[ch.org])
            ch = msgspec.structs.replace(
                ch, mode=mode, leader=leader if mode == "delivery" else None
            )
            await self._put("channels", ch, self.channels)
            return ch

    # --- taking access away (answered once every gateway dropped what it cached) ---

    async def revoke_grant(self, bot_id: str, user_id: str) -> Bot:
        async with self._write:
            bot = self._get(self.bots, bot_id, "bot")
            if user_id not in bot.grants:
                raise NotFound(f"{user_id!r} has no grant on {bot_id!r}", code="grant_not_found")
            grants = {u: p for u, p in bot.grants.items() if u != user_id}
            bot = msgspec.structs.replace(bot, grants=grants)
            await self._put("bots", bot, self.bots)
            revision = self.access.revision
        await self.access.settled(revision)
        return bot

    async def new_token(self, user_id: str) -> str:
        """A new token for the user; every token it had before stops working."""
        async with self._write:
            self._get(self.users, user_id, "user")
            token = "obt_" + secrets.token_urlsafe(32)
            await self.store.replace_tokens(user_id, (hash_token(token), user_id, self.clock()))
            replaced = [h for h, u in self._tokens.items() if u == user_id]
            for old in replaced:
                del self._tokens[old]
            self._tokens[hash_token(token)] = user_id
            keys = [access_key("token", h) for h in (*replaced, hash_token(token))]
            revision = self.access.bump([access_key("user", user_id), *keys])
        await self.access.settled(revision)
        return token

    # --- bots' own rules (WS-2, WS-3) ---

    async def update_rules(self, bot_id: str, update: RulesUpdate, editor: Editor) -> Bot:
        """Compare-and-set on the rules' revision: of concurrent edits naming one revision,
        exactly one is applied and the others get `stale_revision`."""
        async with self._changing():
            bot = update_rules(self._get(self.bots, bot_id, "bot"), update, editor)
            await self._put("bots", bot, self.bots)
            return bot

    async def create_member(
        self,
        creator_id: str,
        name: str,
        prompt: str | None,
        rules: dict | None,
        bot_id: str | None = None,
    ) -> Bot:
        """`bot_id`: from a caller that may ask again for the same member (a delivery asked
        again after a restart), derived from that request (actors/chats/sent_gate.py): the
        member its creator already made under it is returned as it is now."""
        async with self._write:
            creator = self._get(self.bots, creator_id, "bot")
            require_team(creator, self._get(self.orgs, creator.org, "org"))  # WS-1: team building
            made = self.bots.get(bot_id) if bot_id is not None else None
            if made is not None:
                if made.creator != creator_id:
                    raise Conflict(f"bot {bot_id} exists", code="bot_exists")
                return made
            bot_id = bot_id or new_id("b_")
            bot = new_member(creator, bot_id=bot_id, name=name, prompt=prompt, rules=rules)
            await self._put("bots", bot, self.bots)
            return bot

    async def archive_bot(self, bot_id: str, archived: bool, editor: Editor) -> Bot:
        """WS-3: its creator bot or a person with write archives (or restores) a bot."""
        async with self._changing():
            bot = set_archived(self._get(self.bots, bot_id, "bot"), archived, editor)
            await self._put("bots", bot, self.bots)
            return bot

    async def pause_auto_record(self, bot_id: str, paused: bool, user: str) -> Bot:
        """WS-1: a person with write pauses (or resumes) auto-record for one bot."""
        async with self._changing():
            bot = self._get(self.bots, bot_id, "bot")
            if permission(bot, user) != Permission.WRITE:
                raise Forbidden("you need write on this bot", code="no_write")
            bot = msgspec.structs.replace(bot, autoRecordPaused=paused)
            await self._put("bots", bot, self.bots)
            return bot

    # --- workspace projects (issue 5) ---

    async def register_project(self, project_id: str, owner: str) -> str:
        """Record that `owner`'s shard holds project `project_id` (a repeat is a no-op); an id
        another account registered is a conflict. Returns the owner."""
        check_id(project_id, "project id")
        async with self._write:
            known = self.project_owners.get(project_id)
            if known is not None:
                if known != owner:
                    raise Conflict(f"project {project_id!r} already exists", code="exists")
                return known
            await self.store.put_project_owner(project_id, owner)
            self.project_owners[project_id] = owner
            return owner

    async def project_owner(self, project_id: str) -> str | None:
        return self.project_owners.get(project_id)

    async def workspace_people(
        self, org: str, users: list[str], channels: list[str]
    ) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        """For a project of `org`: the given users who are not people of the org (unknown or of
        another org), and the people of each given channel that exists in the org."""
        outsiders = [u for u in users if u not in self.users or org not in self.users[u].orgs]
        people = {
            c: self.channels[c].people
            for c in channels
            if c in self.channels and self.channels[c].org == org
        }
        return outsiders, people

    async def backup(self, dest_dir: str) -> str:
        dest = Path(dest_dir) / "directory.duckdb"
        await self.store.db.snapshot(dest)
        return str(dest)

    async def ping(self) -> str:
        return "directory"
