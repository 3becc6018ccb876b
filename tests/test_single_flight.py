"""actors/shard/single_flight.py: one load per key for concurrent callers; failures are not kept."""

from __future__ import annotations

import asyncio

import pytest

from actors.shard.single_flight import SingleFlight


@pytest.mark.anyio
async def test_concurrent_callers_share_one_load_and_a_failure_is_retried() -> None:
    flight: SingleFlight[str] = SingleFlight()
    calls = 0
    gate = asyncio.Event()

    async def load() -> str:
        nonlocal calls
        calls += 1
        await gate.wait()
        if calls == 1:
            raise RuntimeError("disk hiccup")
        return "pool"

    first = [asyncio.ensure_future(flight.get("p", load)) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(*first, return_exceptions=True)
    assert calls == 1 and all(isinstance(r, RuntimeError) for r in results)
    assert await flight.get("p", load) == "pool" and calls == 2  # not cached as failed
    assert await flight.get("p", load) == "pool" and calls == 2  # cached once loaded
    assert flight.loaded == {"p": "pool"}
    with pytest.raises(KeyError):
        flight.loaded["q"]


@pytest.mark.anyio
async def test_a_cancelled_caller_does_not_fail_the_others_waiting_for_its_load() -> None:
    """The caller whose call started the load is cancelled (a timeout, a stopped request):
    the 24 others waiting for the same key still get the loaded value, from that one load."""

    flight: SingleFlight[str] = SingleFlight()
    calls = 0
    started, gate = asyncio.Event(), asyncio.Event()

    async def load() -> str:
        nonlocal calls
        calls += 1
        started.set()
        await gate.wait()
        return "pool"

    first = asyncio.ensure_future(flight.get("p", load))
    await started.wait()
    others = [asyncio.ensure_future(flight.get("p", load)) for _ in range(24)]
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.wait_for(asyncio.gather(*others, return_exceptions=True), 5)
    assert first.cancelled()
    assert results == ["pool"] * 24 and calls == 1
    assert flight.loaded == {"p": "pool"}
