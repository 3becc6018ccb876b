"""LoCoMo-like long conversations for benchmarks/retrieval.py (`--data locomo-like`): harder and
closer to real dialog than benchmarks/_conversations.py (seeded, generated: no PyPI package
ships LoCoMo, LongMemEval or MSC data with evidence labels).

What makes it like LoCoMo's conversations:

- two people per conversation, many dated sessions (one to three weeks apart) of about twenty
  alternating turns, each opened and closed with greetings;
- each person has six life threads (benchmarks/_locomo_themes.py) with three events told in
  different sessions; an event is one turn ("I ran a 10k last Friday …"), most often followed by
  the other person's reaction and the teller's aside, which reuse the topic's words and the
  person's name without answering anything; small talk between events names no topic, or
  mentions a thread in passing;
- the same threads come back in other conversations with other people and other details, so
  a topic's words alone point to many turns;
- questions of LoCoMo's kinds: single-hop facts; temporal ("When did {S} …?", the turn says
  "last Friday", never a date); multi-hop (all events of a thread, or the first events of a
  person's threads of one category: "What pets does {S} have?"), scored as the share of their
  turns found; open-domain inferences with few words in common ("Would {S} be considered an
  animal lover?").
"""

from __future__ import annotations

import datetime as dt
import random
import re

from benchmarks._conversations import Conversation, Question, Turn
from benchmarks._locomo_lines import (
    CATEGORY_QUESTIONS,
    ECHO_ASIDES,
    ECHO_CALLBACKS,
    ECHO_REACTIONS,
    FAREWELLS,
    FILLER,
    GREETINGS,
    LEADS,
    REACTIONS,
)
from benchmarks._locomo_themes import SLOTS, THEMES, WHEN, Theme

NAMES = [
    ("Caroline", "Melanie"),
    ("Jon", "Gina"),
    ("John", "Maria"),
    ("Joanna", "Nate"),
    ("Tim", "Sara"),
    ("Audrey", "Andrew"),
    ("James", "Olivia"),
    ("Deborah", "Jolene"),
    ("Evan", "Sam"),
    ("Calvin", "Dave"),
    ("Priya", "Daniel"),
    ("Leo", "Hannah"),
    ("Sofia", "Marcus"),
    ("Aisha", "Ben"),
    ("Nora", "Victor"),
    ("Kenji", "Laura"),
    ("Elena", "Tom"),
    ("Grace", "Omar"),
    ("Lucy", "Raj"),
    ("Mia", "Carlos"),
]
THEMES_PER_PERSON = 8  # of 24: the two people of a conversation share some threads


_WORD = re.compile(r"[A-Za-z']+")
_COMMON = set(
    """what which when where who why how did does do was were is are has have had the a an and
    to of in on at for with from by my your his her their our about after over new first just
    really so last week weekend month couple days ago yesterday sunday friday two finally
    """.split()  # noqa: SIM905
)


def _echo(said: str, question: str) -> str:
    """The words of an event's turn that its question asks with (up to three, in the turn's
    order): what the other person picks up ("your first pottery class?") and what comes back
    in later turns, so that the question's words are in many turns besides the answer."""
    asked = {w.lower()[:4] for w in _WORD.findall(question) if w.lower() not in _COMMON}
    words = [w for w in _WORD.findall(said) if len(w) > 3 and w.lower() not in _COMMON]
    shared = [w for w in words if w.lower()[:4] in asked]
    picked = (shared or words)[:3]
    return " ".join(dict.fromkeys(picked))


def _fill(text: str, values: dict[str, str]) -> str:
    for k, v in values.items():
        text = text.replace("{" + k + "}", v)
    return text[0].upper() + text[1:]


def make(conversations: int = 20, turns_per: int = 300, seed: int = 11) -> list[Conversation]:
    rnd = random.Random(seed)
    return [_conversation(rnd, c, turns_per) for c in range(conversations)]


def _conversation(rnd: random.Random, c: int, turns_per: int) -> Conversation:
    a, b = NAMES[c % len(NAMES)]
    if c >= len(NAMES):
        a, b = f"{a} {c // len(NAMES)}", f"{b} {c // len(NAMES)}"
    sessions = max(6, turns_per // 20)
    themes = {p: rnd.sample(THEMES, THEMES_PER_PERSON) for p in (a, b)}
    slots = {p: {k: rnd.choice(v) for k, v in SLOTS.items()} for p in (a, b)}
    # Each thread's three events in three different sessions, in order.
    plan: dict[int, list[tuple[str, Theme, int]]] = {}
    for person in (a, b):
        for theme in themes[person]:
            for n, s in enumerate(sorted(rnd.sample(range(sessions), len(theme.events)))):
                plan.setdefault(s, []).append((person, theme, n))
    conv = Conversation()
    said: dict[tuple[str, str, int], str] = {}  # (person, theme, event) -> turn id
    day = dt.date(2023, 1, 8) + dt.timedelta(days=rnd.randrange(200))
    size = turns_per // sessions
    later: list[tuple[str, str]] = []  # (speaker, a turn bringing an earlier event up again)
    for s in range(sessions):
        day += dt.timedelta(days=rnd.randrange(5, 22))
        conv.dates.append(day.isoformat())
        _session(rnd, conv, c, s, size, (a, b), plan.get(s, []), themes, slots, said, later)
    conv.questions = _questions(rnd, (a, b), themes, slots, said)
    return conv


def _session(rnd, conv, c, s, size, people, events, themes, slots, said, later) -> None:
    a, b = people
    recalled = [x for x in later if rnd.random() < 0.3]
    for x in recalled:
        later.remove(x)
    first = len(conv.turns)
    prefix = f"c{c}-s{s:02d}"
    rnd.shuffle(events)
    turns: list[tuple[str, str, tuple | None]] = []  # (speaker, text, event key or None)
    other = {a: b, b: a}

    def filler(who: str) -> str:
        return _fill(rnd.choice(FILLER), {"O": other[who], "S": who})

    def passing(who: str) -> str:
        """A thread in passing: the speaker's own aside, or asking about the other's."""
        if rnd.random() < 0.5:
            theme = rnd.choice(themes[who])
            return _fill(rnd.choice(theme.asides), {"O": other[who], "S": who})
        theme = rnd.choice(themes[other[who]])
        return _fill(rnd.choice(LEADS), {"w": rnd.choice(theme.words), "S": other[who]})

    starter = rnd.choice(people)
    for who in (starter, other[starter]):
        turns.append((who, _fill(rnd.choice(GREETINGS), {"O": other[who]}), None))
    budget = size - 4 - 3 * len(events)
    for person, theme, n in events:
        while budget > 0 and rnd.random() < 0.5:
            who = other[turns[-1][0]]
            turns.append((who, passing(who) if rnd.random() < 0.4 else filler(who), None))
            budget -= 1
        teller, listener = person, other[person]
        w = {"w": rnd.choice(theme.words), "S": teller, "O": listener}
        if turns[-1][0] == teller:  # turns alternate: the other one asks first
            turns.append((listener, _fill(rnd.choice(LEADS), w), None))
        values = dict(slots[teller], S=teller, O=listener, when=rnd.choice(WHEN))
        event = theme.events[n]
        text = _fill(event.say, values)
        said_text = text
        # Like real turns, many carry more than the news: a word on what was just said before
        # it, an aside after it.
        if rnd.random() < 0.4:
            said_text = _fill(rnd.choice(FILLER), {"O": listener, "S": teller}) + " " + said_text
        if rnd.random() < 0.3:
            said_text += " " + _fill(rnd.choice(theme.asides), {"O": listener, "S": teller})
        turns.append((teller, said_text, (teller, theme.key, n)))
        # The other person picks up the news with its words, or just the topic's.
        p = dict(w, p=_echo(text, _fill(event.fact, values)))
        if rnd.random() < 0.85:
            pool = ECHO_REACTIONS if rnd.random() < 0.6 else REACTIONS
            turns.append((listener, _fill(rnd.choice(pool), p), None))
            if rnd.random() < 0.7:
                aside = rnd.choice(ECHO_ASIDES if rnd.random() < 0.5 else theme.asides)
                turns.append((teller, _fill(aside, dict(p, O=listener)), None))
        if rnd.random() < 0.5:  # brought up again in a later session (not the answer)
            later.append((teller, _fill(rnd.choice(ECHO_CALLBACKS), dict(p, O=listener))))
    while budget > 0:
        who = other[turns[-1][0]]
        mine = [x for x in recalled if x[0] == who]
        if mine and rnd.random() < 0.5:
            recalled.remove(mine[0])
            turns.append((who, mine[0][1], None))
        else:
            turns.append((who, passing(who) if rnd.random() < 0.4 else filler(who), None))
        budget -= 1
    for _ in range(2):
        who = other[turns[-1][0]]
        turns.append((who, _fill(rnd.choice(FAREWELLS), {"O": other[who]}), None))
    for who, text, key in turns:
        turn = Turn(id=f"{prefix}-t{len(conv.turns) - first:02d}", speaker=who, text=text)
        conv.turns.append(turn)
        if key is not None:
            said[key] = turn.id


def _questions(rnd, people, themes, slots, said) -> list[Question]:
    out: list[Question] = []
    for person in people:
        values = dict(slots[person], S=person)
        by_cat: dict[str, list[str]] = {}
        for theme in themes[person]:
            turns = [said[(person, theme.key, n)] for n in range(len(theme.events))]
            by_cat.setdefault(theme.cat, []).append(turns[0])
            for n, event in enumerate(theme.events):
                out.append(Question(_fill(event.fact, values), [turns[n]], "single-hop"))
                if rnd.random() < 0.8:
                    out.append(Question(_fill(event.when, values), [turns[n]], "temporal"))
            if rnd.random() < 0.7:
                q = f"What has {{S}} been up to with {theme.words[0]} over the months?"
                out.append(Question(_fill(q, values), turns, "multi-hop"))
            if rnd.random() < 0.9:
                out.append(Question(_fill(theme.infer, values), [turns[0]], "open-domain"))
        for cat, turns in by_cat.items():
            if len(turns) >= 2:
                out.append(Question(_fill(CATEGORY_QUESTIONS[cat], values), turns, "multi-hop"))
    return out
