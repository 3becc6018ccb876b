"""Listening TCP sockets of a process tree, read from /proc (Linux): no dependency needed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    host: str
    port: int

    @property
    def loopback(self) -> bool:
        return self.host.startswith("127.") or self.host == "::1"


def tree(root: int) -> list[int]:
    """`root` and all its descendants (by /proc/<pid>/stat's parent field)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def _addr(hex_addr: str) -> tuple[str, int]:
    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ".".join(str(b) for b in reversed(raw))
    else:
        # /proc prints IPv6 as four little-endian 32-bit words.
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        full = b"".join(words)
        if full[:12] == b"\0" * 10 + b"\xff\xff":
            ip = ".".join(str(b) for b in full[12:])  # v4-mapped
        else:
            import ipaddress

            ip = str(ipaddress.IPv6Address(full))
    return ip, int(port, 16)


def _listening(pid: int) -> dict[int, tuple[str, int]]:
    """inode → (host, port) of every listening TCP socket in `pid`'s network namespace."""
    out = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] == LISTEN:
                out[int(cols[9])] = _addr(cols[1])
    return out


def listeners(root: int) -> list[Listener]:
    """Every listening TCP socket held open by `root` or a descendant of it."""
    found = []
    for pid in tree(root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        table = _listening(pid)
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inode = int(link[8:-1])
                if inode in table:
                    host, port = table[inode]
                    found.append(Listener(pid, name, host, port))
    return found
