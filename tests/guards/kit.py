"""What the guards share beyond tests/shard_kit.py: an org with bot memory off, a second reader,
the confide and learn tool calls, the stubs' learning routes, a spy on the cipher and stored
entries."""

from __future__ import annotations

from collections import Counter

from engine.directory import Org, OrgSettings
from engine.memory_entries import AccessProof, EntryMeta, Layer, Reader, Source
from storage import crypto
from tests.openai_stub import completion
from tests.shard_kit import POOL

OFF = Org(id="o1", name="o", settings=OrgSettings(botMemory=False, botMemoryModel="mem"))
BOB = Reader(user="u_bob", org="o1", uses_bot=True)
CONFIDE = ("confide", {"text": "I think I got Ann's city wrong"})
LEARN = {"content": "Ann lives in Oslo", "items": [{"chat": "chat_1", "item": "i-1"}]}


def tool_names(body) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or ()}


def learning_route(answer):
    """Answer every learning request (it offers `learn_fact`) with `answer`."""
    return lambda body: answer if "learn_fact" in tool_names(body) else None


def learning_requests(mem) -> list[dict]:
    return [b for b in mem.requests if "learn_fact" in tool_names(b)]


def route_rewrite(text: str, entries: list[str]):
    answer = completion(None, tool_calls=[("rewrite", {"text": text, "entries": entries})])
    return lambda body: answer if "rewrite" in tool_names(body) else None


class CipherSpy:
    """Counts decryptions and encryptions per record (the associated data names pool and record)."""

    def __init__(self, monkeypatch) -> None:
        self.opened: Counter[str] = Counter()
        self.sealed: Counter[str] = Counter()
        real_open, real_seal = crypto.Cipher.open, crypto.Cipher.seal
        spy = self

        def open_(self, blob, aad):
            spy.opened[aad.decode(errors="replace")] += 1
            return real_open(self, blob, aad)

        def seal(self, plaintext, aad):
            spy.sealed[aad.decode(errors="replace")] += 1
            return real_seal(self, plaintext, aad)

        monkeypatch.setattr(crypto.Cipher, "open", open_)
        monkeypatch.setattr(crypto.Cipher, "seal", seal)

    def reset(self) -> None:
        self.opened.clear()
        self.sealed.clear()

    def entries(self, counter: Counter[str], pool: str = POOL) -> set[str]:
        """Entry ids whose content record was touched (not log rows, settings or calls)."""
        out = set()
        for key in counter:
            head, _, rest = key.partition("\x00")
            if head == pool and rest.startswith("mem_") and "\x00" not in rest:
                out.add(rest)
        return out


def fact_meta(entry_id: str, user: str, now: int = 10, topic: str = "tea") -> EntryMeta:
    return EntryMeta(
        id=entry_id,
        pool=POOL,
        layer=Layer.FACT,
        tags=(f"from:{user}", f"for:person:{user}", "org:o1", "chat:chat_1", topic),
        sources=(Source(chat="chat_1", item="i-1"),),
        proofs=(
            AccessProof(chat="chat_1", item="i-1", org="o1", audience=(f"for:person:{user}",)),
        ),
        created_at=now,
        updated_at=now,
    )


def observation_meta(entry_id: str, source: str, user: str = "u_ann", now: int = 20) -> EntryMeta:
    return EntryMeta(
        id=entry_id,
        pool=POOL,
        layer=Layer.OBSERVATION,
        tags=(f"for:person:{user}", "org:o1", "tea", "insight"),
        sources=(Source(entry=source),),
        confidence=0.8,
        created_at=now,
        updated_at=now,
    )


def pinned_meta(entry_id: str, tags: tuple[str, ...], now: int = 5) -> EntryMeta:
    return EntryMeta(
        id=entry_id, pool=POOL, layer=Layer.PINNED, tags=tags, created_at=now, updated_at=now
    )
