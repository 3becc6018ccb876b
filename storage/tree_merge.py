"""An import into a running server (`POST /v1/admin/import`, `openbot import --url`): the
offline import (storage/file_import.py `import_snapshots`, with its `id_clash` rule and its
re-sealing) merges the tree into a copy of the server's consistent snapshot (`Engine.backup`,
with the key); what it changed there, table by table, is what the server's actors then store:
each shard's in one transaction of that shard, the directory's last (the commit point, as
offline: rows of ids the directory never got belong to nothing, and importing again deletes
them first: what the import deleted in the copy is deleted on the shards too). The copy has
the server's master key and shard count, so the rows are sealed and placed as the server
would have made them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine import file_tree as ft
from storage.data_dir_io import (
    DIRECTORY_FILE,
    IMPORTED_DIRECTORY_TABLES,
    IMPORTED_SHARD_TABLES,
    changed_rows,
    drain_journal,
)
from storage.file_import import ImportResult, import_snapshots

Rows = list[tuple[str, list[tuple]]]
Removed = list[tuple[str, str, tuple]]  # (table, key column, keys)


@dataclass
class Merged:
    result: ImportResult
    tokens: dict[str, str]  # the new users' tokens (user → token)
    shards: dict[int, tuple[Rows, Removed]]  # by shard index
    directory: Rows


def merge_rows(
    snapshots: Sequence[ft.AccountSnapshot],
    before: Path,
    after: Path,
    join_orgs: Sequence[str] = (),
) -> Merged:
    """Import `snapshots` into a copy (`after`) of the snapshot `before` (joining only the
    orgs `join_orgs` names), and what it added."""
    shard_files = sorted(before.glob("shard-*.duckdb"))
    for path in shard_files:
        drain_journal(path)  # so that the copy differs from it only by the import
    shutil.copytree(before, after)
    result = import_snapshots(snapshots, after, join_orgs=join_orgs)
    shards = {}
    for path in shard_files:
        added, removed = changed_rows(path, after / path.name, IMPORTED_SHARD_TABLES)
        if added or removed:
            shards[int(path.stem.removeprefix("shard-"))] = (added, removed)
    directory, _ = changed_rows(  # (an import deletes nothing there)
        before / DIRECTORY_FILE, after / DIRECTORY_FILE, IMPORTED_DIRECTORY_TABLES
    )
    # The import's own new file holds its new users' tokens, and only them; the caller hands
    # them out (the scratch copy, the file with it, is removed).
    tokens = json.loads(Path(result.tokens_file).read_text()) if result.tokens_file else {}
    return Merged(result=result, tokens=tokens, shards=shards, directory=directory)
