"""`DirectoryPort` over the directory actor: every call of the port, derived from it
(actors/runtime/proxy.py)."""

from __future__ import annotations

from actors.ports import DirectoryPort
from actors.runtime.proxy import NamedActor


class RayDirectory(NamedActor, DirectoryPort):
    """`DirectoryPort` over the directory actor named `name`."""
