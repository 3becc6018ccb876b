"""Real LoCoMo conversations for benchmarks/retrieval.py (`--data locomo --file PATH`).

LoCoMo (Maharana et al., 2024; snap-research/LoCoMo, `data/locomo10.json`, CC BY-NC 4.0) is not
shipped by any PyPI package and is not part of this repository: pass the file you downloaded.
Ten conversations, 5,882 turns over 19-32 dated sessions each; questions with the dialog ids of
the turns that hold the answer. As in the issue's table, the adversarial questions (category 5,
unanswerable by design) are left out and so are the four without evidence: 1,536 questions.

Evidence ids are written loosely in a few places ("D8:6; D9:17", "D:11:26", "D30:05"); they are
read as lists of `D<session>:<turn>` and ids that name no turn are dropped.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path

from benchmarks._conversations import Conversation, Question, Turn

KINDS = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
_DIA = re.compile(r"D:?(\d+):0*(\d+)")


def _date(text: str) -> str:
    """'1:56 pm on 8 May, 2023' -> '2023-05-08' (the text itself if it does not parse)."""
    try:
        return dt.datetime.strptime(text.split(" on ", 1)[1], "%d %B, %Y").date().isoformat()
    except (IndexError, ValueError):
        return text


def load(path: str | Path, caption: bool = False) -> list[Conversation]:
    """Every conversation of the file; `caption` appends a shared photo's caption to its turn
    ("[shares a photo of …]"), which the turn's text alone does not say."""
    out = []
    for c, sample in enumerate(json.loads(Path(path).read_text())):
        talk = sample["conversation"]
        conv = Conversation()
        sessions = sorted(
            int(k.split("_")[1])
            for k, v in talk.items()
            if re.fullmatch(r"session_\d+", k) and isinstance(v, list)
        )
        conv.dates = [""] * (max(sessions) + 1)
        ids: dict[str, str] = {}
        for s in sessions:
            conv.dates[s] = _date(talk.get(f"session_{s}_date_time", ""))
            for n, raw in enumerate(talk[f"session_{s}"]):
                text = raw["text"]
                if caption and raw.get("blip_caption"):
                    text = f"{text} [shares a photo of {raw['blip_caption']}]"
                turn = Turn(id=f"c{c}-s{s:02d}-t{n:02d}", speaker=raw["speaker"], text=text)
                conv.turns.append(turn)
                m = _DIA.fullmatch(raw["dia_id"])
                if m:
                    ids[f"D{int(m[1])}:{int(m[2])}"] = turn.id
        for qa in sample["qa"]:
            if qa.get("category") == 5:
                continue
            evidence = []
            for e in qa.get("evidence", []):
                for m in _DIA.finditer(e):
                    tid = ids.get(f"D{int(m[1])}:{int(m[2])}")
                    if tid and tid not in evidence:
                        evidence.append(tid)
            if evidence:
                kind = KINDS.get(qa.get("category"), "single-hop")
                conv.questions.append(Question(text=qa["question"], evidence=evidence, kind=kind))
        out.append(conv)
    return out
