"""An account file tree on disk, written and read whole.

Files are written through a recovery log: `.transactions/<id>.json` lists what is about to be
written, each file is replaced atomically, then the log goes. A tree whose `.transactions/` is
not empty was interrupted, and reading it is refused, as is a symbolic link anywhere in it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import msgspec

from engine import file_tree as ft
from engine.errors import InvalidInput, NotFound

TRANSACTIONS = ".transactions"
_enc = msgspec.json.Encoder()


def write_tree(out_dir: Path, files: dict[str, bytes]) -> int:
    """Write the tree into `out_dir` (new or empty), each account through a recovery log."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise InvalidInput(f"{out_dir} is not empty", code="export_exists")
    by_account: dict[str, list[str]] = {}
    for path in files:
        parts = path.split("/")
        if len(parts) < 3 or parts[0] != ft.ROOT or ".." in parts or "" in parts:
            raise InvalidInput(f"{path} is not a tree path", code="invalid_tree")
        by_account.setdefault(parts[1], []).append(path)
    for account, paths in sorted(by_account.items()):
        root = out_dir / ft.ROOT / account
        (root / ".commands").mkdir(parents=True, exist_ok=True)
        (root / TRANSACTIONS).mkdir(exist_ok=True)
        log = root / TRANSACTIONS / f"{secrets.token_hex(8)}.json"
        _atomic(log, _enc.encode({"write": sorted(paths)}), sync=True)
        for path in sorted(paths):
            _atomic(out_dir / path, files[path])
        os.sync()  # every body on disk before the log goes (one sync, not one per file)
        log.unlink()
    return len(files)


def _atomic(path: Path, data: bytes, *, sync: bool = False) -> None:
    """Replace `path` with `data` in one step (a reader sees the old file or the new one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_tree(tree_dir: Path) -> dict[str, bytes]:
    """The files under `tree_dir/bot-workspace`; refuses an interrupted write and symlinks."""
    base = Path(tree_dir) / ft.ROOT
    if not base.is_dir():
        raise NotFound(f"{base} does not exist", code="no_tree")
    files: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(base):
        here = Path(dirpath)
        if here.name == TRANSACTIONS and here.parent.parent == base:
            if filenames or dirnames:
                raise InvalidInput(
                    f"{here} is not empty: writing this tree was interrupted; export again",
                    code="interrupted_tree",
                )
            continue
        for name in [*dirnames, *filenames]:
            if (here / name).is_symlink():
                raise InvalidInput(f"{here / name} is a symbolic link", code="invalid_tree")
        for name in filenames:
            rel = (here / name).relative_to(tree_dir).as_posix()
            files[rel] = (here / name).read_bytes()
    return files
