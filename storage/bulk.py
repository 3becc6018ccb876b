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


def small_pages() -> None:
    """Large numpy arrays on ordinary pages, not transparent huge pages (process-wide).

    numpy asks the kernel for huge pages (`madvise(MADV_HUGEPAGE)`) for every array of 4 MB
    or more. Where huge pages are given only on request (`madvise`, as on our hosts) each
    fault of such an array may have the kernel compact memory to find 2 MB first: opening a
    pool's 40 MB of int8 vectors (storage/vector_store.py) took 200-380 ms of kernel time
    instead of 10-50 once the process had grown, in the first search after a shard opens.
    The same as `NUMPY_MADVISE_HUGEPAGE=0`; a no-op where numpy has no such switch."""
    try:
        from numpy._core.multiarray import _set_madvise_hugepage  # numpy 2
    except ImportError:  # pragma: no cover - numpy 1.26
        try:
            from numpy.core.multiarray import _set_madvise_hugepage
        except ImportError:
            return
    _set_madvise_hugepage(False)
