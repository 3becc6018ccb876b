"""Requests (approvals) on the shard of the bot that proposed them (ENR-3).

A bot's `workspace_request_approval` runs in its step, always on the shard that holds its memory,
so the request is stored there: its structure as JSON, the proposal sealed with the bot's pool
key (SEC-1). A person may open one too (`open`), under the same rules as the tool. Every change
is announced as `request.changed` to the people who may decide. A decision is made once: the
check and the change happen under one lock, so of many concurrent decisions exactly one wins
and the others get 409.

The decision wakes the bot in the chat the request came from (decision_wakes.py, on that
chat's home shard). The wake-up is due in the decision's own row, so it is never lost: it is
asked for until the chat's shard says the step is stored (then the row says `done`), and again
at this shard's start (`resume`) while it is still due. The chat's shard stores each decision's
step once, however often it is asked.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

import msgspec

from actors.contracts import DecisionWake
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel
from engine import requests as rules
from engine.directory import Chat, bot_pool
from engine.errors import InvalidInput, NotFound
from engine.events import Audience, RequestChanged
from engine.requests import ApprovalRequest, Proposal, RequestView
from storage.crypto import aad
from storage.group_commit import Put
from storage.shard_schema import REQUESTS

log = logging.getLogger("openbot.requests")
_enc = msgspec.json.Encoder()
_dec = msgspec.json.Decoder(ApprovalRequest)
# A wake-up the chat's shard could not take (unreachable, restarting) is asked for again after
# these pauses (seconds), then at this shard's next start.
WAKE_RETRIES = (0.5, 1.0, 2.0, 4.0, 8.0)
WAKE_WAIT = 180.0  # `decide(wait=True)`: at most this long for the bot's answer


class Requests:
    def __init__(self, kernel: ShardKernel, peers: Peers) -> None:
        self.kernel = kernel
        self.peers = peers
        self._requests: dict[str, ApprovalRequest] | None = None
        self._sealed: dict[str, bytes] = {}
        self._lock = asyncio.Lock()
        self._waking: dict[str, asyncio.Task[None]] = {}  # request → its wake-up under way
        self.woken = 0  # wake-up steps the chats' shards stored for this shard (tests)

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

    async def _save(
        self, request: ApprovalRequest, sealed: bytes | None = None, announce: bool = True
    ) -> None:
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
        batch = Batch().key(stored).add(row)
        await self.kernel.commit(batch.emit(event, audience) if announce else batch)
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
        opened_by: str | None = None,
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
            opened_by=opened_by,
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

    async def open(self, chat: Chat, bot: str, user: str, proposal: Proposal) -> RequestView:
        """A person's own request in a chat they may post to (the gateway checked that), for
        the people the bot's tool would ask: the person in a direct chat, the group's people in
        a group. Kept as written: nothing reads it through the memory bot."""
        if chat.kind not in ("direct", "group"):
            raise InvalidInput("ask for approval in a person's chat", code="invalid_chat")
        checked = rules.parse_proposal(msgspec.structs.asdict(proposal))
        request = await self.create(
            bot=bot,
            org=chat.org,
            chat=chat.id,
            turn="",
            owner=user,
            channel=chat.channel if chat.kind == "group" else None,
            proposal=checked,
            opened_by=user,
        )
        return await self.view(request)

    async def decide(
        self,
        request_id: str,
        user: str,
        channels: frozenset[str],
        approved: bool,
        note: str,
        wait: bool = False,
    ) -> RequestView | None:
        """Approve or reject once (409 after); None when the request is not here for `user`.
        The decision and its due wake-up commit together; the bot's step follows (with
        `wait`, this answers once it is stored)."""
        async with self._lock:
            request = await self.find(request_id, user, channels)
            if request is None:
                return None
            decided = rules.decide(
                request, user=user, approved=approved, note=note, now=self.kernel.clock()
            )
            await self._save(decided)
        task = self._spawn_wake(decided.id)
        if wait:
            # Past the wait it is still due and goes on without the caller.
            await asyncio.wait([task], timeout=WAKE_WAIT)
            decided = (await self._all())[decided.id]
        return await self.view(decided)

    # --- waking the bot with a decision ---

    def _spawn_wake(self, request_id: str) -> asyncio.Task[None]:
        """One wake-up task per request at a time."""
        if (running := self._waking.get(request_id)) is not None:
            return running
        task = asyncio.get_running_loop().create_task(self._wake(request_id))
        self._waking[request_id] = task
        task.add_done_callback(lambda _: self._waking.pop(request_id, None))
        return task

    async def _wake(self, request_id: str) -> None:
        for pause in (*WAKE_RETRIES, None):
            request = (await self._all())[request_id]
            if request.wake != "due":
                return
            try:
                ran = await self._wake_once(request)
            except NotFound as e:  # the chat or the bot is gone: nobody to wake
                log.warning("request %s: nobody to wake: %s", request.id, e.message)
            except Exception as e:  # unreachable now: asked again, at the latest at start
                log.warning("request %s: wake-up failed: %r", request.id, e)
                if pause is None:
                    return
                await asyncio.sleep(pause)
                continue
            else:
                self.woken += ran
            async with self._lock:
                current = (await self._all())[request_id]
                if current.wake == "due":
                    await self._save(rules.woken(current), announce=False)
            return

    async def _wake_once(self, request: ApprovalRequest) -> bool:
        peers = self.peers
        directory = peers.directory()
        chat = await directory.get_chat(request.chat)
        bot = await directory.get_bot(request.bot)
        org = await directory.get_org(request.org)
        wake = DecisionWake(
            request=request.id,
            turn=rules.decision_turn(request.id),
            chat=chat,
            bot=bot,
            org=org,
            operator=request.decidedBy or request.owner,
            notice=rules.decision_notice(request),
            text=rules.decision_input(request, await self._proposal(request)),
        )
        return await peers.shard(peers.index_of(chat.home or bot.owner)).wake_on_decision(wake)

    async def resume(self) -> None:
        """At start: every decision whose wake-up is still due is woken (once)."""
        try:
            due = [r.id for r in (await self._all()).values() if r.wake == "due"]
        except Exception:  # one failure must not stop the shard serving
            log.exception("reading requests at start failed")
            return
        for request_id in due:
            self._spawn_wake(request_id)
        if due:
            log.info("waking %d decided requests", len(due))

    async def idle(self) -> int:
        """Wait until recovery ran and no wake-up is under way; returns how many wake-up
        steps were stored for this shard's requests."""
        await self.kernel.started()
        while self._waking:
            await asyncio.gather(*list(self._waking.values()), return_exceptions=True)
        return self.woken

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
