"""Registering the `agent` chats a chain's home shard makes with the directory.

A delivery's agent chat is named after its link (engine/directory.py `agent_chat`), so the
chain's shard makes the record itself instead of asking the directory on every hop. Once the
delivery is durable, a durable registration gives the directory the chat (in one directory call
for the chats made within `GATHER_S`). Until then a reader who comes for it (a client fetching
an item its `chat.item.created` announced: events go out as the delivery commits) is served by
the gateway from this shard (`ShardService.find_agent_chat`, gateway/auth.py `context`), which
then shows it in the directory: whoever reads an item its events announce finds the chat. (Each
hop used to show its chat in the directory first, and its events waited for that: an actor
call per delivery, and the chain's last event waited behind it.)

Nothing is lost: a link whose chat the directory has not durably confirmed is listed in its
chain's stored row (`ChainRecords.unregistered`, written in the same transaction as the chat's
first items), and `recover` registers those again after a restart; the directory writes what it
showed soon after showing it, and registering is idempotent there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from actors.chats.chain_rows import under_way
from actors.shard.batch import Batch
from actors.shard.kernel import durable
from engine.collaboration import find_link
from engine.directory import Chat, agent_chat
from engine.errors import OpenBotError, Unavailable

log = logging.getLogger("openbot.chains")
RETRY_S = 1.0  # the directory was unreachable: try again after this long
# Chats made within this long are confirmed in one directory call: a chain's hops follow each
# other every few milliseconds, so a chain costs one or two calls, not one per delivery (the
# chats are visible from the start; this only ends the shard's bookkeeping of them).
GATHER_S = 0.2


class Registrar:
    def __init__(
        self,
        *,
        records: Any,
        peers: Any,
        spawn: Callable[[Coroutine], None],
        lock: asyncio.Lock | None = None,
        kernel: Any = None,
    ) -> None:
        self.records = records
        self.peers = peers
        self._spawn = spawn
        self._lock, self._kernel = lock, kernel  # (the runner's: chain rows are staged under it)
        self._waiting: dict[str, tuple[str, str, Chat]] = {}  # chat id → (chain, link, chat)
        self._running = False
        self._retry: asyncio.TimerHandle | None = None

    def add(self, chain: str, link: str, chat: Chat) -> None:
        """Register `chat` (its delivery is durable) soon, with whatever else is waiting."""
        self._waiting[chat.id] = (chain, link, chat)
        self._kick()

    def _kick(self) -> None:
        self._retry = None
        if not self._running and self._waiting:
            self._running = True
            self._spawn(self._run())

    async def _run(self) -> None:
        try:
            await asyncio.sleep(GATHER_S)
            while self._waiting:
                taken = dict(self._waiting)
                try:
                    await self.peers.directory().register_chats([c for _, _, c in taken.values()])
                except Unavailable as e:  # the directory is restarting: later, not lost
                    log.warning("agent chats not registered yet (%s); retrying", e.message)
                    loop = asyncio.get_running_loop()
                    self._retry = self._retry or loop.call_later(RETRY_S, self._kick)
                    return
                except OpenBotError as e:  # refused: asking again would be refused again
                    log.error("agent chats %s refused by the directory: %s", list(taken), e.message)
                self._confirmed(taken)
                await self._store_registered(taken)
        finally:
            self._running = False

    async def _store_registered(self, taken: dict[str, tuple[str, str, Chat]]) -> None:
        """Store again, in one transaction, the ended chains whose agent chats are all
        registered now: their rows stop listing them and no longer count as live, so a restart
        does not read them (chain_rows.py). A chain under way is stored by its next hop."""
        if self._lock is None:
            return
        chains = {c for c, _, _ in taken.values() if c not in self.records.unregistered}
        batch = Batch()
        try:
            async with self._lock:
                for chain_id in sorted(chains):
                    chain = await self.records.get(chain_id)
                    if chain is not None and not under_way(chain):
                        await self.records.stage(chain, batch, announce=False)
                fut = self._kernel.stage(batch) if batch.writes else None
            await durable(fut)
        except OpenBotError as e:  # the rows still list them: a restart registers them again
            log.warning("registered agent chats not stored: %s", e.message)

    def _confirmed(self, taken: dict[str, tuple[str, str, Chat]]) -> None:
        unregistered = self.records.unregistered
        for chat_id, entry in taken.items():
            if self._waiting.get(chat_id) is entry:
                del self._waiting[chat_id]
            chain, link, _ = entry
            links = unregistered.get(chain)
            if links is not None:
                links.discard(link)
                if not links:
                    del unregistered[chain]
                    self.records.settle(chain)  # (memory may let it go now)

    async def recover(self, lock: asyncio.Lock, kernel: Any) -> None:
        """After a restart: register again every agent chat a stored chain lists as not yet
        confirmed (the shard may have stopped before or while registering it), then store
        those chains' rows without them, so the next restart asks nothing (one directory call
        and one transaction for all). `lock`: the runner's, under which chain rows are staged."""
        records = self.records
        await records.start()
        owed: dict[str, tuple[str, str, Chat]] = {}
        for chain_id, links in list(records.unregistered.items()):
            chain = await records.get(chain_id)
            if chain is None:
                continue
            try:
                root = await records.chat(chain.root_chat)
            except OpenBotError as e:
                log.warning("agent chats of chain %s not registered: %s", chain_id, e.message)
                continue
            for link_id in sorted(links):
                link = find_link(chain, link_id)
                chat = agent_chat(root, link.to_bot, chain.id, link.id, link.sent_at)
                records.know(chat)  # the chain reads it here, not from the directory
                owed[chat.id] = (chain_id, link_id, chat)
        if not owed:
            return
        try:
            await self.peers.directory().register_chats([c for _, _, c in owed.values()])
        except OpenBotError as e:  # later, from the live path (retried while unreachable)
            log.warning("agent chats not registered at start (%s); retrying", e.message)
            for chain_id, link_id, chat in owed.values():
                self.add(chain_id, link_id, chat)
            return
        self._confirmed(owed)
        batch = Batch()
        async with lock:
            for chain_id in {chain for chain, _, _ in owed.values()}:
                await records.stage(await records.need(chain_id), batch)
            fut = kernel.stage(batch)
        await durable(fut)
