"""Memory order (MEM-5): the one stable order in which a pool's entries are listed and used.

Pinned entries first (a person asked for them), then facts, then observations; inside a layer the
newest first; ties broken by id. A new entry therefore comes before older ones of its layer and may
push older text out of a context limit (ENR-8), and the order never depends on content.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.memory_entries import EntryMeta, Layer

_LAYER_RANK = {Layer.PINNED: 0, Layer.FACT: 1, Layer.OBSERVATION: 2}


def order_key(entry: EntryMeta) -> tuple[int, int, str]:
    return (_LAYER_RANK[entry.layer], -entry.created_at, entry.id)


def in_memory_order(entries: Iterable[EntryMeta]) -> list[EntryMeta]:
    return sorted(entries, key=order_key)
