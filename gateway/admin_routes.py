"""Admin routes (docs/design.md §9): the directory's orgs, users, bots, grants and channels,
and backups.
Every route takes the admin token; a model name is checked against the server's config here, so a
typo fails at creation rather than at the bot's first turn."""

from __future__ import annotations

from msgspec import UNSET
from starlette.requests import Request
from starlette.responses import Response

from actors.contracts import access_key
from actors.ports import EnginePort
from engine.errors import Unprocessable
from gateway import wire
from gateway.auth import Auth
from gateway.json_response import json, read_body


class AdminApi:
    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth

    def _check_model(self, name: object) -> None:
        """A model is named in the server's config; a typo fails here, not at the first turn."""
        known = self.engine.models
        if known is None or not isinstance(name, str) or name in known:
            return
        choices = ", ".join(sorted(known)) or "none configured"
        raise Unprocessable(f"unknown model {name!r} (models: {choices})", code="unknown_model")

    async def create_org(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateOrg)
        if body.settings is not None:
            self._check_model(body.settings.botMemoryModel)
        org = await self.engine.directory_port.create_org(body.name, body.id, body.settings)
        return json(org, 201)

    async def patch_org(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.PatchOrg)
        self._check_model(body.settings.get("botMemoryModel"))
        org = await self.engine.directory_port.patch_org(request.path_params["id"], body.settings)
        return json(org)

    async def create_user(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateUser)
        user, token = await self.engine.directory_port.create_user(body.name, body.orgs, body.id)
        return json(wire.UserCreated(id=user.id, name=user.name, orgs=user.orgs, token=token), 201)

    async def create_bot(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateBot)
        self._check_model(body.model)
        bot = await self.engine.directory_port.create_bot(
            name=body.name,
            org=body.org,
            owner=body.owner,
            id=body.id,
            kind=body.kind,
            linked=body.linked,
            model=body.model,
            rules=body.rules,
            avatar=body.avatar,
        )
        self.auth.directory_changed(access_key("bot", bot.id), access_key("user", bot.owner))
        return json(bot, 201)

    async def patch_bot(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.PatchBot)
        changes = {
            f: getattr(body, f) for f in body.__struct_fields__ if getattr(body, f) is not UNSET
        }
        self._check_model(changes.get("model"))
        bot = await self.engine.directory_port.patch_bot(request.path_params["id"], changes)
        self.auth.directory_changed(access_key("bot", bot.id))
        return json(bot)

    async def create_grant(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateGrant)
        await self.engine.directory_port.grant(body.bot, body.user, body.permission)
        self.auth.directory_changed(access_key("bot", body.bot), access_key("user", body.user))
        return json({"bot": body.bot, "user": body.user, "permission": body.permission}, 201)

    async def revoke_grant(self, request: Request) -> Response:
        await self.auth.admin(request)
        bot, user = request.path_params["bot"], request.path_params["user"]
        await self.engine.directory_port.revoke_grant(bot, user)
        self.auth.directory_changed(access_key("bot", bot), access_key("user", user))
        return json({"bot": bot, "user": user, "revoked": True})

    async def share_bot(self, request: Request) -> Response:
        """Let a bot work in another org too (its people still need a grant to use it)."""
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.ShareBot)
        bot = await self.engine.directory_port.share_bot(request.path_params["bot"], body.org)
        self.auth.drop(None)  # who may use the bot changed for every person of the org
        return json(bot)

    async def unshare_bot(self, request: Request) -> Response:
        """Answered once every gateway stopped serving the bot in that org (a revocation)."""
        await self.auth.admin(request)
        bot_id, org = request.path_params["bot"], request.path_params["org"]
        bot = await self.engine.directory_port.unshare_bot(bot_id, org)
        self.auth.drop(None)
        return json(bot)

    async def new_token(self, request: Request) -> Response:
        await self.auth.admin(request)
        user = request.path_params["id"]
        token = await self.engine.directory_port.new_token(user)
        self.auth.directory_changed(access_key("user", user))
        return json({"id": user, "token": token})

    async def create_channel(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.CreateChannel)
        channel = await self.engine.directory_port.create_channel(
            org=body.org,
            people=body.people,
            bots=body.bots,
            id=body.id,
            name=body.name,
            mode=body.mode,
            leader=body.leader,
        )
        people = (access_key("user", u) for u in channel.people)
        self.auth.directory_changed(access_key("channel", channel.id), *people)
        return json(channel, 201)

    async def backup(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.Backup)
        files = await self.engine.backup(body.dir, with_key=body.withKey)
        return json({"dir": body.dir, "files": files}, 201)
