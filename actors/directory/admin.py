"""The directory's writes other than chats: orgs, users and tokens, bots and grants, channels,
bots' own rules, and which account holds each workspace project.

Writes are compare-and-set: every change checks what it depends on (an id is free, a revision
is current) and stores its record under the records' one write lock (records.py), so no other
change slips in at the store's `await` between the check and the write.

Org boundaries: a bot's owner, and a channel's people and bots, belong to the org of the bot or
channel (422 `not_in_org`, `bot_not_in_org`); a bot's grantees belong to an org it works in (its
own, or one an admin shared it with), and only people of its home org may hold write.
"""

from __future__ import annotations

import secrets

import msgspec

from actors.contracts import access_key
from actors.directory.records import DirectoryRecords, new_id
from engine.bot_policy import require_team
from engine.directory import (
    MAX_CHANNEL_BOTS,
    Bot,
    BotRules,
    Channel,
    Org,
    OrgSettings,
    Permission,
    User,
    bot_orgs,
    check_id,
    permission,
)
from engine.errors import Conflict, Forbidden, InvalidInput, NotFound, Unprocessable
from engine.self_rules import Editor, RulesUpdate, new_member, set_archived, update_rules
from storage.directory_store import hash_token


class DirectoryAdmin:
    def __init__(self, records: DirectoryRecords) -> None:
        self.records = records

    # --- admin ---

    async def create_org(
        self, name: str, id: str | None = None, settings: OrgSettings | None = None
    ) -> Org:
        async with self.records.lock:
            org = Org(
                id=self.records.fresh_id(self.records.orgs, id, "o_", "org"),
                name=name,
                settings=settings or OrgSettings(),
            )
            await self.records.put("orgs", org, self.records.orgs)
            return org

    async def patch_org(self, org_id: str, settings: dict) -> Org:
        async with self.records.changing():
            org = self.records.org(org_id)
            merged = msgspec.structs.asdict(org.settings) | settings
            try:
                new_settings = msgspec.convert(merged, OrgSettings)
            except msgspec.ValidationError as e:
                raise InvalidInput(f"settings: {e}", code="invalid_settings") from e
            org = msgspec.structs.replace(org, settings=new_settings)
            await self.records.put("orgs", org, self.records.orgs)
            return org

    async def create_user(
        self, name: str, orgs: list[str], id: str | None = None
    ) -> tuple[User, str]:
        # Answered once every gateway applied it: none answers the new token from a miss it
        # cached while a request with it was on its way (gateway/auth.py `_Misses`).
        async with self.records.changing():
            for o in orgs:
                self.records.org(o)
            user = User(
                id=self.records.fresh_id(self.records.users, id, "u_", "user"),
                name=name,
                orgs=tuple(orgs),
            )
            token = "obt_" + secrets.token_urlsafe(32)
            await self.records.put(
                "users",
                user,
                self.records.users,
                token=(hash_token(token), user.id, self.records.clock()),
            )
            self.records.tokens[hash_token(token)] = user.id
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
        async with self.records.lock:
            self.records.org(org)
            self.records.require_in_org(owner, org, "owner")
            bot = Bot(
                id=self.records.fresh_id(self.records.bots, id, "b_", "bot"),
                name=name,
                org=org,
                owner=owner,
                kind=kind,
                linked=linked,
                model=model,
                rules=rules or BotRules(name=name),
                avatar=avatar,
            )
            await self.records.put("bots", bot, self.records.bots)
            return bot

    async def patch_bot(self, bot_id: str, changes: dict) -> Bot:
        """An admin's change of a bot's `name`, `model` or `avatar` (the gateway checked the
        model's name). Rules that carried the old name follow a rename. Under the write lock:
        a grant or rules change made meanwhile is kept."""
        if "name" in changes and not changes["name"].strip():
            raise InvalidInput("a bot needs a name", code="invalid_name")
        async with self.records.changing():
            bot = self.records.bot(bot_id)
            rules = bot.rules
            if "name" in changes and rules.name in ("", bot.name):
                rules = msgspec.structs.replace(rules, name=changes["name"])
            bot = msgspec.structs.replace(bot, rules=rules, **changes)
            await self.records.put("bots", bot, self.records.bots)
            return bot

    async def grant(self, bot_id: str, user_id: str, permission: Permission) -> Bot:
        async with self.records.lock:
            bot = self.records.bot(bot_id)
            user = self.records.user(user_id)
            if not any(o in user.orgs for o in bot_orgs(bot)):
                self.records.require_in_org(user_id, bot.org, "grantee")  # raises not_in_org
            if permission == Permission.WRITE and bot.org not in user.orgs:
                # Write changes the bot for every org it works in (rules, purge, budget).
                raise Unprocessable(
                    f"grantee {user_id!r} of a shared org may hold read, not write",
                    code="write_needs_home_org",
                    details={"user": user_id, "org": bot.org},
                )
            bot = msgspec.structs.replace(bot, grants={**bot.grants, user_id: permission})
            await self.records.put("bots", bot, self.records.bots)
            return bot

    async def share_bot(self, bot_id: str, org_id: str) -> Bot:
        """Let the bot work in another org too (MB-1). Sharing it again, or with its home org,
        changes nothing. Check and write under the one write lock: concurrent shares all land."""
        async with self.records.lock:
            bot = self.records.bot(bot_id)
            self.records.org(org_id)
            if org_id in bot_orgs(bot):
                return bot
            bot = msgspec.structs.replace(bot, sharedOrgs=(*bot.sharedOrgs, org_id))
            await self.records.put("bots", bot, self.records.bots)
            # Who may use the bot changed for every person of the org: cached principals go.
            self.records.access.bump()
            return bot

    async def unshare_bot(self, bot_id: str, org_id: str) -> Bot:
        """Stop the bot working in `org_id`: its chats there take no more turns and its memory
        written there is seen by no one (no work happens in that org with it any more). Grants
        of people who belong to none of the orgs it still works in go with it, so sharing it
        again later gives them nothing back. Answered once every gateway dropped what it cached
        (a revocation)."""
        async with self.records.lock:
            bot = self.records.bot(bot_id)
            if org_id not in bot.sharedOrgs:
                raise NotFound(f"{bot_id!r} is not shared with {org_id!r}", code="share_not_found")
            remaining = tuple(o for o in bot.sharedOrgs if o != org_id)
            kept = {bot.org, *remaining}
            grants = {
                u: p
                for u, p in bot.grants.items()
                if u in self.records.users and kept & set(self.records.users[u].orgs)
            }
            bot = msgspec.structs.replace(bot, sharedOrgs=remaining, grants=grants)
            await self.records.put("bots", bot, self.records.bots)
            revision = self.records.access.bump()
        await self.records.access.settled(revision)
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
        async with self.records.lock:
            self.records.org(org)
            for u in people:
                self.records.require_in_org(u, org, "person")
            for b in bots:
                if self.records.bot(b).org != org:
                    raise Unprocessable(
                        f"bot {b!r} is not a bot of org {org!r}",
                        code="bot_not_in_org",
                        details={"bot": b, "org": org},
                    )
            if mode == "delivery":  # WS-6: a leader with team permission
                require_team(self.records.bots[leader], self.records.orgs[org])
            channel = Channel(
                id=self.records.fresh_id(self.records.channels, id, "c_", "channel"),
                org=org,
                name=name,
                people=tuple(dict.fromkeys(people)),
                bots=tuple(dict.fromkeys(bots)),
                mode=mode,
                leader=leader,
            )
            await self.records.put("channels", channel, self.records.channels)
            return channel

    async def set_mode(self, channel_id: str, mode: str, leader: str | None) -> Channel:
        """Switch a group between equal discussion and a delivery goal (WS-6). Only the shard
        that keeps the group's chat calls this, holding the chat's turn lock after finding the
        group idle (ShardService.switch_group_mode): no turn starts in between."""
        if mode not in ("discussion", "delivery"):
            raise InvalidInput("mode must be discussion or delivery", code="invalid_mode")
        async with self.records.changing():
            ch = self.records.channel(channel_id)
            if mode == "delivery" and (leader is None or leader not in ch.bots):
                raise Unprocessable(
                    "a delivery group needs a leader among its bots", code="no_leader"
                )
            if mode == "delivery":
                require_team(self.records.bot(leader), self.records.orgs[ch.org])
            ch = msgspec.structs.replace(
                ch, mode=mode, leader=leader if mode == "delivery" else None
            )
            await self.records.put("channels", ch, self.records.channels)
            return ch

    # --- taking access away (answered once every gateway dropped what it cached) ---

    async def revoke_grant(self, bot_id: str, user_id: str) -> Bot:
        async with self.records.lock:
            bot = self.records.bot(bot_id)
            if user_id not in bot.grants:
                raise NotFound(f"{user_id!r} has no grant on {bot_id!r}", code="grant_not_found")
            grants = {u: p for u, p in bot.grants.items() if u != user_id}
            bot = msgspec.structs.replace(bot, grants=grants)
            await self.records.put("bots", bot, self.records.bots)
            revision = self.records.access.revision
        await self.records.access.settled(revision)
        return bot

    async def new_token(self, user_id: str) -> str:
        """A new token for the user; every token it had before stops working."""
        async with self.records.lock:
            self.records.user(user_id)
            token = "obt_" + secrets.token_urlsafe(32)
            await self.records.store.replace_tokens(
                user_id, (hash_token(token), user_id, self.records.clock())
            )
            replaced = [h for h, u in self.records.tokens.items() if u == user_id]
            for old in replaced:
                del self.records.tokens[old]
            self.records.tokens[hash_token(token)] = user_id
            keys = [access_key("token", h) for h in (*replaced, hash_token(token))]
            revision = self.records.access.bump([access_key("user", user_id), *keys])
        await self.records.access.settled(revision)
        return token

    # --- bots' own rules (WS-2, WS-3) ---

    async def update_rules(self, bot_id: str, update: RulesUpdate, editor: Editor) -> Bot:
        """Compare-and-set on the rules' revision: of concurrent edits naming one revision,
        exactly one is applied and the others get `stale_revision`."""
        async with self.records.changing():
            bot = update_rules(self.records.bot(bot_id), update, editor)
            await self.records.put("bots", bot, self.records.bots)
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
        async with self.records.lock:
            creator = self.records.bot(creator_id)
            require_team(creator, self.records.org(creator.org))  # WS-1: team building
            made = self.records.bots.get(bot_id) if bot_id is not None else None
            if made is not None:
                if made.creator != creator_id:
                    raise Conflict(f"bot {bot_id} exists", code="bot_exists")
                return made
            bot_id = bot_id or new_id("b_")
            bot = new_member(creator, bot_id=bot_id, name=name, prompt=prompt, rules=rules)
            await self.records.put("bots", bot, self.records.bots)
            return bot

    async def archive_bot(self, bot_id: str, archived: bool, editor: Editor) -> Bot:
        """WS-3: its creator bot or a person with write archives (or restores) a bot."""
        async with self.records.changing():
            bot = set_archived(self.records.bot(bot_id), archived, editor)
            await self.records.put("bots", bot, self.records.bots)
            return bot

    async def pause_auto_record(self, bot_id: str, paused: bool, user: str) -> Bot:
        """WS-1: a person with write pauses (or resumes) auto-record for one bot."""
        async with self.records.changing():
            bot = self.records.bot(bot_id)
            if permission(bot, user) != Permission.WRITE:
                raise Forbidden("you need write on this bot", code="no_write")
            bot = msgspec.structs.replace(bot, autoRecordPaused=paused)
            await self.records.put("bots", bot, self.records.bots)
            return bot

    # --- workspace projects ---

    async def register_project(self, project_id: str, owner: str) -> str:
        """Record that `owner`'s shard holds project `project_id` (a repeat is a no-op); an id
        another account registered is a conflict. Returns the owner."""
        check_id(project_id, "project id")
        async with self.records.lock:
            known = self.records.project_owners.get(project_id)
            if known is not None:
                if known != owner:
                    raise Conflict(f"project {project_id!r} already exists", code="exists")
                return known
            await self.records.store.put_project_owner(project_id, owner)
            self.records.project_owners[project_id] = owner
            return owner

    async def project_owner(self, project_id: str) -> str | None:
        return self.records.project_owners.get(project_id)

    async def workspace_people(
        self, org: str, users: list[str], channels: list[str]
    ) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        """For a project of `org`: the given users who are not people of the org (unknown or of
        another org), and the people of each given channel that exists in the org."""
        outsiders = [
            u for u in users if u not in self.records.users or org not in self.records.users[u].orgs
        ]
        people = {
            c: self.records.channels[c].people
            for c in channels
            if c in self.records.channels and self.records.channels[c].org == org
        }
        return outsiders, people
