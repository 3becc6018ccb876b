"""Every message that crosses an actor boundary: what the gateway sends to and gets back from
the shards and the directory, what shards send each other, and what the node hub carries (the
ports, typed Protocols over these messages, are in actors/ports.py). Imports engine/ and msgspec
only, so that the gateway (and any other caller) can speak to the actors without importing their
implementation (numpy, storage, each other).

Wire rule (msgspec): new fields get defaults, types never change; these are pickled by Ray
between processes of the same version, and some are serialised to the HTTP API as they are.
"""

from __future__ import annotations

import importlib

import msgspec

from engine import errors
from engine.chat_records import ItemView, Turn
from engine.directory import Bot, Channel, Chat, Org
from engine.errors import OpenBotError
from engine.events import Event, ShardHead
from engine.memory_entries import Reader
from engine.models import Message, ToolSpec
from engine.scoped_memory import WorkspaceEntryView, WorkspaceMemoryCreate
from engine.workspace_search import Hit

# --- the directory's access revision (gateways -> the directory; actors/access_watch.py) ---

# Seconds a gateway's watch of the access revision waits for a change before it is answered.
ACCESS_POLL_WAIT = 5.0


def access_key(kind: str, key: str) -> str:
    """What one directory change touches, as gateways drop their entries by it: `user:<id>`
    (a principal), `token:<hash>`, `bot:<id>`, `org:<id>` or `channel:<id>`."""
    return f"{kind}:{key}"


# --- memory writes (gateway -> a pool's shard) ---------------------------------------------


class RememberCall(msgspec.Struct, frozen=True, kw_only=True):
    """A Remember as ONE packed argument of `ShardService.remember_packed`, which answers with the
    HTTP body (the entry as JSON) as bytes. Ray serialises each argument and the reply on its
    own: five arguments and a Struct reply cost the shard ~1.3 ms of CPU per call against
    ~0.85 ms for one bytes each way (measured here; a bare call ~0.7 ms), and the gateway as
    much again."""

    pool: str
    reader: Reader
    content: str
    topics: tuple[str, ...] = ()
    request_id: str | None = None


class CallError(msgspec.Struct, frozen=True, kw_only=True):
    """One request's engine error inside the reply of a coalesced call (`remember_many`,
    `workspace_create_memory_many`): every request of the call keeps its own answer, so one caller's
    bad input fails that caller only; and a call's error over a shard's lane
    (actors/runtime/lane.py). The error comes back as the class it was raised as."""

    kind: str  # the class's name
    message: str
    code: str
    details: dict = {}
    module: str = ""  # the class's module (engine.errors when empty)

    @classmethod
    def of(cls, e: OpenBotError) -> CallError:
        kind = type(e)
        return cls(
            kind=kind.__name__,
            message=e.message,
            code=e.code,
            details=e.details,
            module="" if kind.__module__ == errors.__name__ else kind.__module__,
        )

    def error(self) -> OpenBotError:
        """The error as raised, as Ray's pickling gives it back: a class of another module of
        the engine (actors.models' ModelError, actors.learning's BudgetSpent) is imported as
        pickle would; anything else comes back as Unavailable."""
        kind = getattr(_module_of(self.module), self.kind, None)
        if not (isinstance(kind, type) and issubclass(kind, OpenBotError)):
            kind = errors.Unavailable
        return kind(self.message, code=self.code, details=dict(self.details))


def _module_of(name: str):
    if not name:
        return errors
    if name.split(".", 1)[0] not in ("engine", "actors", "storage"):
        return None  # only the engine's own modules are imported on a peer's word
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


# A coalesced call: its requests, each one packed call (a RememberCall, a WorkspaceCreateCall) as it
# would be sent alone, as one msgpack array of byte strings; each is decoded alone, so a
# malformed one fails only itself. The reply: per request, in order, the answer's bytes or a
# `CallError`.
COALESCED = msgspec.msgpack.Decoder(list[bytes])
REPLIES = msgspec.msgpack.Decoder(list[bytes | CallError])


# --- turns (gateway -> a chat's home shard) ------------------------------------------------


class TurnStart(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a turn needs from the directory, captured when it starts."""

    chat: Chat
    bot: Bot | None  # direct and review chats
    org: Org
    operator: str
    text: str
    request_id: str | None = None
    channel: Channel | None = None  # group chats, with their member bots
    members: tuple[Bot, ...] = ()
    rounds: int | None = None
    mentions: tuple[str, ...] | None = None


class Mirrored(msgspec.Struct, frozen=True, kw_only=True):
    """A chat item a bot's shard keeps so that its learning can read the evidence (LRN-3)."""

    seq: int
    turn: str | None
    kind: str
    author: str
    at: int
    text: str


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    turn: Turn
    items: list[ItemView]


# --- bot steps (a chat's home shard -> the bot's shard) ------------------------------------


class SentRef(msgspec.Struct, frozen=True, kw_only=True):
    """The collaboration send a delivery's step answers, homed on shard `shard`. Unless it was
    `stored` when the delivery began, the step asks there (`ShardPort.send_stored`) before a
    tool of it writes anything (actors/chats/sent_gate.py)."""

    shard: int
    chain: str
    link: str
    stored: bool = False


class StepInput(msgspec.Struct, frozen=True, kw_only=True):
    chat: Chat  # where the bot speaks: direct, review, group or agent
    bot: Bot
    org: Org
    operator: str  # the person the turn acts for (LRN-6)
    turn: str
    text: str  # what wakes the bot: a person's words, or a delivery
    wake: str = "person"  # person | delivery
    history: tuple[Message, ...] = ()
    after: tuple[Message, ...] = ()  # said after `text` (earlier speakers of a group turn)
    channel: str | None = None
    review: str | None = None  # a review chat: the proposal under review (ENR-3)
    sent: SentRef | None = None  # a delivery's step: the send it answers


class Effect(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # send | post
    link: str  # the receipt id the bot was given
    target: str  # a bot id (send) or a channel id (post)
    message: str
    # A send: the target bot as the directory gave it for this send (its org, its archived
    # flag checked), so the delivery that follows needs no directory call of its own.
    peer: Bot | None = None


class ToolUse(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call of the bot and its result, stored as a `tool_result` chat item (MEM-3): a
    source learning may cite beside a person's words (LRN-9), giving the entry `app:<tool>`."""

    tool: str
    arguments: str
    result: str


class StepOutcome(msgspec.Struct, frozen=True, kw_only=True):
    status: str  # done | failed
    error: str | None = None
    reply: str | None = None  # the bot's final text
    note: str | None = None  # a system notification instead of a reply
    effects: tuple[Effect, ...] = ()
    confided: bool = False
    tools: tuple[ToolUse, ...] = ()  # app tool calls with their results, in order (MEM-3)


class DecisionWake(msgspec.Struct, frozen=True, kw_only=True):
    """A decided request wakes its bot in the chat it came from (ENR-3): the request's shard
    asks the chat's home shard, which stores the notice and the bot's step under `turn` once."""

    request: str
    turn: str  # engine.requests.decision_turn: the same for every wake-up of the decision
    chat: Chat
    bot: Bot
    org: Org
    operator: str  # the person who decided
    notice: str  # the notification the chat shows
    text: str  # the step's input: the decision and the proposal


class StepCall(msgspec.Struct, frozen=True, kw_only=True):
    """`ShardPort.run_step` as one message on the shards' direct lane (actors/runtime/lane.py)."""

    step: StepInput
    mirror: tuple[Mirrored, ...] = ()
    learn_upto: int = 0


class PollCall(msgspec.Struct, frozen=True, kw_only=True):
    """A gateway's event poll (`events_packed`) on a shard's lane; answered with the packed
    `EventBatch` bytes."""

    since: int
    limit: int = 1000
    wait: float = 0.0
    follower: str = ""


class TurnCall(msgspec.Struct, frozen=True, kw_only=True):
    """`ShardPort.start_turn` on a shard's lane (a gateway's turn)."""

    start: TurnStart
    wait: bool = False


class PackedCall(msgspec.Struct, frozen=True, kw_only=True):
    """A coalesced write call on a shard's lane: one of `PACKED_WRITES` with its packed requests,
    answered with the packed replies, as over Ray (actors/shard/packed.py)."""

    method: str
    call: bytes


# The shard's bytes-in, bytes-out write calls that a lane may carry (a gateway's coalesced
# Remembers and workspace memory creations); the lane refuses any other name.
PACKED_WRITES = frozenset(
    {
        "remember_many",
        "remember_many_followed",
        "workspace_create_memory_many",
        "workspace_create_memory_many_followed",
    }
)


class LaneAddress(msgspec.Struct, frozen=True, kw_only=True):
    """Where a shard's lane listens: a Unix socket, reachable from processes on `node` only."""

    node: str
    path: str


# --- collaboration chains ------------------------------------------------------------------


class LinkView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    parent: str | None
    fromBot: str
    toBot: str
    depth: int
    status: str
    reason: str | None = None
    request: str | None = None
    result: str | None = None
    agentChat: str | None = None


class ChainView(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    status: str
    reason: str | None
    rootChat: str
    topic: str
    project: str | None
    rootBot: str
    deliveries: int
    revision: int
    createdAt: int
    updatedAt: int
    links: list[LinkView]


# --- the event pump (a gateway -> each shard) ------------------------------------------------


class EventBatch(msgspec.Struct, frozen=True, kw_only=True):
    """A shard's published events after a seq and where its log stands, as one msgpack blob
    (`events_packed`, actors/shard/packed.py: what the gateways' pumps poll): Ray would pickle
    a list of Events on both sides of every poll; one bytes object costs it next to nothing."""

    head: ShardHead
    events: list[Event]
    # Where a follower's poll answered from, when not from the seq it asked (its shard had
    # handed it more with write replies since: storage/event_log.py `follow_page`).
    since: int | None = None


EVENT_BATCH = msgspec.msgpack.Decoder(EventBatch)


class Followed(msgspec.Struct, frozen=True, array_like=True):
    """A coalesced write's reply with the shard's published events after the `seen` its caller
    sent (`remember_many_followed`, actors/shard/packed.py): the gateway's event follower
    (actors/runtime/follow.py) takes them here, and the shard's answer to its waiting poll
    need not carry them — one Ray call per group commit instead of two."""

    replies: msgspec.Raw  # what the plain coalesced call answers (`REPLIES`)
    events: EventBatch  # the published events after `seen` ...
    upto: int  # ... up to this seq, all of them (the head, or the last of a full batch)


FOLLOWED = msgspec.msgpack.Decoder(Followed)


class FollowingCall(msgspec.Struct, frozen=True, array_like=True):
    """A coalesced write call whose reply is to bring the events after `seen` to `follower`
    (one argument: Ray handles each argument of a call on its own, both sides)."""

    follower: str
    seen: int
    call: msgspec.Raw  # the plain coalesced call (`COALESCED`)


FOLLOWING_CALL = msgspec.msgpack.Decoder(FollowingCall)
HANDED_LIMIT = 1000  # events a write's reply carries at most (a poll answers for the rest)


# --- workspace memory (gateway and shards -> the shards that hold the pools) ---------------

USING = ("all", "keyword", "semantic")


class WorkspaceAccess(msgspec.Struct, frozen=True, kw_only=True):
    """Who is asking: the signed-in account and the bots it uses (owner or grant).

    `orgs` (the org the request names first) and `channels` make the entry reader of a bot's
    one memory (engine/memory_union.py): a bot pool's entries are listed under its visibility rule.
    `bot_orgs`, when given, is the org the caller works in with each bot (a shared bot works in
    several, engine/directory.py `bot_org`); a bot it does not name is read in no org.
    Without it (None), the home org rule of `WorkspaceRules.bot_reader`.
    """

    account: str
    bots: frozenset[str] = frozenset()
    orgs: tuple[str, ...] = ()
    channels: frozenset[str] = frozenset()
    bot_orgs: dict[str, str] | None = None


class WorkspaceCreateCall(msgspec.Struct, frozen=True, kw_only=True):
    """`workspace_create_memory`'s arguments as ONE msgpack blob (`workspace_create_memory_packed`,
    actors/shard/packed.py): as for Remember, Ray pickles Structs on both sides of every call,
    while one bytes argument and one bytes reply cost it next to nothing."""

    access: WorkspaceAccess
    body: WorkspaceMemoryCreate


WORKSPACE_CREATE_CALL = msgspec.msgpack.Decoder(WorkspaceCreateCall)
# A workspace creation's answer is the HTTP body itself (JSON, as a Remember's): the gateway
# sends it on as it came, and decodes it only where a typed view is asked for.
WORKSPACE_ENTRY_VIEW = msgspec.json.Decoder(WorkspaceEntryView)


class WorkspaceQuery(msgspec.Struct, frozen=True, kw_only=True):
    """What to list on one shard. `pools` are bot and user pools the gateway routed here;
    `projects` names projects to include, or None for every project here the account is a
    member of (with `linked`, only those linking that channel: a group chat's projects, SC-5).
    `contributor` keeps one bot's contributions; `q` searches the bodies."""

    pools: tuple[str, ...] = ()
    projects: tuple[str, ...] | None = ()
    linked: str | None = None
    contributor: str | None = None
    q: str | None = None
    status: str = "active"  # active | forgotten | all
    limit: int = 200
    using: str = "all"  # with q: all (hybrid when semantic search is on) | keyword | semantic


class WorkspaceListing(msgspec.Struct, frozen=True, kw_only=True):
    """Records found on one shard; with a query, `hits` rank them. `names` are display names
    of the project pools listed (for the export's headings)."""

    entries: list[WorkspaceEntryView]
    hits: list[Hit] = []  # keyword hits among `fused` (with their BM25 scores)
    semantic: list[Hit] = []  # semantic hits among `fused` (with their cosines)
    fused: list[Hit] = []  # the ranking, best first; `entries` are in this order
    names: dict[str, str] = {}


class ChatHit(msgspec.Struct, frozen=True, kw_only=True):
    """One chat item found by a chat history search: its fused score and the retrievers that
    found it."""

    chat: str
    item: ItemView
    score: float
    foundBy: tuple[str, ...]


class ChatFound(msgspec.Struct, frozen=True, kw_only=True):
    """Chat items found on one shard, ranked as a `WorkspaceListing` is (hit ids are
    `<chat>/<item id>`)."""

    items: list[ChatHit] = []
    hits: list[Hit] = []
    semantic: list[Hit] = []
    fused: list[Hit] = []


class RevisionView(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `GET /memories/:id/revisions`: who (a user or a bot), when, before/after."""

    entry: str
    revision: int
    operator: str
    at: int
    change: str
    before: str | None = None
    after: str | None = None


# --- execution nodes (gateways and shards <-> the node hub) --------------------------------


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    memory_isolation: bool
    memory_extraction: bool
    connected: bool = True
    hint: str | None = None


class Work(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...]
