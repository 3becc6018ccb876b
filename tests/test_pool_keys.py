"""No two pools share a key: search terms are hashed with each pool's own key,
a vector block's associated data covers its list of records, and a file written in the first key
format (one term key per shard, blocks without their list covered, unkeyed chain fingerprints)
is brought to the current one when it opens: once, in one transaction, searching as before.

Real shards on real DuckDB files. The first format is written by today's code with the three
old behaviours put back in this test only (`_format_one`), and the file's marker removed."""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from pathlib import Path

import duckdb
import msgspec
import numpy as np
import pytest

from actors.contracts import WorkspaceAccess, WorkspaceQuery
from actors.shard.batch import Batch
from actors.shard.kernel import terms_pool
from actors.shard.service import ShardService
from engine import collaboration as co
from engine.errors import StorageError
from engine.memory_entries import Reader, Scope
from engine.scoped_memory import WorkspaceMemoryChange, WorkspaceMemoryCreate
from storage import key_upgrade
from storage import vector_store as vs
from storage.crypto import chain_fp_key
from storage.database import Database
from storage.group_commit import Put
from storage.key_upgrade import KEYS_FORMAT, keys_format, legacy_terms_key, upgrade_keys
from storage.shard_schema import MIGRATIONS
from storage.term_keys import Analyzer, unpack_row
from storage.term_store import TermKeys
from storage.vector_store import VectorStore
from tests.shard_kit import Shards

ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_1"}))
BEN = WorkspaceAccess(account="u_ben", bots=frozenset({"b_1"}))
ALICE = Reader(user="u1", org="o1", uses_bot=True)
BOT = "bot:b1"
MASTER = bytes(range(32))
MODEL = "m:8"

NOTES = [  # written one after another: each indexed with its neighbours' words too
    "We deployed the billing service on Friday.",
    "The pottery workshop was fun, I made a bowl.",
    "Did the release train leave on time?",
    "我们讨论了明年的预算和招聘计划",
    "Zorblax fixed the flaky invoice tests.",
]
FACTS = ["The billing team deploys on Fridays.", "Alice prefers green tea after lunch."]
QUERIES = ["billing friday", "bowl", "pottery workshop", "release", "预算", "invoice zorblax"]


@pytest.fixture
def master_key(monkeypatch) -> bytes:
    monkeypatch.setenv("OPENBOT_MASTER_KEY", base64.urlsafe_b64encode(MASTER).decode())
    return MASTER


def _shard(shards: Shards) -> ShardService:
    return shards(search={"context_window_s": 120}, directory=True)


async def _create(svc: ShardService, who: WorkspaceAccess, content: str) -> str:
    body = WorkspaceMemoryCreate(
        requestId="r-" + secrets.token_hex(4), scope=Scope.USER, bot="b_1", content=content
    )
    return (await svc.workspace_create_memory(who, body)).id


async def _hits(svc: ShardService, who: WorkspaceAccess, q: str) -> list[tuple[str, float]]:
    listing = await svc.workspace_entries(who, WorkspaceQuery(pools=(f"user:{who.account}",), q=q))
    return [(h.id, round(h.score, 4)) for h in listing.hits]


async def _found(svc: ShardService) -> dict[str, object]:
    """Every query's keyword hits with their scores: in Ann's pool, and in the bot's memory."""
    out: dict[str, object] = {}
    for q in QUERIES:
        out["ws " + q] = await _hits(svc, ANN, q)
        page = await svc.search_memory_page(BOT, ALICE, q, 10)
        out["bot " + q] = [(e.id, round(e.score, 4)) for e in page.entries]
    return out


# --- per-pool term keys ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_one_word_in_two_pools_is_stored_under_two_keys(shards, master_key):
    svc = _shard(shards)
    a = await _create(svc, ANN, "quokka")
    b = await _create(svc, BEN, "quokka")
    learned = (await svc.remember(BOT, ALICE, "quokka", [])).id
    await svc.flush()
    stored = {
        "ann": (await svc.kernel.terms.load("user:u_ann"))[a][1],
        "ben": (await svc.kernel.terms.load("user:u_ben"))[b][1],
        "bot": (await svc.kernel.terms.load(terms_pool(BOT)))[learned][1],
    }
    # Each pool finds its own record by the word (the query hashed for that pool).
    found = (await _hits(svc, ANN, "quokka"), await _hits(svc, BEN, "quokka"))
    page = await svc.search_memory_page(BOT, ALICE, "quokka", 10)
    bot_found = [e.id for e in page.entries]

    assert all(len(k) == 1 for k in stored.values())
    keys = {int(k[0]) for k in stored.values()}
    assert len(keys) == 3  # one word, three pools, three stored keys
    # None of them is the one shard-wide key's hash of the word.
    shard_wide = Analyzer(legacy_terms_key(MASTER)).keys("quokka").tolist()
    assert not keys & set(shard_wide)
    assert [i for i, _ in found[0]] == [a] and [i for i, _ in found[1]] == [b]
    assert bot_found == [learned]


@pytest.mark.anyio
async def test_a_search_of_two_pools_hashes_the_query_for_each_and_ranks_them_as_one(
    shards, master_key
):
    """Ann's user pool and a project's pool, searched at once: each pool's records are found
    (the query hashed with each pool's key) and scored as one index holding both pools' records
    would score them (`keyword_stats`)."""
    from engine.projects import ProjectCreate
    from storage.search_index import TermIndex

    mine = ["zork blip", "zork zork fleem", "fleem gronk"]
    shared = ["zork wibble", "fleem plonk quux", "quux zork zork", "gronk"]

    svc = shards(search={"context_window_s": 0}, directory=True)
    d = svc.peers.directory()
    org = await d.create_org("Acme", "o_1")
    await d.create_user("Ann", [org.id], "u_ann")
    made = ProjectCreate(requestId="p1", name="Launch", members=[])
    await svc.workspace_save_project("u_ann", org.id, made, "p_1")
    texts = {}
    for t in mine:
        texts[await _create(svc, ANN, t)] = t
    for t in shared:
        body = WorkspaceMemoryCreate(
            requestId="r-" + secrets.token_hex(4),
            scope=Scope.PROJECT,
            bot="b_1",
            project="p_1",
            content=t,
        )
        texts[(await svc.workspace_create_memory(ANN, body)).id] = t
    found = {}
    for q in ("zork", "fleem quux", "gronk zork blip"):
        query = WorkspaceQuery(pools=("user:u_ann", "project:p_1"), q=q, limit=20)
        found[q] = {h.id: h.score for h in (await svc.workspace_entries(ANN, query)).hits}

    one = Analyzer(b"k" * 32)
    both = TermIndex()
    both.build((i, one.keys(t)) for i, t in texts.items())
    for q, got in found.items():
        want = dict(both.search(one.query(q), 20))
        assert got.keys() == want.keys(), q
        assert all(abs(got[i] - want[i]) <= 1e-4 * want[i] for i in want), q


def test_term_keys_differ_by_pool_and_by_master_key():
    one, other = TermKeys(MASTER), TermKeys(bytes(32))
    word = one.of("user:u_ann").keys("quokka").tolist()
    assert word != one.of("user:u_ben").keys("quokka").tolist()
    assert word != other.of("user:u_ann").keys("quokka").tolist()
    assert word == TermKeys(MASTER).of("user:u_ann").keys("quokka").tolist()  # derived


# --- vector blocks --------------------------------------------------------------------------


def _items(prefix: str, n: int, seed: int) -> list[tuple[str, str, np.ndarray]]:
    rnd = np.random.default_rng(seed)
    return [(f"{prefix}{k}", f"fp-{prefix}{k}", rnd.normal(size=8)) for k in range(n)]


@pytest.mark.anyio
async def test_a_vector_block_with_a_swapped_entry_list_fails_to_open(shards, master_key):
    """Two blocks of one pool of the same size: the first's sealed vectors stored with the
    second's list would give the second's records the first's vectors, were the list not in
    the block's associated data."""
    svc = _shard(shards)
    await _create(svc, ANN, "a record, for the pool's key")
    cipher = (await svc.kernel.pool("user:u_ann")).stored.cipher
    one = VectorStore.block("user:u_ann", MODEL, 1, _items("a", 3, 1), cipher)
    two = VectorStore.block("user:u_ann", MODEL, 2, _items("b", 3, 2), cipher)
    await svc.kernel.commit(Batch(writes=[one, two]))
    await svc.flush()
    store = VectorStore(svc.db)
    ids = (await store.load_all("user:u_ann", MODEL, cipher))[0]
    key, pool, model, seq, _, sealed = one.row
    swapped = (key, pool, model, seq, two.row[4], sealed)
    await svc.kernel.commit(Batch(writes=[Put("ws_vector_blocks", swapped)]))
    await svc.flush()
    with pytest.raises(StorageError):
        await store.load_all("user:u_ann", MODEL, cipher)
    # An edited list (one fingerprint changed) fails too.
    edited = one.row[4].replace("fp-a1", "fp-b1")
    await svc.kernel.commit(
        Batch(writes=[Put("ws_vector_blocks", (key, pool, model, seq, edited, sealed))])
    )
    await svc.flush()
    with pytest.raises(StorageError):
        await store.load_all("user:u_ann", MODEL, cipher)
    assert ids == ["a0", "a1", "a2", "b0", "b1", "b2"]


# --- the first key format, and its upgrade ---------------------------------------------------


def _format_one(monkeypatch) -> None:
    """Today's code writing as the first format did: one term key for the whole shard, blocks
    sealed without their list, unkeyed chain fingerprints."""
    legacy = Analyzer(legacy_terms_key(MASTER))
    monkeypatch.setattr(TermKeys, "of", lambda self, pool: legacy)
    monkeypatch.setattr(
        vs, "block_aad", lambda pool, model, seq, entries: vs.legacy_block_aad(pool, model, seq)
    )


def _unkeyed(text: str) -> str:
    return hashlib.sha256(co.normalize(text).encode()).hexdigest()[:32]


def _chain_doc() -> str:
    """A chain's row document with a link as the first format stored it."""
    chain = co.new_chain(
        chain_id="ch_1",
        org="o1",
        owner="u1",
        root_chat="c_1",
        topic="t_1",
        project=None,
        root_bot="b1",
        now=1,
    )
    chain, _ = co.on_send(
        chain,
        link_id="dl_1",
        parent=None,
        from_bot="b1",
        to_bot="b2",
        message="Please check the invoice totals",
        now=2,
        fp_key=b"unused" * 6,
    )
    chain, _ = co.on_result(chain, link_id="dl_1", text="All correct", now=3, fp_key=b"x" * 32)
    (link,) = chain.links
    link = msgspec.structs.replace(
        link,
        fingerprint=_unkeyed("Please check the invoice totals"),
        result_fingerprint=_unkeyed("All correct"),
    )
    chain = msgspec.structs.replace(chain, links=(link,))
    return msgspec.json.encode({"chain": chain, "channel": None}).decode()


async def _write_format_one(shards: Shards, monkeypatch) -> tuple[dict[str, object], list, dict]:
    """A data directory in the first key format: Ann's notes (written in sequence), a bot's
    learned facts, a vector block and a chain row; what its searches found then, the block's
    loaded vectors and the stored term rows."""
    with monkeypatch.context() as m:
        _format_one(m)
        svc = _shard(shards)
        svc.workspace_pools.snapshot_rows = 1  # the close stores each pool's keyword snapshot
        ids = [await _create(svc, ANN, text) for text in NOTES]
        # Edited after its neighbours were indexed with its words: they keep the words
        # (found by "pottery workshop", "bowl"), which only its revision still holds.
        edit = WorkspaceMemoryChange(
            requestId="edit", id=ids[1], expectedRevision=1, content="A quiet day at home."
        )
        await svc.workspace_change_memory(ANN, edit)
        await _create(svc, BEN, "Ben's own billing note")
        for text in FACTS:
            await svc.remember(BOT, ALICE, text, [])
        cipher = (await svc.kernel.pool("user:u_ann")).stored.cipher
        block = VectorStore.block("user:u_ann", MODEL, 1, _items("v", 4, 3), cipher)
        await svc.kernel.commit(Batch(writes=[block]))
        await shards.close(svc)
        # What the first format's code found, its indexes loaded from the stored rows (as the
        # upgraded file's will be: an index written to in place counts dead rows a while).
        found, vectors, rows = await _reopened(shards, marked=False)
    con = duckdb.connect(str(shards.path / "shard-0.duckdb"))
    con.execute("DELETE FROM shard_meta WHERE key = 'keys'")  # as the first format left it
    assert con.execute("SELECT count(*) FROM search_snapshots").fetchall()[0][0] >= 2
    con.close()
    return found, vectors, rows


async def _reopened(shards: Shards, marked: bool = True) -> tuple[dict[str, object], list, dict]:
    """The folder's shard opened again: its searches' hits, the block's vectors, the term rows;
    closed again after, for the next open or a direct read of its file."""
    svc = _shard(shards)
    found = await _found(svc)
    cipher = (await svc.kernel.pool("user:u_ann")).stored.cipher
    vectors = await VectorStore(svc.db).load_all("user:u_ann", MODEL, cipher)
    rows = await svc.kernel.terms.load("user:u_ann")
    assert not marked or keys_format(svc.db) == KEYS_FORMAT
    await svc.flush()
    await shards.close(svc)
    return found, vectors, rows


def _same_vectors(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and np.array_equal(a[2], b[2])


@pytest.mark.anyio
async def test_a_first_format_data_dir_opens_and_searches_as_before(
    shards, master_key, monkeypatch
):
    before, vectors, old_rows = await _write_format_one(shards, monkeypatch)
    assert sum(len(v) for v in before.values()) > len(QUERIES)  # the queries find things
    assert before["ws pottery workshop"] and before["ws bowl"]  # (the edited note's words)
    after, reloaded, rows = await _reopened(shards)
    assert after == before  # the same hits, the same scores
    assert _same_vectors(reloaded, vectors)
    # Every term row hashed again, under the pool's key.
    assert rows.keys() == old_rows.keys()
    assert all(not np.array_equal(rows[i][1], old_rows[i][1]) for i in rows)
    # Once: opened again, nothing is rewritten.
    again, reloaded, rows_again = await _reopened(shards)
    assert again == before and _same_vectors(reloaded, vectors)
    assert all(np.array_equal(rows_again[i][1], rows[i][1]) for i in rows)


@pytest.mark.anyio
async def test_an_upgrade_cut_short_is_done_whole_at_the_next_open(
    shards, tmp_path: Path, master_key, monkeypatch
):
    """A crash inside the upgrade's transaction (after its terms and blocks were rewritten,
    before the chains and the marker) leaves the first format whole; the next open does it
    all."""
    before, vectors, old_rows = await _write_format_one(shards, monkeypatch)

    def crash(con, master_key):
        raise RuntimeError("crashed")

    db = Database(tmp_path / "shard-0.duckdb", MIGRATIONS)
    with monkeypatch.context() as m:
        m.setattr(key_upgrade, "_chains", crash)
        with pytest.raises(RuntimeError):
            upgrade_keys(db, MASTER)
    stored = db.query("SELECT entry, terms, tfs FROM search_terms WHERE pool = 'user:u_ann'")
    terms = {e: unpack_row(t, n) for e, t, n in stored}
    assert keys_format(db) == "1"
    db.close()
    assert all(np.array_equal(terms[i], old_rows[i][1]) for i in old_rows)  # rolled back
    after, reloaded, _ = await _reopened(shards)
    assert after == before and _same_vectors(reloaded, vectors)


def test_first_format_chain_fingerprints_are_keyed_with_the_org_key_on_open(tmp_path: Path):
    db = Database(tmp_path / "shard-0.duckdb", MIGRATIONS)
    try:
        db.run_sync(
            lambda con: con.execute(
                "INSERT INTO chains (id, org, doc, texts) VALUES ('ch_1', 'o1', ?, ?)",
                [_chain_doc(), b""],
            )
        )
        assert upgrade_keys(db, MASTER) is True
        (doc,) = db.query("SELECT doc FROM chains WHERE id = 'ch_1'")[0]
        assert upgrade_keys(db, MASTER) is False  # once
        assert db.query("SELECT doc FROM chains WHERE id = 'ch_1'")[0][0] == doc
    finally:
        db.close()
    (link,) = msgspec.json.decode(doc)["chain"]["links"]
    key = chain_fp_key(MASTER, "o1")
    assert link["fingerprint"] == co.fingerprint("Please check the invoice totals", key)
    assert link["result_fingerprint"] == co.fingerprint("All correct", key)
    assert link["fingerprint"] != _unkeyed("Please check the invoice totals")
    # The rest of the document is as it was.
    chain = msgspec.convert(msgspec.json.decode(doc)["chain"], co.Chain)
    assert chain.links[0].status == "answered" and chain.links[0].to_bot == "b2"


@pytest.mark.anyio
async def test_a_block_of_the_first_format_does_not_open_once_upgraded(
    shards, master_key, monkeypatch
):
    """After the upgrade only the current associated data opens a block: a block sealed the
    first format's way (its list not covered) is refused, not read as it was."""
    await _write_format_one(shards, monkeypatch)
    await _reopened(shards)

    svc = _shard(shards)
    cipher = (await svc.kernel.pool("user:u_ann")).stored.cipher
    items = _items("w", 2, 4)
    with monkeypatch.context() as m:
        _format_one(m)
        old = VectorStore.block("user:u_ann", MODEL, 5, items, cipher)
    await svc.kernel.commit(Batch(writes=[old]))
    await svc.flush()
    with pytest.raises(StorageError):
        await VectorStore(svc.db).load_all("user:u_ann", MODEL, cipher)


def test_derived_keys_are_32_bytes_and_scoped():
    assert len(chain_fp_key(MASTER, "o1")) == 32
    assert chain_fp_key(MASTER, "o1") != chain_fp_key(MASTER, "o2")
    assert chain_fp_key(MASTER, "o1") != chain_fp_key(os.urandom(32), "o1")


def test_pools_keyed_apart_searched_as_one_score_as_one_index_holding_every_row():
    """`Stats.across` (actors/workspace/search.py `keyword_stats`): two pools whose terms are
    hashed with keys of their own, each searched with the query hashed for it, score every
    row as one index holding both pools' rows (under one key) does."""
    from storage.search_index import Stats, TermIndex

    keys = TermKeys(MASTER)
    first = {"u1": "zork blip", "u2": "zork zork fleem", "u3": "zork gronk wibble"}
    second = {"b1": "zork wibble", "b2": "fleem plonk quux", "b3": "quux zork zork"}

    def index(rows: dict[str, str], an: Analyzer) -> TermIndex:
        idx = TermIndex()
        idx.build((i, an.keys(t)) for i, t in rows.items())
        return idx

    one_key = keys.of("user:u_ann")
    a_an, b_an = keys.of("user:u_ann"), keys.of("project:p_1")
    a, b = index(first, a_an), index(second, b_an)
    both = index({**first, **second}, one_key)
    for q in ("zork", "zork fleem", "wibble zork zork", "quux blip", "nothing"):
        qa, qb = a_an.query(q), b_an.query(q)
        sa, sb = Stats.across([(a.stats(qa), qa), (b.stats(qb), qb)])
        got = dict(a.search(qa, 10, None, sa) + b.search(qb, 10, None, sb))
        want = dict(both.search(one_key.query(q), 10))
        assert got.keys() == want.keys(), q
        assert all(abs(got[i] - want[i]) <= 1e-5 * want[i] for i in want), q


@pytest.mark.anyio
async def test_a_chain_stores_its_links_fingerprints_keyed_with_its_orgs_key(
    shards, tmp_path: Path, master_key
):
    """Through a real send (Asker to Peer, in-process shard): the chain's stored document
    holds the message's fingerprint under the org's key, not a plain hash of the text."""
    from actors.contracts import TurnStart
    from actors.models.registry import ScriptedModel
    from tests.chain_kit import PEER_SCRIPT, asker_and_peer

    script = tmp_path / "chain.toml"
    script.write_text(PEER_SCRIPT)
    models = {"s": ScriptedModel.from_file("s", str(script))}

    svc = shards(models=models, directory=True)
    org, asker, chat = await asker_and_peer(shards.directory_service())
    start = TurnStart(chat=chat, bot=asker, org=org, operator="u_ann", text="start")
    await svc.start_turn(start, True)
    await svc.chains_idle()
    await svc.flush()
    (doc,) = [d for (d,) in svc.db.query("SELECT doc FROM chains")]
    (link,) = msgspec.json.decode(doc)["chain"]["links"]
    key = chain_fp_key(MASTER, org.id)
    assert link["fingerprint"] == co.fingerprint("x", key) != _unkeyed("x")
    result = "Result received and merged into my work."  # Peer's answer (its default)
    assert link["result_fingerprint"] == co.fingerprint(result, key) != _unkeyed(result)
