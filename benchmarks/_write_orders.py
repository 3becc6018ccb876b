"""The ways a harness may write conversations as workspace memories (`--write-order` of
benchmarks/retrieval.py and benchmarks/retrieval_lab.py), as the order and times the writes
reach the shard.

- `sequential`: one writer, every conversation's turns in order, one after the other;
- `concurrent-N`: the same list written by N requests in flight (each turn's arrival moved by
  up to N places: neighbours within a conversation change, conversations barely mix);
- `parallel`: one writer per conversation, all at once (the conversations' turns interleave at
  random);
- `round-robin`: turn k of every conversation, then turn k+1 of every one;
- `per-project`: each conversation in its own project (pool), written in order;
- `slow`: in order, sessions more than the context window apart (as a harness that replays the
  dialog's pace, or writes each session when it happens);
- `topics`: `round-robin` with each turn's conversation named in its `topics`.

`content` is what a turn's record holds: `speaker` ("Caroline: text", the default), `plain`
(the text alone), `dated` ("[2023-05-08] Caroline: text", the session's date first) or
`speaker-date` ("Caroline (8 May 2023): text", the date in the speaker's label).
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from benchmarks._conversations import Conversation, Turn

ORDERS = (
    "sequential",
    "concurrent-8",
    "concurrent-32",
    "parallel",
    "round-robin",
    "per-project",
    "slow",
    "topics",
)
CONTENTS = ("speaker", "plain", "dated", "speaker-date")
STEP_MS = 5  # between two writes of one writer
SESSION_GAP_MS = 180_000  # `slow`: more than the default context window (120 s)


@dataclass(frozen=True)
class Arrival:
    turn: Turn
    conversation: int
    at: int  # ms since the first write
    project: int | None  # per-project: the conversation's project
    topics: tuple[str, ...]
    content: str


def _content(turn: Turn, conv: Conversation, how: str) -> str:
    if how == "plain":
        return turn.text
    if how == "dated" and conv.dates:
        session = int(turn.id.split("-s")[1].split("-")[0])
        return f"[{conv.dates[session]}] {turn.content}"
    if how == "speaker-date" and conv.dates:
        session = int(turn.id.split("-s")[1].split("-")[0])
        return f"{turn.speaker} ({_long_date(conv.dates[session])}): {turn.text}"
    return turn.content


def _long_date(iso: str) -> str:
    """'2023-05-08' -> '8 May 2023' (the text itself if it is no ISO date)."""
    try:
        day = dt.date.fromisoformat(iso)
    except ValueError:
        return iso
    return f"{day.day} {day:%B} {day.year}"


def arrivals(
    convs: list[Conversation], order: str, content: str = "speaker", seed: int = 7
) -> list[Arrival]:
    """Every turn once, in the order its write reaches the shard, with the time it does."""
    rnd = random.Random(seed)
    tagged = [(c, k, t) for c, conv in enumerate(convs) for k, t in enumerate(conv.turns)]

    def arrival(c: int, t: Turn, at: int) -> Arrival:
        return Arrival(
            turn=t,
            conversation=c,
            at=at,
            project=c if order == "per-project" else None,
            topics=(f"conversation-{c}",) if order == "topics" else (),
            content=_content(t, convs[c], content),
        )

    if order in ("sequential", "per-project"):
        seq = [(c, t) for c, _, t in tagged]
    elif order.startswith("concurrent-"):
        n = int(order.split("-")[1])
        keyed = sorted(range(len(tagged)), key=lambda i: i + rnd.uniform(0, n))
        seq = [(tagged[i][0], tagged[i][2]) for i in keyed]
    elif order == "parallel":
        keyed = sorted(tagged, key=lambda x: x[1] + rnd.uniform(0, 1))
        seq = [(c, t) for c, _, t in keyed]
    elif order in ("round-robin", "topics"):
        seq = [(c, t) for c, _, t in sorted(tagged, key=lambda x: (x[1], x[0]))]
    elif order == "slow":
        out, at, session = [], 0, None
        for c, _, t in tagged:
            s = t.id.rsplit("-t", 1)[0]
            at += SESSION_GAP_MS if session is not None and s != session else STEP_MS
            session = s
            out.append(arrival(c, t, at))
        return out
    else:
        raise ValueError(f"unknown write order {order!r}")
    return [arrival(c, t, n * STEP_MS) for n, (c, t) in enumerate(seq)]


SLOW_WINDOW_S = 0.5  # `slow` through the API: the server's context window, and the gap
SLOW_GAP_S = 0.7  # between sessions (the pace of 120 s and more, scaled down)


def write_through_api(
    client,
    convs: list[Conversation],
    order: str,
    content: str,
    bot: str,
    threaded: bool = False,
    tag: str = "",
):
    """Write every turn as a workspace memory the way `order` says (benchmarks/retrieval.py;
    real requests in flight for `concurrent-N` and `parallel`, real pauses for `slow`);
    returns memory id -> turn id. `threaded`: each turn names its conversation as `thread`
    and its place there as `position`."""
    place = {t.id: (c, k) for c, conv in enumerate(convs) for k, t in enumerate(conv.turns)}
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    projects: dict[int, str] = {}
    if order == "per-project":
        for c in range(len(convs)):
            resp = client.post(
                "/api/app/workspace/projects",
                json={"requestId": f"p-{c}", "name": f"conversation {c}"},
            )
            resp.raise_for_status()
            projects[c] = resp.json()["id"]
    ids: dict[str, str] = {}
    lock = threading.Lock()

    def one(a: Arrival) -> None:
        body: dict = {
            "requestId": f"r{tag}-{a.turn.id}",
            "scope": "user",
            "bot": bot,
            "content": a.content,
        }
        if a.project is not None:
            body.update(scope="project", project=projects[a.project])
        if a.topics:
            body["topics"] = list(a.topics)
        if threaded:
            c, k = place[a.turn.id]
            body.update(thread=f"conversation-{c}", position=k)
        resp = client.post("/api/app/workspace/memories", json=body)
        resp.raise_for_status()
        with lock:
            ids[resp.json()["id"]] = a.turn.id

    if order.startswith("concurrent-"):
        in_order = arrivals(convs, "sequential", content)
        with ThreadPoolExecutor(int(order.split("-")[1])) as pool:
            list(pool.map(one, in_order))
    elif order == "parallel":
        in_order = arrivals(convs, "sequential", content)

        def conversation(c: int) -> None:
            for a in in_order:
                if a.conversation == c:
                    one(a)

        with ThreadPoolExecutor(len(convs)) as pool:
            list(pool.map(conversation, range(len(convs))))
    else:
        session = None
        for a in arrivals(convs, order, content):
            s = a.turn.id.rsplit("-t", 1)[0]
            if order == "slow" and session is not None and s != session:
                time.sleep(SLOW_GAP_S)
            session = s
            one(a)
    return ids
