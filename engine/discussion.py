"""Who speaks in a group turn, in which order, for how many rounds (WS-5, docs/design.md §5 step 7).

A normal message is one round; a discussion is two unless the sender asks for 1-12 rounds, by
option or in the text (English or Chinese). When nobody is named every member takes part, and
the first speaker changes every round so that no bot always frames the answer for the others.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import msgspec

from engine.errors import InvalidInput, Unprocessable

MAX_ROUNDS = 12
DISCUSSION_ROUNDS = 2
MAX_MEMBERS = 8


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    participants: tuple[str, ...]  # bot ids, in channel order
    rounds: int

    def order(self, round_index: int) -> tuple[str, ...]:
        """Speakers of round `round_index` (0-based): it starts with participant r mod n."""
        if isinstance(round_index, bool) or not isinstance(round_index, int):
            raise InvalidInput("a round index is an integer", code="invalid_round")
        if not 0 <= round_index < self.rounds:
            raise InvalidInput(
                f"round {round_index} is outside 0..{self.rounds - 1}", code="invalid_round"
            )
        if not self.participants:
            return ()
        start = round_index % len(self.participants)
        return self.participants[start:] + self.participants[:start]


# ---- rounds asked for in the text ----------------------------------------------------------

# Words past twelve are recognised too, so that "twenty rounds" is refused rather than silently
# read as an ordinary two-round discussion.
_EN_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
    "twenty",
)  # fmt: skip
_EN_NUMBERS = {word: i for i, word in enumerate(_EN_WORDS)}
_EN_NUMBER = "|".join(sorted(_EN_NUMBERS, key=len, reverse=True))
# ASCII-only boundaries: Python's \b treats CJK characters as word characters, which would hide
# "discuss" inside mixed text such as "请discuss一下".
_EN_ROUNDS = re.compile(
    rf"(?<![A-Za-z0-9.,])(\d+|{_EN_NUMBER})\s*-?\s*rounds?(?![A-Za-z])", re.IGNORECASE
)

_ZH_DIGITS = dict(
    zip("零一二两兩三四五六七八九", (0, 1, 2, 2, 2, 3, 4, 5, 6, 7, 8, 9), strict=True)
)
_ZH_UNITS = {"十": 10, "百": 100, "千": 1000}
_ZH_NUMERAL = "[" + "".join(_ZH_DIGITS) + "".join(_ZH_UNITS) + "]+"
# A number after these characters names *which* round ("第三轮", "下一轮", "这一轮", "新一轮"),
# not how many; a digit or numeral before means we are inside a longer number.
_ZH_NOT_A_COUNT = "第这這那每上下哪本该該同前后後新另" + "".join(_ZH_DIGITS) + "".join(_ZH_UNITS)
_ZH_ROUNDS = re.compile(
    rf"(?<![{_ZH_NOT_A_COUNT}\d.,])(\d+|{_ZH_NUMERAL})\s*(?:个\s*|個\s*)?(?:轮|輪|回合)"
)

# Far past any sane round count, and below Python's limit on converting long digit strings.
_HUGE = 10**9


def _digits(s: str) -> int:
    s = s.lstrip("0") or "0"
    return int(s) if len(s) <= 9 else _HUGE


def _zh_number(s: str) -> int:
    total = current = 0
    for ch in s:
        if ch in _ZH_UNITS:
            # "十二" is 12: a unit with no digit before it counts once.
            total += (current or 1) * _ZH_UNITS[ch]
            current = 0
        else:
            current = _ZH_DIGITS[ch]
    return total + current


def _count(token: str) -> int:
    if token[0].isdigit():
        return _digits(token)
    if token[0] in _ZH_DIGITS or token[0] in _ZH_UNITS:
        return _zh_number(token)
    return _EN_NUMBERS[token.lower()]


def requested_rounds(text: str) -> int | None:
    """The number of rounds the text asks for (the first one it states), or None.

    Numbers outside 1..12 are returned as they are; the caller refuses them.
    """
    found = [m for m in (_EN_ROUNDS.search(text), _ZH_ROUNDS.search(text)) if m is not None]
    if not found:
        return None
    first = min(found, key=lambda m: m.start())
    return _count(first.group(1))


_EN_DISCUSS = re.compile(
    r"(?<![A-Za-z])(?:discuss(?:es|ed|ing|ions?)?|debat(?:es?|ed|ing))(?![A-Za-z])",
    re.IGNORECASE,
)
_ZH_DISCUSS = re.compile("讨论|討論|辩论|辯論")


def asks_for_discussion(text: str) -> bool:
    return bool(_EN_DISCUSS.search(text) or _ZH_DISCUSS.search(text))


# ---- @mentions -----------------------------------------------------------------------------

# Not after a letter or digit, so that an e-mail address ("ann@anna.org") names nobody.
_AT = re.compile("(?<![A-Za-z0-9])[@\\uff20]")  # also the full-width at sign of CJK input


def _cjk(ch: str) -> bool:
    o = ord(ch)
    return (
        0x3040 <= o <= 0x30FF  # kana
        or 0x3400 <= o <= 0x9FFF  # CJK ideographs
        or 0xAC00 <= o <= 0xD7AF  # hangul
        or 0xF900 <= o <= 0xFAFF
        or 0xFF00 <= o <= 0xFFEF  # full-width forms
    )


def _wordy(ch: str) -> bool:
    return (ch.isalnum() or ch in "_-") and not _cjk(ch)


def _ends_name(text: str, end: int) -> bool:
    """ "@Ann" must not name "Anna"; but Chinese has no spaces, so "@小明你好" names 小明."""
    return end == len(text) or not (_wordy(text[end - 1]) and _wordy(text[end]))


def _label_pattern(label: str) -> re.Pattern[str]:
    # A name with spaces may be typed with any run of whitespace between its words.
    return re.compile(r"\s+".join(re.escape(part) for part in label.split()), re.IGNORECASE)


def mentioned(text: str, names: Mapping[str, str]) -> tuple[str, ...]:
    """Bot ids (keys of `names`) named as "@name" or "@id" in the text, in the order of `names`.

    At each "@" the longest matching name wins, so "@Ann Lee" names "Ann Lee" and not "Ann".
    Bots sharing that longest name are all named: the text cannot tell them apart.
    """
    labels: list[tuple[str, re.Pattern[str]]] = []
    for bot_id, name in names.items():
        for label in dict.fromkeys((name if isinstance(name, str) else "", bot_id)):
            if label.strip():
                labels.append((bot_id, _label_pattern(label.strip())))
    found: set[str] = set()
    for at in _AT.finditer(text):
        best_end, best = -1, []
        for bot_id, pattern in labels:
            m = pattern.match(text, at.end())
            if m is None or not _ends_name(text, m.end()):
                continue
            if m.end() > best_end:
                best_end, best = m.end(), [bot_id]
            elif m.end() == best_end:
                best.append(bot_id)
        found.update(best)
    return tuple(bot_id for bot_id in names if bot_id in found)


# ---- the plan ------------------------------------------------------------------------------


def _check_rounds(rounds: int) -> int:
    if not 1 <= rounds <= MAX_ROUNDS:
        raise Unprocessable(
            f"a group turn has 1 to {MAX_ROUNDS} rounds, not {rounds}", code="invalid_rounds"
        )
    return rounds


def plan_turn(
    *,
    members: Sequence[str],
    names: Mapping[str, str],
    text: str,
    rounds: int | None = None,
    mentions: Sequence[str] | None = None,
) -> Plan:
    """Participants and rounds of one group turn.

    `rounds` and `mentions` are the send options; they win over what the text says.
    """
    members = tuple(dict.fromkeys(members))
    if not members:
        raise Unprocessable("this group has no bots", code="no_bots")
    if len(members) > MAX_MEMBERS:
        raise Unprocessable(
            f"a group discussion has at most {MAX_MEMBERS} bots, this group has {len(members)}",
            code="too_many_members",
        )

    if rounds is not None:
        if isinstance(rounds, bool) or not isinstance(rounds, int):
            raise InvalidInput("rounds must be an integer", code="invalid_rounds")
        count = _check_rounds(rounds)
    elif (asked := requested_rounds(text)) is not None:
        count = _check_rounds(asked)
    else:
        count = DISCUSSION_ROUNDS if asks_for_discussion(text) else 1

    chosen: set[str] = set()
    if mentions is not None:
        for bot_id in mentions:
            if bot_id not in members:
                raise Unprocessable(
                    f"{bot_id!r} is not a bot of this group",
                    code="not_a_member",
                    details={"bot": bot_id},
                )
        chosen = set(mentions)
    if not chosen:
        chosen = set(mentioned(text, {m: names.get(m, "") for m in members}))
    participants = tuple(m for m in members if m in chosen) if chosen else members
    return Plan(participants=participants, rounds=count)


def plan_goal(
    *,
    members: Sequence[str],
    leader: str | None,
    rounds: int | None,
    mentions: Sequence[str] | None,
) -> Plan:
    """A delivery-goal group (WS-6): the goal goes to the leader alone, once; the leader hands
    out work to the members itself. Asking for rounds or naming speakers does not fit it."""
    if leader is None or leader not in members:
        raise Unprocessable("a delivery group needs a leader among its bots", code="no_leader")
    if rounds not in (None, 1) or mentions:
        raise Unprocessable(
            "a delivery group works through its leader: no rounds or mentions",
            code="delivery_mode",
        )
    return Plan(participants=(leader,), rounds=1)


def leader_brief(team: Mapping[str, str], leader: str) -> str:
    """What the leader is told besides the goal: who it can hand work to, and how."""
    names = ", ".join(name for bot_id, name in team.items() if bot_id != leader)
    return (
        "You lead this group towards the person's goal. Hand out parts of the work to your "
        f"team ({names}) with workspace_send_to_agent; their results come back to you here. "
        "When everything is back, deliver the final result for the person to accept or reject."
    )
