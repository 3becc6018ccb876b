"""The guards' fixtures: two loopback OpenAI-compatible stubs (the bots' model and the memory
model), started once for the package and emptied before each test; no master key from the
environment."""

from __future__ import annotations

import pytest

from tests.conftest import LiveServer
from tests.openai_stub import OpenAIStub


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch) -> None:
    monkeypatch.delenv("OPENBOT_MASTER_KEY", raising=False)


@pytest.fixture(scope="package")
def stubs():
    bot, mem = OpenAIStub(), OpenAIStub()
    servers = [LiveServer(bot.app), LiveServer(mem.app)]
    bot.url, mem.url = servers[0].url + "/v1", servers[1].url + "/v1"
    yield bot, mem
    for s in servers:
        s.stop()


@pytest.fixture
def fresh(stubs):
    for s in stubs:
        s.queue.clear()
        s.requests.clear()
        s.routes.clear()
    return stubs
