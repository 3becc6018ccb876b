"""What the commit-journal tests share: a small table and a crash's copy of the files."""

from __future__ import annotations

import shutil
from pathlib import Path

from storage.group_commit import Table

KV = Table("kv", (("k", "VARCHAR"), ("grp", "VARCHAR"), ("n", "BIGINT")))
KV_SQL = "CREATE TABLE kv (k VARCHAR, grp VARCHAR, n BIGINT)"


def journal_of(db_file: Path) -> Path:
    return Path(str(db_file) + ".journal")


def crash_copy(src: Path, dest: Path) -> None:
    """What a crash leaves: the files as they are now, their writer still open."""
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, dest / f.name)
