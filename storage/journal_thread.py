"""The group committer's journal appends on a thread of their own (`GroupCommitter`'s
`sync_aside`): the event loop serves other calls while the disk syncs, and the flush loop,
which waits for each append in turn, is answered on its loop once the record is synced."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading


def resolve(fut: asyncio.Future, value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def _reject(fut: asyncio.Future, error: BaseException) -> None:
    if not fut.done():
        fut.set_exception(error)


class JournalThread:
    """One thread that runs the journal's appends in the order given, each answered on the
    caller's event loop: a queue and one thread-safe callback per append, without an
    executor's futures chained to the loop's (this hand-off is on every commit's path)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="journal", daemon=True)
        self._thread.start()

    def run(self, fn, arg) -> asyncio.Future[None]:
        """`fn(arg)` on the thread; the future (of the running loop) settles with its outcome."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._jobs.put((loop, fn, arg, fut))
        return fut

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, fn, arg, fut = job
            try:
                fn(arg)
            except BaseException as e:  # (raised to the caller, as an executor would)
                outcome = (_reject, fut, e)
            else:
                outcome = (resolve, fut, None)
            with contextlib.suppress(RuntimeError):  # (a closed loop: nobody waits any more)
                loop.call_soon_threadsafe(*outcome)

    def stop(self) -> None:
        """Run what was given, then end the thread (waits for it)."""
        self._jobs.put(None)
        self._thread.join()
