"""One bot's step in a chat, on the shard that holds the bot's memory (docs/design.md §5 steps 2-4).

Direct chats, each participant of a group round and each peer of a collaboration chain run the
same step: enrichment of a person's input (ENR), the bot's model with its tools (docs/design.md §6),
`confide` with the memory bot's answer. The step does not add chat items itself: the chat's
home shard stores the reply. What the step records (confessions, enrichment records, the model
call log, spend) goes into the caller's batch, so a direct turn still commits in one transaction.

Workspace tools that reach outside the step (sending to another bot, posting to a group) are
answered at once with a receipt and returned as effects; the home shard carries them out under
the collaboration chain's rules (WS-4, CO-1).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable

import msgspec

from actors.chats.requests import Requests
from actors.chats.sent_gate import REFUSED, SendUnconfirmed, StepWrites
from actors.chats.step_memory import StepMemory
from actors.chats.step_policy import (
    NOT_HERE,
    UNRECORDED_TOOLS,
    WRITING_TOOLS,
    may_request,
    memory_reader,
    reader_for,
)
from actors.contracts import (
    Effect,
    StepInput,
    StepOutcome,
    ToolUse,
)
from actors.learning.memory_bot_runtime import MemoryBotRuntime
from actors.models.registry import ModelError, measured
from actors.runtime.lock_guard import assert_no_pool_lock
from actors.runtime.peers import Peers
from actors.shard.batch import Batch
from actors.shard.kernel import ShardKernel, durable, ignore_failure
from actors.shard.memory_ops import MemoryOps
from engine.bot_policy import require_collaboration
from engine.chat_records import Confession, Enrichment
from engine.directory import Bot, bot_pool
from engine.errors import OpenBotError
from engine.models import Message, ToolCall
from engine.requests import parse_proposal
from engine.self_rules import Editor, parse_update, rules_view
from engine.turns import (
    accept_rewrite,
    bot_system_prompt,
    bot_tools,
    enrichment_messages,
    review_prompt,
)
from storage.chat_store import ChatLog, ChatStore
from storage.group_commit import Put

LogOf = Callable[[], Awaitable[ChatLog]]  # the chat's log on this shard, read on first use
TOOL_ROUNDS = 4
FIND_TTL = 2.0
MEMORY_INSTRUCTIONS = (
    "What you remember, by scope. Use it when it helps; what is not here may be found with "
    "workspace_memory_search."
)
ENRICH_CONTEXT = 8_000
CONFIDE_CONTEXT = 4_000  # characters of memory the confessor may be given
SEARCH_HITS = 10
_enc = msgspec.json.Encoder()


class BotStepper:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        runtime: MemoryBotRuntime,
        store: ChatStore,
        memory: MemoryOps,
        requests: Requests,
        peers: Peers,
        keyword_only: bool = False,
    ) -> None:
        self.kernel = kernel
        self.runtime = runtime
        self.store = store
        self.memory = memory
        self.requests = requests
        self.peers = peers
        self.scoped = StepMemory(
            memory=memory.memory_reader, peers=peers, keyword_only=keyword_only
        )
        # A send's target by name, for FIND_TTL seconds: the delivery reads the peer again
        # (and an archived one is asked nothing), so this only saves the lookup's actor call.
        self._found: dict[tuple[str, str], tuple[float, Bot]] = {}

    async def _find_bot(self, org: str, agent: str) -> Bot:
        key, now = (org, agent.strip().casefold()), time.monotonic()
        hit = self._found.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        bot = await self.peers.directory().find_bot(org, agent)
        if len(self._found) >= 10_000:
            self._found.clear()
        self._found[key] = (now + FIND_TTL, bot)
        return bot

    async def run(self, step: StepInput, log: LogOf, batch: Batch) -> StepOutcome:
        """`log` gives the chat's log on this shard, read only if the step records something
        with it (an enrichment, a confession)."""
        bot = step.bot
        pool = bot_pool(bot.id)
        records = self.memory.memory_reader.records
        if step.chat.kind != "review" and records.get(pool) is None:
            # A bot's first step loads its memory: its records' reads start beside the settings'
            # pool load instead of after it (each was 5-30 ms at a chain's first hops).
            ignore_failure(asyncio.ensure_future(records.pool(pool)))
        settings = await self.memory.memory_bot_settings(pool)
        text = await self._enrich(step, log, batch, settings)
        model = self.runtime.model(bot.model)
        if model is None:
            return StepOutcome(
                status="failed",
                error="the bot has no model",
                note="This bot has no model configured.",
            )
        review = step.chat.kind == "review"
        memory = "" if review else await self._packed_memory(step)
        system = bot_system_prompt(bot, memory)
        if step.review is not None:
            system += "\n" + review_prompt(step.review)
        messages = [Message(role="system", content=system), *step.history]
        messages.append(Message(role="user", content=text))  # ENR-3: the model sees the rewrite
        messages.extend(step.after)
        tools = bot_tools(review=review)
        offered = {t.name for t in tools}  # a made-up tool name is never recorded
        confided = False
        confessions = 0
        effects: list[Effect] = []
        used: list[ToolUse] = []
        done = None
        sent = StepWrites(self.peers, step.sent)  # a delivery's send, asked for on first write
        for _ in range(TOOL_ROUNDS):
            try:
                assert_no_pool_lock("the bot's model call")
                done = await measured(model, messages, tools)
            except ModelError as e:
                return StepOutcome(
                    status="failed",
                    error=e.message,
                    note="The bot's model did not answer.",
                    effects=tuple(effects),
                    confided=confided,
                    tools=tuple(used),
                )
            if not done.tool_calls:
                break
            messages.append(
                Message(role="assistant", content=done.text, tool_calls=done.tool_calls)
            )
            for call in done.tool_calls:
                try:
                    if call.name == "confide" and not await sent.stored():
                        result = REFUSED  # its confession would outlive the failed send
                    elif call.name == "confide":
                        result = await self._confide(call, step, log, settings, confessions, batch)
                        if result is not None:
                            confided = True
                            confessions += 1
                    else:
                        result = await self._workspace_tool(
                            call, step, effects, batch.durable_before, sent
                        )
                except SendUnconfirmed as e:  # unknown is not "not stored": the step fails
                    return StepOutcome(
                        status="failed",
                        error=f"{e.code}: {e.message}",
                        effects=tuple(effects),
                        tools=tuple(used),
                    )
                if call.name in offered and call.name not in UNRECORDED_TOOLS:
                    used.append(
                        ToolUse(
                            tool=call.name,
                            arguments=call.arguments,
                            result=result or "not available",
                        )
                    )
                messages.append(
                    Message(role="tool", content=result or "not available", tool_call_id=call.id)
                )
        reply = (done.text if done else "") or ""
        return StepOutcome(
            status="done",
            reply=reply,
            effects=tuple(effects),
            confided=confided,
            tools=tuple(used),
        )

    async def memory_allowed(self, bot: Bot) -> bool:
        """ND-2: memory reaches a bot's model only on a node that isolates it (the built-in
        worker does; an external node must say so)."""
        model = self.runtime.model(bot.model)
        isolation = getattr(model, "isolation", None)
        if isolation is None:
            return True
        return (await isolation())[0]

    async def _packed_memory(self, step: StepInput) -> str:
        """SC-5: the bot's, the person's and the chat's project memory (a group's: its linked
        projects') in one budget (actors/chats/step_memory.py). Nothing on a node that does
        not isolate (ND-2)."""
        if not await self.memory_allowed(step.bot):
            return ""
        return await self.scoped.packed(step, memory_reader(step), MEMORY_INSTRUCTIONS)

    async def _enrich(self, step: StepInput, log: LogOf, batch: Batch, settings) -> str:
        """ENR-1 … ENR-4: the memory bot may rewrite the input from entries this reader may see."""
        org = step.org
        reader = reader_for(step)
        if reader is None or not (org.settings.botMemory and org.settings.botMemoryModel):
            return step.text
        if not await self.memory_allowed(step.bot):
            return step.text
        pool = bot_pool(step.bot.id)
        # What the input is about first (the one memory search, when not all fits).
        parts, has = await self.scoped.context(step, reader, step.text, ENRICH_CONTEXT)
        if not (has and parts):
            return step.text
        done = await self.runtime.rewrite(
            pool,
            settings,
            org.settings.botMemoryModel,
            enrichment_messages(step.text, parts, settings.instructions),
            batch.calls,
            org=step.chat.org,
        )
        call = next((c for c in (done.tool_calls if done else ()) if c.name == "rewrite"), None)
        rewrite = accept_rewrite(call.arguments, {i for i, _ in parts}) if call else None
        if rewrite is None:
            return step.text
        record = Enrichment(
            turn=step.turn,
            text=rewrite.text,
            original=step.text,
            entries=rewrite.entries,
            at=self.kernel.clock(),
        )
        batch.writes.append(self.store.enrichment_row(await log(), record))
        return rewrite.text

    async def _confide(
        self,
        call: ToolCall,
        step: StepInput,
        log: LogOf,
        settings,
        n: int,
        batch: Batch,
    ) -> str | None:
        if step.chat.kind == "review":
            return None  # review chats have no confide
        text = str(_args(call).get("text", "")).strip()
        if not text:
            return None
        pool = bot_pool(step.bot.id)
        answer, calm = await self.runtime.confessor_answer(
            pool,
            settings,
            step.org.settings.botMemoryModel,
            text,
            batch.calls,
            await self._confessor_memory(step, pool, text),
            org=step.chat.org,
        )
        record = Confession(
            turn=step.turn, text=text, answer=answer, calm=calm, at=self.kernel.clock()
        )
        row = self.store.confession_row(await log(), record, n)
        # A delivery asked again after a restart confides again under the same key: replaced.
        batch.writes.append(Put(*row) if step.sent is not None else row)
        return answer

    async def _confessor_memory(
        self, step: StepInput, pool: str, text: str
    ) -> list[tuple[str, str]]:
        """What the confessor may know of the bot's memory: the entries the reader of this
        step (the person, or the channel, it works for) may see, by the same checks as an
        enrichment (ENR-2); nothing for a delivery between bots or with memory off."""
        reader = reader_for(step)
        org = step.org.settings
        if reader is None or not (org.botMemory and org.botMemoryModel):
            return []
        if not await self.memory_allowed(step.bot):
            return []
        parts, _ = await self.scoped.context(step, reader, text, CONFIDE_CONTEXT)
        return parts

    async def _workspace_tool(
        self,
        call: ToolCall,
        step: StepInput,
        effects: list[Effect],
        after: Callable[[], asyncio.Future[None] | None] | None = None,
        sent: StepWrites | None = None,
    ):
        """`after()`: the commit the step's own rows wait for (a direct turn's person item).
        Tools that write elsewhere at once wait for it first: a turn whose item failed to
        store leaves no member, rules change or request behind for its retry to repeat. `sent`:
        for a delivery, the send it answers, on another shard (sent_gate.py): the same."""
        args = _args(call)
        bot = step.bot
        if call.name == "workspace_request_approval" and not may_request(step):
            return NOT_HERE  # (asks the gate nothing)
        if sent is not None and call.name in WRITING_TOOLS and not await sent.stored():
            return REFUSED  # (`SendUnconfirmed` goes up: the step fails)
        try:
            if call.name in WRITING_TOOLS:
                await durable(after() if after is not None else None)
            if call.name == "workspace_get_self_rules":
                return _enc.encode(rules_view(bot)).decode()
            if call.name == "workspace_update_self_rules":
                update = parse_update(args)
                changed = await self.peers.directory().update_rules(
                    bot.id, update, Editor(kind="self", id=bot.id)
                )
                return _enc.encode(rules_view(changed)).decode()
            if call.name == "workspace_create_agent":
                name, prompt, rules = (
                    str(args.get("name", "")),
                    args.get("prompt"),
                    args.get("rules"),
                )
                made_as = sent.member_id(name, prompt, rules) if sent else None  # (a delivery's)
                member = await self.peers.directory().create_member(
                    bot.id, name, prompt, rules, made_as
                )
                return _enc.encode({"id": member.id, "name": member.name}).decode()
            if call.name in ("workspace_rename_agent", "workspace_archive_agent"):
                return await self._manage_member(call.name, step, args)
            if call.name == "workspace_memory_search":
                return await self._search(step, str(args.get("query", "")))
            if call.name == "workspace_chat_search":
                if not await self.memory_allowed(step.bot):  # other chats' words: as memory
                    return _enc.encode(
                        {"error": "memory_not_isolated", "message": "memory is off on this node"}
                    ).decode()
                found = await self.scoped.search_chats(step, str(args.get("query", "")))
                return _enc.encode({"items": found}).decode()
            if call.name == "workspace_send_to_agent":
                return await self._send(step, args, effects)
            if call.name == "workspace_request_approval":
                return await self._request(step, args)
            if call.name == "workspace_post_to_group":
                return await self._post(step, args, effects)
        except msgspec.ValidationError as e:
            return _enc.encode({"error": "invalid_arguments", "message": str(e)}).decode()
        except OpenBotError as e:
            return _enc.encode({**e.details, "error": e.code, "message": e.message}).decode()
        return None

    async def _manage_member(self, name: str, step: StepInput, args: dict) -> str:
        """WS-3: the creator renames or archives a member it created (never its other rules)."""
        directory = self.peers.directory()
        member = await directory.find_bot(step.org.id, str(args.get("agent", "")))
        editor = Editor(kind="bot", id=step.bot.id)
        if name == "workspace_archive_agent":
            changed = await directory.archive_bot(member.id, True, editor)
            return _enc.encode({"id": changed.id, "archived": changed.archived}).decode()
        update = parse_update({"expectedRevision": member.revision, "name": args.get("name")})
        changed = await directory.update_rules(member.id, update, editor)
        return _enc.encode({"id": changed.id, "name": changed.name}).decode()

    async def _send(self, step: StepInput, args: dict, effects: list[Effect]) -> str:
        agent, message = str(args.get("agent", "")), str(args.get("message", "")).strip()
        require_collaboration(step.bot, step.org)  # WS-1: server policy, not a client toggle
        peer = await self._find_bot(step.org.id, agent)
        if peer.id == step.bot.id:
            return _enc.encode({"error": "self_send", "message": "that is you"}).decode()
        require_collaboration(peer, step.org, role="target")  # archived bots are not asked
        if not message:
            return _enc.encode({"error": "empty_message", "message": "say something"}).decode()
        link = "dlv_" + secrets.token_hex(8)
        effects.append(Effect(kind="send", link=link, target=peer.id, message=message, peer=peer))
        # WS-4: a receipt at once; the peer's reply comes back later as a delivery.
        return _enc.encode({"receipt": link, "to": peer.id, "status": "queued"}).decode()

    async def _request(self, step: StepInput, args: dict) -> str:
        """ENR-3: store what the bot proposes, for the person of this turn (or the group's
        people) to approve; the rewritten input it saw is never part of it."""
        request = await self.requests.create(
            bot=step.bot.id,
            org=step.chat.org,
            chat=step.chat.id,
            turn=step.turn,
            owner=step.operator,
            channel=step.channel if step.chat.kind == "group" else None,
            proposal=parse_proposal(args),
        )
        return _enc.encode({"request": request.id, "status": request.status}).decode()

    async def _post(self, step: StepInput, args: dict, effects: list[Effect]) -> str:
        group, message = str(args.get("group", "")), str(args.get("message", "")).strip()
        require_collaboration(step.bot, step.org)
        channel = await self.peers.directory().get_channel(group)
        if step.bot.id not in channel.bots or channel.org != step.org.id:
            return _enc.encode(
                {"error": "not_a_member", "message": "you can only post to your own groups"}
            ).decode()
        if not message:
            return _enc.encode({"error": "empty_message", "message": "say something"}).decode()
        link = "pst_" + secrets.token_hex(8)
        effects.append(Effect(kind="post", link=link, target=channel.id, message=message))
        return _enc.encode({"receipt": link, "group": channel.id, "status": "posted"}).decode()

    async def _search(self, step: StepInput, query: str) -> str:
        """`workspace_memory_search`: the one memory search (the memory routes' ranking) over
        the bot's one memory as the step's reader may use it and the person's and the
        project's scopes, ranked together (actors/chats/step_memory.py)."""
        reader = reader_for(step)
        if not await self.memory_allowed(step.bot):
            return _enc.encode(
                {"error": "memory_not_isolated", "message": "memory is off on this node"}
            ).decode()
        if reader is None or not query.strip():
            return _enc.encode({"entries": []}).decode()
        found = await self.scoped.ranked(step, reader, query, SEARCH_HITS)
        entries = [{"id": e.id, "content": e.content} for e in found]
        return _enc.encode({"entries": entries}).decode()


def _args(call: ToolCall) -> dict:
    try:
        value = msgspec.json.decode(call.arguments.encode())
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}
