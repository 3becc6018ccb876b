"""A pool's vectors stay int8 as loaded (actors/workspace/vectors.py): a search scores them a
chunk at a time, with the same scores and ranking as the float32 matrix they used to be widened
into at load; the first new vector widens them once, and nothing moves."""

from __future__ import annotations

import os

import numpy as np
import pytest

from actors.workspace import vectors as vmod
from actors.workspace.vectors import PoolVectors
from storage.vector_store import quantize


def _stored(n: int, dim: int, seed: int = 3) -> tuple[list[str], np.ndarray, np.ndarray]:
    rnd = np.random.default_rng(seed)
    raw = rnd.normal(size=(n, dim)).astype(np.float32)
    raw[7] = 0.0  # a zero row: factor 0, never a hit above a positive floor
    codes, scale = quantize(raw)
    return [f"m{i:05d}" for i in range(n)], codes, scale


def _reference(codes: np.ndarray, scale: np.ndarray, query: np.ndarray) -> np.ndarray:
    """What a search scored before: the int8 rows widened into one float32 matrix."""
    return (codes.astype(np.float32) @ query) * scale


def test_int8_rows_score_and_rank_as_the_widened_matrix_did():
    n = 3 * vmod.CHUNK + 77  # chunks and a partial one
    ids, codes, scale = _stored(n, 48)
    v = PoolVectors()
    v.load_matrix(ids, ["fp"] * n, codes, unit=True, scale=scale)
    assert v.codes is not None and v.codes.dtype == np.int8  # kept as stored: a quarter
    rnd = np.random.default_rng(9)
    for _ in range(5):
        q = rnd.normal(size=48).astype(np.float32)
        q /= np.linalg.norm(q)
        want = _reference(codes, scale, q)
        got = v.scores(q)
        assert got.shape == (n,) and got[7] == 0.0
        assert np.allclose(got, want, atol=1e-6)
        top = v.top(q, list(range(n)), 20, -1.0)
        assert [h.id for h in top] == [ids[r] for r in np.argsort(-want, kind="stable")[:20]]
        few = v.top(q, [3, n - 1, 700], 3, -1.0)  # few rows: scored one by one
        got_few = {h.id: h.score for h in few}
        assert got_few.keys() == {ids[3], ids[n - 1], ids[700]}
        assert all(np.isclose(got_few[ids[r]], want[r], atol=1e-6) for r in (3, n - 1, 700))


def test_the_first_new_vector_widens_the_rows_once_and_keeps_every_score():
    n = vmod.CHUNK + 5
    ids, codes, scale = _stored(n, 16)
    v = PoolVectors()
    v.load_matrix(ids, ["fp"] * n, codes, unit=True, scale=scale)
    q = np.random.default_rng(1).normal(size=16).astype(np.float32)
    q /= np.linalg.norm(q)
    before = v.scores(q).copy()
    edited = np.arange(16, dtype=np.float32) - 8
    v.put(ids[4], "fp2", edited)  # overwritten in place
    v.put("new", "fp", np.ones(16, dtype=np.float32))  # a new row
    assert v.codes is None and v.mat.dtype == np.float32
    after = v.scores(q)
    keep = np.ones(n, dtype=bool)
    keep[4] = False
    assert np.allclose(after[:n][keep], before[keep], atol=1e-6)
    assert np.isclose(after[4], edited @ q / np.linalg.norm(edited), atol=1e-6)
    assert np.isclose(after[n], np.ones(16) @ q / 4.0, atol=1e-6)
    assert v.row["new"] == n and v.fp(ids[4]) == "fp2"


@pytest.mark.anyio
async def test_a_pool_of_int8_blocks_loads_int8_and_ranks_as_before(shards):
    """Through the store: blocks written as the background writes them load as one int8
    matrix with each row's factor, and a search ranks the records as the widened float32
    matrix did."""
    from actors.shard.batch import Batch
    from storage.crypto import Cipher
    from storage.vector_store import VectorStore

    cipher = Cipher(os.urandom(32))
    rnd = np.random.default_rng(5)
    raw = rnd.normal(size=(300, 24)).astype(np.float32)
    items = [(f"r{k}", f"fp{k}", raw[k]) for k in range(300)]

    svc = shards()
    for seq, at in enumerate(range(0, 300, 128)):
        block = VectorStore.block("user:u", "m:24", seq, items[at : at + 128], cipher)
        await svc.kernel.commit(Batch(writes=[block]))
    await svc.flush()
    got = await VectorStore(svc.db).load_all("user:u", "m:24", cipher)
    await shards.close(svc)
    ids, fps, mat, row, scale = got
    assert mat.dtype == np.int8 and mat.shape == (300, 24) and scale is not None
    assert ids == [f"r{k}" for k in range(300)] and row is None
    v = PoolVectors()
    v.load_matrix(ids, fps, mat, unit=True, row=row, scale=scale)
    q = rnd.normal(size=24).astype(np.float32)
    q /= np.linalg.norm(q)
    widened = mat.astype(np.float32) * scale[:, None]  # what the load made before
    want = widened @ q
    assert np.allclose(v.scores(q), want, atol=1e-6)
    cosines = (raw / np.linalg.norm(raw, axis=1, keepdims=True)) @ q
    assert np.allclose(v.scores(q), cosines, atol=0.02)  # int8: near the exact cosines
    top = [h.id for h in v.top(q, list(range(300)), 10, -1.0)]
    assert top == [ids[r] for r in np.argsort(-want, kind="stable")[:10]]
