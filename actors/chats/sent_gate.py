"""A collaboration peer's writing tools wait for the send they answer.

A delivery's step starts while the send that made its link is still committing on the chain's
home shard (actors/chats/chains.py: the peer's step overlaps that commit; what the hop stores
goes `after` it, never without it). The step runs on the peer's own shard, which holds no
future of that commit, so a tool that changes something at once (the bot's rules, its members,
a confession) could outlive a send that then failed: a side effect of a failed write.

So a delivery's `StepInput` carries a `SentRef` (home shard, chain, link), and when the send
was not yet durable as the delivery began, the step's first tool that writes asks the home
shard (`ShardPort.send_stored`), which waits for that commit and answers whether it stored;
the answer holds for the rest of the step. When it did not store, the tool changes nothing and
the model is told so (the delivery's own rows fail with the send). Read-only tools and steps
that write nothing ask nothing: the common hop costs no extra call and no wait.

A delivery asked again after a restart (its send stored, nothing of the delivery: the shard
stopped before the hop's transaction) runs the peer's step again; what it writes is named
after the link and the request, so the same request is not made twice: a member's id is derived
from the link, the member asked for (name, prompt, rules) and the how-manieth such request of
the step it is (the directory returns the member made under that id); a model that asks for
another member this time gets that one too, never the first one's in its place. A confession
replaces the one under its key. A rules change is NOT made once: it is a compare-and-set on
the revision the model names, so a model that names the revision the first step read is
refused (`stale_revision`), but one that reads its rules again and names the revision it reads
now applies its change a second time (a second revision, the same rules).

The home shard answers from the commit's future while the step is under way (`SendGate`), and
after that (a step that outlived its delivery, a home shard restarted meanwhile) from its file:
the link is in the chain's stored row or it is not. A send whose commit failed, or whose chain
or link is not stored, answers "not stored" (the write is refused, the model told). A home
shard that fails to answer is not a "not stored": it is asked again a few times, then the step
fails (`SendUnconfirmed`, `send_unconfirmed`): the delivery records the failure instead of an
answer the model gave believing, wrongly perhaps, that its request was never stored.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import msgspec

from actors.contracts import SentRef
from engine.collaboration import Chain
from engine.errors import OpenBotError, Unavailable
from storage.database import ReadScope
from storage.shard_schema import CHAINS

REFUSED = msgspec.json.encode(
    {
        "error": "send_not_stored",
        "message": "the request you are answering was not stored; nothing was changed",
    }
).decode()

# Pauses before asking a home shard that failed to answer again (then the step fails).
RETRY_PAUSES = (0.05, 0.2, 1.0)


class SendUnconfirmed(Unavailable):
    """The home shard could not say whether the send is stored, also when asked again: the
    step fails (actors/chats/bot_step.py); its model is never told "not stored"."""

    code = "send_unconfirmed"


class SendGate:
    """On the chain's home shard: the commits of the sends whose deliveries are being worked
    on, by link (only while the delivery's step runs; the file answers after that)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self._open: dict[str, asyncio.Future[None]] = {}

    def open(self, chain: str, link: str, after: asyncio.Future[None] | None) -> SentRef:
        """The reference a delivery of `link` carries; `stored` (nothing to ask) unless `after`,
        its send's commit, is still running (or failed)."""
        ref = SentRef(shard=self.kernel.index, chain=chain, link=link)
        if after is None or (after.done() and not after.cancelled() and not after.exception()):
            return msgspec.structs.replace(ref, stored=True)
        self._open[link] = after
        return ref

    def close(self, link: str, after: asyncio.Future[None] | None) -> None:
        if after is not None and self._open.get(link) is after:
            del self._open[link]

    def pending(self) -> list[str]:
        """The links whose send's commit a delivery may still wait for here."""
        return list(self._open)

    async def stored(self, ref: SentRef) -> bool:
        """Whether the send of `ref` is durable: waits for its commit if it is still running."""
        fut = self._open.get(ref.link)
        if fut is not None:
            await asyncio.wait([fut])  # (a cancelled waiter leaves the commit alone)
            return not fut.cancelled() and fut.exception() is None
        return await self._on_disk(ref)

    async def _on_disk(self, ref: SentRef) -> bool:
        scope = (ReadScope(CHAINS.name, "id", (ref.chain,)),)
        rows = await self.kernel.db.run(
            lambda con: con.execute(
                f"SELECT doc FROM {CHAINS.name} WHERE id = ?", [ref.chain]
            ).fetchall(),
            scope=scope,
        )
        if not rows:
            return False
        chain = msgspec.convert(msgspec.json.decode(rows[0][0])["chain"], Chain)
        return any(link.id == ref.link for link in chain.links)


class StepWrites:
    """In one step, on the bot's shard: what its tools that write need when the step answers a
    delivery (`ref`; None for any other step): whether the send is stored, asked of the home
    shard once, on the first tool that writes; the ids of what it makes, named after the link."""

    def __init__(self, peers: Any, ref: SentRef | None) -> None:
        self.peers = peers
        self.ref = ref
        self._answer: bool | None = True if ref is None or ref.stored else None
        self._members: dict[bytes, int] = {}

    async def stored(self) -> bool:
        """Raises `SendUnconfirmed` when the home shard fails to answer (after RETRY_PAUSES)."""
        if self._answer is None:
            ref = self.ref
            assert ref is not None
            for pause in (*RETRY_PAUSES, None):
                try:
                    self._answer = await self.peers.shard(ref.shard).send_stored(ref)
                    break
                except OpenBotError as e:  # unknown, not "not stored": ask again, then fail
                    if pause is None:
                        raise SendUnconfirmed(
                            f"whether the request answered was stored is unknown: {e.message}"
                        ) from e
                    await asyncio.sleep(pause)
        assert self._answer is not None
        return self._answer

    def member_id(self, name: str, prompt: Any, rules: Any) -> str | None:
        """The id of the member this delivery's step asks for (None: a fresh one): derived
        from the link, the request and the how-manieth such request of the step it is."""
        if self.ref is None:
            return None
        asked = msgspec.json.encode([name, prompt, rules], order="sorted")
        n = self._members[asked] = self._members.get(asked, 0) + 1
        key = b"\x00".join((self.ref.link.encode(), asked, str(n).encode()))
        return "b_" + hashlib.blake2b(key, digest_size=8).hexdigest()
