"""Guards for protections that no other test pinned down (issue 12 point 10).

Each test is named after the SPEC id it guards, and each was checked by applying a one-line
break of the protection by hand, seeing the test fail, and reverting. The break and the failure
are in each docstring ("Break:"). Tests drive `ShardService` directly (no Ray) with real DuckDB
files and real HTTP to loopback OpenAI-compatible stubs (tests/openai_stub.py); decryption is
observed by counting `Cipher.open`/`Cipher.seal` at the storage seam, not by reading code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter

import msgspec
import pytest

from actors.chats.bot_step import StepInput, reader_for
from actors.models.registry import OpenAIModel
from actors.shard.service import ShardService, TurnStart
from engine.directory import Bot, Chat, Org, OrgSettings
from engine.memory import AccessProof, EntryMeta, Layer, Reader, Source, Status
from engine.memory_bot import SettingsPatch
from engine.models import Completion, Price
from engine.turns import CALM_ANSWER, confessor_messages
from storage import crypto
from tests.conftest import LiveServer
from tests.openai_stub import OpenAIStub, completion

ORG = Org(id="o1", name="o", settings=OrgSettings(botMemory=True, botMemoryModel="mem"))
OFF = Org(id="o1", name="o", settings=OrgSettings(botMemory=False, botMemoryModel="mem"))
BOT = Bot(id="b1", name="Helper", org="o1", owner="u_owner", model="bot")
CHAT = Chat(id="chat_1", kind="direct", owner="u_ann", org="o1", bot="b1")
ANN = Reader(user="u_ann", org="o1", uses_bot=True)
BOB = Reader(user="u_bob", org="o1", uses_bot=True)
POOL = "bot:b1"
CONFIDE = ("confide", {"text": "I think I got Ann's city wrong"})
LEARN = {"content": "Ann lives in Oslo", "items": [{"chat": "chat_1", "item": "i-1"}]}


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch) -> None:
    monkeypatch.delenv("OPENBOT_MASTER_KEY", raising=False)


@pytest.fixture(scope="module")
def stubs():
    bot, mem = OpenAIStub(), OpenAIStub()
    servers = [LiveServer(bot.app), LiveServer(mem.app)]
    bot.url, mem.url = servers[0].url + "/v1", servers[1].url + "/v1"
    yield bot, mem
    for s in servers:
        s.stop()


@pytest.fixture
def fresh(stubs):
    for s in stubs:
        s.queue.clear()
        s.requests.clear()
        s.routes.clear()
    return stubs


def _service(path, stubs, **kw) -> ShardService:
    bot, mem = stubs
    models = kw.pop("models", None) or {
        "bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"),
        "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model"),
    }
    return ShardService(path, 0, models=models, answer_wait=kw.pop("answer_wait", 2.0), **kw)


async def _turn(svc, text, chat=CHAT, org=ORG):
    turn = await svc.start_turn(
        TurnStart(chat=chat, bot=BOT, org=org, operator=chat.owner, text=text)
    )
    result = await svc.wait_turn(chat.id, turn.id)
    await svc.learning_idle()
    return result


def _tool_names(body) -> set[str]:
    return {t["function"]["name"] for t in body.get("tools") or ()}


def _learning_route(answer):
    """Answer every learning request (it offers `learn_fact`) with `answer`."""
    return lambda body: answer if "learn_fact" in _tool_names(body) else None


def _learning_requests(mem) -> list[dict]:
    return [b for b in mem.requests if "learn_fact" in _tool_names(b)]


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


def _fact(entry_id: str, user: str, now: int = 10, topic: str = "tea") -> EntryMeta:
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


def _observation(entry_id: str, source: str, user: str = "u_ann", now: int = 20) -> EntryMeta:
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


def _pinned(entry_id: str, tags: tuple[str, ...], now: int = 5) -> EntryMeta:
    return EntryMeta(
        id=entry_id, pool=POOL, layer=Layer.PINNED, tags=tags, created_at=now, updated_at=now
    )


# --- ACL-9: the pool's lock -------------------------------------------------------------------


def test_ACL_9_reads_wait_for_a_change_and_changes_wait_for_reads(tmp_path, fresh):
    """While a change holds the pool's lock no read runs; while a read holds it no change runs.

    Breaks tried: in `RWLock.shared`, `if self._writer or self._waiting_writers:` → `if False:`
    → "a read ran while a change held the lock"; in `RWLock.exclusive`, `if self._writer or
    self._readers or self._waiting_writers:` → `if False:` → "a change ran under a read"; in
    `BotMemory.read`, `async with pool.lock.shared():` → `if True:` → "a read ran while a
    change held the lock"."""

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            first = await svc.remember(POOL, ANN, "Ann drinks green tea")
            pool = await svc.kernel.pool(POOL)
            async with pool.lock.exclusive():  # a change deciding and queueing
                reads = [
                    asyncio.create_task(svc.read_memory(POOL, ANN)),
                    asyncio.create_task(svc.context(POOL, ANN, 1_000)),
                    asyncio.create_task(svc.has_entries(POOL, ANN)),
                    asyncio.create_task(svc.memory_log(POOL, ANN)),
                ]
                await asyncio.sleep(0.2)
                pending = [t for t in reads if not t.done()]
                assert pending == reads, "a read ran while a change held the lock"
            await asyncio.gather(*reads)
            async with pool.lock.shared():  # a read checking visibility and decrypting
                changes = [
                    asyncio.create_task(svc.remember(POOL, ANN, "Ann moved to Oslo")),
                    asyncio.create_task(svc.set_status(POOL, first.id, Status.INVALIDATED)),
                    asyncio.create_task(svc.forget(POOL, ANN, first.id)),
                ]
                await asyncio.sleep(0.2)
                assert not any(t.done() for t in changes), "a change ran under a read"
            await asyncio.gather(*changes, return_exceptions=True)
        finally:
            await svc.close()

    asyncio.run(go())


def test_ACL_9_24_concurrent_retries_of_one_request_store_one_entry(tmp_path, fresh):
    """The receipt check and the write are one atomic step under the exclusive lock.

    Break tried: `async with pool.lock.exclusive():` in `ShardService.remember` → `if True:` →
    `assert 24 == 1`: each retry missed the receipt while it was read from disk."""

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            # The pool's stored receipts are not read yet: the first check awaits the disk.
            answers = await asyncio.gather(
                *(svc.remember(POOL, ANN, "Ann likes trains", request_id="r1") for _ in range(24))
            )
            page = await svc.read_memory(POOL, ANN)
        finally:
            await svc.close()
        return answers, page

    answers, page = asyncio.run(go())
    assert len({a.id for a in answers}) == 1
    assert [e.content for e in page.entries] == ["Ann likes trains"]


# --- ACL-8: visibility never decrypts ----------------------------------------------------------


def test_ACL_8_reads_decrypt_only_what_the_reply_shows(tmp_path, fresh, monkeypatch):
    """Visibility is decided from tags, sources and proofs; content is decrypted only for the
    entries the reply carries, and checking an observation's sources never decrypts them.

    Breaks tried (each fails): in `ShardService._read`, a line `[self.store.open_content(
    pool.stored, i) for i in pool.candidates(reader)]` before the visibility check (decrypt
    every candidate first) → "decrypted more than the reply shows" (mem_h1..h4 decrypted); the
    same line in `context_parts` → hidden ids among the decrypted; `has_entries` returning
    `any(vis.usable(i) and self.store.open_content(...) ...)` → `{'mem_a2'} == set()`. After
    main's one-bot-memory read (actors/shard/bot_memory.py): `Snapshot.visible_seeds` filtering on
    `self.open(i) and check(i)` → "decrypted more than the reply shows"."""
    spy = CipherSpy(monkeypatch)
    entries = [
        (_fact("mem_a1", "u_ann", 10), "Ann drinks green tea"),
        (_observation("mem_a2", "mem_a1", now=20), "Ann likes hot drinks"),
        (_fact("mem_b1", "u_bob", 11), "Bob drinks coffee"),
        # Candidates for Ann (their audience names her or the bot) that she may not see:
        (_observation("mem_h1", "mem_b1", now=21), "hidden: built on Bob's entry"),
        (
            msgspec.structs.replace(_fact("mem_h2", "u_ann", 12), proofs=()),
            "hidden: no access proof",
        ),
        (_pinned("mem_h3", ("for:person:u_ann", "org:o2")), "hidden: another org"),
        (_pinned("mem_h4", ("for:bot", "org:o2")), "hidden: another org's bot entry"),
        (_pinned("mem_h5", ("org:o1",)), "hidden: no audience at all"),
    ]
    hidden = {"mem_h1", "mem_h2", "mem_h3", "mem_h4", "mem_h5", "mem_b1"}

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            await svc.add_entries(POOL, entries)
        finally:
            await svc.close()
        svc = _service(tmp_path, fresh)  # loaded from disk: nothing decrypted in memory yet
        try:
            out = {}
            spy.reset()
            out["page"] = await svc.read_memory(POOL, ANN)
            out["page_opened"] = spy.entries(spy.opened)
            spy.reset()
            # Only the observation: its source is checked, never decrypted.
            out["obs"] = await svc.read_memory(POOL, ANN, tags=["insight"])
            out["obs_opened"] = spy.entries(spy.opened)
            spy.reset()
            out["ctx"] = await svc.context(POOL, ANN, len("Ann drinks green tea"))
            out["ctx_opened"] = spy.entries(spy.opened)
            spy.reset()
            out["has"] = await svc.has_entries(POOL, ANN)
            out["refs"] = await svc.validate_references(POOL, ANN, ["mem_a1", "mem_a2"])
            out["log"] = await svc.memory_log(POOL, ANN)
            out["meta_opened"] = spy.entries(spy.opened)
        finally:
            await svc.close()
        return out

    out = asyncio.run(go())
    shown = {e.id for e in out["page"].entries}
    assert shown == {"mem_a1", "mem_a2"}
    assert out["page_opened"] == shown, "decrypted more than the reply shows"
    assert not out["page_opened"] & hidden
    assert out["ctx"].entries == ("mem_a1",) and out["ctx"].hasEntries
    # ENR-5: at most the first entry that did not fit is decrypted, never a later one.
    assert out["ctx_opened"] - {"mem_a1"} <= {"mem_a2"} and not out["ctx_opened"] & hidden
    assert [e.id for e in out["obs"].entries] == ["mem_a2"]
    assert out["obs_opened"] == {"mem_a2"}, "checking a source decrypted it"
    assert out["has"] and out["refs"] and out["meta_opened"] == set()


# --- LRN-8: tag and status changes leave the ciphertext alone ------------------------------------


def test_LRN_8_status_and_topic_changes_never_decrypt_or_reseal_content(
    tmp_path, fresh, monkeypatch
):
    """`set_status`, and learning's `invalidate` and `rename_topic`, rewrite metadata only: the
    stored ciphertext is carried over byte for byte and the content is neither decrypted for the
    change nor sealed again (the learning *context* may decrypt what the model is shown).

    Breaks tried (each fails): in `ShardService.set_status`, passing `{entry_id:
    self.store.seal_content(pool.stored, entry_id, self.store.open_content(pool.stored,
    entry_id))}` to `_queue` → "a status change touched the content" ({'mem_f1'} opened and
    sealed); in `LearningRunner._apply`, `sealed = {...}` also re-sealing every
    `decision.changed` entry → "learning re-sealed changed entries"."""
    spy = CipherSpy(monkeypatch)
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you. Tell Ann and put it right."))
    calls = [("rename_topic", {"from": "tea", "to": "drinks"}), ("invalidate", {"entry": "mem_f2"})]
    mem.routes.append(_learning_route(completion(None, tool_calls=calls)))

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            await svc.add_entries(
                POOL,
                [
                    (_fact("mem_f1", "u_ann", 10), "Ann drinks green tea"),
                    (_fact("mem_f2", "u_ann", 11), "Ann drinks tea at nine"),
                    (_fact("mem_f3", "u_ann", 12), "Ann dislikes black tea"),
                ],
            )
            pool = await svc.kernel.pool(POOL)
            before = dict(pool.stored.sealed)
            spy.reset()
            await svc.set_status(POOL, "mem_f1", Status.INVALIDATED)
            status_touched = (spy.entries(spy.opened), spy.entries(spy.sealed))
            after_status = dict(pool.stored.sealed)
            spy.reset()
            await _turn(svc, "I moved to Oslo, not Bergen")
            learn_sealed = spy.entries(spy.sealed)
            jobs = await svc.learning_jobs(POOL)
        finally:
            await svc.close()
        svc = _service(tmp_path, fresh)  # what is on disk
        try:
            pool = await svc.kernel.pool(POOL)
            on_disk = {i: pool.stored.sealed[i] for i in before}
            page = await svc.read_memory(POOL, ANN)
        finally:
            await svc.close()
        return before, status_touched, after_status, learn_sealed, jobs, on_disk, page

    before, status_touched, after_status, learn_sealed, jobs, on_disk, page = asyncio.run(go())
    assert status_touched == (set(), set()), "a status change touched the content"
    assert after_status == before
    assert jobs[-1].status == "done", jobs
    entries = {e.id: e for e in page.entries}
    # The learning step did change them: a topic renamed everywhere, one entry invalidated.
    assert "drinks" in entries["mem_f3"].tags and "tea" not in entries["mem_f3"].tags
    assert entries["mem_f2"].status == "invalidated" and entries["mem_f1"].status == "invalidated"
    assert entries["mem_f3"].content == "Ann dislikes black tea"
    assert not learn_sealed & set(before), "learning re-sealed changed entries"
    assert on_disk == before, "stored ciphertext changed"


# --- SEC-1 and LRN-2: the confessor and the encrypted call log -----------------------------------


def _route_rewrite(text: str, entries: list[str]):
    answer = completion(None, tool_calls=[("rewrite", {"text": text, "entries": entries})])
    return lambda body: answer if "rewrite" in _tool_names(body) else None


def test_SEC_1_confide_and_enrichment_calls_go_to_the_encrypted_call_log(
    tmp_path, fresh, monkeypatch
):
    """The memory bot's model requests and results for the input rewrite and for `confide` are
    stored, sealed with the pool's key, in the call log of the turn (SEC-1).

    Breaks tried (each fails): in `Conversations._own_rows`, dropping the `sink.writes.extend(
    self.store.model_call_row(...) for c in sink.calls)` line → `[None, None, None]`; in
    `MemoryBotRuntime.confessor_answer`, `log=log` → `log=None` → the confide call is missing."""
    spy = CipherSpy(monkeypatch)
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you. Tell Ann directly and put it right."))

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            mine = await svc.remember(POOL, ANN, "Ann prefers trains")
            mem.routes.append(_route_rewrite("Plan my trip to Oslo by train", [mine.id]))
            mem.routes.append(_learning_route(completion("nothing to learn")))
            result = await _turn(svc, "Plan my trip to Oslo")
            pool = await svc.kernel.pool(POOL)
            store = svc.conversations.store
            calls = [await store.model_call(pool.stored, result.turn.id, s) for s in (1, 2, 3)]
        finally:
            await svc.close()
        return result, calls

    result, calls = asyncio.run(go())
    assert calls[0] is not None and calls[1] is not None, calls
    rewrite, confide = calls[0], calls[1]
    assert "Plan my trip to Oslo" in rewrite.request and "Oslo by train" in rewrite.response
    assert CONFIDE[1]["text"] in confide.request and "Tell Ann directly" in confide.response
    assert calls[2] is None
    sealed = {k for k in spy.sealed if k.startswith(f"{POOL}\x00call\x00{result.turn.id}\x00")}
    assert len(sealed) == 2, "call records not sealed with the pool's key"


def test_LRN_2_the_confessor_listens_without_judging_and_gives_no_task(tmp_path, fresh):
    """The confessor's instructions (and the fixed calm answer) say what LRN-2 asks, and are
    what the memory model actually receives on `confide`.

    Break tried: `confessor_messages`' system text → "You are a confessor." → fails on
    `'listen' in 'you are a confessor.'`."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you."))

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            await _turn(svc, "hi", org=OFF)  # botMemory off: answers still come (LRN-10)
        finally:
            await svc.close()

    asyncio.run(go())
    (request,) = [b for b in mem.requests if not b.get("tools")]
    system = request["messages"][0]["content"]
    assert request["messages"][0]["role"] == "system"
    assert request["messages"][-1]["content"] == CONFIDE[1]["text"]
    assert system == confessor_messages(CONFIDE[1]["text"], "")[0].content
    said = system.lower()
    for phrase in (
        "listen",
        "do not judge",
        "mistakes are part of work",
        "tell the person directly",
        "put things right",
        "no new task",
    ):
        assert phrase in said, phrase
    calm = CALM_ANSWER.lower()
    for phrase in ("mistakes", "part of the work", "tell the person directly", "put it right"):
        assert phrase in calm, phrase


# --- LRN-10, ENR-4: review chats and `botMemory` off ----------------------------------------------

AUTO = Org(
    id="o1", name="o", settings=OrgSettings(botMemory=True, botMemoryModel="mem", autoRecord=True)
)
AUTO_OFF = Org(
    id="o1", name="o", settings=OrgSettings(botMemory=False, botMemoryModel="mem", autoRecord=True)
)


def test_LRN_10_review_chats_have_no_confide_and_learn_nothing(tmp_path, fresh):
    """A review chat offers no `confide`; a bot that calls it anyway gets no confessor, and the
    turn is never learned from, even with autoRecord on.

    Breaks tried (each fails): in `BotStepper._confide`, dropping `if step.chat.kind ==
    "review": return None` → a confession is recorded; in `conversations.learns`,
    `chat.kind in ("review", "agent")` → `chat.kind in ("agent",)` → a learning job exists."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Here is my review."))
    mem.routes.append(_learning_route(completion(None, tool_calls=[("learn_fact", LEARN)])))
    review = Chat(id="chat_1", kind="review", owner="u_ann", org="o1", bot="b1")

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            await _turn(svc, "Please review this", chat=review, org=AUTO)
            return (
                await svc.confessions("chat_1"),
                await svc.learning_jobs(POOL),
                await svc.read_memory(POOL, ANN),
            )
        finally:
            await svc.close()

    confessions, jobs, page = asyncio.run(go())
    assert "confide" not in _tool_names(bot.requests[0])
    assert confessions == [] and jobs == [] and page.entries == ()
    assert mem.requests == []


def test_LRN_10_bot_memory_off_still_answers_confide_but_learns_nothing(tmp_path, fresh):
    """With `botMemory` off the confessor still answers, and no learning execution is made.

    Break tried: in `conversations.learns`, dropping `not org.settings.botMemory or` → a job
    runs and the fact is stored (`jobs == []` fails)."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you."))
    mem.routes.append(_learning_route(completion(None, tool_calls=[("learn_fact", LEARN)])))

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            await _turn(svc, "I moved to Oslo", org=AUTO_OFF)
            return (
                await svc.confessions("chat_1"),
                await svc.learning_jobs(POOL),
                await svc.read_memory(POOL, ANN),
            )
        finally:
            await svc.close()

    confessions, jobs, page = asyncio.run(go())
    assert [(c.answer, c.calm) for c in confessions] == [("I hear you.", False)]
    assert jobs == [] and page.entries == ()
    assert _learning_requests(mem) == []


def test_ENR_4_bot_memory_off_leaves_the_input_unchanged(tmp_path, fresh):
    """With `botMemory` off the memory bot is not asked to rewrite and the bot's model gets the
    person's own words, with no enrichment record.

    Break tried: in `BotStepper._enrich`, `not (org.settings.botMemory and
    org.settings.botMemoryModel)` → `not org.settings.botMemoryModel` → the bot's model gets
    the rewrite."""
    bot, mem = fresh
    bot.answer(completion("Sure."))

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            mine = await svc.remember(POOL, ANN, "Ann prefers trains")
            mem.routes.append(_route_rewrite("Plan my trip to Oslo by train", [mine.id]))
            await _turn(svc, "Plan my trip to Oslo", org=OFF)
            return await svc.enrichments("chat_1")
        finally:
            await svc.close()

    enrichments = asyncio.run(go())
    assert bot.requests[0]["messages"][-1]["content"] == "Plan my trip to Oslo"
    assert enrichments == [] and mem.requests == []


# --- ENR-2: a group's reader ----------------------------------------------------------------------


def test_ENR_2_in_a_channel_group_only_the_groups_and_bot_entries_shape_the_input(tmp_path, fresh):
    """The reader of a group turn's enrichment admits `for:channel:<group>` and `for:bot`
    entries only — not the person's own entries, not another channel's.

    Break tried: in `bot_step.reader_for`, the group reader's `user="\\x00"` →
    `user=step.operator` → the person's own entry is in the context."""
    group = Chat(id="chat_g", kind="group", owner="u_ann", org="o1", channel="c1")
    step = StepInput(
        chat=group, bot=BOT, org=ORG, operator="u_ann", turn="t1", text="hi", channel="c1"
    )
    reader = reader_for(step)
    assert reader is not None

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            await svc.add_entries(
                POOL,
                [
                    (_pinned("mem_p1", ("for:person:u_ann", "org:o1"), 1), "Ann's private note"),
                    (_pinned("mem_c1", ("for:channel:c1", "org:o1"), 2), "the group's plan"),
                    (_pinned("mem_c2", ("for:channel:c2", "org:o1"), 3), "another group"),
                    (_pinned("mem_bt", ("for:bot", "org:o1"), 4), "the bot's own habit"),
                ],
            )
            return await svc.context_parts(POOL, reader, 10_000)
        finally:
            await svc.close()

    parts, has = asyncio.run(go())
    assert {i for i, _ in parts} == {"mem_c1", "mem_bt"} and has


# --- MB-4, MB-5: the time limits ------------------------------------------------------------------


def test_MB_4_MB_5_default_limits_are_15_seconds_and_2_minutes(tmp_path):
    """The limits themselves (the tests below shorten them through the same attributes).

    Breaks tried: `ANSWER_WAIT = 15.0` → `150.0` → `(150.0, 120.0) == (15.0, 120.0)` fails
    (it first *survived*: `ShardService` had its own literal 15.0, so the constant was dead; the
    default now comes from `engine.turns.ANSWER_WAIT`); `LEARNING_STEP_LIMIT = 120.0` →
    `1200.0` → fails."""

    async def go():
        svc = ShardService(tmp_path, 0, models={})
        try:
            return svc.memory_bot.answer_wait, svc.learning.step_limit
        finally:
            await svc.close()

    assert asyncio.run(go()) == (15.0, 120.0)


def test_MB_4_the_wait_for_a_busy_slot_counts_toward_the_answer_limit(tmp_path, fresh):
    """With the memory bot's one slot busy, the rewrite and the confide answer each give up
    after `answer_wait` (15 s in production, 1 s here): unchanged input, the calm answer.

    Break tried: in `MemoryBotRuntime.call`, `done = await asyncio.wait_for(run(), timeout)` →
    `done = await run()` (the model's own timeout still applies, the slot wait is unbounded) →
    the turn waits for the slot (elapsed ≥ 6 s) and then gets the rewrite."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Sorry, Ann."))
    mem.answer(completion("I hear you."))

    async def go():
        svc = _service(tmp_path, fresh, answer_wait=1.0)
        svc.learning.step_limit = 1.0
        release = asyncio.Event()
        try:
            mine = await svc.remember(POOL, ANN, "Ann prefers trains")
            mem.routes.append(_route_rewrite("Plan my trip to Oslo by train", [mine.id]))
            settings = await svc.patch_memory_bot_settings(
                POOL, SettingsPatch(expected=0, concurrency=1)
            )
            held = asyncio.Event()

            async def hold():
                async with svc.memory_bot.slot(POOL, settings):
                    held.set()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(release.wait(), 6.0)

            holder = asyncio.create_task(hold())
            await held.wait()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            turn = await svc.start_turn(
                TurnStart(chat=CHAT, bot=BOT, org=ORG, operator="u_ann", text="Plan my trip")
            )
            await svc.wait_turn(CHAT.id, turn.id)
            elapsed = loop.time() - t0
            release.set()
            await holder
            await svc.learning_idle()
            return elapsed, await svc.confessions("chat_1"), await svc.enrichments("chat_1")
        finally:
            release.set()
            await svc.close()

    elapsed, confessions, enrichments = asyncio.run(go())
    assert elapsed < 4.5, elapsed
    assert bot.requests[0]["messages"][-1]["content"] == "Plan my trip"  # unchanged input
    assert enrichments == []
    assert [(c.answer, c.calm) for c in confessions] == [(CALM_ANSWER, True)]


def test_MB_5_a_slow_learning_step_ends_safely_and_the_evidence_stays_unread(tmp_path, fresh):
    """A learning step over the limit (2 min in production, 0.5 s here) ends the execution as
    failed with a safe message; the read position does not move, nothing is stored, and a later
    confide learns from the same evidence.

    Break tried: in `LearningRunner._execute`, `timeout=self.step_limit` → `timeout=600.0` →
    the slow step (3 s) completes and stores the fact (`status == "failed"` fails)."""
    bot, mem = fresh
    bot.answer(
        completion(None, tool_calls=[CONFIDE]),
        completion("Sorry, Ann."),
        completion(None, tool_calls=[CONFIDE]),
        completion("Done."),
    )
    learn = completion(None, tool_calls=[("learn_fact", LEARN)])
    slow = [True]
    mem.routes.append(
        lambda b: (
            (("delay", 3.0, learn) if slow[0] else learn)
            if "learn_fact" in _tool_names(b)
            else None
        )
    )

    async def go():
        svc = _service(tmp_path, fresh)
        svc.learning.step_limit = 0.5
        try:
            await _turn(svc, "I moved to Oslo")
            first = (
                await svc.learning_jobs(POOL),
                await svc.learning.store.position(POOL, "chat_1"),
                await svc.read_memory(POOL, ANN),
            )
            slow[0] = False
            await _turn(svc, "Did you get that?")
            second = (
                await svc.learning_jobs(POOL),
                await svc.learning.store.position(POOL, "chat_1"),
                await svc.read_memory(POOL, ANN),
            )
            return first, second
        finally:
            await svc.close()

    (jobs, position, page), (jobs2, position2, page2) = asyncio.run(go())
    assert [(j.status, j.error) for j in jobs] == [
        ("failed", "the learning step took longer than 2 minutes")
    ]
    assert position == 0 and page.entries == ()
    assert sorted(j.status for j in jobs2) == ["done", "failed"]
    assert position2 == 4 and [e.content for e in page2.entries] == ["Ann lives in Oslo"]


# --- LRN-5: the same evidence is never applied twice ----------------------------------------------


def test_LRN_5_concurrent_learning_applies_the_same_evidence_once(tmp_path, fresh):
    """Two executions over the same items, started together: one model step, one fact, and the
    read position, the fact and both jobs' ends are on disk after a restart.

    Breaks tried: in `LearningRunner._run`, `lock = self._chains.setdefault(...)` →
    `lock = asyncio.Lock()` (no per-chat exclusion) → fails, "the same evidence went to the
    model twice" (the `_apply` re-check still keeps one fact); that break plus `if await
    self._position(...) >= job.upto:` in `_apply` → `if False:` → fails, "applied twice" (two
    facts). Survived (harmless): `if start >= job.upto:` in `_execute` → `if False:` alone —
    the evidence window `start < seq <= upto` is then empty, so the job ends without a model
    call."""
    bot, mem = fresh
    bot.answer(completion("Noted."))
    mem.routes.append(
        _learning_route(("delay", 0.3, completion(None, tool_calls=[("learn_fact", LEARN)])))
    )
    plain = Org(id="o1", name="o", settings=OrgSettings(botMemory=True, botMemoryModel="mem"))

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            await _turn(svc, "I moved to Oslo", org=plain)  # no confide: nothing learned yet
            jobs = [
                svc.conversations.new_job(BOT, CHAT, f"turn-{k}", 2, "for:person:u_ann", plain)
                for k in range(2)
            ]
            await asyncio.gather(*(svc.learning.schedule(j) for j in jobs))
            await svc.learning_idle()
        finally:
            await svc.close()
        svc = _service(tmp_path, fresh)
        try:
            return (
                await svc.read_memory(POOL, ANN),
                await svc.learning_jobs(POOL),
                await svc.learning.store.position(POOL, "chat_1"),
            )
        finally:
            await svc.close()

    page, jobs, position = asyncio.run(go())
    assert [e.content for e in page.entries] == ["Ann lives in Oslo"], "applied twice"
    assert len(_learning_requests(mem)) == 1, "the same evidence went to the model twice"
    assert [j.status for j in jobs] == ["done", "done"] and position == 2


# --- SC-6: the extraction request stays under 60,000 characters ---------------------------------


def test_SC_6_build_request_keeps_whole_json_under_the_limit_person_words_first():
    """Engine rule: at most 60,000 characters (minus the caller's overhead), sized on the JSON,
    whole strings only, person items before other items, the JSON whole.

    Breaks tried (each fails): `REQUEST_LIMIT = 60_000` → `600_000`; `if sizes_i[k] <= room:`
    → `if True:`; `key=lambda k: (evidence[k].kind != "person", -k)` → `key=lambda k: -k`."""
    from engine.learning import REQUEST_LIMIT, ContextEntry, EvidenceItem, build_request

    assert REQUEST_LIMIT == 60_000
    evidence = []
    for k in range(120):
        kind = "person" if k % 3 == 0 else "bot"
        text = f"{kind}-{k:03d} " + '\u00e9"\\' * 300 + " end"  # escapes grow the JSON
        evidence.append(EvidenceItem(chat="c", item=f"i-{k}", kind=kind, author="a", text=text))
    entries = [
        ContextEntry(
            id=f"mem_{k}",
            layer="fact",
            tier="log",
            scope="bot",
            content="x" * 500,
            topics=("t",),
            status="active",
        )
        for k in range(200)
    ]
    text, kept = build_request(evidence, entries, {"t": 200}, overhead=400)
    assert len(text) <= REQUEST_LIMIT - 400
    body = json.loads(text)
    originals = {e.item: e.text for e in evidence}
    assert all(e["text"] == originals[e["item"]] for e in body["evidence"])  # never truncated
    kinds = [e.kind for e in kept]
    persons = sum(1 for e in evidence if e.kind == "person")
    if "bot" in kinds:
        assert kinds.count("person") == persons, "a bot item displaced a person's words"
    assert kinds.count("person") > 0


def test_SC_6_the_learning_request_with_its_instructions_fits_60000(tmp_path, fresh):
    """Through the runner: system text + request ≤ 60,000 characters with a pool far larger.

    Break tried: in `LearningRunner._execute`, `overhead=len(LEARNING_SYSTEM)` → `overhead=0`
    → the messages together exceed 60,000."""
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    mem.answer(completion("I hear you."))
    mem.routes.append(_learning_route(completion("nothing new")))

    async def go():
        svc = _service(tmp_path, fresh)
        try:
            await svc.add_entries(
                POOL,
                [
                    (_fact(f"mem_{k:04d}", "u_ann", 10 + k), f"{k:04d} " + "y" * 150)
                    for k in range(400)
                ],
            )
            await _turn(svc, "I moved to Oslo")
        finally:
            await svc.close()

    asyncio.run(go())
    (request,) = _learning_requests(mem)
    total = sum(len(m["content"] or "") for m in request["messages"])
    assert 55_000 < total <= 60_000, total


# --- ND-2: memory only on nodes that isolate it; extraction only where offered ---------------


class NodeStub:
    """A model served by an execution node that reports its memory flags (the `isolation()` of
    actors/node_hub.NodeModel), recording what it was asked."""

    def __init__(self, name: str, isolation: bool, extraction: bool, answer: str) -> None:
        self.name = name
        self.price = Price()
        self.flags = (isolation, extraction)
        self.answer = answer
        self.calls: list[list] = []

    async def isolation(self) -> tuple[bool, bool]:
        return self.flags

    async def complete(self, messages, tools=(), *, timeout: float = 60.0) -> Completion:
        self.calls.append([m.content for m in messages] + [t.name for t in tools])
        if any(t.name == "learn_fact" for t in tools):
            return Completion(text="nothing new")
        return Completion(text=self.answer)


def test_ND_2_extraction_runs_only_on_a_node_reporting_memory_extraction(tmp_path, fresh):
    """The memory model on a node with `memory_extraction: false` never gets a learning
    request (the job ends with a clear error); with it true, learning runs.

    Break tried: in `LearningRunner._execute`, `if isolation is not None and not (await
    isolation())[1]:` → `if False:` → the node gets the extraction request."""
    bot, _ = fresh
    bot.answer(
        completion(None, tool_calls=[CONFIDE]),
        completion("Sorry."),
        completion(None, tool_calls=[CONFIDE]),
        completion("Sorry again."),
    )
    node = NodeStub("mem", isolation=True, extraction=False, answer="I hear you.")
    models = {"bot": OpenAIModel("bot", base_url=bot.url, model="bot-model"), "mem": node}

    async def go():
        svc = _service(tmp_path, fresh, models=models)
        try:
            await _turn(svc, "I moved to Oslo")
            first = await svc.learning_jobs(POOL), list(node.calls)
            node.flags = (True, True)
            await _turn(svc, "and I like trains")
            return first, await svc.learning_jobs(POOL), list(node.calls)
        finally:
            await svc.close()

    (jobs, calls), jobs2, calls2 = asyncio.run(go())
    assert [(j.status, j.error) for j in jobs] == [
        ("failed", "the memory model's node cannot run extraction")
    ]
    assert not any("learn_fact" in c for c in calls), "extraction ran on a node without it"
    assert any("learn_fact" in c for c in calls2) and "done" in [j.status for j in jobs2]


def test_ND_2_memory_reaches_a_bot_only_on_a_node_reporting_memory_isolation(tmp_path, fresh):
    """A bot whose model runs on a node without `memory_isolation` gets no enrichment and no
    memory in its prompt; the same bot on an isolating node does.

    Break tried: in `BotStepper.memory_allowed`, `return (await isolation())[0]` →
    `return True` → the non-isolating node receives the rewritten input."""
    _, mem = fresh
    node = NodeStub("bot", isolation=False, extraction=False, answer="Sure.")
    models = {"bot": node, "mem": OpenAIModel("mem", base_url=mem.url, model="mem-model")}

    async def go():
        svc = _service(tmp_path, fresh, models=models)
        try:
            mine = await svc.remember(POOL, ANN, "Ann prefers trains")
            mem.routes.append(_route_rewrite("Plan my trip to Oslo by train", [mine.id]))
            await _turn(svc, "Plan my trip to Oslo")
            first = list(node.calls)
            node.flags = (True, False)
            node.calls.clear()
            await _turn(svc, "Plan my trip to Oslo")
            return first, list(node.calls)
        finally:
            await svc.close()

    first, second = asyncio.run(go())
    seen = "\n".join(str(x) for x in first[0])
    assert "Plan my trip to Oslo by train" not in seen and "trains" not in seen
    assert "Plan my trip to Oslo by train" in "\n".join(str(x) for x in second[0])


def test_LRN_5_learned_changes_read_position_and_job_end_commit_together(
    tmp_path, fresh, monkeypatch
):
    """If the transaction carrying the read position fails, the learned fact and the job's end
    are not on disk either (each batch is its own transaction here, so a split would show).

    Break tried: in `LearningRunner._apply`, moving `self.store.position_row(...)` out of
    `extra` into its own `kernel.stage(Batch(...))` → the fact and "done" are stored
    while the position is not (fails `assert ['Ann lives in Oslo'] == []`)."""
    from engine.errors import StorageError
    from storage.group_commit import GroupCommitter

    original = GroupCommitter._commit
    failed = []

    def commit(self, batches, con):
        writes = [w for batch in batches for w in batch]
        # Every time: the automatic retries (CO-3) fail the same way.
        if any(getattr(w, "table", "") == "learn_positions" for w in writes):
            failed.append(True)
            raise StorageError("disk full (simulated)")
        return original(self, batches, con)

    monkeypatch.setattr(GroupCommitter, "_commit", commit)
    bot, mem = fresh
    bot.answer(completion(None, tool_calls=[CONFIDE]), completion("Noted."))
    mem.answer(completion("I hear you."))
    mem.routes.append(_learning_route(completion(None, tool_calls=[("learn_fact", LEARN)])))

    async def go():
        svc = _service(tmp_path, fresh, group_commit=False)
        try:
            await _turn(svc, "I moved to Oslo")
        finally:
            await svc.close()
        svc = _service(tmp_path, fresh)  # what is on disk (no call starts recovery)
        try:
            return (
                await svc.read_memory(POOL, ANN),
                await svc.learning_jobs(POOL),
                await svc.learning.store.position(POOL, "chat_1"),
            )
        finally:
            await svc.close()

    page, jobs, position = asyncio.run(go())
    assert failed, "the learning transaction was never attempted"
    assert position == 0
    assert [e.content for e in page.entries] == []
    assert [j.status for j in jobs] == ["failed"]


# --- found by mutation testing (engine/visibility.py) -------------------------------------------


def test_ACL_1_an_unknown_kind_of_for_tag_admits_nobody():
    """A `for:` tag of a kind the engine does not know fails closed.

    Surviving mutants this kills (checked): `grant_admits`' final `return False` → `return
    True`; `directly_visible`'s `return org_ok and admitted and ...` → `org_ok or admitted and
    ...` (the shard's audience index hides both from the other tests: such entries are never
    candidates)."""
    from engine.visibility import directly_visible, grant_admits

    odd = _pinned("mem_x", ("org:o1", "for:team:t1"))
    for reader in (ANN, BOB, Reader(user="t1", org="o1", channels=frozenset({"t1"}))):
        assert not grant_admits(reader, "for:team:t1")
        assert not directly_visible(reader, odd)


def test_ACL_2_any_one_grant_admits_whatever_the_other_grants_say():
    """An entry for several audiences admits a reader named by any one of them.

    Surviving mutant this kills: in `directly_visible`, `elif not admitted and
    tag.startswith("for:")` → `elif not admitted or ...` (a later grant overrode an earlier
    one that admitted the reader)."""
    from engine.visibility import directly_visible

    both = _pinned("mem_y", ("org:o1", "for:person:u_ann", "for:channel:c9", "tea"))
    assert directly_visible(ANN, both)
    assert directly_visible(Reader(user="u_bob", org="o1", channels=frozenset({"c9"})), both)
    assert not directly_visible(BOB, both)
