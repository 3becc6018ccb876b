"""Bearer authentication and the gateway's cache of who may do what.

Every request names its caller with `Authorization: Bearer <token>`: the admin token, or a user
token the directory issued (stored there only as a hash). Principals and bot records are cached
so that a request costs no directory call; each entry carries the directory's access revision it
was read at (actors/access_watch.py). A background watch long-polls the directory and, as soon as
the revision moves, drops the entries of what the changes touched (every entry when the directory
cannot say); an answer read before a change is never stored after it. A revocation (a token, a
grant) returns only once this gateway has applied it, so no request that starts after it is
served with the old access; the hooks of `on_access_change` (open event sockets re-checking who
they serve, gateway/events.py) run on every change before that acknowledgement, so the same holds
for them. When the watch stops answering the cache is bypassed (every request asks the
directory) until it answers again. `ttl` bounds an entry's age besides; 0 turns caching off.
Each entry is kept with the access keys it depends on (its token and person, its bot, org or
channel). Unknown tokens are remembered as misses (bounded, briefly) so a bad token does not
reach the directory on every request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from actors.contracts import ACCESS_POLL_WAIT as POLL_WAIT
from actors.contracts import access_key
from actors.ports import EnginePort
from engine.directory import Bot, Channel, Chat, ChatContext, Org, Principal, agent_chat_id
from engine.errors import Forbidden, NotFound, OpenBotError, Unauthenticated
from gateway.errors import error_response, status_of
from storage.directory_store import hash_token

# The only HTTP paths answered without a token: exact paths, and path prefixes (the
# web console's static files go here). Everything else, known route or not, needs a valid
# admin or user token before any endpoint runs; endpoints then check what the caller may do.
PUBLIC_PATHS: frozenset[str] = frozenset({"/healthz", "/"})  # "/": the console's page
PUBLIC_PREFIXES: tuple[str, ...] = ("/console/",)  # the console's scripts and styles (no data)
_PRINCIPAL = "openbot.principal"  # where the middleware leaves the caller for the endpoint


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIXES)


log = logging.getLogger("openbot.auth")
TRUST = POLL_WAIT + 0.5  # seconds the cache is used after the watch last answered
# Seconds an agent chat id no shard knew is not asked of every shard again (the directory is
# still asked first, so a chat registered meanwhile is found at once).
AGENT_MISS_TTL = 1.0
# Unknown tokens answered 401 without asking the directory again: the most recent few, for a
# short while (a client retrying a bad token costs one directory call per MISS_TTL). A token's
# creation or replacement drops its miss (the watch names its hash) before the call returns.
MISSES = 4096
MISS_TTL = 2.0
# Tokens whose hash (the directory's key for them) this gateway keeps at hand: a token comes
# back on every request of its client, and hashing it each time is a good part of the work of a
# request answered from the caches. Emptied when full: at worst a token is hashed once more.
HASHED = 10_000


class _Cache:
    """Entries read at a directory access revision, each with the access keys it depends on
    (actors/contracts.py `access_key`): a change drops the entries of the keys it names."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self.ttl = ttl
        self.clock = clock
        self._items: dict[str, tuple[float, Any, tuple[str, ...]]] = {}
        self._by_key: dict[str, set[str]] = {}  # access key → entries that depend on it

    def get(self, key: str) -> Any:
        hit = self._items.get(key)
        if hit is None or hit[0] < self.clock():
            return None
        return hit[1]

    def put(self, key: str, revision: int, value: Any, floor: int, keys: tuple[str, ...]) -> None:
        if revision < floor:
            return  # read before a change this gateway already applied
        if len(self._items) > 50_000:
            self.drop()
        self._pop(key)
        self._items[key] = (self.clock() + self.ttl, value, keys)
        for k in keys:
            self._by_key.setdefault(k, set()).add(key)

    def _pop(self, key: str) -> None:
        hit = self._items.pop(key, None)
        for k in hit[2] if hit is not None else ():
            held = self._by_key.get(k)
            if held is not None:
                held.discard(key)
                if not held:
                    del self._by_key[k]

    def drop(self, access: str | None = None) -> None:
        """Drop the entries that depend on access key `access` (None: every entry)."""
        if access is None:
            self._items.clear()
            self._by_key.clear()
            return
        for key in list(self._by_key.get(access, ())):
            self._pop(key)


class _Misses:
    """Token hashes the directory did not know, at the revision it said so: the `MISSES` most
    recent, each for `MISS_TTL` seconds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._until: OrderedDict[str, float] = OrderedDict()

    def known(self, key: str) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until < self.clock():
            del self._until[key]
            return False
        return True

    def add(self, key: str, revision: int, floor: int) -> None:
        if revision < floor:
            return  # the token may have been made by a change this gateway applied since
        self._until[key] = self.clock() + MISS_TTL
        self._until.move_to_end(key)
        while len(self._until) > MISSES:
            self._until.popitem(last=False)

    def drop(self, key: str | None = None) -> None:
        if key is None:
            self._until.clear()
        else:
            self._until.pop(key, None)


def bearer(header: str) -> str | None:
    """The token of an `Authorization` header's value (None unless it is `Bearer <token>`)."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def bearer_token(conn: HTTPConnection) -> str:
    return scope_bearer(conn.scope)


def first_header(scope: Scope, name: bytes) -> str | None:
    """The value of the scope's first header `name` (lower case), as `request.headers.get`
    reads it, without building the request's header map."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def org_header(conn: HTTPConnection) -> str | None:
    """The `OpenBot-Org` header: the org the caller works in for this request."""
    return first_header(conn.scope, b"openbot-org")


def scope_bearer(scope: Scope) -> str:
    """The token of the scope's first `Authorization` header (Unauthenticated without one)."""
    header = first_header(scope, b"authorization")
    token = bearer(header) if header is not None else None
    if token is None:
        raise Unauthenticated("send Authorization: Bearer <token>", code="missing_token")
    return token


class Auth:
    def __init__(
        self,
        engine: EnginePort,
        admin_token: str,
        ttl: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.admin_token = admin_token
        self._admin = admin_token.encode()
        self._hashed: dict[str, str] = {}  # token → hash_token(token), at most HASHED
        self.ttl = ttl
        self.clock = clock  # (entries' ages and misses; the watch's trust runs on real time)
        self._principals = _Cache(ttl, clock)
        self._bots = _Cache(ttl, clock)
        # A turn's context in parts (gateway/chat_routes.py): orgs, and channels with their
        # bots, at the access revision like bots; chat records change only by a change that
        # moves the access revision (a chat's project, WS-7), so they are kept until it moves
        # a change that names no keys (bounded), and a new chat's first turn asks nothing when
        # its bot and org are known.
        self._orgs = _Cache(ttl, clock)
        self._channels = _Cache(ttl, clock)
        self._misses = _Misses(clock)
        self._chats: dict[str, Chat] = {}
        self._agent_misses: dict[str, float] = {}  # agent chat id → until when it is a miss
        self._applied = 0  # the directory access revision the caches reflect
        self._heard = 0.0  # when the watch last answered (monotonic)
        self._watch: asyncio.Task[None] | None = None
        self._watcher = "gateway-" + secrets.token_hex(8)
        self._closed = False
        self._hooks: list[Callable[[], Awaitable[None]]] = []

    def on_access_change(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Await `hook` whenever the directory's access revision moves, before this gateway
        acknowledges the change: a revocation returns only once it has run (call `watch` to
        have the watch running)."""
        self._hooks.append(hook)

    def watch(self) -> None:
        """Follow the directory's access revision (whatever `ttl`): this gateway counts among
        those a revocation waits for."""
        if self._closed:
            return
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watching())

    async def close(self) -> None:
        """Stop watching and tell the directory, so that no revocation waits for a gateway
        that is gone; the cache is not used from here on."""
        self._closed = True
        self._heard = 0.0
        watch, self._watch = self._watch, None
        if watch is None:
            return
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        try:  # a directory that is gone or slow has nobody to wait for it anyway
            await asyncio.wait_for(self.engine.directory_port.unwatch_access(self._watcher), 5)
        except Exception as e:
            log.warning("leaving the directory watch failed: %r", e)

    def _caching(self) -> bool:
        """Whether the cache may be used now: on, and the watch answering."""
        if self.ttl <= 0:
            return False
        self.watch()
        return time.monotonic() - self._heard < TRUST

    async def _watching(self) -> None:
        while True:
            try:
                revision, changed = await self.engine.directory_port.watch_access(
                    self._watcher, self._applied, POLL_WAIT
                )
            except Exception as e:  # the directory is restarting: no cache until it answers
                self._heard = 0.0
                log.warning("directory watch failed: %r", e)
                await asyncio.sleep(0.5)
                continue
            self._heard = time.monotonic()
            if revision != self._applied:
                # (None from a restarted directory, or a chat's project changed: every
                # entry, chats too; access_watch.py)
                self.drop(changed)
                self._applied = revision
                # Before the next poll, which acknowledges the change.
                for hook in self._hooks:
                    try:
                        await hook()
                    except Exception:
                        log.exception("an access-change hook failed")

    def drop(self, changed: Iterable[str] | None) -> None:
        """Drop the entries that depend on the access keys `changed` (None: every entry)."""
        caches = (self._principals, self._bots, self._orgs, self._channels)
        if changed is None:
            for cache in caches:
                cache.drop()
            self._misses.drop()
            self._chats.clear()
            return
        for key in changed:
            for cache in caches:
                cache.drop(key)
            if key.startswith("token:"):
                self._misses.drop(key.removeprefix("token:"))

    async def principal_for(self, token: str) -> Principal:
        if hmac.compare_digest(token.encode(), self._admin):
            return Principal(admin=True)
        key = self.key_of(token)
        caching = self._caching()
        principal = self._principals.get(key) if caching else None
        if principal is None:
            if caching and self._misses.known(key):
                raise Unauthenticated("unknown token", code="bad_token")
            revision, principal = await self.engine.directory_port.authenticate_at(key)
            if principal is None:
                if caching:
                    self._misses.add(key, revision, self._applied)
                raise Unauthenticated("unknown token", code="bad_token")
            if caching:
                user = (access_key("user", principal.user.id),) if principal.user else ()
                keys = (access_key("token", key), *user)
                self._principals.put(key, revision, principal, self._applied, keys)
        return principal

    def known(self, token: str) -> Principal | None:
        """The user `token` names, when the cache holds it and may be used now; None means
        "ask `principal_for`" (an unknown or uncached token, no trusted cache; the admin token
        is never cached). It never asks the directory."""
        return self._principals.get(self.key_of(token)) if self._caching() else None

    def key_of(self, token: str) -> str:
        """`hash_token(token)`: what the directory knows the token by."""
        key = self._hashed.get(token)
        if key is None:
            if len(self._hashed) >= HASHED:
                self._hashed.clear()
            key = self._hashed[token] = hash_token(token)
        return key

    @property
    def hashed(self) -> int:
        """How many tokens' hashes are kept at hand (at most `HASHED`)."""
        return len(self._hashed)

    def known_bot(self, bot_id: str) -> Bot | None:
        """`bot`'s record when the cache holds it and may be used now, else None."""
        return self._bots.get(bot_id) if self._caching() else None

    async def caller(self, conn: HTTPConnection) -> Principal:
        """The request's principal, resolved once per request."""
        return await self.caller_of(conn.scope)

    async def caller_of(self, scope: Scope) -> Principal:
        """`caller` for an ASGI scope (its first `Authorization` header, as `conn.headers`
        reads it, without building the request's header map)."""
        principal = scope.get(_PRINCIPAL)
        if principal is None:
            principal = await self.principal_for(scope_bearer(scope))
            scope[_PRINCIPAL] = principal
        return principal

    async def user(self, conn: HTTPConnection) -> Principal:
        # The caller `TokenRequired` left in the scope, read here: `caller` would read it
        # through two more coroutines, on every request of a user's route.
        principal = conn.scope.get(_PRINCIPAL)
        if principal is None:
            principal = await self.caller_of(conn.scope)
        if principal.user is None:
            raise Forbidden("this route acts for a user; use a user token", code="user_only")
        return principal

    async def admin(self, conn: HTTPConnection) -> None:
        principal = await self.caller(conn)
        if not principal.admin:
            raise Forbidden("this route needs the admin token", code="admin_only")

    async def bot(self, bot_id: str) -> Bot:
        caching = self._caching()
        bot = self._bots.get(bot_id) if caching else None
        if bot is None:
            revision, bot = await self.engine.directory_port.bot_at(bot_id)
            if caching:
                self._bots.put(bot_id, revision, bot, self._applied, _bot_keys(bot_id))
        return bot

    def know_chat(self, chat: Chat) -> None:
        """A chat record this gateway made, changed or read (the newest revision is kept)."""
        if self.ttl > 0:
            if len(self._chats) >= 50_000:
                self._chats.clear()
            held = self._chats.get(chat.id)
            if held is None or held.revision <= chat.revision:
                self._chats[chat.id] = chat

    async def context(self, chat_id: str) -> ChatContext:
        """The chat with its org and its bot or its channel and the channel's bots, as the
        directory has them at the revision this gateway applied: from the cache when every
        part is there, else in one directory call whose parts are cached (the same watch
        drops them as soon as anything that could change them changed; a change to one of
        them returns only once every gateway applied it, actors/directory/records.py `changing`)."""
        caching = self._caching()
        if caching:
            ctx = self._cached_context(chat_id)
            if ctx is not None:
                return ctx
        revision, ctx = await self._context_at(chat_id)
        if caching:
            floor = self._applied
            if revision >= floor:  # not read before a change this gateway already applied
                self.know_chat(ctx.chat)
            self._orgs.put(ctx.org.id, revision, ctx.org, floor, (access_key("org", ctx.org.id),))
            if ctx.bot is not None:
                self._bots.put(ctx.bot.id, revision, ctx.bot, floor, _bot_keys(ctx.bot.id))
            if ctx.channel is not None:
                # (the channel's entry holds its bots: a change of any of them drops it)
                keys = (access_key("channel", ctx.channel.id),)
                keys += tuple(k for b in ctx.members for k in _bot_keys(b.id))
                self._channels.put(
                    ctx.channel.id, revision, (ctx.channel, ctx.members), floor, keys
                )
        return ctx

    async def _context_at(self, chat_id: str) -> tuple[int, ChatContext]:
        """`chat_context_at`; a delivery's agent chat the directory does not have yet (its
        shard registers it in the background, actors/chats/agent_chats.py) is found on the
        shard that made it and shown in the directory first."""
        directory = self.engine.directory_port
        try:
            return await directory.chat_context_at(chat_id)
        except NotFound as e:
            if e.code != "chat_not_found" or not chat_id.startswith(agent_chat_id("")):
                raise
            if self._agent_misses.get(chat_id, 0.0) > self.clock():
                raise
            found = await asyncio.gather(
                *(s.find_agent_chat(chat_id) for s in self.engine.shard_ports),
                return_exceptions=True,
            )
            made = next((c for c in found if isinstance(c, Chat)), None)
            if made is None:
                if self.ttl > 0:
                    if len(self._agent_misses) >= 10_000:
                        self._agent_misses.clear()
                    self._agent_misses[chat_id] = self.clock() + AGENT_MISS_TTL
                raise
            await directory.register_chats([made], False)
            return await directory.chat_context_at(chat_id)

    def _cached_context(self, chat_id: str) -> ChatContext | None:
        chat = self._chats.get(chat_id)
        if chat is None:
            return None
        org: Org | None = self._orgs.get(chat.org)
        if org is None:
            return None
        if chat.channel is not None:
            held: tuple[Channel, tuple[Bot, ...]] | None = self._channels.get(chat.channel)
            if held is None:
                return None
            return ChatContext(chat=chat, org=org, channel=held[0], members=held[1])
        bot: Bot | None = None
        if chat.bot is not None:
            bot = self._bots.get(chat.bot)
            if bot is None:
                return None
        return ChatContext(chat=chat, org=org, bot=bot)

    def directory_changed(self, *changed: str) -> None:
        """Drop what a change through this gateway made stale at once, by the access keys it
        touched (the watch brings the same news about one actor call later)."""
        self.drop(changed)


def _bot_keys(bot_id: str) -> tuple[str, ...]:
    return (access_key("bot", bot_id),)


class TokenRequired:
    """ASGI middleware: an HTTP request outside `PUBLIC_PATHS`/`PUBLIC_PREFIXES` without a valid
    token gets 401 before routing, so a route added later cannot forget its check. Websockets
    pass: browsers send their token as the first message, and each endpoint refuses without
    one (close 4401)."""

    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not is_public(scope["path"]):
            try:
                await self.auth.caller_of(scope)
            except OpenBotError as e:  # a bad token, or the directory unavailable (503)
                response = error_response(status_of(e), e.code, e.message, e.details)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
