"""Which shard holds what: stable across processes and restarts (Python's `hash` is salted
per process, so crc32)."""

from __future__ import annotations

import zlib


def shard_of(key: str, shards: int) -> int:
    return zlib.crc32(key.encode()) % shards
