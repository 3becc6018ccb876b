"""Envelope encryption (docs/design.md §7, SEC-1).

A master key wraps one data key per pool; content is AES-GCM-256 under the pool's data key with
`pool` and the record id as associated data, so a ciphertext moved to another row or pool does not
decrypt. The master key comes from `OPENBOT_MASTER_KEY` (urlsafe base64 of 32 bytes), else from
the file named by `OPENBOT_MASTER_KEY_FILE` (best outside the data directory, so that a copy of
the data is not a copy of the key), else from `master.key` in the data directory; the file is
created with mode 0600 on first start.
"""

from __future__ import annotations

import base64
import os
import threading
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from engine.errors import InvalidInput, StorageError

KEY_FILE = "master.key"
_NONCE = 12
_RANDOM_BLOCK = 4096  # bytes of the OS's randomness read at once (`random_bytes`)


class _RandomBytes:
    """Bytes of the OS's CSPRNG, read a block at a time: every write seals several values
    (each a fresh nonce) and names a new record, and one `os.urandom` call (a system call)
    each cost more than the sealing. Each byte is handed out once, under a lock (sealing
    also runs on worker threads); a forked child drops what its parent read, so the two never
    hand out the same bytes (the same nonce under the same key would break AES-GCM)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._block = b""
        self._at = 0

    def __call__(self, n: int) -> bytes:
        with self._lock:
            at = self._at
            if at + n > len(self._block):
                self._block = os.urandom(max(_RANDOM_BLOCK, n))
                at = 0
            self._at = at + n
            return self._block[at : at + n]

    def drop(self) -> None:
        self._lock = threading.Lock()  # (a lock held by another thread at the fork stays held)
        self._block = b""
        self._at = 0


random_bytes = _RandomBytes()
os.register_at_fork(after_in_child=random_bytes.drop)


def _decode_key(text: str) -> bytes:
    try:
        key = base64.urlsafe_b64decode(text.strip().encode())
    except ValueError as e:
        raise InvalidInput("OPENBOT_MASTER_KEY is not base64", code="bad_master_key") from e
    if len(key) != 32:
        raise InvalidInput("the master key must be 32 bytes", code="bad_master_key")
    return key


def key_file(data_dir: Path) -> Path:
    """Where the master key file is: `OPENBOT_MASTER_KEY_FILE`, else `master.key` in `data_dir`."""
    named = os.environ.get("OPENBOT_MASTER_KEY_FILE")
    return Path(named) if named else Path(data_dir) / KEY_FILE


def has_master_key(data_dir: Path) -> bool:
    """Whether a master key is available without making one."""
    return bool(os.environ.get("OPENBOT_MASTER_KEY")) or key_file(data_dir).exists()


def require_key_for_sealed_data(data_dir: Path) -> None:
    """Refuse a data directory that holds encrypted stores but no key (a backup taken without
    `--with-key`): making a new key there would leave every entry unreadable."""
    data_dir = Path(data_dir)
    if not has_master_key(data_dir) and any(data_dir.glob("shard-*.duckdb")):
        raise StorageError(
            f"{data_dir} holds encrypted stores but no master key ({key_file(data_dir)} is "
            "missing): set OPENBOT_MASTER_KEY or OPENBOT_MASTER_KEY_FILE, or put the key file "
            "back",
            code="no_master_key",
        )


def write_key_copy(data_dir: Path, dest: Path) -> Path:
    """The master key in use, written to `dest` (new, mode 0600): a backup taken `--with-key`."""
    key = load_master_key(data_dir) if has_master_key(data_dir) else None
    if key is None:
        raise StorageError(f"no master key to copy ({key_file(data_dir)} is missing)")
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(base64.urlsafe_b64encode(key).decode())
    return dest


def load_master_key(data_dir: Path) -> bytes:
    """The master key from the environment, else from its file (created if absent)."""
    env = os.environ.get("OPENBOT_MASTER_KEY")
    if env:
        return _decode_key(env)
    path = key_file(data_dir)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = AESGCM.generate_key(bit_length=256)
        # O_EXCL: when two processes race on first start, one creates and both read the winner.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(base64.urlsafe_b64encode(key).decode())
    return _decode_key(path.read_text())


class Cipher:
    """AES-GCM with associated data; errors become StorageError."""

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)

    def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = random_bytes(_NONCE)
        return nonce + self._aead.encrypt(nonce, plaintext, aad)

    def open(self, blob: bytes, aad: bytes) -> bytes:
        try:
            return self._aead.decrypt(blob[:_NONCE], blob[_NONCE:], aad)
        except (InvalidTag, ValueError) as e:  # ValueError: too short to hold a nonce
            raise StorageError("a stored record failed its integrity check") from e

    def open_into(self, blob: bytes, aad: bytes, out: memoryview) -> None:
        """`open`, writing the plaintext into `out` (exactly its size): no copy of a large
        blob (a pool's vectors)."""
        view = memoryview(blob)
        try:
            self._aead.decrypt_into(view[:_NONCE], view[_NONCE:], aad, out)
        except (InvalidTag, ValueError) as e:
            raise StorageError("a stored record failed its integrity check") from e


class Keyring:
    """The master key and the per-pool data keys it wraps."""

    def __init__(self, master_key: bytes) -> None:
        self._master = Cipher(master_key)
        # Unwrapped keys by pool, with the wrapped form they came from: a cached key is used
        # only for that same stored key (a pool whose first key was never stored may get
        # another one later).
        self._pools: dict[str, tuple[bytes, Cipher]] = {}

    def new_pool_key(self, pool: str) -> tuple[Cipher, bytes]:
        """A fresh data key for `pool` and its wrapped form to store."""
        key = AESGCM.generate_key(bit_length=256)
        wrapped = self._master.seal(key, b"pool-key\x00" + pool.encode())
        cipher = Cipher(key)
        self._pools[pool] = (wrapped, cipher)
        return cipher, wrapped

    def forget(self, pool: str) -> None:
        """Drop `pool`'s unwrapped key (the pool left memory; its wrapped key is stored)."""
        self._pools.pop(pool, None)

    def unwrap_pool_key(self, pool: str, wrapped: bytes) -> Cipher:
        cached = self._pools.get(pool)
        if cached is not None and cached[0] == wrapped:
            return cached[1]
        cipher = Cipher(self._master.open(wrapped, b"pool-key\x00" + pool.encode()))
        self._pools[pool] = (bytes(wrapped), cipher)
        return cipher


def derive_key(master_key: bytes, purpose: str, scope: str) -> bytes:
    """A 32-byte secret for one purpose and one scope (a pool, an org), derived from the master
    key (HKDF-SHA256, both in `info`): nothing more to store or back up, and what one scope's
    secret makes says nothing of another's."""
    info = f"openbot\x00{purpose}\x00{scope}".encode()
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master_key)


def chain_fp_key(master_key: bytes, org: str) -> bytes:
    """An org's key for the message fingerprints of its collaboration chains."""
    return derive_key(master_key, "chain fingerprints", org)


def aad(pool: str, record: str) -> bytes:
    return f"{pool}\x00{record}".encode()
