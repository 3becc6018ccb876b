"""A context over a kept view (actors/shard/memory_reader.py `context_of_kept`) takes the same parts
as walking the usable entries one by one: ranked hits first, each whole where it fits, then the
room left in memory order up to the first entry that does not fit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.shard.memory_reader import CONTEXT_HITS, MemoryReader
from actors.shard.pool import KeptView
from engine.memory_entries import EntryMeta, Layer
from engine.order import in_memory_order


def _walk(texts, limit, first, partial):
    """The walk, entry by entry (what `context_for` does over records)."""
    if not partial and not first:
        whole, size = [], -1
        for entry_id, text in texts:
            size += len(text) + 1
            if size > limit:
                return [], True, False
            whole.append((entry_id, text))
        return whole, bool(whole), True
    by_id = dict(texts)
    taken: dict[str, str] = {}
    size = 0

    def take(entry_id: str) -> bool:
        nonlocal size
        extra = len(by_id[entry_id]) + (1 if taken else 0)
        if size + extra > limit:
            return False
        taken[entry_id] = by_id[entry_id]
        size += extra
        return True

    for entry_id in first[:CONTEXT_HITS]:
        if entry_id not in taken and entry_id in by_id:
            take(entry_id)
    for entry_id, _ in texts:
        if entry_id not in taken and not take(entry_id):
            break
    parts = [(i, t) for i, t in texts if i in taken]
    return parts, bool(texts), len(parts) == len(texts)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(0, 30), max_size=25),
    st.integers(0, 200),
    st.lists(st.integers(-3, 30), max_size=40),
    st.booleans(),
)
def test_a_context_over_a_kept_view_takes_what_the_walk_takes(lengths, limit, picks, partial):
    metas = in_memory_order(
        EntryMeta(
            id=f"m{n:02d}", pool="bot:b1", layer=Layer.FACT, tags=(), created_at=n % 7, updated_at=0
        )
        for n in range(len(lengths))
    )
    texts = [(m.id, "x" * length) for m, length in zip(metas, lengths, strict=True)]
    view = KeptView(changes=0, metas=list(metas))
    by_id = dict(texts)
    view.make("text", lambda m: (m.id, by_id[m.id]))
    first = [f"m{k:02d}" if k >= 0 else "gone" for k in picks]
    got = MemoryReader.context_of_kept(view, limit, first, partial)
    assert got == _walk(texts, limit, first, partial)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 6), min_size=1, max_size=20),
    st.lists(st.tuples(st.integers(0, 40), st.booleans()), max_size=8),
)
def test_a_kept_views_positions_follow_its_changes(ages, edits):
    """A context finds its ranked hits by the view's map of positions: after the view is
    brought up to date (entries moved, added, gone) the map answers as bisecting the view
    does, and a context over it still takes what the walk takes."""

    def meta(n: int, age: int) -> EntryMeta:
        return EntryMeta(
            id=f"m{n:02d}", pool="bot:b1", layer=Layer.FACT, tags=(), created_at=age, updated_at=0
        )

    entries = {m.id: m for m in (meta(n, age) for n, age in enumerate(ages))}
    view = KeptView(changes=0, metas=in_memory_order(entries.values()))
    view.make("text", lambda m: (m.id, m.id))
    assert all(view.position(m) == k for k, m in enumerate(view.metas))  # the map is made
    olds: dict[str, EntryMeta | None] = {}
    for n, keep in edits:
        entry_id = f"m{n:02d}"
        olds.setdefault(entry_id, entries.get(entry_id))
        if keep:
            entries[entry_id] = meta(n, n % 5)
        else:
            entries.pop(entry_id, None)
    view.catch_up(olds, entries, lambda entry_id: True)
    assert view.metas == in_memory_order(entries.values())
    for m in [*entries.values(), *(o for o in olds.values() if o is not None)]:
        assert view.position(m) == view.at(m)
    texts = [(m.id, m.id) for m in view.metas]
    first = sorted(entries)[::2]
    for limit in (0, 7, 20, 1000):
        got = MemoryReader.context_of_kept(view, limit, first, True)
        assert got == _walk(texts, limit, first, True)
