"""Server-Sent Events: framing, and answering one call as an event stream.

Owns the wire form of an event (one single-line JSON per `data:`), keep-alive comments, and
`CallStream`: the answer to one call that may emit notifications before its result (in a 2025 session, with
event ids, what a dropped connection did not get kept for a reconnection, and with `sse_poll_after` the connection
ended on purpose for the client to poll: resumable.py). A call
that finishes before it emits anything, or before the first keep-alive is due, is answered
with the whole stream in one body (one write, with a length), or as plain JSON when its
caller gives a way to make that (a client that accepts JSON); only a call that has something
to say early, or runs long, holds a chunked stream open. Does not own which calls get SSE
(mcp_http.py, modern.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from gatewayd import resumable
from gatewayd.deadlines import Deadline, Deadlines
from gatewayd.resumable import Replay, Replays
from gatewayd.web import aiohttp_hooks, bodies

logger = logging.getLogger(__name__)

# Events a slow reader may fall behind by before further notifications are dropped (the result never is).
QUEUE_LIMIT = 1024
EVENT_STREAM = "text/event-stream"
# What keeps a proxy from holding events back.
_UNBUFFERED = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
HEADERS = {"Content-Type": EVENT_STREAM, **_UNBUFFERED}
KEEPALIVE = b": keep-alive\n\n"


def whole(message: dict[str, Any], headers: dict[str, str]) -> web.StreamResponse:
    """A stream of one event, sent as one body with a length: an answer that is ready at once."""
    return bodies.response(bodies.sse_body(message), content_type=EVENT_STREAM, headers={**_UNBUFFERED, **headers})


def abort(request: web.BaseRequest) -> None:
    """Close the connection of `request` at once, unsent bytes dropped (a write waiting on it ends): a reconnection
    took over the stream it carried (resumable.py)."""
    transport = request.transport
    if transport is not None:
        transport.abort()


class CallStream:
    """The SSE answer to one call. Give `emit` to the call as its event sink, then `answer` with the call; what the
    client did not get (a stream closed early, notifications dropped) is logged under `client` at the end."""

    # A session's streams kept for resumption (resumable.py): an open stream gets ids, and what it cannot deliver is
    # kept. None: a stream without ids (no session, or the 2026-07-28 era).
    _replays: Replays | None = None
    _replay: Replay | None = None
    # With ids: the connection is ended this long after the stream opened, for the client to come back for the rest
    # (SEP-1699 polling); 0: never. The timer, whether it is due, whether it ended the connection.
    _poll_after = 0.0
    _poll: Deadline | None = None
    _poll_due = False
    _polled = False

    def __init__(self, request: web.Request, headers: dict[str, str], keepalive: float, deadlines: Deadlines, *,
                 client: str, replays: Replays | None = None, poll_after: float = 0.0) -> None:
        self._request = request
        self._client = client
        if replays is not None:
            # Set only for a session's stream (the class defaults stand for the rest: this is on every call's path).
            self._replays = replays
            self._poll_after = poll_after
        # The caller's own headers; the SSE ones are added only when the answer is SSE (most calls end unopened,
        # and a client that takes JSON then gets JSON: mcp_http.py).
        self._headers = headers
        self._keepalive = keepalive
        # Encoded events waiting for the pump.
        self._events: collections.deque[bytes] = collections.deque()
        self._deadlines = deadlines
        # What the open stream's pump waits on while it has nothing to write: set by `emit` and `finish` (False),
        # or by the keep-alive's deadline (True). A future and a coarse deadline per wait, not an Event and a loop
        # timer: a streaming call waits once per notification.
        self._waiter: asyncio.Future[bool] | None = None
        self._response: web.StreamResponse | None = None
        self._pump: asyncio.Task[None] | None = None
        self._timer = deadlines.call_later(keepalive, self._open)
        self._finished = False
        # An event was written past the pump (`emit`) since it began to wait: its keep-alive is not due.
        self._spoke = False
        self.broken = False
        self.dropped = 0  # past QUEUE_LIMIT, for a reader that fell behind
        self.unsendable = 0  # holding what JSON cannot carry on (a lone surrogate a child escaped as `\ud800`)

    def emit(self, message: dict[str, Any]) -> None:
        """Send a notification of the call: written at once on an open stream whose pump waits with nothing queued
        and whose client keeps up (no loop turn for the pump), else queued for the pump, opening the stream if it is
        not open yet."""
        if self.broken and self._replay is None:
            return
        if len(self._events) >= QUEUE_LIMIT:
            self.dropped += 1
            return
        try:
            event = bodies.event(message)
        except ValueError:  # UnicodeEncodeError among them: dropped whole rather than sent broken; the call goes on
            self.unsendable += 1
            return
        if self._replays is not None:
            event = (self._replay or self._resumable()).framed(event)
        if self.broken:
            return  # kept for the client's reconnection
        waiter, response = self._waiter, self._response
        if waiter is not None and not waiter.done() and not self._events and response is not None:
            try:
                if aiohttp_hooks.write_now(response, event):
                    self._spoke = True
                    return
            except ConnectionError:
                self._broke()
                return
        self._events.append(event)
        self._open()
        self._wake(False)

    def _broke(self) -> None:
        """The connection dropped: the call goes on, what it says kept for a reconnection if the stream has ids."""
        self.broken = True
        if self._replay is not None:
            self._replay.detach()
            self._replay.let_go(self._let_go)  # nothing left to let go of

    def _open(self) -> None:
        if self._pump is None and not self._finished:
            self._pump = asyncio.ensure_future(self._run())

    def _resumable(self) -> Replay:
        """The stream's replay, made when it first has something to say (most calls never open a stream)."""
        if self._replay is None:
            assert self._replays is not None
            self._replay = self._replays.open()
            self._replay.cut = self._let_go
        return self._replay

    def _let_go(self) -> None:
        """A reconnection took the stream over: the client lost this connection, though it may not look closed (a
        network gone without a word). It is closed at once (a write waiting on it ends), and what the call says from
        here goes to the reconnection (what was queued is in the replay already)."""
        self._broke()
        self._events.clear()
        abort(self._request)
        self._wake(False)

    def _wake(self, idle: bool) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(idle)

    async def _run(self) -> None:
        """Owns the open stream: headers, queued events (those queued together in one write), keep-alives, until
        `finish`. While it waits with nothing queued, `emit` writes past it."""
        response = self._response = web.StreamResponse(headers={**HEADERS, **self._headers})
        loop = asyncio.get_running_loop()
        try:
            await response.prepare(self._request)
            if self._replays is not None:
                # Its id and `retry` first: a client that loses the connection from here on can reconnect.
                await response.write(self._resumable().priming())
                if self._poll_after:
                    self._poll = self._deadlines.call_later(self._poll_after, self._end_connection)
            while not self.broken:
                if self._poll_due and not self._finished:
                    await self._end_for_poll(response)
                    return
                if self._events:
                    events = self._events
                    self._events = collections.deque()
                    await response.write(b"".join(events))
                    continue
                if self._finished:
                    return
                waiter = self._waiter = loop.create_future()
                keepalive = self._deadlines.call_later(self._keepalive, self._wake, True)
                try:
                    idle = await waiter
                finally:
                    keepalive.cancel()
                    self._waiter = None
                if idle and not self._spoke:
                    await response.write(KEEPALIVE)
                self._spoke = False
        except ConnectionError:
            # A dropped stream is not a cancellation (MCP 2025): the call goes on, its answer has nowhere to go.
            self._broke()

    async def answer(self, call: Awaitable[dict[str, Any]],
                     plain: Callable[[dict[str, Any]], web.StreamResponse] | None = None) -> web.StreamResponse:
        """The answer to `call` (its response, once it comes): at the end of the stream, or made by `plain` (plain
        JSON, for a client that takes it) when nothing opened the stream first. A call that fails or is cancelled
        stops the stream without a response."""
        try:
            try:
                message = await call
            except BaseException:
                await self._abandon()
                raise
            if plain is not None and self._pump is None:
                self._stop()
                return plain(message)
            return await self._finish(message)
        finally:
            if self.broken or self.dropped or self.unsendable:
                self._log_losses()

    def _log_losses(self) -> None:
        """Say what the client was not sent."""
        if self._polled:
            assert self._replay is not None
            logger.debug("client=%s stream %s ended its connection after %gs for the client to poll", self._client,
                         self._replay.id, self._poll_after)
        elif self.broken and self._replay is not None:
            logger.info("client=%s SSE stream closed before the answer: kept %gs for a reconnection (stream %s)",
                        self._client, resumable.KEEP_S, self._replay.id)
        elif self.broken:
            logger.info("client=%s SSE stream closed before the answer", self._client)
        if self.dropped:
            logger.warning("client=%s slow SSE reader: %d notifications dropped", self._client, self.dropped)
        if self.unsendable:
            logger.warning("client=%s %d notifications not sent: not encodable as JSON text (a lone surrogate)",
                           self._client, self.unsendable)

    def _stop(self) -> None:
        self._finished = True
        self._timer.cancel()
        if self._poll is not None:
            self._poll.cancel()

    def _end_connection(self) -> None:
        """SEP-1699 polling is due: the pump ends the response and its connection (below)."""
        self._poll_due = True
        self._wake(False)

    async def _end_for_poll(self, response: web.StreamResponse) -> None:
        """End the response whole, then its connection (which the client must not use again while the call still
        holds it): the call runs on, what it says from here is kept, and the client reconnects for it with
        Last-Event-ID (resumable.py; what was queued is in the replay already)."""
        self._polled = True
        self._broke()
        self._events.clear()
        await response.write_eof()
        transport = self._request.transport
        if transport is not None:
            transport.close()

    async def _finish(self, message: dict[str, Any]) -> web.StreamResponse:
        """End the stream with the call's response."""
        self._stop()
        if self._pump is None:
            return whole(message, self._headers)  # nothing was streamed
        self._wake(False)
        await self._pump
        response, replay = self._response, self._replay
        assert response is not None
        if not self.broken:
            try:
                # A delivered answer is not kept (its stream is forgotten now): written as it is encoded.
                await bodies.write_event(response, message, replay.id_line() if replay is not None else b"")
            except ConnectionError:
                self._broke()
        if self.broken and replay is not None:
            replay.framed(bodies.event(message))  # kept: the client may reconnect for it
        self._ended(delivered=not self.broken)
        return response

    def _ended(self, *, delivered: bool) -> None:
        """The call ended: a stream all of whose events reached the connection has nothing left to resume."""
        replay = self._replay
        if replay is None:
            return
        replay.let_go(self._let_go)
        replay.end()
        if delivered:
            assert self._replays is not None
            self._replays.delivered(replay)

    async def _abandon(self) -> None:
        """Stop the stream without a response (the call itself failed or was cancelled)."""
        self._stop()
        self._ended(delivered=True)  # no answer to resume for
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
