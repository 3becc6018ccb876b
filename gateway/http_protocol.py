"""uvicorn's httptools protocol with one keep-alive timer per connection, not one per request.

uvicorn arms a timer when a response completes (`call_later`) and cancels it when the next
request's bytes come: on a keep-alive connection under load, a timer handle is made, pushed on
the loop's heap and cancelled for every request, and the heap is swept of cancelled handles
every so often. Here a connection notes when it went idle and arms a timer only when none is
armed; when the timer fires it closes the connection if it has been idle since the moment the
timer was armed for, waits on to the later moment if the connection went idle again since, and
does nothing while a request is under way (that request's response arms it again). The
connection closes when uvicorn's would: `timeout_keep_alive` seconds after its last response,
if no byte came since.
"""

from __future__ import annotations

from asyncio import TimerHandle

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class KeepAliveHttpProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` with the keep-alive timer above (uvicorn's `http` option)."""

    _idle_since: float | None = None  # loop time of the last response, None once bytes came
    _idle_timer: TimerHandle | None = None

    def _unset_keepalive_if_required(self) -> None:
        # uvicorn calls this when bytes come (and as a response completes, and when the
        # connection is lost): not idle. The timer stays armed and finds it so if it fires.
        self._idle_since = None
        if self.timeout_keep_alive_task is not None:  # (never armed by this class)
            super()._unset_keepalive_if_required()

    def on_response_complete(self) -> None:
        # uvicorn's own (tests/test_http_protocol.py keeps it in step), but for the timer.
        self.server_state.total_requests += 1

        if self.transport.is_closing():
            return

        self._unset_keepalive_if_required()

        # Unpause data reads if needed.
        self.flow.resume_reading()

        # Unblock any pipelined events. If there are none, note the connection idle (and arm
        # the keep-alive timer if none is armed).
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_since = now = self.loop.time()
            if self._idle_timer is None:
                self._idle_timer = self.loop.call_at(now + self.timeout_keep_alive, self._idle)

    def _idle(self) -> None:
        timer, self._idle_timer = self._idle_timer, None
        since = self._idle_since
        if since is None:
            return  # a request is under way
        due = since + self.timeout_keep_alive
        if timer is not None and due > timer.when():
            self._idle_timer = self.loop.call_at(due, self._idle)  # idle again since
            return
        self.timeout_keep_alive_handler()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
