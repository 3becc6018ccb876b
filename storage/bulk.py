"""Building many objects at once: the cyclic garbage collector paused meanwhile.

Loading a pool of 100,000 records makes several hundred thousand objects (decoded records, their
tuples, dict slots). Each 700 new objects start a young-generation collection, and the older
generations are walked again and again as they grow: about a fifth of a large pool's load time,
spent finding no garbage (none of these objects is in a reference cycle). `paused_gc` wraps such
a synchronous stretch; it never spans an await, so nothing else runs without the collector.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
