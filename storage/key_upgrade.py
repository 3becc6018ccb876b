"""Data a shard's file holds under the keys of an earlier format, brought to the current ones
when the file opens (shard_meta `keys`: the format reached; none: the first).

Format 2 differs from format 1 in three places:

- search terms (storage/term_store.py): hashed with each pool's own key (`pool_terms_key`)
  instead of one key for the whole shard. A hash cannot be turned back into its word, so each
  pool's records are opened and their words hashed under both keys: every stored key that is a
  word of the pool's text (current, or an earlier revision's) maps to that word's new key. A
  key of no such word (a record is indexed with its neighbours' words too, and a neighbour may
  have been forgotten since) becomes a keyed hash of the old key: it keeps its place in the
  record's length and term counts, and matches no query. Stored keyword snapshots are dropped
  (made again from the rows when next needed).
- vector blocks (storage/vector_store.py): sealed again with their list of records in the
  associated data.
- collaboration chains (engine/collaboration.py): each link's message fingerprints keyed with
  the org's key (`rekeyed`: no text needed).

All of it, and the new marker, is one transaction: a crash before it commits leaves format 1
whole, and the next open does it all again; once committed, it is never done again. It runs
after the commit journal is applied (storage/group_commit.py), so the journal's rows are in
the tables it rewrites.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Callable

import duckdb
import msgspec
import numpy as np

from engine import collaboration
from engine.errors import StorageError
from storage.crypto import Cipher, Keyring, aad, chain_fp_key
from storage.database import Database
from storage.term_keys import Analyzer, text_terms, unpack_row
from storage.term_store import pool_terms_key
from storage.vector_store import reseal_block
from storage.workspace_store import WorkspaceStore

log = logging.getLogger("openbot")

KEYS_FORMAT = "2"
_MARK = "keys"
_SEED = "seed:"  # the prefix of a bot memory pool's term rows (actors/shard/kernel.py `terms_pool`)


def legacy_terms_key(master_key: bytes) -> bytes:
    """The one term key of format 1, for every pool of a shard."""
    return hmac.new(master_key, b"openbot search terms", hashlib.sha256).digest()


def keys_format(db: Database) -> str:
    rows = db.query("SELECT value FROM shard_meta WHERE key = ?", [_MARK])
    return rows[0][0] if rows else "1"


def upgrade_keys(db: Database, master_key: bytes) -> bool:
    """Bring the file to the current key format (see the module's doc); whether it had to."""
    if keys_format(db) == KEYS_FORMAT:
        return False
    db.run_sync(lambda con: _upgrade(con, master_key))
    return True


def _upgrade(con: duckdb.DuckDBPyConnection, master_key: bytes) -> None:
    keyring = Keyring(master_key)
    wrapped = dict(con.execute("SELECT pool, wrapped_key FROM pools").fetchall())

    def cipher(pool: str) -> Cipher | None:
        key = wrapped.get(pool)
        return None if key is None else keyring.unwrap_pool_key(pool, key)

    con.begin()
    try:
        terms = _terms(con, master_key, cipher)
        blocks = _vector_blocks(con, cipher)
        chains = _chains(con, master_key)
        con.execute("DELETE FROM shard_meta WHERE key = ?", [_MARK])
        con.execute("INSERT INTO shard_meta VALUES (?, ?)", [_MARK, KEYS_FORMAT])
        con.commit()
    except BaseException:
        con.rollback()
        raise
    if terms or blocks or chains:
        log.info("keys upgraded: %d term rows, %d vector blocks, %d chains", terms, blocks, chains)


def _terms(
    con: duckdb.DuckDBPyConnection, master_key: bytes, cipher: Callable[[str], Cipher | None]
) -> int:
    old = Analyzer(legacy_terms_key(master_key))
    scopes: dict[str, list[str]] = {}  # key scope (pool id) -> its term-row pools
    for (row_pool,) in con.execute("SELECT DISTINCT pool FROM search_terms").fetchall():
        scope = row_pool[len(_SEED) :] if row_pool.startswith(_SEED) else row_pool
        scopes.setdefault(scope, []).append(row_pool)
    done = 0
    for scope, row_pools in scopes.items():
        new = Analyzer(pool_terms_key(master_key, scope))
        mapping = _vocabulary(con, scope, cipher(scope), old, new)
        for row_pool in row_pools:
            rows = con.execute(
                "SELECT key, pool, entry, fp, terms, seq, tfs FROM search_terms WHERE pool = ?",
                [row_pool],
            ).fetchall()
            out = []
            for key, pool, entry, fp, blob, seq, tfs in rows:
                keys = [
                    mapping[k] if k in mapping else _orphan(new, k)
                    for k in unpack_row(blob, tfs).tolist()
                ]
                keys.sort()
                packed = np.asarray(keys, dtype="<i8").tobytes()
                out.append((key, pool, entry, fp, packed, seq, None))
            con.execute("DELETE FROM search_terms WHERE pool = ?", [row_pool])
            if out:
                appender = con.appender("search_terms")
                appender.append_rows(out)
                appender.flush()
            done += len(out)
    con.execute("DELETE FROM search_snapshots")
    return done


def _vocabulary(
    con: duckdb.DuckDBPyConnection,
    pool: str,
    keyed: Cipher | None,
    old: Analyzer,
    new: Analyzer,
) -> dict[int, int]:
    """Old key -> new key of every word of the pool's text (its workspace records and their
    revisions, its learned entries: all indexed under the pool's one key)."""
    if keyed is None:
        return {}
    words: set[str] = set()
    for table, opener in (("ws_entries", _ws_text), ("memory_entries", _seed_text)):
        rows = con.execute(f"SELECT id, content FROM {table} WHERE pool = ?", [pool]).fetchall()
        for entry_id, sealed in rows:
            try:
                text = opener(keyed, pool, entry_id, sealed)
            except StorageError:
                continue  # does not open for a search either
            words.update(text_terms(text))
    # Earlier texts of edited records: a record indexed with a neighbour's words keeps the
    # words the neighbour had then.
    rows = con.execute(
        "SELECT entry, revision, body FROM ws_revisions WHERE pool = ?", [pool]
    ).fetchall()
    for entry_id, revision, body in rows:
        try:
            sides = WorkspaceStore.open_revision(keyed, pool, entry_id, revision, body)
        except StorageError:
            continue
        for text in sides:
            if text:
                words.update(text_terms(text))
    ordered = sorted(words)
    return dict(zip(old.term_keys(ordered), new.term_keys(ordered), strict=True))


def _ws_text(keyed: Cipher, pool: str, entry_id: str, sealed: bytes) -> str:
    return WorkspaceStore.open(keyed, pool, entry_id, sealed)


def _seed_text(keyed: Cipher, pool: str, entry_id: str, sealed: bytes) -> str:
    return keyed.open(sealed, aad(pool, entry_id)).decode()  # (storage/memory_store.py)


def _orphan(new: Analyzer, old_key: int) -> int:
    """A key of no current word, under the pool's key (`\\x00` is in no term)."""
    return new.term_keys([f"\x00format-1\x00{old_key}"])[0]


def _vector_blocks(con: duckdb.DuckDBPyConnection, cipher: Callable[[str], Cipher | None]) -> int:
    rows = con.execute(
        "SELECT key, pool, model, seq, entries, vecs FROM ws_vector_blocks"
    ).fetchall()
    done = 0
    for key, pool, model, seq, entries, vecs in rows:
        keyed = cipher(pool)
        if keyed is None:
            continue
        try:
            sealed = reseal_block(keyed, pool, model, seq, entries, vecs)
        except StorageError:
            # Damaged already: it fails to open as it did; its vectors are made again.
            log.warning("vector block %s of %s did not open; left as it is", seq, pool)
            continue
        con.execute("UPDATE ws_vector_blocks SET vecs = ? WHERE key = ?", [sealed, key])
        done += 1
    return done


def _chains(con: duckdb.DuckDBPyConnection, master_key: bytes) -> int:
    rows = con.execute("SELECT id, org, doc FROM chains").fetchall()
    done = 0
    for chain_id, org, doc in rows:
        record = msgspec.json.decode(doc)
        links = record.get("chain", {}).get("links", [])
        if not links:
            continue
        key = chain_fp_key(master_key, org)
        for link in links:
            for field in ("fingerprint", "result_fingerprint"):
                if link.get(field):
                    link[field] = collaboration.rekeyed(link[field], key)
        con.execute(
            "UPDATE chains SET doc = ? WHERE id = ?",
            [msgspec.json.encode(record).decode(), chain_id],
        )
        done += 1
    return done
