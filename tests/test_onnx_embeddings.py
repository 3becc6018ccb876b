"""Local embeddings on ONNX Runtime (`kind = "onnx"`): all-MiniLM-L6-v2 int8 from the
PyPI package, nothing downloaded; configured as one model line and found by semantic search."""

from __future__ import annotations

import secrets
from pathlib import Path

import numpy as np
import pytest

from actors.contracts import WorkspaceAccess, WorkspaceQuery
from actors.models.embeddings import OnnxEmbeddings, load_embedder, search_settings
from actors.models.registry import load_models
from engine.errors import InvalidInput
from engine.memory_entries import Scope
from engine.scoped_memory import WorkspaceMemoryCreate

MODELS = {"minilm": {"kind": "onnx"}}
ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))


@pytest.fixture(scope="module")
def minilm() -> OnnxEmbeddings:
    embedder = load_embedder(search_settings({"embedding_model": "minilm"}, MODELS), MODELS)
    assert isinstance(embedder, OnnxEmbeddings)
    return embedder


@pytest.mark.anyio
async def test_one_config_line_gives_unit_sentence_vectors_that_know_synonyms(minilm):
    assert load_models(MODELS) == {}  # an embedding model only, accepted by the model table
    texts = ["The automobile needs new tyres.", "my car", "Lunch is at noon.", ""]
    vectors = np.asarray(await minilm.embed(texts))
    assert vectors.shape == (4, 384)
    assert np.allclose(np.linalg.norm(vectors[:3], axis=1), 1.0, atol=1e-4)
    sims = vectors[:3] @ vectors[1]
    assert sims[0] > 0.25 and sims[0] > 2 * sims[2]  # "car": near "automobile", not lunch
    # Batching and ordering do not change a text's vector.
    again = np.asarray(await minilm.embed(texts[::-1]))[::-1]
    assert np.allclose(again, vectors, atol=1e-4)
    assert minilm.ident.startswith("onnx:model.onnx:")


def test_a_missing_model_file_is_a_config_error(tmp_path: Path):
    models = {"m": {"kind": "onnx", "model": "nowhere.onnx"}}
    with pytest.raises(InvalidInput) as info:
        load_embedder(search_settings({"embedding_model": "m"}, models), models, base_dir=tmp_path)
    assert info.value.code == "bad_config" and "nowhere.onnx" in info.value.message


@pytest.mark.anyio
async def test_semantic_search_with_the_onnx_model_finds_a_record_sharing_no_word(
    shards, minilm, monkeypatch
):
    monkeypatch.delenv("OPENBOT_MASTER_KEY", raising=False)

    svc = shards(embedder=minilm, directory=True)
    ids = []
    for text in ("The automobile needs new tyres.", "Lunch is at noon.", "Pay the rent."):
        body = WorkspaceMemoryCreate(
            requestId="r-" + secrets.token_hex(4), scope=Scope.USER, bot="b_1", content=text
        )
        ids.append((await svc.workspace_create_memory(ANN, body)).id)
    listing = await svc.workspace_entries(
        ANN, WorkspaceQuery(pools=("user:u_ann",), q="my car", limit=3)
    )
    assert listing.fused[0].id == ids[0] and listing.fused[0].kinds == ("semantic",)
