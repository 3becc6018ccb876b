"""The actor processes freeze what start-up made (actors/runtime/hosting.py `tune_gc`): a full
collection then walks only what the service made since, instead of ~100k start-up objects (one
took 88 ms in a shard under load, in the middle of a collaboration chain)."""

from __future__ import annotations

import gc


def test_the_directory_and_every_shard_froze_their_start_up_objects(engine):
    where = engine.where()
    frozen = [where["directory"]["gc_frozen"], *[s["gc_frozen"] for s in where["shards"]]]
    assert len(frozen) == 1 + len(engine.shards)
    assert all(n > 10_000 for n in frozen), frozen


def test_tune_gc_freezes_and_raises_the_thresholds():
    from actors.runtime.hosting import tune_gc

    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_freeze_count() > 0
        young, _, oldest = gc.get_threshold()
        assert young >= 5_000 and oldest == 100
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
