"""Collaboration chains (WS-4, CO-1): what happens when bots send work to each other.

A chain starts when a bot in a chat calls `workspace_send_to_agent`. Each send is a *link*: the
caller gets a delivery receipt (the link id) at once, the peer works in an `agent` chat, and the
peer's final reply comes back as a result that wakes the sender as a delivery, never as human
speech. The functions here only decide; the caller stores the chain and wakes the bots.

Loops are what this guards against: two helpful bots can thank, confirm and re-delegate to each
other for ever. Hence the caps (depth and automatic deliveries per chain), the suppression of
duplicates and bare acknowledgements, and a stop that no late result can undo.

Decisions a reader might not guess:

- Suppression is checked before the caps. A suppressed message wakes nobody, so it cannot be the
  delivery that exceeds a cap; a bot that says "thanks" at the deepest level should not end the
  whole chain.
- A capped chain treats results like a stopped one: the reply is recorded on its link ("late")
  but wakes nobody, because waking the sender would only invite more work the cap just refused.
- Only a result can make a chain "done", and a done chain refuses further sends. The bot woken by
  the final result therefore cannot continue the chain; the caller must not open a new chain for a
  turn that a delivery woke, or the caps could be sidestepped by starting over. Only a person's
  turn starts a chain.
- Results are not checked for duplicates: the same short answer ("done") to two different
  requests is legitimate, and every result answers exactly one delivered send.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import unicodedata

import msgspec

from engine.errors import Conflict, InvalidInput, NotFound

MAX_DEPTH = 8
MAX_DELIVERIES = 32


class ChainStatus(enum.StrEnum):
    RUNNING = "running"
    DONE = "done"
    STOPPED = "stopped"
    CAPPED = "capped"


class LinkStatus(enum.StrEnum):
    SENT = "sent"
    ANSWERED = "answered"
    SUPPRESSED = "suppressed"
    REFUSED = "refused"


class Action(enum.StrEnum):
    DELIVER = "deliver"
    SUPPRESS = "suppress"
    REFUSE = "refuse"
    LATE = "late"


ACKNOWLEDGEMENT = "acknowledgement"
DUPLICATE = "duplicate"
ALREADY_ANSWERED = "already answered"
DEPTH_REACHED = f"depth limit of {MAX_DEPTH} reached"
DELIVERIES_REACHED = f"{MAX_DELIVERIES} deliveries reached"

# Links whose message actually reached the peer; only these can have an agent chat or a result.
_DELIVERED = (LinkStatus.SENT, LinkStatus.ANSWERED)


class Link(msgspec.Struct, frozen=True, kw_only=True):
    id: str  # delivery id (the receipt id), given by the caller
    parent: str | None  # the link whose peer sent this one (None: sent from the root chat)
    from_bot: str
    to_bot: str
    depth: int  # 1 for a send from the root chat
    fingerprint: str
    status: str  # "sent" | "answered" | "suppressed" | "refused"
    # Why the message (or, once answered, the result) was not delivered.
    reason: str | None = None
    agent_chat: str | None = None
    result_fingerprint: str | None = None
    sent_at: int
    answered_at: int | None = None


class Chain(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    org: str
    owner: str  # the person whose turn started it
    root_chat: str
    topic: str  # the root turn id
    project: str | None = None
    root_bot: str
    status: str = ChainStatus.RUNNING
    reason: str | None = None  # why it is stopped or capped
    deliveries: int = 0
    links: tuple[Link, ...] = ()
    revision: int = 1
    created_at: int
    updated_at: int


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    action: str  # send: "deliver" | "suppress" | "refuse";  result: "deliver" | "suppress" | "late"
    reason: str | None = None
    link: Link | None = None


# Variation selectors turn a character into its emoji form; they are invisible and would let the
# same message slip past the duplicate check.
_VARIATION_SELECTORS = frozenset(range(0xFE00, 0xFE10))


def normalize(text: str) -> str:
    """Text as compared for duplicates: NFKC, case-folded, invisible characters dropped,
    whitespace collapsed. Punctuation is kept: "v1.2" and "v12" are different requests."""
    text = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    visible = (
        ch
        for ch in text
        if unicodedata.category(ch) != "Cf" and ord(ch) not in _VARIATION_SELECTORS
    )
    return " ".join("".join(visible).split())


def fingerprint(text: str, key: bytes) -> str:
    """A message's fingerprint as stored on its link (the chain's document is not sealed):
    keyed, so that a guess at a short message cannot be confirmed against it without the key.
    The key is the caller's (engine holds none); `rekeyed` of the text's `digest`."""
    return rekeyed(digest(text), key)


def digest(text: str) -> str:
    """A message's unkeyed digest: what an export keeps of a fingerprint (the key stays with
    the data directory; an import keys it again with `rekeyed`)."""
    return hashlib.sha256(normalize(text).encode()).hexdigest()[:32]


def rekeyed(digest: str, key: bytes) -> str:
    """The keyed fingerprint of a text whose unkeyed digest (`sha256(normalize(text))`, first
    32 hex digits) is `digest`: what a link stored by a version without keyed fingerprints
    becomes, with no need of the text."""
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()[:32]


# Written as normalize() leaves them (case-folded, single spaces). Words that could be a real
# answer ("yes", "sure", "done") are deliberately absent: a peer's one-word reply may be the result.
_ACK_PHRASES = frozenset(
    {
        "ok",
        "okay",
        "okey",
        "okie",
        "thanks",
        "thank you",
        "thank u",
        "thankyou",
        "thx",
        "ty",
        "thanks a lot",
        "thanks so much",
        "thank you so much",
        "thank you very much",
        "many thanks",
        "got it",
        "noted",
        "understood",
        "收到",
        "收到了",
        "好的",
        "好",
        "好了",
        "好嘞",
        "谢谢",
        "多谢",
        "感谢",
        "谢啦",
        "明白",
        "明白了",
        "知道了",
        "了解",
        "嗯",
    }
)


def _ack_skeleton(text: str) -> str:
    # Letters, digits and marks carry content; punctuation, symbols and emoji (👍 included) are
    # only decoration around an acknowledgement.
    kept = (ch if unicodedata.category(ch)[0] in "LNM" else " " for ch in normalize(text))
    return " ".join("".join(kept).split())


def _ends_word(s: str, j: int) -> bool:
    # Chinese needs no spaces between words ("好的谢谢"); Latin words must end at a space, so
    # "thanksgiving" is not "thanks".
    return (
        j == len(s)
        or s[j] == " "
        or unicodedata.category(s[j]) == "Lo"
        or unicodedata.category(s[j - 1]) == "Lo"
    )


def is_bare_ack(text: str) -> bool:
    """True when the text is nothing but acknowledgement phrases ("ok, thanks!", "好的 谢谢 👍"),
    or has no words at all (empty, only emoji or punctuation): delivering it would wake a bot for
    nothing."""
    s = _ack_skeleton(text)
    reachable = [False] * (len(s) + 1)
    reachable[0] = True
    for i in range(len(s)):
        if not reachable[i]:
            continue
        if s[i] == " ":
            reachable[i + 1] = True
            continue
        for phrase in _ACK_PHRASES:
            j = i + len(phrase)
            if s.startswith(phrase, i) and _ends_word(s, j):
                reachable[j] = True
    return reachable[len(s)]


def new_chain(
    *,
    chain_id: str,
    org: str,
    owner: str,
    root_chat: str,
    topic: str,
    project: str | None,
    root_bot: str,
    now: int,
) -> Chain:
    return Chain(
        id=chain_id,
        org=org,
        owner=owner,
        root_chat=root_chat,
        topic=topic,
        project=project,
        root_bot=root_bot,
        created_at=now,
        updated_at=now,
    )


def find_link(chain: Chain, link_id: str) -> Link:
    for link in chain.links:
        if link.id == link_id:
            return link
    raise NotFound(f"no link {link_id!r} in chain {chain.id!r}", code="link_not_found")


def open_links(chain: Chain) -> tuple[Link, ...]:
    """Links whose peer has not answered yet: after a stop, the work the caller may cancel."""
    return tuple(link for link in chain.links if link.status == LinkStatus.SENT)


def reply_chat(chain: Chain, link: Link) -> str | None:
    """Where the link's result goes: the root chat for a send from it, else the agent chat in
    which the sending bot was working (None if the caller never attached one)."""
    if link.parent is None:
        return chain.root_chat
    return find_link(chain, link.parent).agent_chat


def _touch(chain: Chain, now: int, **changes) -> Chain:
    return msgspec.structs.replace(chain, revision=chain.revision + 1, updated_at=now, **changes)


def _replace_link(chain: Chain, link: Link) -> tuple[Link, ...]:
    return tuple(link if old.id == link.id else old for old in chain.links)


def _not_running_reason(chain: Chain) -> str:
    return f"chain {chain.status}"


def _check_text(text: object, what: str) -> str:
    if not isinstance(text, str):
        raise InvalidInput(f"{what} must be a string", code="invalid_message")
    return text


def _sender_depth(chain: Chain, parent: str | None, from_bot: str) -> int:
    """The depth of a new link, after checking that `from_bot` really holds `parent`: a bot may
    only send on behalf of the delivery that woke it, so that nobody escapes the depth count."""
    if parent is None:
        if from_bot != chain.root_bot:
            raise InvalidInput(
                f"only {chain.root_bot!r} sends from the root chat", code="not_your_link"
            )
        return 1
    held = next((link for link in chain.links if link.id == parent), None)
    if held is None or held.to_bot != from_bot or held.status not in _DELIVERED:
        raise InvalidInput(
            f"link {parent!r} was not delivered to {from_bot!r}", code="not_your_link"
        )
    return held.depth + 1


def on_send(
    chain: Chain,
    *,
    link_id: str,
    parent: str | None,
    from_bot: str,
    to_bot: str,
    message: str,
    now: int,
    fp_key: bytes,
) -> tuple[Chain, Decision]:
    """Decide a `workspace_send_to_agent` call. Every outcome is recorded as a link, so the
    client can show refused and suppressed requests too. `fp_key`: the chain's fingerprint
    key (`fingerprint`)."""
    message = _check_text(message, "message")
    if from_bot == to_bot:
        raise InvalidInput("a bot cannot send to itself", code="self_send")
    if any(link.id == link_id for link in chain.links):
        raise Conflict(f"link {link_id!r} already exists", code="duplicate_link")
    depth = _sender_depth(chain, parent, from_bot)
    fp = fingerprint(message, fp_key)
    link = Link(
        id=link_id,
        parent=parent,
        from_bot=from_bot,
        to_bot=to_bot,
        depth=depth,
        fingerprint=fp,
        status=LinkStatus.SENT,
        sent_at=now,
    )

    def record(status: str, reason: str | None, *, capped: bool = False) -> tuple[Chain, Decision]:
        final = msgspec.structs.replace(link, status=status, reason=reason)
        action = {
            LinkStatus.SENT: Action.DELIVER,
            LinkStatus.SUPPRESSED: Action.SUPPRESS,
            LinkStatus.REFUSED: Action.REFUSE,
        }[status]
        updated = _touch(
            chain,
            now,
            links=(*chain.links, final),
            deliveries=chain.deliveries + (action == Action.DELIVER),
            status=ChainStatus.CAPPED if capped else chain.status,
            reason=reason if capped else chain.reason,
        )
        return updated, Decision(action=action, reason=reason, link=final)

    if chain.status != ChainStatus.RUNNING:
        return record(LinkStatus.REFUSED, _not_running_reason(chain))
    if is_bare_ack(message):
        return record(LinkStatus.SUPPRESSED, ACKNOWLEDGEMENT)
    if any(
        old.from_bot == from_bot
        and old.to_bot == to_bot
        and old.fingerprint == fp
        and old.status in _DELIVERED
        for old in chain.links
    ):
        return record(LinkStatus.SUPPRESSED, DUPLICATE)
    if depth > MAX_DEPTH:
        return record(LinkStatus.REFUSED, DEPTH_REACHED, capped=True)
    if chain.deliveries + 1 > MAX_DELIVERIES:
        return record(LinkStatus.REFUSED, DELIVERIES_REACHED, capped=True)
    return record(LinkStatus.SENT, None)


def on_result(
    chain: Chain, *, link_id: str, text: str, now: int, fp_key: bytes
) -> tuple[Chain, Decision]:
    """Decide what becomes of a peer's final reply to link `link_id`. The link is answered
    whatever the decision, so a result is recorded exactly once; a repeat changes nothing.
    `fp_key`: as for `on_send`."""
    text = _check_text(text, "result")
    link = find_link(chain, link_id)
    if link.status == LinkStatus.ANSWERED:
        return chain, Decision(action=Action.SUPPRESS, reason=ALREADY_ANSWERED, link=link)
    if link.status != LinkStatus.SENT:
        raise Conflict(
            f"link {link_id!r} was {link.status}; its peer was never asked", code="link_not_sent"
        )

    def record(action: str, reason: str | None, *, capped: bool = False) -> tuple[Chain, Decision]:
        answered = msgspec.structs.replace(
            link,
            status=LinkStatus.ANSWERED,
            reason=reason,
            result_fingerprint=fingerprint(text, fp_key),
            answered_at=now,
        )
        links = _replace_link(chain, answered)
        status = ChainStatus.CAPPED if capped else chain.status
        if status == ChainStatus.RUNNING and not any(
            other.status == LinkStatus.SENT for other in links
        ):
            status = ChainStatus.DONE
        updated = _touch(
            chain,
            now,
            links=links,
            deliveries=chain.deliveries + (action == Action.DELIVER),
            status=status,
            reason=reason if capped else chain.reason,
        )
        return updated, Decision(action=action, reason=reason, link=answered)

    if chain.status != ChainStatus.RUNNING:
        return record(Action.LATE, _not_running_reason(chain))
    if is_bare_ack(text):
        return record(Action.SUPPRESS, ACKNOWLEDGEMENT)
    if chain.deliveries + 1 > MAX_DELIVERIES:
        return record(Action.LATE, DELIVERIES_REACHED, capped=True)
    return record(Action.DELIVER, None)


def attach_agent_chat(
    chain: Chain, link_id: str, agent_chat: str, *, now: int | None = None
) -> Chain:
    """Record the `agent` chat the peer of a delivered link works in. Attaching the same chat
    again changes nothing; a different one is a conflict (a link has one peer conversation).
    Without `now` the update time is left as it was."""
    if not isinstance(agent_chat, str) or not agent_chat:
        raise InvalidInput("agent_chat must be a non-empty string", code="invalid_agent_chat")
    link = find_link(chain, link_id)
    if link.agent_chat == agent_chat:
        return chain
    if link.agent_chat is not None:
        raise Conflict(
            f"link {link_id!r} already works in {link.agent_chat!r}", code="agent_chat_attached"
        )
    if link.status not in _DELIVERED:
        raise Conflict(f"link {link_id!r} was {link.status}", code="link_not_sent")
    attached = msgspec.structs.replace(link, agent_chat=agent_chat)
    return _touch(
        chain,
        chain.updated_at if now is None else now,
        links=_replace_link(chain, attached),
    )


def stop(chain: Chain, *, by: str, now: int) -> Chain:
    """End a running chain for good. A chain that already ended (done, capped, stopped) is left
    as it is, so a second stop, or a stop racing the last result, is harmless; it refuses every
    send and wakes nobody either way."""
    if chain.status != ChainStatus.RUNNING:
        return chain
    return _touch(chain, now, status=ChainStatus.STOPPED, reason=f"stopped by {by}")
