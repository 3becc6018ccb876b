"""Content fingerprints: what makes two wordings of a fact the same record, without its text.

Records are stored encrypted; beside them the store keeps `content_fingerprint(text, key)`, an
HMAC-SHA256 of the normalized text under the pool's secret key, so that equal facts (in case,
width, punctuation or spacing aside) are found equal and forgotten facts stay forgotten
(barriers), while nobody without the key can confirm a guessed fact by hashing it. The same key
must be used for a pool's records and barriers.
"""

from __future__ import annotations

import hmac
import unicodedata

_KEYS_MAX = 4_096
# key → an HMAC already keyed: copying it skips setting the key up again, which on every write
# cost more than hashing the text.
_keyed: dict[bytes, hmac.HMAC] = {}


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
        if len(_keyed) >= _KEYS_MAX:
            _keyed.clear()
        keyed = _keyed[key] = hmac.new(key, digestmod="sha256")
    mac = keyed.copy()
    mac.update(normalize(text).encode())
    return f"fp1:{mac.hexdigest()}"
