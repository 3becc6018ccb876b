"""A pool's int8 vector blocks are opened straight into one matrix (storage/vector_store.py,
`_open_int8`): the same ids, fingerprints, rows and factors as opening every block into one
buffer and copying the rows out (the general path, still taken for float32 blocks), a later
block's vector of a record winning; a damaged block fails as before."""

from __future__ import annotations

import os

import msgspec
import numpy as np
import pytest

from engine.errors import StorageError
from storage import vector_store as vs
from storage.crypto import Cipher

POOL, MODEL = "user:u", "m:24"


def _blocks(cipher: Cipher, sizes: list[int], dim: int = 24, seed: int = 5) -> list[tuple]:
    """(seq, entries, sealed) rows as `VectorStore.read` returns them, ordered by seq; record
    m3 is embedded again in the last block (its later vector wins)."""
    rnd = np.random.default_rng(seed)
    out, n = [], 0
    for seq, size in enumerate(sizes, start=1):
        items = []
        for _ in range(size):
            items.append((f"m{n}", f"fp{n}", rnd.normal(size=dim).astype(np.float32)))
            n += 1
        if seq == len(sizes):
            items.append(("m3", "fp3-again", rnd.normal(size=dim).astype(np.float32)))
        put = vs.VectorStore.block(POOL, MODEL, seq, items, cipher)
        _, _, _, _, entries, sealed = put.row
        out.append((seq, entries, sealed))
    return out


def _general(monkeypatch, cipher, legacy, blocks):
    with monkeypatch.context() as m:
        m.setattr(vs, "_open_int8", lambda *a: None)
        return vs.assemble_blocks(POOL, MODEL, cipher, legacy, blocks)


@pytest.mark.parametrize("sizes", [[1], [128, 128, 37], [5, 1, 128, 64, 2, 128, 9]])
def test_int8_blocks_open_in_place_as_the_general_path_does(monkeypatch, sizes):
    cipher = Cipher(os.urandom(32))
    blocks = _blocks(cipher, sizes)
    ids, fps, mat, row, scale = vs.assemble_blocks(POOL, MODEL, cipher, [], blocks)
    want = _general(monkeypatch, cipher, [], blocks)
    assert mat.dtype == np.int8 and mat.flags.c_contiguous
    assert (ids, fps) == (want[0], want[1])
    assert row == want[3]
    assert np.array_equal(mat, want[2]) and np.array_equal(scale, want[4])
    k = ids.index("m3")
    assert fps[k] == "fp3-again" and ids.count("m3") == 1


def test_a_float32_block_among_int8_ones_loads_by_the_general_path(monkeypatch):
    cipher = Cipher(os.urandom(32))
    blocks = _blocks(cipher, [4, 3])
    old = np.arange(2 * 24, dtype=np.float32).reshape(2, 24) + 1
    entries = msgspec.json.encode([("old0", "f0"), ("old1", "f1")]).decode()
    sealed = cipher.seal(vs.pack(old.ravel()), vs.block_aad(POOL, MODEL, 0, entries))
    rows = [(0, entries, sealed), *blocks]
    ids, _, mat, _, scale = vs.assemble_blocks(POOL, MODEL, cipher, [], rows)
    assert mat.dtype == np.float32 and ids[:2] == ["old0", "old1"] and len(ids) == 2 + 4 + 3
    unit = old / np.linalg.norm(old, axis=1, keepdims=True)
    assert np.allclose(mat[:2] * scale[:2, None], unit, atol=1e-6)


def test_a_damaged_block_fails_its_check(monkeypatch):
    cipher = Cipher(os.urandom(32))
    blocks = _blocks(cipher, [6, 6])
    seq, entries, sealed = blocks[0]
    bad = bytearray(sealed)
    bad[-1] ^= 1
    blocks[0] = (seq, entries, bytes(bad))
    with pytest.raises(StorageError):
        vs.assemble_blocks(POOL, MODEL, cipher, [], blocks)
