"""Process-wide figures for `GET /metrics`: counters and histograms kept by the code that does
the work (group commits, pool locks, model calls, learning jobs) in whatever process it runs.

A shard actor's figures live in its own process; the gateway asks each shard for `snapshot()`
(plain builtins, cheap to send) and renders them in the Prometheus format (gateway/metrics.py).
Recording is a dict update: no lock is needed (each process records on its event loop or under
the GIL) and nothing here does I/O.
"""

from __future__ import annotations

import bisect
from typing import Any

SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

Labels = tuple[tuple[str, str], ...]


class Stats:
    def __init__(self) -> None:
        self.counters: dict[tuple[str, Labels], float] = {}
        # name, labels → (bucket bounds, count per bucket (last: above all bounds), sum, count)
        self.histograms: dict[tuple[str, Labels], list[Any]] = {}
        self.help: dict[str, str] = {}

    def inc(self, name: str, amount: float = 1.0, /, help: str = "", **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        self.counters[key] = self.counters.get(key, 0.0) + amount
        if help:
            self.help.setdefault(name, help)

    def observe(
        self,
        name: str,
        value: float,
        /,
        buckets: tuple[float, ...] = SECONDS,
        help: str = "",
        **labels: str,
    ) -> None:
        _add(self._series((name, tuple(sorted(labels.items()))), buckets, help), value)

    def histogram(
        self, name: str, /, buckets: tuple[float, ...] = SECONDS, help: str = "", **labels: str
    ) -> Histogram:
        """One histogram series to observe often (a commit's, a lock's): its key is made once,
        not on every `observe`. It appears in `snapshot` once something was observed."""
        return Histogram(self, (name, tuple(sorted(labels.items()))), buckets, help)

    def _series(self, key: tuple[str, Labels], buckets: tuple[float, ...], help: str) -> list:
        h = self.histograms.get(key)
        if h is None:
            h = self.histograms[key] = [buckets, [0] * (len(buckets) + 1), 0.0, 0]
        if help:
            self.help.setdefault(key[0], help)
        return h

    def snapshot(self) -> dict[str, Any]:
        return {
            "counters": [[n, dict(lb), v] for (n, lb), v in self.counters.items()],
            "histograms": [
                [n, dict(lb), list(h[0]), list(h[1]), h[2], h[3]]
                for (n, lb), h in self.histograms.items()
            ],
            "help": dict(self.help),
        }


class Histogram:
    """A series of `Stats.histogram`."""

    __slots__ = ("_buckets", "_help", "_key", "_series", "_stats")

    def __init__(
        self, stats: Stats, key: tuple[str, Labels], buckets: tuple[float, ...], help: str
    ) -> None:
        self._stats, self._key, self._buckets, self._help = stats, key, buckets, help
        self._series: list | None = None

    def observe(self, value: float) -> None:
        h = self._series
        if h is None:
            h = self._series = self._stats._series(self._key, self._buckets, self._help)
        _add(h, value)


def _add(h: list, value: float) -> None:
    """Count `value` into a series: [buckets, counts per bucket, sum, count]."""
    h[1][bisect.bisect_left(h[0], value)] += 1
    h[2] += value
    h[3] += 1


STATS = Stats()
