"""The schema of a shard's DuckDB file: versioned migrations, append only.

Never edit a migration that has shipped; add a new one. Tables have no primary-key constraints:
each shard has exactly one writer (its actor), which keys rows itself, and group commit replaces
rows by deleting and inserting in one transaction (see storage/group_commit.py).
"""

from __future__ import annotations

from storage.group_commit import Table

MIGRATIONS: tuple[str, ...] = (
    # 1: memory pools, entries, change log, idempotency receipts, chats' items and turns.
    """
    CREATE TABLE pools (
        pool VARCHAR, version BIGINT, wrapped_key BLOB, settings BLOB
    );
    CREATE TABLE memory_entries (
        key VARCHAR, pool VARCHAR, id VARCHAR, meta VARCHAR, content BLOB
    );
    -- (no index on pool: ART maintenance at commit cost more than the load-time scan saves)
    CREATE TABLE memory_log (
        key VARCHAR, pool VARCHAR, version BIGINT, at_ms BIGINT, entry_key VARCHAR,
        entry VARCHAR, payload BLOB
    );

    CREATE TABLE receipts (
        key VARCHAR, scope VARCHAR, request_id VARCHAR, fingerprint VARCHAR,
        response BLOB, at_ms BIGINT
    );
    CREATE TABLE chat_items (
        key VARCHAR, chat VARCHAR, seq BIGINT, turn VARCHAR, kind VARCHAR, author VARCHAR,
        payload BLOB, at_ms BIGINT
    );
    CREATE INDEX chat_items_chat ON chat_items (chat);
    CREATE TABLE turns (
        id VARCHAR, chat VARCHAR, operator VARCHAR, status VARCHAR, meta VARCHAR, at_ms BIGINT
    );
    """,
    # 2: the durable event log and the shard's epoch.
    """
    CREATE TABLE events (seq BIGINT, at_ms BIGINT, type VARCHAR, doc VARCHAR);
    CREATE TABLE shard_meta (key VARCHAR, value VARCHAR);
    """,
    # 3: the memory bot: confessions, enrichments, learning jobs, read positions, the encrypted
    # model call log and confirmed spend. (chat_items and turns come from migration 1.)
    """
    CREATE TABLE confessions (key VARCHAR, chat VARCHAR, turn VARCHAR, at_ms BIGINT, payload BLOB);
    CREATE TABLE enrichments (key VARCHAR, chat VARCHAR, turn VARCHAR, at_ms BIGINT, payload BLOB);
    CREATE TABLE learning_jobs (id VARCHAR, pool VARCHAR, chat VARCHAR, doc VARCHAR);
    CREATE TABLE learn_positions (key VARCHAR, pool VARCHAR, chat VARCHAR, seq BIGINT);
    CREATE TABLE model_calls (key VARCHAR, job VARCHAR, at_ms BIGINT, payload BLOB);
    CREATE TABLE model_spend (key VARCHAR, pool VARCHAR, period VARCHAR, micros BIGINT,
                              unknown BIGINT);
    """,
    # 4: collaboration chains (their structure; request and result texts are sealed).
    """
    CREATE TABLE chains (id VARCHAR, org VARCHAR, doc VARCHAR, texts BLOB);
    """,
    # 5: workspace: projects, scoped memory records (content sealed with the pool's
    # data key), their revisions (before/after sealed) and forget barriers. Receipts as in 1.
    """
    CREATE TABLE projects (id VARCHAR, owner VARCHAR, doc VARCHAR);
    CREATE TABLE ws_entries (key VARCHAR, pool VARCHAR, id VARCHAR, meta VARCHAR, content BLOB);
    CREATE TABLE ws_revisions (
        key VARCHAR, pool VARCHAR, entry VARCHAR, revision BIGINT, at_ms BIGINT,
        operator VARCHAR, change VARCHAR, body BLOB
    );
    CREATE TABLE ws_barriers (key VARCHAR, pool VARCHAR, entry VARCHAR, at_ms BIGINT, doc VARCHAR);
    """,
    # 6: semantic search (SC-7): one vector per workspace record, float32 sealed with the pool's
    # data key (an embedding can be inverted to much of its text), with the embedding model's
    # ident and the content fingerprint it was computed from (a mismatch means recompute).
    """
    CREATE TABLE ws_vectors (
        key VARCHAR, pool VARCHAR, entry VARCHAR, model VARCHAR, fp VARCHAR, vec BLOB
    );
    """,
    # 7: one memory per bot (MEM-1, engine/memory_union.py): workspace bot-scope records join the
    # bot's memory under its visibility rule. Records stored before get their system tags
    # `from:<first revision's operator>` and `for:bot`; `org:` (the bot's home org, kept in the
    # directory's file) is added when the shard loads the pool.
    """
    UPDATE ws_entries SET meta = json_merge_patch(meta, json_object('tags',
        CASE WHEN r.operator IS NULL THEN json_array('for:bot')
             ELSE json_array('from:' || r.operator, 'for:bot') END))::VARCHAR
    FROM (
        SELECT e.key AS k,
               (SELECT min(v.operator) FROM ws_revisions v
                WHERE v.pool = e.pool AND v.entry = e.id AND v.revision = 1) AS operator
        FROM ws_entries e
    ) r
    WHERE ws_entries.key = r.k AND ws_entries.pool LIKE 'bot:%'
      AND json_extract(ws_entries.meta, '$.tags') IS NULL;
    """,
    # 8: keyword search: each record's search terms as sorted keyed 64-bit hashes
    # (no word in the clear, SEC-1), with the content fingerprint they were made from, so a
    # pool's keyword index loads without decrypting and tokenizing every record. And vectors in
    # blocks, one per embedding batch (a matrix sealed as one): a pool's vectors load in bulk.
    """
    CREATE TABLE search_terms (key VARCHAR, pool VARCHAR, entry VARCHAR, fp VARCHAR, terms BLOB);
    CREATE TABLE ws_vector_blocks (
        key VARCHAR, pool VARCHAR, model VARCHAR, seq BIGINT, entries VARCHAR, vecs BLOB
    );
    """,
    # 9: which chat items are bot-to-bot communication and in which direction (UI-1),
    # and requests (approvals) with their proposal sealed with the bot's pool key (ENR-3).
    """
    CREATE TABLE communications (
        key VARCHAR, chat VARCHAR, seq BIGINT, direction VARCHAR, peer VARCHAR
    );
    CREATE TABLE requests (id VARCHAR, bot VARCHAR, doc VARCHAR, proposal BLOB);
    """,
    # 10: a workspace pool's keyword index kept whole (postings of keyed term hashes,
    # sealed with the pool's key), and each term row's place in its pool's order of writes, so
    # a load restores the snapshot and applies only the rows written since (storage/term_store).
    """
    ALTER TABLE search_terms ADD COLUMN seq BIGINT DEFAULT 0;
    CREATE TABLE search_snapshots (pool VARCHAR, covers BIGINT, body BLOB);
    """,
    # 11: user and project facts a learning step decided, staged (sealed with the bot's pool
    # key) in the commit that moves the chat's read position, until their pools stored them.
    """
    CREATE TABLE learn_outbox (job VARCHAR, pool VARCHAR, at_ms BIGINT, payload BLOB);
    """,
    # 12: collaboration chains read without loading them all (actors/chats/chain_rows.py): what
    # a listing filters and sorts on, and whether a restart has work for the chain (`live`).
    # Rows stored before count as live when running or still listing waiting work; the next
    # write of each sets it exactly.
    """
    ALTER TABLE chains ADD COLUMN status VARCHAR;
    ALTER TABLE chains ADD COLUMN owner VARCHAR;
    ALTER TABLE chains ADD COLUMN channel VARCHAR;
    ALTER TABLE chains ADD COLUMN topic VARCHAR;
    ALTER TABLE chains ADD COLUMN created_at BIGINT;
    ALTER TABLE chains ADD COLUMN live BOOLEAN;
    UPDATE chains SET
        status = json_extract_string(doc, '$.chain.status'),
        owner = json_extract_string(doc, '$.chain.owner'),
        channel = json_extract_string(doc, '$.channel'),
        topic = json_extract_string(doc, '$.chain.topic'),
        created_at = CAST(json_extract(doc, '$.chain.created_at') AS BIGINT),
        live = json_extract_string(doc, '$.chain.status') = 'running'
            OR coalesce(json_array_length(json_extract(doc, '$.learn')), 0) > 0
            OR coalesce(json_array_length(json_extract(doc, '$.unregistered')), 0) > 0;
    """,
    # 13: a term row of a record indexed among its neighbours stores each distinct key once
    # with its count (`tfs`: uint16 little-endian, one per key of `terms`) instead of every
    # repeat; NULL: `terms` holds the repeats (each key's count is how often it occurs).
    """
    ALTER TABLE search_terms ADD COLUMN tfs BLOB;
    """,
    # 14: a receipt's sealed answer (hundreds of random bytes) stored uncompressed: DuckDB's
    # string compression finds nothing to gain in random bytes, and every checkpoint paid for
    # trying. The same rows; the table is made again, as no ALTER sets a column's compression.
    """
    CREATE TABLE receipts_14 (
        key VARCHAR, scope VARCHAR, request_id VARCHAR, fingerprint VARCHAR,
        response BLOB USING COMPRESSION uncompressed, at_ms BIGINT
    );
    INSERT INTO receipts_14
        SELECT key, scope, request_id, fingerprint, response, at_ms FROM receipts;
    DROP TABLE receipts;
    ALTER TABLE receipts_14 RENAME TO receipts;
    """,
)

POOLS = Table(
    "pools",
    (("pool", "VARCHAR"), ("version", "BIGINT"), ("wrapped_key", "BLOB"), ("settings", "BLOB")),
)
MEMORY_ENTRIES = Table(
    "memory_entries",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("id", "VARCHAR"),
        ("meta", "VARCHAR"),
        ("content", "BLOB"),
    ),
)
MEMORY_LOG = Table(
    "memory_log",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("version", "BIGINT"),
        ("at_ms", "BIGINT"),
        ("entry_key", "VARCHAR"),
        ("entry", "VARCHAR"),
        ("payload", "BLOB"),
    ),
)
RECEIPTS = Table(
    "receipts",
    (
        ("key", "VARCHAR"),
        ("scope", "VARCHAR"),
        ("request_id", "VARCHAR"),
        ("fingerprint", "VARCHAR"),
        ("response", "BLOB"),
        ("at_ms", "BIGINT"),
    ),
)
EVENTS = Table(
    "events",
    (("seq", "BIGINT"), ("at_ms", "BIGINT"), ("type", "VARCHAR"), ("doc", "VARCHAR")),
)
CHAT_ITEMS = Table(
    "chat_items",
    (
        ("key", "VARCHAR"),
        ("chat", "VARCHAR"),
        ("seq", "BIGINT"),
        ("turn", "VARCHAR"),
        ("kind", "VARCHAR"),
        ("author", "VARCHAR"),
        ("payload", "BLOB"),
        ("at_ms", "BIGINT"),
    ),
)
TURNS = Table(
    "turns",
    (
        ("id", "VARCHAR"),
        ("chat", "VARCHAR"),
        ("operator", "VARCHAR"),
        ("status", "VARCHAR"),
        ("meta", "VARCHAR"),
        ("at_ms", "BIGINT"),
    ),
)
_RECORD = (
    ("key", "VARCHAR"),
    ("chat", "VARCHAR"),
    ("turn", "VARCHAR"),
    ("at_ms", "BIGINT"),
    ("payload", "BLOB"),
)
CONFESSIONS = Table("confessions", _RECORD)
ENRICHMENTS = Table("enrichments", _RECORD)
LEARNING_JOBS = Table(
    "learning_jobs",
    (("id", "VARCHAR"), ("pool", "VARCHAR"), ("chat", "VARCHAR"), ("doc", "VARCHAR")),
)
LEARN_POSITIONS = Table(
    "learn_positions",
    (("key", "VARCHAR"), ("pool", "VARCHAR"), ("chat", "VARCHAR"), ("seq", "BIGINT")),
)
MODEL_CALLS = Table(
    "model_calls",
    (("key", "VARCHAR"), ("job", "VARCHAR"), ("at_ms", "BIGINT"), ("payload", "BLOB")),
)
MODEL_SPEND = Table(
    "model_spend",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("period", "VARCHAR"),
        ("micros", "BIGINT"),
        ("unknown", "BIGINT"),
    ),
)
CHAINS = Table(
    "chains",
    (
        ("id", "VARCHAR"),
        ("org", "VARCHAR"),
        ("doc", "VARCHAR"),
        ("texts", "BLOB"),
        ("status", "VARCHAR"),
        ("owner", "VARCHAR"),
        ("channel", "VARCHAR"),
        ("topic", "VARCHAR"),
        ("created_at", "BIGINT"),
        ("live", "BOOLEAN"),
    ),
)
TABLES = (
    POOLS,
    MEMORY_ENTRIES,
    MEMORY_LOG,
    RECEIPTS,
    EVENTS,
    CHAT_ITEMS,
    TURNS,
    CONFESSIONS,
    ENRICHMENTS,
    LEARNING_JOBS,
    LEARN_POSITIONS,
    MODEL_CALLS,
    MODEL_SPEND,
    CHAINS,
)

# --- workspace (migration 5) ---
PROJECTS = Table("projects", (("id", "VARCHAR"), ("owner", "VARCHAR"), ("doc", "VARCHAR")))
WORKSPACE_ENTRIES = Table(
    "ws_entries",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("id", "VARCHAR"),
        ("meta", "VARCHAR"),
        ("content", "BLOB"),
    ),
)
WORKSPACE_REVISIONS = Table(
    "ws_revisions",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("entry", "VARCHAR"),
        ("revision", "BIGINT"),
        ("at_ms", "BIGINT"),
        ("operator", "VARCHAR"),
        ("change", "VARCHAR"),
        ("body", "BLOB"),
    ),
)
WORKSPACE_BARRIERS = Table(
    "ws_barriers",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("entry", "VARCHAR"),
        ("at_ms", "BIGINT"),
        ("doc", "VARCHAR"),
    ),
)
TABLES = (*TABLES, PROJECTS, WORKSPACE_ENTRIES, WORKSPACE_REVISIONS, WORKSPACE_BARRIERS)

# --- semantic search (SC-7, migration 6) ---
WORKSPACE_VECTORS = Table(
    "ws_vectors",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("entry", "VARCHAR"),
        ("model", "VARCHAR"),
        ("fp", "VARCHAR"),
        ("vec", "BLOB"),
    ),
)
TABLES = (*TABLES, WORKSPACE_VECTORS)

# --- keyword search (migration 8) ---
SEARCH_TERMS = Table(
    "search_terms",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("entry", "VARCHAR"),
        ("fp", "VARCHAR"),
        ("terms", "BLOB"),
        ("seq", "BIGINT"),  # migration 10
        ("tfs", "BLOB"),  # migration 13
    ),
)
SEARCH_SNAPSHOTS = Table(
    "search_snapshots", (("pool", "VARCHAR"), ("covers", "BIGINT"), ("body", "BLOB"))
)
TABLES = (*TABLES, SEARCH_TERMS, SEARCH_SNAPSHOTS)
WORKSPACE_VECTOR_BLOCKS = Table(
    "ws_vector_blocks",
    (
        ("key", "VARCHAR"),
        ("pool", "VARCHAR"),
        ("model", "VARCHAR"),
        ("seq", "BIGINT"),
        ("entries", "VARCHAR"),
        ("vecs", "BLOB"),
    ),
)
TABLES = (*TABLES, WORKSPACE_VECTOR_BLOCKS)
# --- communication records and requests (migration 9) ---
COMMUNICATIONS = Table(
    "communications",
    (
        ("key", "VARCHAR"),
        ("chat", "VARCHAR"),
        ("seq", "BIGINT"),
        ("direction", "VARCHAR"),
        ("peer", "VARCHAR"),
    ),
)
REQUESTS = Table(
    "requests", (("id", "VARCHAR"), ("bot", "VARCHAR"), ("doc", "VARCHAR"), ("proposal", "BLOB"))
)
TABLES = (*TABLES, COMMUNICATIONS, REQUESTS)

# --- staged learned facts (migration 11) ---
LEARN_OUTBOX = Table(
    "learn_outbox",
    (("job", "VARCHAR"), ("pool", "VARCHAR"), ("at_ms", "BIGINT"), ("payload", "BLOB")),
)
TABLES = (*TABLES, LEARN_OUTBOX)
