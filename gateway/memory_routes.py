"""Bot memory routes (docs/design.md §9): read, search, remember, forget, widen, purge, the memory
log and the memory bot's settings. Reads are served from this gateway's `ReadCache`; every write
drops the pool's cached pages around it, so a client reads its own writes."""

from __future__ import annotations

import asyncio

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from actors.contracts import RememberCall
from actors.ports import EnginePort, ShardPort
from engine import tags as tagmod
from engine import widening
from engine.directory import (
    Bot,
    Principal,
    bot_org,
    bot_orgs,
    bot_pool,
    require_use,
    require_write,
)
from engine.errors import OpenBotError
from engine.memory_bot_settings import SettingsPatch
from engine.memory_entries import Reader
from engine.numbers import query_number
from gateway import wire
from gateway.auth import Auth, org_header
from gateway.events import Hub
from gateway.json_response import JsonBytes, json, read_body
from gateway.read_cache import ReadCache

_packer = msgspec.msgpack.Encoder()


class MemoryApi:
    def __init__(self, engine: EnginePort, auth: Auth, hub: Hub) -> None:
        self.engine = engine
        self.auth = auth
        self.hub = hub
        self.cache = ReadCache(hub)

    async def _memory_call(
        self, request: Request, *, write: bool = False
    ) -> tuple[Bot, ShardPort, Reader]:
        """Caller, bot, the bot's shard and the caller's reader for a memory route."""
        principal = await self.auth.user(request)
        assert principal.user is not None
        bot_id = request.path_params["bot"]
        # (`bot` when the cache does not hold it: a coroutine less on most requests)
        bot = self.auth.known_bot(bot_id) or await self.auth.bot(bot_id)
        (require_write if write else require_use)(bot, principal.user)
        reader = _reader(principal, org_header(request), bot)
        return bot, self.engine.shard_port(bot.owner), reader

    def cached_page(self, token: str, bot_id: str, org: str | None) -> bytes | None:
        """What `get_memory` answers without a query, when this gateway's caches hold all of
        it: the token's user and the bot (gateway/auth.py), and the reader's page, still
        current (gateway/read_cache.py). The same checks run as on the route: a user token,
        use of the bot, the org (`org`: the OpenBot-Org header). None: take the route, which
        answers whatever this cannot, errors included. Never awaits, never asks an actor."""
        principal = self.auth.known(token)
        if principal is None or principal.user is None:
            return None
        bot = self.auth.known_bot(bot_id)
        if bot is None:
            return None
        try:
            require_use(bot, principal.user)
            reader = _reader(principal, org, bot)
        except OpenBotError:
            return None
        return self.cache.get(ReadCache.key(bot_pool(bot.id), reader, ()))

    async def get_memory(self, request: Request) -> Response:
        bot, shard, reader = await self._memory_call(request)
        wanted: tuple[str, ...] = ()
        if request.scope.get("query_string"):  # (parsing even an empty one costs a read more)
            query = request.query_params
            q = query.get("q")
            limit = _limit(query.get("limit"))  # checked even where it is not used
            if q is not None and q.strip():
                # Ranked keyword search: never cached, the ranking is per query.
                found = await shard.search_memory_json(bot_pool(bot.id), reader, q, limit)
                return Response(found, media_type="application/json")
            raw = query.get("tags")
            if raw:
                wanted = tuple(sorted({t.strip() for t in raw.split(",") if t.strip()}))
        pool = bot_pool(bot.id)
        key = ReadCache.key(pool, reader, wanted)
        body = self.cache.get(key)
        if body is None:
            generation = self.cache.generation(pool)
            await self.hub.start()
            epoch, fill, body = await shard.read_memory_json(pool, reader, wanted)
            shard_index = self.engine.shard_index(bot.owner)
            self.cache.put(key, shard_index, epoch, fill, body, generation)
        return JsonBytes(body)

    def _writing(self, pool: str) -> _Writing:
        return _Writing(self.cache, pool)

    async def post_memory(self, request: Request) -> Response:
        bot, shard, reader = await self._memory_call(request)
        body = wire.decode_memory_command(await read_body(request))
        command = body.command
        pool = bot_pool(bot.id)
        with self._writing(pool):
            if isinstance(command, wire.Remember):
                remember = RememberCall(
                    pool=pool,
                    reader=reader,
                    content=command.content,
                    topics=tuple(command.tags),
                    request_id=body.requestId,
                )
                # One bytes each way (remember_packed): the reply is the HTTP body.
                created = await shard.remember_packed(_packer.encode(remember))
                return JsonBytes(created, 201)
            entry = await shard.forget(pool, reader, command.id, body.requestId)
            return json(entry)

    async def widen(self, request: Request) -> Response:
        """ACL-4: anyone who uses the bot may ask; every source's rule decides (409 when not)."""
        bot, shard, reader = await self._memory_call(request)
        body = wire.decode(await read_body(request), wire.Widen)
        widening.check_grant(body.to)
        pool = bot_pool(bot.id)
        with self._writing(pool):
            done = await shard.widen(pool, request.path_params["id"], body.to, reader.user)
        return json(done)

    async def memory_log(self, request: Request) -> Response:
        bot, shard, reader = await self._memory_call(request)
        body = await shard.memory_log_json(bot_pool(bot.id), reader)
        return Response(body, media_type="application/json")

    async def purge(self, request: Request) -> Response:
        bot, shard, _ = await self._memory_call(request, write=True)
        body = wire.decode(await read_body(request), wire.Purge)
        tagmod.validate_purge_tag(body.tag)
        with self._writing(bot_pool(bot.id)):
            count = await shard.purge(bot_pool(bot.id), body.tag)
        if body.tag.startswith("chat:"):
            # What the bot's memory bot learned from the chat for people and projects too:
            # their pools are on any shard (API-5).
            chat = body.tag.removeprefix("chat:")
            found = await asyncio.gather(
                *(s.workspace_purge_learned(bot.id, chat) for s in self.engine.shard_ports)
            )
            count += sum(found)
        return json({"count": count})

    async def get_memory_bot(self, request: Request) -> Response:
        # The settings are the memory's management, as PATCH: write on a non-linked bot.
        bot, shard, _ = await self._memory_call(request, write=True)
        return json(await shard.memory_bot_view(bot_pool(bot.id), bot_orgs(bot)))

    async def patch_memory_bot(self, request: Request) -> Response:
        bot, shard, _ = await self._memory_call(request, write=True)
        patch = wire.decode(await read_body(request), SettingsPatch)
        return json(await shard.patch_memory_bot_settings(bot_pool(bot.id), patch))


class _Writing:
    """Around a write: this gateway's cached pages of the pool go, before and after, so its
    clients read their own writes even before the change's event arrives. (A plain context
    manager: an async one costs a generator and its steps on every write.)"""

    __slots__ = ("cache", "pool")

    def __init__(self, cache: ReadCache, pool: str) -> None:
        self.cache = cache
        self.pool = pool

    def __enter__(self) -> None:
        self.cache.forget_pool(self.pool)

    def __exit__(self, *exc: object) -> None:
        self.cache.forget_pool(self.pool)


MEMORY_SEARCH_LIMIT = 20
MAX_MEMORY_SEARCH_LIMIT = 500


def _limit(raw: str | None) -> int:
    return query_number(
        raw, field="limit", low=1, high=MAX_MEMORY_SEARCH_LIMIT, default=MEMORY_SEARCH_LIMIT
    )


def _reader(principal: Principal, requested: str | None, bot: Bot) -> Reader:
    """The caller reading or writing through `bot`: in the org they work in with it
    (engine/directory.py `bot_org`, `requested`: the OpenBot-Org header; a Remember is tagged
    `org:<that org>`, never with an org the bot does not work in)."""
    assert principal.user is not None
    org = bot_org(bot, principal.user, requested)
    return Reader(user=principal.user.id, org=org, channels=principal.channels, uses_bot=True)
