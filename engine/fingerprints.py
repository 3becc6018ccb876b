"""Content fingerprints: what makes two wordings of a fact the same record, without its text.

Records are stored encrypted; beside them the store keeps `content_fingerprint(text, key)`, an
HMAC-SHA256 of the normalized text under the pool's secret key, so that equal facts (in case,
width, punctuation or spacing aside) are found equal and forgotten facts stay forgotten
(barriers), while nobody without the key can confirm a guessed fact by hashing it. The same key
must be used for a pool's records and barriers.
"""

from __future__ import annotations

import hashlib
import unicodedata

_KEYS_MAX = 4_096
_BLOCK = 64  # SHA-256's block size, as HMAC pads the key to it
# key → its HMAC's inner and outer hashes, each already fed its padded key: copying them skips
# setting the key up again, which on every write cost more than hashing the text. (What
# `hmac.HMAC` computes, without its Python-level wrapper around each step.)
_keyed: dict[bytes, tuple[hashlib._Hash, hashlib._Hash]] = {}


def normalize(text: str) -> str:
    """Casefolded, compatibility-normalized (full-width forms), punctuation removed, whitespace
    collapsed. Rewording still changes it; that is what evidence barriers are for.

    (Every workspace write runs this: ASCII text, the common case, loses its punctuation as
    bytes, cheaper than `str.translate` with a table; and `split`/`join` splits on exactly the
    characters the regex `\\s` matches, cheaper than the regex.)"""
    text = unicodedata.normalize("NFKC", text).casefold()
    if text.isascii():
        text = text.encode().translate(None, _ASCII_PUNCTUATION).decode()
    else:
        text = text.translate(_PUNCTUATION)
    return " ".join(text.split())


class _Punctuation(dict):
    """A `str.translate` table that deletes Unicode punctuation (categories P*), filled in as
    characters are met: one C-level lookup per character instead of a Python call (this runs
    on every write)."""

    def __missing__(self, code: int) -> int | None:
        kept = None if unicodedata.category(chr(code)).startswith("P") else code
        self[code] = kept
        return kept


_PUNCTUATION = _Punctuation()
_ASCII_PUNCTUATION = bytes(c for c in range(128) if _PUNCTUATION[c] is None)


def content_fingerprint(text: str, key: bytes = b"") -> str:
    """A fingerprint of `normalize(text)`: HMAC-SHA256 under `key`."""
    keyed = _keyed.get(key)
    if keyed is None:
        keyed = _pads(key)
    inner = keyed[0].copy()
    inner.update(normalize(text).encode())
    outer = keyed[1].copy()
    outer.update(inner.digest())
    return "fp1:" + outer.hexdigest()


def _pads(key: bytes) -> tuple[hashlib._Hash, hashlib._Hash]:
    """HMAC-SHA256's inner and outer hashes keyed with `key` (RFC 2104), memoised."""
    if len(_keyed) >= _KEYS_MAX:
        _keyed.clear()
    padded = (hashlib.sha256(key).digest() if len(key) > _BLOCK else key).ljust(_BLOCK, b"\0")
    inner = hashlib.sha256(bytes(b ^ 0x36 for b in padded))
    outer = hashlib.sha256(bytes(b ^ 0x5C for b in padded))
    _keyed[key] = (inner, outer)
    return inner, outer
