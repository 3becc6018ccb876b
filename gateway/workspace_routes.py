"""Workspace routes for the signed-in account (docs/requirements.md §11, WA-1): collaboration
chains and bots' rules. Chains live on the home shard of their root chat, so listing asks
every shard."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from actors.contracts import access_key
from actors.ports import EnginePort, ShardPort
from engine.bot_policy import parse_profile_patch, profile
from engine.directory import Principal, chat_home, require_use
from engine.errors import Forbidden, InvalidInput, NotFound, Unprocessable
from engine.listing import Page, chain_key, decode_cursor, encode_cursor, parse_limit
from engine.self_rules import Editor, parse_update, rules_view
from gateway import wire
from gateway.auth import Auth
from gateway.json_response import json, read_body


class WorkspaceApi:
    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth

    async def collaborations(self, request: Request) -> Response:
        """One page (`{items, nextCursor}`, engine/listing.py) of the chains the caller may
        see, newest first: each shard answers its first `limit + 1` after the cursor, so the
        merged page and whether another follows need nothing more."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        cursor = request.query_params.get("cursor") or None
        limit = parse_limit(request.query_params.get("limit"))
        after = decode_cursor(cursor)
        pages = await asyncio.gather(
            *(
                shard.collaborations(principal.user.id, principal.channels, after, limit + 1)
                for shard in self.engine.shard_ports
            )
        )
        merged = (c for p in pages for c in p)
        chains = sorted(merged, key=lambda c: (c.createdAt, c.id), reverse=True)
        shown = chains[:limit]
        more = len(chains) > limit
        last = shown[-1] if shown else None
        next_cursor = encode_cursor(chain_key(last.createdAt, last.id)) if more and last else None
        return json(Page(items=shown, nextCursor=next_cursor))

    async def stop_collaboration(self, request: Request) -> Response:
        principal = await self.auth.user(request)
        assert principal.user is not None
        chain_id = request.path_params["id"]
        for shard in self.engine.shard_ports:
            stopped = await shard.stop_collaboration(
                chain_id, principal.user.id, principal.channels
            )
            if stopped is not None:
                return json(stopped)
        raise NotFound(f"no collaboration {chain_id}", code="collaboration_not_found")

    async def _used_pools(self, principal: Principal) -> dict[int, tuple[ShardPort, list[str]]]:
        """The caller's bots' memory pools by shard: the bots they may use."""
        by_shard: dict[int, tuple[ShardPort, list[str]]] = {}
        for bot_id in sorted(principal.bots):
            bot = await self.auth.bot(bot_id)
            shard = self.engine.shard_port(bot.owner)
            by_shard.setdefault(id(shard), (shard, []))[1].append(f"bot:{bot.id}")
        return by_shard

    async def memory_jobs(self, request: Request) -> Response:
        """Background learning (extraction) jobs of the caller's turns (SC-2, CO-3)."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        jobs = []
        for shard, pools in (await self._used_pools(principal)).values():
            jobs.extend(await shard.memory_jobs(pools, principal.user.id, principal.channels))
        jobs.sort(key=lambda j: (j.created_at, j.id))
        return json({"jobs": jobs})

    async def retry_memory_job(self, request: Request) -> Response:
        principal = await self.auth.user(request)
        assert principal.user is not None
        job_id = request.path_params["id"]
        for shard, pools in (await self._used_pools(principal)).values():
            job = await shard.retry_memory_job(job_id, pools, principal.user.id, principal.channels)
            if job is not None:
                return json(job)
        raise NotFound(f"no memory job {job_id}", code="job_not_found")

    async def group_mode(self, request: Request) -> Response:
        """Switch a group's mode, only while it is idle (WS-6: else 409)."""
        principal = await self.auth.user(request)
        channel_id = request.path_params["channel"]
        if channel_id not in principal.channels:
            raise Forbidden("you are not a member of this group", code="not_member")
        body = wire.decode(await read_body(request), wire.GroupMode)
        directory = self.engine.directory_port
        channel = await directory.get_channel(channel_id)
        if body.mode not in ("discussion", "delivery"):
            raise InvalidInput("mode must be discussion or delivery", code="invalid_mode")
        if body.mode == "delivery" and body.leader not in channel.bots:
            raise Unprocessable("a delivery group needs a leader among its bots", code="no_leader")
        chat = await directory.group_chat(channel_id)
        home = self.engine.shard_port(chat_home(chat))
        # The home shard checks that the group is idle and switches under the chat's turn
        # lock: no turn can start between the check and the switch.
        channel = await home.switch_group_mode(chat.id, channel_id, body.mode, body.leader)
        self.auth.directory_changed(access_key("channel", channel_id))
        return json(channel)

    async def bot_rules(self, request: Request) -> Response:
        """GET: a bot's rules for anyone who uses it; PATCH: changed by a person with write
        (WS-3: users edit rules in the client), checked against `expectedRevision`."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        bot = await self.engine.directory_port.get_bot(request.path_params["bot"])
        require_use(bot, principal.user)
        if request.method == "GET":
            return json(rules_view(bot))
        update = parse_update(wire.decode_any(await read_body(request)))
        editor = Editor(kind="user", id=principal.user.id)
        changed = await self.engine.directory_port.update_rules(bot.id, update, editor)
        self.auth.directory_changed(access_key("bot", bot.id))
        return json(rules_view(changed))

    async def bot_profile(self, request: Request) -> Response:
        """GET: the bot and the team/collaboration status the server gives it (WS-1). PATCH
        (write): `autoRecord` pauses or resumes learning after every turn; a client's old
        per-bot `team`/`collaboration` toggles are accepted and never override the policy."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        directory = self.engine.directory_port
        bot = await directory.get_bot(request.path_params["bot"])
        require_use(bot, principal.user)
        ignored: list[str] = []
        if request.method == "PATCH":
            auto_record, ignored = parse_profile_patch(wire.decode_any(await read_body(request)))
            paused = bot.autoRecordPaused if auto_record is None else not auto_record
            bot = await directory.pause_auto_record(bot.id, paused, principal.user.id)
            self.auth.directory_changed(access_key("bot", bot.id))
        org = await directory.get_org(bot.org)
        return json(profile(bot, org, ignored))

    async def archive_bot(self, request: Request) -> Response:
        """Archive (or, with `{"archived": false}`, restore) a bot; needs write (WS-3)."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        directory = self.engine.directory_port
        bot = await directory.get_bot(request.path_params["bot"])
        require_use(bot, principal.user)
        raw = await read_body(request)
        body = wire.decode(raw, wire.Archive) if raw.strip() else wire.Archive()
        editor = Editor(kind="user", id=principal.user.id)
        bot = await directory.archive_bot(bot.id, body.archived, editor)
        self.auth.directory_changed(access_key("bot", bot.id))
        return json(profile(bot, await directory.get_org(bot.org)))
