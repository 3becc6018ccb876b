"""Requests (approvals) on the shard of the bot that proposed them (ENR-3).

A bot's `workspace_request_approval` runs in its step, always on the shard that holds its memory,
so the request is stored there: its structure as JSON, the proposal sealed with the bot's pool
key (SEC-1). Every change is announced as `request.changed` to the people who may decide. A
decision is made once: the check and the change happen under one lock, so of many concurrent
decisions exactly one wins and the others get 409.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import msgspec

from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel
from engine import requests as rules
from engine.directory import bot_pool
from engine.errors import NotFound, OpenBotError
from engine.events import Audience, RequestChanged
from engine.requests import ApprovalRequest, Proposal, RequestView
from storage.crypto import aad
from storage.group_commit import Put
from storage.shard_schema import REQUESTS

log = logging.getLogger("openbot.requests")
_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(ApprovalRequest)


class Requests:
    def __init__(self, kernel: ShardKernel, peers: Peers) -> None:
        self.kernel = kernel
        self.peers = peers
        self._requests: dict[str, ApprovalRequest] | None = None
        self._sealed: dict[str, bytes] = {}
        self._lock = asyncio.Lock()

    async def _all(self) -> dict[str, ApprovalRequest]:
        if self._requests is None:
            rows = await self.kernel.db.run(
                lambda con: con.execute("SELECT doc, proposal FROM requests").fetchall()
            )
            loaded = {}
            for doc, sealed in rows:
                request = _dec.decode(doc)
                loaded[request.id] = request
                self._sealed[request.id] = sealed
            if self._requests is None:
                self._requests = loaded
        return self._requests

    async def reload(self) -> None:
        """Read the stored requests again at next use (an import added some)."""
        async with self._lock:
            self._requests = None

    async def _proposal(self, request: ApprovalRequest) -> str:
        stored = (await self.kernel.pool(bot_pool(request.bot))).stored
        record = aad(stored.pool, f"request\x00{request.id}")
        return stored.cipher.open(self._sealed[request.id], record).decode()

    async def view(self, request: ApprovalRequest) -> RequestView:
        return rules.view(request, await self._proposal(request))

    async def _save(self, request: ApprovalRequest, sealed: bytes | None = None) -> None:
        """Store the request (and its sealed proposal when new) with its event; answers once
        durable. Call under the lock."""
        stored = (await self.kernel.pool(bot_pool(request.bot))).stored
        sealed = sealed if sealed is not None else self._sealed[request.id]
        event = RequestChanged(
            request=request.id,
            status=request.status,
            revision=request.revision,
            bot=request.bot,
            chat=request.chat,
        )
        audience = Audience(
            org=request.org,
            users=(request.owner,),
            channels=(request.channel,) if request.channel else (),
        )
        row = Put(REQUESTS.name, (request.id, request.bot, _enc.encode(request).decode(), sealed))
        await self.kernel.commit(Batch().key(stored).add(row).emit(event, audience))
        (await self._all())[request.id] = request
        self._sealed[request.id] = sealed

    async def create(
        self,
        *,
        bot: str,
        org: str,
        chat: str,
        turn: str,
        owner: str,
        channel: str | None,
        proposal: Proposal,
    ) -> ApprovalRequest:
        """Store what the bot proposed: only its words, never the (rewritten) input."""
        request = rules.new_request(
            request_id="req_" + secrets.token_hex(8),
            bot=bot,
            org=org,
            chat=chat,
            turn=turn,
            owner=owner,
            channel=channel,
            proposal=proposal,
            now=self.kernel.clock(),
        )
        stored = (await self.kernel.pool(bot_pool(bot))).stored
        sealed = stored.cipher.seal(
            proposal.proposal.encode(), aad(stored.pool, f"request\x00{request.id}")
        )
        async with self._lock:
            await self._save(request, sealed)
        return request

    async def find_view(
        self, request_id: str, user: str, channels: frozenset[str]
    ) -> RequestView | None:
        """The request if it is on this shard and `user` may see it, else None."""
        found = await self.find(request_id, user, channels)
        return None if found is None else await self.view(found)

    async def find(self, request_id: str, user: str, channels: frozenset[str]):
        """The request if it is here and the user may see it (else None)."""
        request = (await self._all()).get(request_id)
        if request is None or not rules.may_see(request, user, channels):
            return None
        return request

    async def listing(
        self, user: str, channels: frozenset[str], status: str | None = None
    ) -> list[RequestView]:
        out = []
        for request in (await self._all()).values():
            if rules.may_see(request, user, channels) and status in (None, request.status):
                out.append(await self.view(request))
        return out

    async def decide(
        self,
        request_id: str,
        user: str,
        channels: frozenset[str],
        approved: bool,
        note: str,
    ) -> RequestView | None:
        """Approve or reject once (409 after); None when the request is not here for `user`."""
        async with self._lock:
            request = await self.find(request_id, user, channels)
            if request is None:
                return None
            decided = rules.decide(
                request, user=user, approved=approved, note=note, now=self.kernel.clock()
            )
            await self._save(decided)
        await self._tell_chat(decided)
        return await self.view(decided)

    async def _tell_chat(self, request: ApprovalRequest) -> None:
        """The chat the bot asked in shows the decision as a notification (never as the
        person's words); its home may be another shard."""
        peers = self.peers
        text = f"Request “{request.title}” {request.status}" + (
            f": {request.note}" if request.note else "."
        )
        try:
            chat = await peers.directory().get_chat(request.chat)
            index = peers.index_of(chat.home or request.owner)
            await peers.shard(index).notify(chat, request.decidedBy or "", text)
        except OpenBotError as e:  # the decision stands; the chat may be gone
            log.warning("request %s: chat not told: %s", request.id, e.message)

    async def attach_review(self, request_id: str, chat: str) -> RequestView:
        async with self._lock:
            request = (await self._all()).get(request_id)
            if request is None:
                raise NotFound(f"no request {request_id}", code="request_not_found")
            changed = rules.with_review_chat(request, chat, self.kernel.clock())
            if changed is not request:
                await self._save(changed)
        return await self.view(changed)

    async def for_review_chat(self, chat: str) -> RequestView | None:
        """The request a review chat is about (its proposal is what the review sees)."""
        for request in (await self._all()).values():
            if chat in request.reviewChats:
                return await self.view(request)
        return None
