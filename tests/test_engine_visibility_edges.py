"""Edge cases of visibility and forget found while testing against the oracle."""

from __future__ import annotations

from engine import commands
from engine.memory_entries import AccessProof, EntryMeta, Layer, Reader, Source, Status
from engine.visibility import visible_ids

R = Reader(user="a", org="o1")


def _fact(proofs, eid="f", pool="bot:b"):
    return EntryMeta(
        id=eid,
        pool=pool,
        layer=Layer.FACT,
        tags=("for:person:a", "org:o1"),
        sources=(Source(chat="k", item="i1"),),
        proofs=tuple(proofs),
        created_at=1,
        updated_at=1,
    )


def test_conflicting_proofs_for_one_item_fail_closed_in_any_order():
    good = AccessProof(chat="k", item="i1", org="o1", audience=("for:person:a",))
    other_org = AccessProof(chat="k", item="i1", org="o2", audience=("for:person:a",))
    for proofs in ([good, other_org], [other_org, good]):
        assert visible_ids(R, {"f": _fact(proofs)}) == set()
    assert visible_ids(R, {"f": _fact([good])}) == {"f"}


def test_a_source_from_another_pool_does_not_count():
    good = AccessProof(chat="k", item="i1", org="o1", audience=("for:person:a",))
    obs = EntryMeta(
        id="o",
        pool="bot:b",
        layer=Layer.OBSERVATION,
        tags=("for:person:a", "org:o1"),
        sources=(Source(entry="f"),),
        created_at=2,
        updated_at=2,
    )
    assert visible_ids(R, {"f": _fact([good]), "o": obs}) == {"f", "o"}
    assert visible_ids(R, {"f": _fact([good], pool="bot:other"), "o": obs}) == {"f"}


def test_forget_retracts_when_duplicate_tags_name_only_the_caller():
    pinned = EntryMeta(
        id="p",
        pool="bot:b",
        layer=Layer.PINNED,
        tags=("for:person:a", "for:person:a", "org:o1"),
        created_at=1,
        updated_at=1,
    )
    out = commands.forget(entries={"p": pinned}, entry_id="p", reader=R, now=5, version=1)
    assert out.upserts[0].status == Status.RETRACTED
