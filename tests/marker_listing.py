"""A pytest plugin for the suite's own tests (`-p tests.marker_listing --collect-only`): lists
each selected test with the markers tests/conftest.py gave it, so one collection answers what
several `-m` runs would."""

from __future__ import annotations

import pytest

_listed: list[str] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        names = sorted({mark.name for mark in item.iter_markers()})
        _listed.append(f"MARKERS {item.nodeid} {' '.join(names)}")


def pytest_terminal_summary(terminalreporter) -> None:
    for line in _listed:
        terminalreporter.write_line(line)
