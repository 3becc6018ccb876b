"""Where a shard's lane listens (actors/runtime/lane.py) and whom it trusts: the temp dir its
socket's folder is made in, refused when another user could replace what is made there; the
uid at the other end of a connection (`SO_PEERCRED`); and the sweep of folders that killed
shards left behind."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any

PREFIX = "oblane-"  # a lane's folder in the temp dir: oblane-<pid of its shard>-<random>
PATH_MAX = 107  # a Unix socket's path, in bytes, without the final NUL (Linux: 108)
STALE_S = 60.0  # an old-style folder (no pid) without a listener older than this is removed


def lane_root() -> tuple[str | None, str]:
    """Where a shard makes its lane's folder: Ray's temp dir, else the system's, the first one
    no other user could swap the folder out of (`unsafe_root`); None and why when neither."""
    why = []
    for base in dict.fromkeys(b for b in (socket_root(), tempfile.gettempdir()) if b):
        unsafe = unsafe_root(base)
        if unsafe is None:
            return base, ""
        why.append(unsafe)
    return None, "; ".join(why)


def socket_root() -> str | None:
    """Ray's temporary directory where it is short enough for a socket path (a shard that dies
    without closing leaves its socket there, with Ray's own); else the system's."""
    root = os.environ.get("RAY_TMPDIR", "")
    return root if root and len(root) <= 80 and os.path.isdir(root) else None


PeerUid = Callable[[Any], int | None]


def peer_uid(sock: Any) -> int | None:
    """The uid of the process at the other end of a connected Unix socket; None where the
    system cannot say (no `SO_PEERCRED`): such a peer is not trusted."""
    option = getattr(socket, "SO_PEERCRED", None)
    if sock is None or option is None:
        return None
    creds = struct.Struct("3i")  # pid, uid, gid
    try:
        _, uid, _ = creds.unpack(sock.getsockopt(socket.SOL_SOCKET, option, creds.size))
    except OSError:
        return None
    return uid


def unsafe_root(base: str) -> str | None:
    """Why a lane's folder must not be made in `base`, or None: another user could replace
    what is made there when it belongs to someone else (not this user, not root) or may be
    written by group or others without the sticky bit."""
    try:
        st = os.stat(base)
    except OSError as e:
        return f"{base!r} cannot be examined ({e})"
    if st.st_uid not in (os.getuid(), 0):
        return f"{base!r} belongs to uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return f"{base!r} is writable by other users and not sticky"
    return None


def sweep(base: str) -> int:
    """Remove this user's lane folders in `base` that no shard will remove: their process is
    gone (killed, crashed: `close` never ran) and nobody listens on their socket. Folders are
    named by their shard's pid; one without a pid (older ones) goes when its socket refuses
    connections and it is older than STALE_S. Answers how many were removed."""
    removed = 0
    try:
        names = [n for n in os.listdir(base) if n.startswith(PREFIX)]
    except OSError:
        return 0
    uid = os.getuid()
    for name in names:
        folder = os.path.join(base, name)
        try:
            st = os.lstat(folder)
        except OSError:
            continue
        if st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
            continue
        pid = name[len(PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and "-" in name[len(PREFIX) :]:
            if int(pid) == os.getpid() or _alive(int(pid)):
                continue
        elif time.time() - st.st_mtime < STALE_S:
            continue
        if _listening(os.path.join(folder, "s")):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process of that pid: not ours to judge
    return True


def _listening(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        try:
            s.connect(path)
        except OSError:
            return False
        return True
