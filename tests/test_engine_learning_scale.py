"""What learning's checks read of a large pool (engine/learning.py): an observation's check
reads its sources, not every entry; a kept provenance check holds only for the same entry."""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping

import msgspec

from engine.learning import Audience, EvidenceItem, context_selection, decide, provable
from engine.memory_entries import AccessProof, EntryMeta, Layer, Source

AUD = Audience(chat="chat_1", org="o1", grant="for:person:a")
EVIDENCE = {
    ("chat_1", "i-1"): EvidenceItem(
        chat="chat_1", item="i-1", kind="person", author="a", text="I moved to Oslo"
    ),
}


class NoWalk(Mapping[str, EntryMeta]):
    """A pool too large to walk: looking an entry up is fine, listing them fails."""

    def __init__(self, entries: dict[str, EntryMeta]) -> None:
        self.entries = entries

    def __getitem__(self, key: str) -> EntryMeta:
        return self.entries[key]

    def __iter__(self):
        raise AssertionError("the whole pool was walked")

    def __len__(self) -> int:
        return len(self.entries)


def _fact(entry_id: str, item: str = "i-1", proven: bool = True) -> EntryMeta:
    return EntryMeta(
        id=entry_id,
        pool="bot:b_1",
        layer=Layer.FACT,
        tags=("from:a", "for:person:a", "org:o1", "chat:chat_1"),
        sources=(Source(chat="chat_1", item=item),),
        proofs=(
            (AccessProof(chat="chat_1", item=item, org="o1", audience=("for:person:a",)),)
            if proven
            else ()
        ),
        created_at=1,
        updated_at=1,
    )


def test_an_observation_is_checked_against_its_sources_not_the_whole_pool():
    pool = {f"mem_{n}": _fact(f"mem_{n}") for n in range(50)}
    pool["mem_bad"] = _fact("mem_bad", proven=False)
    ids = (f"new_{n}" for n in itertools.count())

    def observe(*sources: str):
        args = {"content": "x", "entries": list(sources), "confidence": 0.5}
        return decide(
            [("learn_observation", json.dumps(args).encode())],
            pool="bot:b_1",
            entries=NoWalk(pool),
            evidence=EVIDENCE,
            audience=AUD,
            now=100,
            new_ids=ids,
        )

    ok = observe("mem_3", "mem_7")
    assert [m.sources for m, _ in ok.new] == [
        (Source(entry="mem_3"), Source(entry="mem_7"))
    ] and not ok.rejected
    bad = observe("mem_3", "mem_bad")
    assert bad.new == [] and "unprovable" in bad.rejected[0].reason


def test_a_kept_provenance_check_is_made_again_for_a_changed_entry():
    known: dict = {}
    entries = {"f": _fact("f")}
    assert provable(entries, known) == {"f"}
    assert "f" in known  # kept
    # The same id, its proof gone: a new entry object, checked again.
    entries = {"f": msgspec.structs.replace(entries["f"], proofs=())}
    assert provable(entries, known) == set()
    assert context_selection(entries, known=known)[0] == []
    entries = {"f": _fact("f")}
    assert provable(entries, known) == {"f"}
