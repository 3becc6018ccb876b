"""The scenarios' shape (bots, rounds, groups, chains) and the scripted model's scripts: a plain
reply for discussions, and tool calls that send on along a linear chain or a binary tree."""

from __future__ import annotations

import json
from pathlib import Path

SHARDS = 2
BOTS, ROUNDS = 8, 12
STEPS = BOTS * ROUNDS
CHAIN_BOTS = 8
MAX_DEPTH = 8  # engine/collaboration.py
TREE_LABEL_MAX = 6  # labels deeper than the 32-delivery cap can reach
GROUPS, GROUP_BOTS = 100, 3
REPLY = (
    "I agree with the direction so far; let us keep the scope small, ship the first part this "
    "week and measure it before we add anything else."
)
DISCUSS_TEXT = "Plan the next release together and settle on the first milestone."
GROUP_TEXT = "Quick check before the release: anything blocking?"
CHAIN_TEXT = {"linear": "start the chain", "tree": "start the tree"}
CHAIN_NAMES = {"linear": "Link", "tree": "Node"}


def _q(s: str) -> str:
    return json.dumps(s)  # a JSON string of ASCII text is a valid TOML basic string


def _send(agent: str, message: str) -> str:
    args = f"{{ agent = {_q(agent)}, message = {_q(message)} }}"
    return f'{{ name = "workspace_send_to_agent", arguments = {args} }}'


def _rule(match: str, sends: list[str]) -> str:
    return f"[[rules]]\nmatch = '{match}'\ntool_calls = [{', '.join(sends)}]\n"


# Neither reply may be a bare acknowledgement, or the chain would suppress it as a result.
_CHAIN_HEAD = (
    f"default = {_q('Result received and merged into my work.')}\n"
    f"after_tool = {_q('Handed on; the answer will follow.')}\n"
)


def talk_script() -> str:
    return f"default = {_q(REPLY)}\n"


def linear_script() -> str:
    """Link0 (the root chat's bot) sends "hop 1" to Link1; whoever gets "hop k" sends "hop k+1"
    to Link(k+1 mod 8). The 9th send is at depth 9: refused, the chain is capped."""
    name = CHAIN_NAMES["linear"]
    rules = [_rule(f"^{CHAIN_TEXT['linear']}$", [_send(f"{name}1", "hop 1")])]
    for k in range(1, MAX_DEPTH + 1):
        rules.append(
            _rule(rf"\] hop {k}$", [_send(f"{name}{(k + 1) % CHAIN_BOTS}", f"hop {k + 1}")])
        )
    return _CHAIN_HEAD + "\n".join(rules)


def tree_script() -> str:
    """A binary tree of sends with unique labels (no duplicate suppression): Node0 sends
    "node 0" to Node1 and "node 1" to Node2; the bot b that gets "node L" sends "node L0" to
    Node(b+1) and "node L1" to Node(b+2). 2+4+8+16 sends, then the 32nd delivery caps it."""
    name = CHAIN_NAMES["tree"]
    receiver = {"0": 1, "1": 2}
    rules = [
        _rule(
            f"^{CHAIN_TEXT['tree']}$",
            [_send(f"{name}1", "node 0"), _send(f"{name}2", "node 1")],
        )
    ]
    frontier = ["0", "1"]
    for _ in range(TREE_LABEL_MAX - 1):
        nxt = []
        for label in frontier:
            b = receiver[label]
            kids = [(label + "0", (b + 1) % CHAIN_BOTS), (label + "1", (b + 2) % CHAIN_BOTS)]
            sends = []
            for kid, to in kids:
                receiver[kid] = to
                sends.append(_send(f"{name}{to}", f"node {kid}"))
                nxt.append(kid)
            rules.append(_rule(rf"\] node {label}$", sends))
        frontier = nxt
    return _CHAIN_HEAD + "\n".join(rules)


def write_scripts(root: Path) -> dict[str, dict[str, str]]:
    scripts = {"talk": talk_script(), "linear": linear_script(), "tree": tree_script()}
    config = {}
    for name, text in scripts.items():
        path = root / f"{name}.toml"
        path.write_text(text)
        config[name] = {"kind": "scripted", "script": str(path)}
    return config
