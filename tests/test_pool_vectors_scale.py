"""A pool's vectors loaded as int8 directions keep each row's factor to unit length beside the
matrix (actors/workspace/vectors.py, storage/vector_store.py): scores are cosines all the same,
after rows are overwritten and the matrix grows."""

from __future__ import annotations

import numpy as np
import pytest

from actors.workspace.vectors import PoolVectors


def test_scores_with_kept_factors_are_cosines_after_puts_and_growth():
    rnd = np.random.default_rng(1)
    raw = rnd.normal(size=(20, 8)).astype(np.float32)
    raw[3] = 0.0  # a zero row: factor 0, never above a positive floor
    peak = np.abs(raw).max(axis=1, keepdims=True)
    codes = np.rint(raw * 127 / np.where(peak > 0, peak, 1)).astype(np.float32)
    norms = np.linalg.norm(codes, axis=1)
    factor = np.where(norms > 0, 1 / np.where(norms > 0, norms, 1), 0).astype(np.float32)
    ids = [f"m{i}" for i in range(20)]
    v = PoolVectors()
    v.load_matrix(ids, ["fp"] * 20, codes.copy(), unit=True, scale=factor)
    assert v.scale is not None
    edited = rnd.normal(size=8).astype(np.float32) * 5
    v.put("m5", "fp2", edited)  # overwritten in place: its factor becomes 1
    for k in range(20, 60):  # new rows: the matrix and the factors grow together
        v.put(f"m{k}", "fp", rnd.normal(size=8).astype(np.float32))
    q = rnd.normal(size=8).astype(np.float32)
    q /= np.linalg.norm(q)
    want = np.concatenate([raw[:20], np.zeros((40, 8), np.float32)])
    want[5] = edited
    for k in range(20, 60):
        want[k] = v.mat[k]
    lengths = np.linalg.norm(want, axis=1, keepdims=True)
    want = np.where(lengths > 0, want / np.where(lengths > 0, lengths, 1), 0)
    got = v.scores(q)
    assert got.shape == (60,)
    assert np.allclose(got, want @ q, atol=0.02)  # int8 rounding on the loaded rows
    assert got[3] == 0.0 and np.isclose(got[5], want[5] @ q, atol=1e-6)
    top = v.top(q, list(range(60)), 5, 0.0)
    assert [h.id for h in top] == list(np.array(v.ids)[np.argsort(-got)][:5])
    few = v.top(q, [5, 7], 2, -1.0)  # few rows: scored one by one, the same factors
    assert np.allclose(sorted(h.score for h in few), sorted([got[5], got[7]]), atol=1e-6)


@pytest.mark.anyio
async def test_a_later_block_wins_whatever_order_the_blocks_were_stored_in(shards):
    """Blocks are read unordered and ordered by seq in Python (no sort of blobs in DuckDB)."""
    import os

    from actors.shard.batch import Batch
    from storage.crypto import Cipher
    from storage.vector_store import VectorStore

    cipher = Cipher(os.urandom(32))
    early, late = np.eye(4, dtype=np.float32)[0], np.eye(4, dtype=np.float32)[1]

    svc = shards()
    for seq, vec in ((7, late), (3, early)):  # the later seq stored first
        block = VectorStore.block("user:u", "m:4", seq, [("a", f"fp{seq}", vec)], cipher)
        await svc.kernel.commit(Batch(writes=[block]))
    await svc.flush()
    got = await VectorStore(svc.db).load_all("user:u", "m:4", cipher)
    await shards.close(svc)
    ids, fps, mat, _, scale = got
    assert ids == ["a"] and fps == ["fp7"]
    assert np.allclose(mat[0] * scale[0], late)
