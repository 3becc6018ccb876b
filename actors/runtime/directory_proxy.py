"""`DirectoryPort` (actors/ports.py) over the directory actor: typed methods that name the remote
method as an attribute, with Ray's failures mapped as every actor call maps them
(actors/runtime/shard_proxy.py `remote`)."""

from __future__ import annotations

from actors.contracts import ACCESS_POLL_WAIT
from actors.runtime.shard_proxy import NamedActor, remote
from engine.directory import (
    Bot,
    BotRules,
    Channel,
    Chat,
    ChatContext,
    Org,
    OrgSettings,
    Permission,
    Principal,
    User,
)
from engine.listing import Page
from engine.self_rules import Editor, RulesUpdate


class RayDirectory(NamedActor):
    """`DirectoryPort` over the directory actor named `name`."""

    async def get_org(self, org_id: str) -> Org:
        return await remote(self._actor().get_org, org_id)

    async def get_chat(self, chat_id: str) -> Chat:
        return await remote(self._actor().get_chat, chat_id)

    async def get_channel(self, channel_id: str) -> Channel:
        return await remote(self._actor().get_channel, channel_id)

    async def get_bot(self, bot_id: str) -> Bot:
        return await remote(self._actor().get_bot, bot_id)

    async def find_bot(self, org: str, name_or_id: str) -> Bot:
        return await remote(self._actor().find_bot, org, name_or_id)

    async def group_chat(self, channel_id: str) -> Chat:
        return await remote(self._actor().group_chat, channel_id)

    async def agent_chat(self, root: Chat, peer: str, chain: str, link: str) -> Chat:
        return await remote(self._actor().agent_chat, root, peer, chain, link)

    async def delivery_chat(
        self, root_id: str, peer: str, asker: str, chain: str, link: str
    ) -> tuple[Chat, Bot, Bot]:
        return await remote(self._actor().delivery_chat, root_id, peer, asker, chain, link)

    async def register_chats(self, chats: list[Chat], durable: bool = True) -> int:
        return await remote(self._actor().register_chats, chats, durable)

    async def set_mode(self, channel_id: str, mode: str, leader: str | None) -> Channel:
        return await remote(self._actor().set_mode, channel_id, mode, leader)

    async def update_rules(self, bot_id: str, update: RulesUpdate, editor: Editor) -> Bot:
        return await remote(self._actor().update_rules, bot_id, update, editor)

    async def create_member(
        self,
        creator_id: str,
        name: str,
        prompt: str | None,
        rules: dict | None,
        bot_id: str | None = None,
    ) -> Bot:
        return await remote(self._actor().create_member, creator_id, name, prompt, rules, bot_id)

    async def archive_bot(self, bot_id: str, archived: bool, editor: Editor) -> Bot:
        return await remote(self._actor().archive_bot, bot_id, archived, editor)

    async def project_owner(self, project_id: str) -> str | None:
        return await remote(self._actor().project_owner, project_id)

    async def register_project(self, project_id: str, owner: str) -> str:
        return await remote(self._actor().register_project, project_id, owner)

    async def workspace_people(
        self, org: str, users: list[str], channels: list[str]
    ) -> tuple[list[str], dict[str, tuple[str, ...]]]:
        return await remote(self._actor().workspace_people, org, users, channels)

    # --- what a gateway asks ---

    async def authenticate_at(self, token_hash: str) -> tuple[int, Principal | None]:
        return await remote(self._actor().authenticate_at, token_hash)

    async def bot_at(self, bot_id: str) -> tuple[int, Bot]:
        return await remote(self._actor().bot_at, bot_id)

    async def chat_context_at(self, chat_id: str) -> tuple[int, ChatContext]:
        return await remote(self._actor().chat_context_at, chat_id)

    async def watch_access(self, watcher: str, since: int, wait: float = ACCESS_POLL_WAIT) -> int:
        return await remote(self._actor().watch_access, watcher, since, wait)

    async def create_org(
        self, name: str, id: str | None = None, settings: OrgSettings | None = None
    ) -> Org:
        return await remote(self._actor().create_org, name, id, settings)

    async def patch_org(self, org_id: str, settings: dict) -> Org:
        return await remote(self._actor().patch_org, org_id, settings)

    async def create_user(
        self, name: str, orgs: list[str], id: str | None = None
    ) -> tuple[User, str]:
        return await remote(self._actor().create_user, name, orgs, id)

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
        return await remote(
            self._actor().create_bot,
            name=name,
            org=org,
            owner=owner,
            id=id,
            kind=kind,
            linked=linked,
            model=model,
            rules=rules,
            avatar=avatar,
        )

    async def patch_bot(self, bot_id: str, changes: dict) -> Bot:
        return await remote(self._actor().patch_bot, bot_id, changes)

    async def grant(self, bot_id: str, user_id: str, permission: Permission) -> Bot:
        return await remote(self._actor().grant, bot_id, user_id, permission)

    async def revoke_grant(self, bot_id: str, user_id: str) -> Bot:
        return await remote(self._actor().revoke_grant, bot_id, user_id)

    async def new_token(self, user_id: str) -> str:
        return await remote(self._actor().new_token, user_id)

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
        return await remote(
            self._actor().create_channel,
            org=org,
            people=people,
            bots=bots,
            id=id,
            name=name,
            mode=mode,
            leader=leader,
        )

    async def backup(self, dest_dir: str) -> str:
        return await remote(self._actor().backup, dest_dir)

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
        return await remote(
            self._actor().create_chat,
            user_id,
            org,
            bot=bot,
            channel=channel,
            project=project,
            kind=kind,
            project_org=project_org,
        )

    async def chat_context(self, chat_id: str) -> ChatContext:
        return await remote(self._actor().chat_context, chat_id)

    async def review_chat(self, request_id: str, user_id: str, org: str, bot_id: str) -> Chat:
        return await remote(self._actor().review_chat, request_id, user_id, org, bot_id)

    async def pause_auto_record(self, bot_id: str, paused: bool, user: str) -> Bot:
        return await remote(self._actor().pause_auto_record, bot_id, paused, user)

    async def list_chats(
        self, user_id: str, cursor: str | None, limit: int, kind: str | None = None
    ) -> Page:
        return await remote(self._actor().list_chats, user_id, cursor, limit, kind)

    async def list_user_bots(self, user_id: str, cursor: str | None, limit: int) -> Page:
        return await remote(self._actor().list_user_bots, user_id, cursor, limit)

    async def list_user_channels(self, user_id: str, cursor: str | None, limit: int) -> Page:
        return await remote(self._actor().list_user_channels, user_id, cursor, limit)

    async def list_records(
        self, table: str, cursor: str | None, limit: int, org: str | None = None
    ) -> Page:
        return await remote(self._actor().list_records, table, cursor, limit, org)
