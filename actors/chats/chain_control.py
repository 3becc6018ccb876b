"""A collaboration chain's life outside its hops: resuming after a restart, stopping, listing,
and releasing a turn's waiting learning jobs once its chains are done (WS-4, CO-1, CO-2).

Mixed into `ChainRunner` (chains.py), which owns the state named below and the delivery path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from actors.chats.agent_chats import Registrar
from actors.chats.chain_records import ChainRecords
from actors.contracts import ChainView
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel
from engine import collaboration as rules
from engine.collaboration import Chain
from engine.directory import Org
from engine.errors import NotFound, OpenBotError

log = logging.getLogger("openbot.chains")


class ChainControl:
    """Restart, stop and listing for `ChainRunner` (which builds every attribute declared here)."""

    kernel: ShardKernel
    peers: Peers
    records: ChainRecords
    registrar: Registrar
    _lock: asyncio.Lock
    _busy: dict[str, int]
    _learn: dict[str, list[tuple[int, str]]]
    _spawn: Callable[[Coroutine], None]

    if TYPE_CHECKING:  # ChainRunner's (declared only: a definition here would shadow it)

        def _spawn_delivery(
            self, chain_id: str, link_id: str, org: Org, after: Any = None
        ) -> None: ...

    async def resume(self) -> None:
        """`recover` at start; a chain that cannot resume must not stop the shard serving."""
        try:
            await self.recover()
        except Exception:
            log.exception("resuming collaboration chains failed")

    async def recover(self) -> int:
        """Resume the deliveries that were under way when the shard stopped (nothing is lost;
        a delivery already answered is not asked again)."""
        resumed = 0
        await self.registrar.recover(self._lock, self.kernel)
        await self.records.start()
        for chain in self.records.running():
            open_ = [
                k for k in rules.open_links(chain) if not any(c.parent == k.id for c in chain.links)
            ]
            if not open_:
                continue
            try:
                org = await self.peers.directory().get_org(chain.org)
            except OpenBotError as e:  # one chain that cannot resume does not hold the others
                log.warning("chain %s not resumed: %s", chain.id, e.message)
                continue
            for link in open_:
                self._spawn_delivery(chain.id, link.id, org)  # (not if one runs already)
                resumed += 1
        log.info("resumed %d deliveries", resumed)
        return resumed

    async def _save(self, chain: Chain) -> None:
        batch = Batch()
        await self.records.stage(chain, batch)
        await self.kernel.commit(batch)

    # --- what people see and do ---

    async def stop_visible(
        self, chain_id: str, user: str, channels: frozenset[str]
    ) -> ChainView | None:
        """Stop a chain homed here that `user` may see; None when it is not here."""
        chain = await self.records.get(chain_id)
        if chain is None or not self.records.may_see(chain, user, channels):
            return None
        return await self.stop(chain_id, user)

    async def stop(self, chain_id: str, by: str) -> ChainView:
        async with self._lock:
            chain = await self.records.get(chain_id)
            if chain is None:
                raise NotFound(f"no collaboration {chain_id}", code="collaboration_not_found")
            chain = rules.stop(chain, by=by, now=self.kernel.clock())
            await self._save(chain)
        await self._maybe_release(chain.topic)
        return self.records.view(chain)

    async def _maybe_release(self, topic: str) -> None:
        """Once no collaboration of this turn is under way, its waiting learning jobs run, once,
        over everything that came back (CO-2)."""
        waiting = self._learn.get(topic)
        if not waiting or await self.running_for(topic) or self._busy.get(topic):
            return
        self._learn.pop(topic, None)
        for chain in await self.records.release_learning(topic, waiting):
            await self._save(chain)  # the stored record no longer lists them

    async def running_for(self, topic: str) -> bool:
        """Whether a chain started by this turn is still under way (an index by turn: this
        runs on every turn of a chat, whatever the number of chains)."""
        await self.records.start()
        return self.records.under_way(topic)

    async def listing(
        self, user: str, channels: frozenset[str], after: str | None = None, limit: int = 200
    ) -> list[ChainView]:
        return await self.records.listing(user, channels, after, limit)
