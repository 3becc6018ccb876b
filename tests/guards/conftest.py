"""The guards run without a master key from the environment (their shards make their own); the
model stubs are tests/conftest.py's `stubs` and `fresh`."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch) -> None:
    monkeypatch.delenv("OPENBOT_MASTER_KEY", raising=False)
