"""Record documents sealed at rest (SEC-1).

Some tables keep a whole record as one JSON text column: the directory's orgs, users, bots
(names, rules, prompts), channels and chats; a shard's projects (names, metadata) and turns
(a delivery verdict's note). Their ids and keys stay in their own clear columns; the document
is sealed with a data key (AES-GCM, storage/crypto.py) and stored as text with a prefix, the
table and the record id as associated data, so a sealed document moved to another row does not
open. Rows written before sealing (plain JSON) still open: `open_doc` passes them through, and
their stores rewrite them sealed (see `is_sealed`).
"""

from __future__ import annotations

import base64

from engine.errors import StorageError
from storage.crypto import Cipher, aad

PREFIX = "sealed1:"


def doc_aad(scope: str, table: str, record_id: str) -> bytes:
    return aad(scope, f"doc\x00{table}\x00{record_id}")


def seal_doc(cipher: Cipher, scope: str, table: str, record_id: str, doc: bytes) -> str:
    blob = cipher.seal(doc, doc_aad(scope, table, record_id))
    return PREFIX + base64.b64encode(blob).decode()


def is_sealed(text: str) -> bool:
    return text.startswith(PREFIX)


def open_doc(cipher: Cipher | None, scope: str, table: str, record_id: str, text: str) -> bytes:
    """The JSON of a stored document; a legacy plain one as it is."""
    if not is_sealed(text):
        return text.encode()
    if cipher is None:
        raise StorageError(f"no key for the sealed {table} record {record_id}")
    blob = base64.b64decode(text[len(PREFIX) :])
    return cipher.open(blob, doc_aad(scope, table, record_id))
