"""Semantic search over workspace memory (SC-7, docs/design.md §6).

The embeddings client against the tests' OpenAI-compatible server (batches, order, errors);
the `[search]` configuration; a shard driven directly (vectors kept across a restart, recomputed
after an edit, keyword search going on when the model is down); and the real server: a semantic
hit need not contain the query, keyword hits are kept, and what the caller may not read is never
returned.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import threading
from pathlib import Path

import duckdb
import numpy as np
import pytest

from actors.contracts import WorkspaceAccess, WorkspaceQuery
from actors.directory import DirectoryService
from actors.models.embeddings import (
    EmbeddingError,
    OpenAIEmbeddings,
    SearchSettings,
    load_embedder,
    search_settings,
)
from actors.models.registry import load_models
from actors.shard.service import ShardService
from actors.workspace.vectors import PoolVectors
from engine.errors import InvalidInput, Unavailable
from engine.memory_entries import Scope, Tier
from engine.scoped_memory import WorkspaceEntry, WorkspaceMemoryChange, WorkspaceMemoryCreate
from engine.workspace_search import cosine_top_k
from gateway.live_server import LiveServer
from gateway.server import load_settings
from storage.vector_store import pack
from tests.openai_stub import OpenAIStub, embed_text

WS = "/api/app/workspace"
pytestmark = pytest.mark.usefixtures("no_env_key")


# --- the embeddings client ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def emb_stub():
    stub = OpenAIStub()
    live = LiveServer(stub.app)
    stub.url = live.url + "/v1"
    yield stub
    live.stop()


def _client(stub: OpenAIStub, **options) -> OpenAIEmbeddings:
    return OpenAIEmbeddings("emb", base_url=stub.url, model="emb-model", **options)


def test_client_batches_keeps_order_and_cuts_long_inputs(emb_stub):
    async def go():
        client = _client(emb_stub, batch_size=2, max_input_chars=12, dimensions=64)
        emb_stub.embedding_requests.clear()
        texts = ["car", "automobile", "tea", "", "a very long text that is cut"]
        try:
            vectors = await client.embed(texts)
        finally:
            await client.close()
        assert vectors == [embed_text(t) for t in ["car", "automobile", "tea", " ", texts[4][:12]]]
        assert vectors[0] == vectors[1]  # the stub's thesaurus: one direction
        sent = emb_stub.embedding_requests
        batches = sorted(r["input"] for r in sent)  # two in flight at once: any order
        assert batches == sorted([["car", "automobile"], ["tea", " "], [texts[4][:12]]])
        assert {(r["model"], r["encoding_format"], r["dimensions"]) for r in sent} == {
            ("emb-model", "float", 64)
        }
        assert client.ident == "openai:emb-model:64"
        assert await _client(emb_stub).embed([]) == []

    asyncio.run(go())


@pytest.mark.parametrize(
    ("faults", "code", "requests"),
    [
        ([400], "embedding_error", 1),  # not retried
        ([503, 503, 503], "embedding_error", 3),  # retried twice, then given up
        ([OpenAIStub.GARBAGE], "embedding_garbage", 1),
        ([OpenAIStub.SHORT], "embedding_garbage", 1),
        ([("delay", 2.0)], "embedding_timeout", 1),
    ],
)
def test_client_errors_are_unavailable(emb_stub, faults, code, requests):
    async def go():
        client = _client(emb_stub, timeout=0.5)
        emb_stub.embedding_requests.clear()
        emb_stub.embedding_faults.clear()
        emb_stub.embedding_faults.extend(faults)
        try:
            with pytest.raises(EmbeddingError) as err:
                await client.embed(["car"])
        finally:
            await client.close()
            emb_stub.embedding_faults.clear()
        assert isinstance(err.value, Unavailable) and err.value.code == code
        assert len(emb_stub.embedding_requests) == requests

    asyncio.run(go())


def test_client_retries_a_passing_failure_and_reports_an_unreachable_server(emb_stub):
    async def go():
        client = _client(emb_stub)
        emb_stub.embedding_faults.extend([429])
        try:
            assert await client.embed(["tea"]) == [embed_text("tea")]
        finally:
            await client.close()
        dead = OpenAIEmbeddings(
            "emb", base_url="http://127.0.0.1:9/v1", model="m", retries=0, timeout=2
        )
        try:
            with pytest.raises(EmbeddingError) as err:
                await dead.embed(["tea"])
        finally:
            await dead.close()
        assert err.value.code == "embedding_unreachable"

    asyncio.run(go())


# --- configuration --------------------------------------------------------------------------------


def test_search_settings_are_checked_against_the_models(tmp_path: Path):
    models = {
        "emb": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "e"},
        "demo": {"kind": "scripted", "script": "x.toml"},
        "mini": {"kind": "sentence-transformers", "model": "all-MiniLM-L6-v2"},
    }
    assert search_settings({}, models) == SearchSettings()  # keyword-only
    assert load_embedder(SearchSettings(), models) is None
    assert search_settings({"embedding_model": "emb", "min_score": 0.5}, models).min_score == 0.5
    for bad in (
        {"embedding_model": "nope"},
        {"embedding_model": "demo"},
        {"embedding_model": "emb", "min_score": 2},
        {"embedding_model": "emb", "typo": 1},
    ):
        with pytest.raises(InvalidInput) as err:
            search_settings(bad, models)
        assert err.value.code == "bad_config"
    # The local kind is an embedding model only: chat models skip it.
    assert "mini" not in load_models({"mini": models["mini"]})
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        with pytest.raises(InvalidInput, match="local-embeddings"):
            load_embedder(SearchSettings(embedding_model="mini"), models)
    config = tmp_path / "openbot.toml"
    config.write_text(
        '[models.emb]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "e"\n'
        '[search]\nembedding_model = "emb"\n'
    )
    assert load_settings(config=str(config)).search == {"embedding_model": "emb"}
    config.write_text('[search]\nembedding_model = "missing"\n')
    with pytest.raises(InvalidInput, match="missing"):
        load_settings(config=str(config))


# --- the vector index -----------------------------------------------------------------------------


def _entry(entry_id: str, fp: str = "fp") -> WorkspaceEntry:
    return WorkspaceEntry(
        id=entry_id,
        scope=Scope.USER,
        pool="user:u",
        contributor="b",
        tier=Tier.PROFILE,
        content_fp=fp,
        created_at=0,
        updated_at=0,
    )


def test_pool_vectors_rank_like_the_pure_reference():
    rnd = random.Random(3)
    vectors = {f"m{k:03d}": [rnd.gauss(0, 1) for _ in range(16)] for k in range(300)}
    vectors["m_tie"] = list(vectors["m007"])  # the same vector: ties go by id
    vectors["m_zero"] = [0.0] * 16  # no direction: never a hit
    query = [rnd.gauss(0, 1) for _ in range(16)]
    one_by_one, at_once = PoolVectors(), PoolVectors()
    for entry_id, v in vectors.items():
        one_by_one.put(entry_id, "fp", v)
    at_once.load([(i, "fp", np.asarray(v, dtype=np.float32)) for i, v in vectors.items()])
    unit = np.asarray(query, dtype=np.float32) / np.linalg.norm(query)
    expected = [h.id for h in cosine_top_k(query, vectors, 20)]
    for index in (one_by_one, at_once):
        rows, stale = index.split(_entry(i) for i in vectors)
        assert stale == [] and len(rows) == len(vectors)
        assert [h.id for h in index.top(unit, rows, 20, -1.0)] == expected
        best = cosine_top_k(query, vectors, 1)[0]
        assert [h.id for h in index.top(unit, rows, 5, best.score - 1e-4)] == [best.id]
    # A stale fingerprint, an unknown record: to be embedded, not searched.
    rows, stale = at_once.split([_entry("m001", "other"), _entry("nope"), _entry("m002")])
    assert [e.id for e in stale] == ["m001", "nope"] and len(rows) == 1
    # Vectors of another length: what was kept belongs to another model and is dropped.
    at_once.put("m001", "fp2", [1.0, 0.0])
    assert at_once.n == 1 and at_once.dim == 2 and at_once.fp("m002") is None


# --- a shard driven directly ----------------------------------------------------------------------


class InProcessEmbedder:
    """The stub's vectors without HTTP, counting what it embeds; `down` makes it fail."""

    name = "fake"
    ident = "fake:1"

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.down = False

    async def embed(self, texts):
        if self.down:
            raise EmbeddingError("the fake model is down")
        self.texts.extend(texts)
        return [embed_text(t) for t in texts]

    async def close(self) -> None:
        pass


def _shard(data: Path, embedder: InProcessEmbedder) -> ShardService:
    svc = ShardService(data, 0, embedder=embedder, search={"context_window_s": 0})
    svc.peers.connect(directory=DirectoryService(data))  # what the features call without Ray
    return svc


async def _close(svc: ShardService) -> None:
    await svc.close()
    svc.peers.directory().store.db.close()


ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))
BEN = WorkspaceAccess(account="u_ben", bots=frozenset({"b_2"}))


async def _remember(svc: ShardService, who: WorkspaceAccess, content: str) -> str:
    body = WorkspaceMemoryCreate(
        requestId="r-" + secrets.token_hex(4),
        scope=Scope.USER,
        bot=next(iter(who.bots)),
        content=content,
    )
    return (await svc.workspace_create_memory(who, body)).id


async def _search(svc: ShardService, q: str, *pools: str):
    listing = await svc.workspace_entries(ANN, WorkspaceQuery(pools=pools or ("user:u_ann",), q=q))
    return (
        [h.id for h in listing.hits],
        [h.id for h in listing.semantic],
        [e.id for e in listing.entries],
    )


def test_shard_keeps_vectors_recomputes_edits_and_survives_a_dead_model(tmp_path: Path):
    async def first() -> dict[str, str]:
        emb = InProcessEmbedder()
        svc = _shard(tmp_path, emb)
        ids = {
            "auto": await _remember(svc, ANN, "The automobile needs new tyres."),
            "maps": await _remember(svc, ANN, "Cartography class: maps on Tuesdays."),
            "lunch": await _remember(svc, ANN, "Lunch is at noon."),
            "ben": await _remember(svc, BEN, "My automobile is red."),
        }
        await svc.workspace.semantic.idle()  # embedded in the background after each commit
        assert len(emb.texts) == 4
        keyword, semantic, entries = await _search(svc, "car map", "user:u_ann", "user:u_ben")
        assert keyword == [ids["maps"]]  # "map" is the stem of "maps"
        assert semantic == [ids["auto"]]  # no "car" in it, and not Ben's (not Ann's to read)
        assert set(entries) == {ids["auto"], ids["maps"]}
        assert emb.texts[4:] == ["car map"]  # only the query was embedded for the search
        # An edit changes the content: its vector is computed again.
        change = WorkspaceMemoryChange(
            requestId="r-edit", id=ids["lunch"], expectedRevision=1, content="Lunch by car."
        )
        await svc.workspace_change_memory(ANN, change)
        await svc.workspace.semantic.idle()
        assert emb.texts[-1] == "Lunch by car."
        keyword, semantic, _ = await _search(svc, "automobile")
        assert keyword == [ids["auto"]]
        assert set(semantic) == {ids["auto"], ids["lunch"]}
        await _close(svc)
        return ids

    ids = asyncio.run(first())

    # Vectors are sealed at rest, in blocks of what one embedding batch made.
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"), read_only=True)
    rows = con.execute("SELECT entries, model, vecs FROM ws_vector_blocks").fetchall()
    con.close()
    stored = {e for r in rows for e, _ in json.loads(r[0])}
    assert stored == set(ids.values()) and {r[1] for r in rows} == {"fake:1"}
    plain = pack(embed_text("The automobile needs new tyres."))
    assert all(plain[:64] not in r[2] for r in rows)

    async def again() -> None:
        emb = InProcessEmbedder()
        svc = _shard(tmp_path, emb)
        keyword, semantic, _ = await _search(svc, "vehicle")
        assert semantic == [ids["lunch"], ids["auto"]]  # "Lunch by car." is the nearer
        assert keyword == []
        assert emb.texts == ["vehicle"]  # the records' vectors came from the file
        # A new record's vector (its rows, loaded int8, are widened once for it, off the loop):
        # the loaded ones score as before.
        ids["truck"] = await _remember(svc, ANN, "A car and a car: the automobile of a car.")
        await svc.workspace.semantic.idle()
        _, again_semantic, _ = await _search(svc, "vehicle")
        assert again_semantic[0] == ids["truck"] and again_semantic[1:] == semantic
        # The model goes down: keyword hits still come, and a query seen before still finds
        # semantic hits from the vectors kept.
        emb.down = True
        keyword, semantic, entries = await _search(svc, "cartography")
        assert keyword == [ids["maps"]] and semantic == [] and entries == [ids["maps"]]
        keyword, semantic, _ = await _search(svc, "vehicle")
        assert set(semantic) == {ids["auto"], ids["lunch"], ids["truck"]}
        await _close(svc)

    asyncio.run(again())


def test_an_edited_record_is_not_found_by_its_old_vector(tmp_path: Path):
    """A vector counts only for the content it was made from: edited while the model is down
    (no new vector yet), a record is not a semantic hit for what it used to say."""

    async def go() -> None:
        emb = InProcessEmbedder()
        svc = _shard(tmp_path, emb)
        auto = await _remember(svc, ANN, "The automobile needs new tyres.")
        await svc.workspace.semantic.idle()
        assert (await _search(svc, "vehicle"))[1] == [auto]  # the query's vector is kept
        emb.down = True
        change = WorkspaceMemoryChange(
            requestId="r-edit", id=auto, expectedRevision=1, content="Gardening on Sundays."
        )
        await svc.workspace_change_memory(ANN, change)
        keyword, semantic, entries = await _search(svc, "vehicle")
        assert semantic == [] and keyword == [] and entries == []
        await _close(svc)

    asyncio.run(go())


# --- the real server ------------------------------------------------------------------------------


def _ok(resp, status: int = 200) -> dict:
    assert resp.status_code == status, resp.text
    return resp.json()


def _create(client, **body) -> str:
    body = {"requestId": "r-" + secrets.token_hex(6), **body}
    return _ok(client.post(f"{WS}/memories", json=body), 201)["id"]


def _found(client, q: str) -> list[str]:
    return [e["id"] for e in _ok(client.get(f"{WS}/memories", params={"q": q}))["entries"]]


def test_search_keeps_semantic_and_keyword_hits_and_only_what_the_caller_may_read(
    world, model_stubs
):
    w = world
    w.grant("bob", "read")
    w.grant("carol", "read")
    with w.client("alice") as alice, w.client("bob") as bob, w.client("carol") as carol:
        project = _ok(
            alice.post(
                f"{WS}/projects",
                json={"requestId": "r-p", "name": "Fleet", "members": [w.users["bob"]]},
            ),
            201,
        )["id"]
        mine = _create(alice, scope="user", bot=w.bot, content="The automobile needs new tyres.")
        maps = _create(
            alice, scope="user", bot=w.bot, content="Cartography class: maps on Tuesdays."
        )
        lunch = _create(alice, scope="user", bot=w.bot, content="Lunch is at noon.")
        fleet = _create(
            alice,
            scope="project",
            bot=w.bot,
            project=project,
            content="The automobile fleet lease ends in May.",
        )
        bobs = _create(bob, scope="user", bot=w.bot, content="My automobile is red.")
        before = len(model_stubs["emb"].embedding_requests)

        found = _found(alice, "car map")
        # Semantic hits without the word "car", the keyword hit, nothing of Bob's own memory.
        assert set(found) == {mine, maps, fleet}, (found, mine, maps, fleet)
        assert lunch not in found and bobs not in found
        assert len(model_stubs["emb"].embedding_requests) > before  # the model was asked

        # Bob: the project's record and his own; none of Alice's user memory.
        assert set(_found(bob, "car")) == {fleet, bobs}
        # Carol uses the bot but is in no project and wrote nothing: nothing at all.
        assert _found(carol, "car") == []
        assert _found(carol, "automobile") == []
        # Keyword search alone still works as before.
        assert _found(alice, "tuesdays") == [maps]
        # Each hit says how it was found and with what fused score.
        resp = _ok(alice.get(f"{WS}/memories", params={"q": "car map"}))["entries"]
        found_by = {e["id"]: e["foundBy"] for e in resp}
        assert found_by[maps] == ["keyword"] and found_by[mine] == ["semantic"]
        assert all(e["score"] > 0 for e in resp)
        # One retriever on request; an unknown one is a clear 400.
        only = _ok(alice.get(f"{WS}/memories", params={"q": "car map", "using": "keyword"}))
        assert [e["id"] for e in only["entries"]] == [maps]
        bad = alice.get(f"{WS}/memories", params={"q": "car", "using": "psychic"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_using"


def test_semantic_search_finds_the_learned_entries_the_caller_may_read(tmp_path: Path):
    """A bot's learned entries (one memory per bot) are found by meaning too, not only by their
    words, and only by whom they are for; a learned entry is embedded when a search first meets it,
    once."""
    from tests.test_shard_service import POOL as BOT_POOL
    from tests.test_shard_service import fact

    async def main() -> None:
        emb = InProcessEmbedder()
        svc = _shard(tmp_path, emb)
        try:
            await svc.add_entries(
                BOT_POOL,
                [
                    (fact("mem_l1", user="u1"), "Her automobile is a green hatchback"),
                    (fact("mem_l2", user="u2"), "His automobile is a red van"),
                ],
            )
            bot = BOT_POOL.removeprefix("bot:")
            u1 = WorkspaceAccess(account="u1", bots=frozenset({bot}), orgs=("o1",))
            u2 = WorkspaceAccess(account="u2", bots=frozenset({bot}), orgs=("o1",))
            only = WorkspaceQuery(pools=(BOT_POOL,), projects=(), q="car", using="semantic")
            listing = await svc.workspace_entries(u1, only)
            assert [h.id for h in listing.semantic] == ["mem_l1"]  # no "car" in it
            assert [e.id for e in listing.entries] == ["mem_l1"]  # and not u2's
            hybrid = await svc.workspace_entries(
                u1, WorkspaceQuery(pools=(BOT_POOL,), projects=(), q="car")
            )
            assert [(h.id, h.kinds) for h in hybrid.fused] == [("mem_l1", ("semantic",))]
            assert [e.id for e in (await svc.workspace_entries(u2, only)).entries] == ["mem_l2"]
            embedded = [t for t in emb.texts if "automobile" in t]
            assert sorted(embedded) == sorted(
                ["Her automobile is a green hatchback", "His automobile is a red van"]
            )  # each once, by the search that first met it
        finally:  # a failed check must fail the test, not leave the shard's threads running
            await _close(svc)

    # A bound on the whole: a search that never returns fails here instead of hanging the run.
    asyncio.run(asyncio.wait_for(main(), timeout=60))


# --- the model is never awaited under a pool's search lock (ACL-9) -------------------------------


def test_a_search_answers_while_the_background_waits_on_a_slow_model(tmp_path: Path, emb_stub):
    """The background embeds a new record through a real client whose server holds the request
    (until the test lets it go): a search of the same pool answers meanwhile, the request still
    held."""
    entered, gate = threading.Event(), threading.Event()

    async def go() -> None:
        svc = _shard(tmp_path, _client(emb_stub))
        try:
            tea = await _remember(svc, ANN, "Green tea in the morning.")
            await svc.workspace.semantic.idle()
            assert (await _search(svc, "beverage"))[1] == [tea]  # vectors loaded, query known
            emb_stub.embedding_faults.append(("hold", entered, gate, 60.0))
            coffee = await _remember(svc, ANN, "Coffee after lunch.")
            assert await asyncio.to_thread(entered.wait, 30)  # the background is on the model
            # The model answers only once the gate opens: a search that waited on it would time
            # out here (bounded below the client's own timeout), however loaded the host.
            _, semantic, _ = await asyncio.wait_for(_search(svc, "beverage"), 20)
            assert emb_stub.embeddings_held == 1  # answered while the model still works
            assert semantic == [tea]
            gate.set()
            await svc.workspace.semantic.idle()
            _, semantic, _ = await _search(svc, "beverage")
            assert set(semantic) == {tea, coffee}  # what the model made is kept after all
        finally:
            gate.set()
            emb_stub.embedding_faults.clear()
            await _close(svc)

    asyncio.run(go())


def test_a_vector_of_content_edited_while_the_model_ran_is_not_kept(tmp_path: Path, emb_stub):
    """The background embeds a record's first content, slowly; the record is edited and a search
    embeds its new content meanwhile. The background's late vector (of the old content) must not
    replace the new one: the record stays a semantic hit for its new content."""
    entered, gate = threading.Event(), threading.Event()

    async def go() -> None:
        svc = _shard(tmp_path, _client(emb_stub))
        try:
            await _remember(svc, ANN, "Green tea in the morning.")
            await svc.workspace.semantic.idle()
            emb_stub.embedding_faults.append(("hold", entered, gate, 30.0))
            rec = await _remember(svc, ANN, "Coffee after lunch.")
            assert await asyncio.to_thread(entered.wait, 30)
            change = WorkspaceMemoryChange(
                requestId="r-edit", id=rec, expectedRevision=1, content="Maps and cartography."
            )
            await svc.workspace_change_memory(ANN, change)
            assert (await _search(svc, "maps"))[1] == [rec]  # its new content, embedded inline
            assert emb_stub.embeddings_held == 1
            gate.set()
            await svc.workspace.semantic.idle()
            assert (await _search(svc, "maps"))[1] == [rec]
            assert (await _search(svc, "beverage"))[1] != [rec]
        finally:
            gate.set()
            emb_stub.embedding_faults.clear()
            await _close(svc)

    asyncio.run(go())


class HeldEmbedder(InProcessEmbedder):
    """Holds a call whose texts mention HOLD until `gate` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.holding = asyncio.Event()

    async def embed(self, texts):
        if any("HOLD" in t for t in texts):
            self.holding.set()
            await self.gate.wait()
        return await super().embed(texts)


def test_a_record_a_failed_search_could_not_embed_is_embedded_later(tmp_path: Path):
    """A search embeds a waiting record inline and the model fails: the record stays queued,
    and the background embeds it once the model answers again."""

    async def go() -> None:
        emb = HeldEmbedder()
        svc = _shard(tmp_path, emb)
        semantic = svc.workspace.semantic
        semantic.retry_after = 0.0  # the model may be asked again at once
        try:
            tea = await _remember(svc, ANN, "Green tea in the morning.")
            await semantic.idle()
            assert (await _search(svc, "beverage"))[1] == [tea]
            await _remember(svc, ANN, "HOLD the background here.")
            await asyncio.wait_for(emb.holding.wait(), 30)  # the background is busy
            coffee = await _remember(svc, ANN, "Coffee after lunch.")  # so this one waits
            emb.down = True
            assert (await _search(svc, "beverage"))[1] == [tea]  # its inline embedding failed
            emb.down = False
            emb.gate.set()
            await semantic.idle()
            assert set((await _search(svc, "beverage"))[1]) == {tea, coffee}
        finally:
            emb.gate.set()
            await _close(svc)

    asyncio.run(go())
