"""What a workspace memory creation costs the shard (workspace writes over HTTP at least
as fast as Remember), without changing what it stores: a coalesced call's creations are each
indexed once, with both their neighbours, and stored in the call's one commit; the previous
record's context row goes with them, pending or not."""

from __future__ import annotations

import asyncio
import hmac
import re
import unicodedata
from pathlib import Path

import duckdb
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.contracts import (
    REPLIES,
    CallError,
    WorkspaceAccess,
    WorkspaceCreateCall,
    WorkspaceQuery,
)
from actors.shard.service import ShardService
from engine.errors import StorageError
from engine.fingerprints import content_fingerprint, normalize
from engine.scoped_memory import WorkspaceMemoryCreate
from storage.group_commit import GroupCommitter
from storage.search_index import TermIndex
from storage.term_keys import in_context, unpack_row

pytestmark = pytest.mark.usefixtures("no_env_key")
ANN = WorkspaceAccess(account="u_ann", bots=frozenset({"b_ws"}))
_enc = msgspec.msgpack.Encoder()
TEXTS = {
    "a": "Did you go to the pottery workshop?",
    "b": "Yes! I made a bowl and a little mug.",
    "c": "It rained all afternoon.",
    "d": "We read novels by the fire instead.",
}


Shard = ShardService  # what `PlacedShardService` is, without Ray's start-up guard


def _create(name: str, rid: str | None = None) -> bytes:
    body = WorkspaceMemoryCreate(
        bot="b_ws", scope="user", content=TEXTS[name], requestId=rid or name
    )
    return _enc.encode(WorkspaceCreateCall(access=ANN, body=body))


async def _found(svc: Shard, q: str) -> list[str]:
    listing = await svc.workspace_entries(ANN, WorkspaceQuery(pools=("user:u_ann",), q=q))
    return [h.id for h in listing.fused]


def test_a_calls_creations_are_indexed_once_with_both_neighbours_in_its_one_commit(
    tmp_path: Path, monkeypatch
):
    put: list[str] = []
    plain_put = TermIndex.put

    def counted(self, entry_id, keys):
        put.append(entry_id)
        plain_put(self, entry_id, keys)

    monkeypatch.setattr(TermIndex, "put", counted)

    async def go():
        svc = Shard(tmp_path, 0, search={"context_window_s": 120})
        ids = iter(["mem_a", "mem_b", "mem_c", "mem_d"])
        svc.workspace.new_id = lambda: next(ids)
        await svc.workspace_create_memory_many(_enc.encode([_create("a")]))
        committer = svc.kernel.committer
        batches = committer.batches
        put.clear()
        # b, c, d in one call; a reused requestId between them is refused and takes no part.
        calls = [_create("b"), _create("c", "b"), _create("c"), _create("d")]
        replies = REPLIES.decode(await svc.workspace_create_memory_many(_enc.encode(calls)))
        assert isinstance(replies[1], CallError) and replies[1].code == "request_id_reused"
        assert [msgspec.json.decode(replies[i])["id"] for i in (0, 2, 3)] == [
            "mem_b",
            "mem_c",
            "mem_d",
        ]
        # Each record indexed once (a again, with b's words), all in the call's one batch.
        assert put == ["mem_a", "mem_b", "mem_c", "mem_d"]
        await committer.drain()
        assert committer.batches - batches == 1
        found = [await _found(svc, q) for q in ("bowl", "pottery workshop", "novels")]
        an = svc.kernel.analyzer("user:u_ann")
        keys = {k: an.key_list(t) for k, t in TEXTS.items()}
        await svc.close()
        return found, keys

    found, keys = asyncio.run(go())
    bowl, pottery, novels = found
    assert bowl[0] == "mem_b" and set(bowl) == {"mem_a", "mem_b", "mem_c", "mem_d"}
    assert pottery[0] == "mem_a" and "mem_b" in pottery and "mem_d" not in pottery
    assert novels == ["mem_d", "mem_c"]
    # What is stored is what was indexed: each record's own keys, each neighbour's, and those
    # of the second record before it (`in_context`).
    want = {
        "mem_a": in_context(keys["a"], None, keys["b"]).expanded(),
        "mem_b": in_context(keys["b"], keys["a"], keys["c"]).expanded(),
        "mem_c": in_context(keys["c"], keys["b"], keys["d"], keys["a"]).expanded(),
        "mem_d": in_context(keys["d"], keys["c"], None, keys["b"]).expanded(),
    }
    con = duckdb.connect(str(tmp_path / "shard-0.duckdb"), read_only=True)
    rows = con.execute("SELECT entry, terms, seq, tfs FROM search_terms").fetchall()
    con.close()
    stored = {e: unpack_row(t, n).tolist() for e, t, _, n in rows}
    assert stored == want
    assert len({seq for _, _, seq, _ in rows}) == 4  # each row its own seq (snapshots: term_store)
    # Each distinct key once with its count: a fraction of the bytes of every repeat.
    for e, t, _, n in rows:
        distinct = sorted(set(want[e]))
        assert np.frombuffer(t, dtype="<i8").tolist() == distinct
        assert np.frombuffer(n, dtype="<u2").tolist() == [want[e].count(k) for k in distinct]

    async def again() -> list[list[str]]:
        svc = Shard(tmp_path, 0, search={"context_window_s": 120})
        out = [await _found(svc, q) for q in ("bowl", "pottery workshop", "novels")]
        await svc.close()
        return out

    assert asyncio.run(again()) == found  # from the stored rows, as before the restart


def test_the_previous_records_context_row_goes_with_the_next_record_even_while_pending(
    tmp_path: Path,
):
    """One creation at a time: the previous record's row (with the new one's words) goes into
    the new record's batch, whether or not the previous record's commit is done: no batch of
    its own."""

    async def go():
        svc = Shard(tmp_path, 0, search={"context_window_s": 120})
        committer = svc.kernel.committer
        await svc.workspace_create_memory_many(_enc.encode([_create("a")]))
        batches = committer.batches
        await svc.workspace_create_memory_many(_enc.encode([_create("b")]))
        done_before = committer.batches - batches
        batches = committer.batches
        # c's commit still pending when d comes: d's batch carries c's row all the same.
        pending = asyncio.ensure_future(
            svc.workspace_create_memory_many(_enc.encode([_create("c")]))
        )
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        await svc.workspace_create_memory_many(_enc.encode([_create("d")]))
        await pending
        await committer.drain()
        found = await _found(svc, "rained")
        await svc.close()
        return done_before, committer.batches - batches, found

    done_before, batches, found = asyncio.run(go())
    assert done_before == 1
    assert batches == 2  # c's, and d's with c's context row
    assert found[0] != found[-1] and len(found) == 3  # c, and b and d by c's words


def test_when_the_previous_records_commit_fails_the_next_one_is_kept_without_it(
    tmp_path: Path, monkeypatch
):
    """c's commit fails while d, whose batch carries c's context row, is decided: d is
    acknowledged and kept, c is not, and the row naming c is skipped when the pool loads."""
    plain = GroupCommitter.append_record

    def append(self, batches):
        rows = [w for batch in batches for w in batch]
        # c's own rows (its context row, in d's batch, is a search_terms row)
        if any(w.table != "search_terms" and "mem_c" in repr(getattr(w, "row", "")) for w in rows):
            raise StorageError("disk full (simulated)")
        return plain(self, batches)

    monkeypatch.setattr(GroupCommitter, "append_record", append)

    async def go():
        svc = Shard(tmp_path, 0, search={"context_window_s": 120})
        ids = iter(["mem_a", "mem_b", "mem_c", "mem_d"])
        svc.workspace.new_id = lambda: next(ids)
        for name in "ab":
            await svc.workspace_create_memory_many(_enc.encode([_create(name)]))
        pending = asyncio.ensure_future(
            svc.workspace_create_memory_many(_enc.encode([_create("c")]))
        )
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        d = REPLIES.decode(await svc.workspace_create_memory_many(_enc.encode([_create("d")])))
        c = REPLIES.decode(await pending)
        await svc.close()
        again = Shard(tmp_path, 0, search={"context_window_s": 120})
        listing = await again.workspace_entries(ANN, WorkspaceQuery(pools=("user:u_ann",)))
        found = {q: await _found(again, q) for q in ("rained", "novels", "bowl")}
        await again.close()
        con = duckdb.connect(str(tmp_path / "shard-0.duckdb"), read_only=True)
        rows = sorted(e for (e,) in con.execute("SELECT entry FROM search_terms").fetchall())
        con.close()
        return c, d, sorted(e.id for e in listing.entries), found, rows

    c, d, ids, found, rows = asyncio.run(go())
    assert isinstance(c[0], CallError)
    assert msgspec.json.decode(d[0])["id"] == "mem_d"
    assert ids == ["mem_a", "mem_b", "mem_d"]
    assert "mem_c" in rows  # the context row d's batch carried, naming a record not stored
    # c's words: only where d was indexed with them (c was its neighbour when it was written)
    assert found["rained"] == ["mem_d"]
    assert found["novels"][0] == "mem_d"
    assert found["bowl"][0] == "mem_b"


def _normalize_as_first_written(text: str) -> str:
    """`normalize` as it was first written (the fingerprints stored since depend on it)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = "".join(c for c in text if not unicodedata.category(c).startswith("P"))
    return re.sub(r"\s+", " ", text).strip()


_ascii = st.text(st.characters(max_codepoint=127), max_size=80)
_any = st.text(max_size=80)
_mixed = st.lists(st.sampled_from([" ", "\t", "\x1c", "\u00a0", "\u3000", "!", "\u00bf", "A",
                                   "\uff21", "\u00c9", "\u017f", "\u00df", "-", "_", "$"]),
                  max_size=20).map("".join)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.one_of(_ascii, _any, _mixed))
def test_normalize_and_so_every_stored_fingerprint_are_unchanged_by_its_fast_path(text: str):
    assert normalize(text) == _normalize_as_first_written(text)
    assert content_fingerprint(text, b"k") == content_fingerprint(
        _normalize_as_first_written(text), b"k"
    )


@pytest.mark.parametrize("key_size", [0, 1, 32, 64, 65, 200])
def test_a_fingerprint_is_hmac_sha256_of_the_normalized_text(key_size: int):
    """Every stored fingerprint stays what `hmac` makes, whatever the key's length (longer
    than SHA-256's block: hashed first)."""
    key = bytes(range(key_size % 256)) * (key_size // 256) + bytes(range(key_size % 256))
    for text in ("", "Hello,  World!", "x" * 1000, "\u00dcn\u00efcode \uff21\uff22"):
        want = hmac.new(key, normalize(text).encode(), "sha256").hexdigest()
        assert content_fingerprint(text, key) == f"fp1:{want}"
        assert content_fingerprint(text, key) == f"fp1:{want}"  # (memoised key)


def test_a_bug_while_indexing_a_calls_creations_fails_them_all_and_stores_none(
    tmp_path: Path, monkeypatch
):
    """The call's records are indexed after they are decided: a failure there (a bug) fails
    each of its requests, stages nothing, and the pool reloads from the file without them."""
    plain_put = TermIndex.put

    def put(self, entry_id, keys):
        if entry_id.startswith("mem_bug"):
            raise RuntimeError("a bug")
        plain_put(self, entry_id, keys)

    monkeypatch.setattr(TermIndex, "put", put)

    async def go():
        svc = Shard(tmp_path, 0, search={"context_window_s": 120})
        ids = iter(["mem_a", "mem_bug_b", "mem_bug_c", "mem_d"])
        svc.workspace.new_id = lambda: next(ids)
        await svc.workspace_create_memory_many(_enc.encode([_create("a")]))
        failed = REPLIES.decode(
            await svc.workspace_create_memory_many(_enc.encode([_create("b"), _create("c")]))
        )
        later = REPLIES.decode(await svc.workspace_create_memory_many(_enc.encode([_create("d")])))
        listing = await svc.workspace_entries(ANN, WorkspaceQuery(pools=("user:u_ann",)))
        found = await _found(svc, "novels")
        await svc.close()
        return failed, later, sorted(e.id for e in listing.entries), found

    failed, later, ids, found = asyncio.run(go())
    assert [r.code for r in failed] == ["engine_error", "engine_error"]
    assert msgspec.json.decode(later[0])["id"] == "mem_d"
    assert ids == ["mem_a", "mem_d"] and found == ["mem_d"]
