"""Bounded waits on a condition, for tests: what a test waits for is a state it can check, and
the bound is generous (a loaded host is slow, not wrong); no test asserts how long it took."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

TIMEOUT = 60.0


async def until(cond: Callable[[], object], what: str = "", timeout: float = TIMEOUT) -> None:
    """Yields to the loop until `cond()` holds; fails after `timeout` s."""
    try:
        async with asyncio.timeout(timeout):
            while not cond():
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"never happened: {what or cond}") from None


async def settle(turns: int = 50) -> None:
    """Lets every task that is ready run, `turns` times over: before checking that something
    did not happen (a task still waiting), once all that could make it happen has run."""
    for _ in range(turns):
        await asyncio.sleep(0)


def wait_until(cond: Callable[[], object], what: str = "", timeout: float = TIMEOUT) -> None:
    """`until` for code outside an event loop (a server in another thread or process)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what or cond}")
        time.sleep(0.05)
