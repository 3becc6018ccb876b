"""A histogram series made once (`Stats.histogram`) records exactly what `Stats.observe` records
for the same name and labels, into the same series, and shows in the snapshot only once
something was observed (as `observe` alone would have it)."""

from __future__ import annotations

from storage.stats import SIZES, Stats


def _series(stats: Stats) -> dict[tuple[str, tuple], list]:
    return {
        (name, tuple(sorted(labels.items()))): [bounds, counts, total, count]
        for name, labels, bounds, counts, total, count in stats.snapshot()["histograms"]
    }


def test_a_series_is_listed_only_once_observed() -> None:
    stats = Stats()
    series = stats.histogram("x_seconds", help="x", mode="a")
    assert stats.snapshot() == {"counters": [], "histograms": [], "help": {}}
    series.observe(0.003)
    assert list(_series(stats)) == [("x_seconds", (("mode", "a"),))]
    assert stats.snapshot()["help"] == {"x_seconds": "x"}


def test_a_series_records_what_observe_records_into_the_same_series() -> None:
    made, plain = Stats(), Stats()
    series = made.histogram("n", buckets=SIZES, help="h", b="2", a="1")
    for v in (1, 3, 3, 700, 16):
        series.observe(v)
        plain.observe("n", v, buckets=SIZES, help="h", a="1", b="2")
    assert _series(made) == _series(plain)
    made.observe("n", 5, buckets=SIZES, a="1", b="2")  # the same series by either way
    assert _series(made)[("n", (("a", "1"), ("b", "2")))][3] == 6
