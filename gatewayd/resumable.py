"""Resumable call streams of MCP 2025-11-25 sessions (Streamable HTTP resumability, SEP-1699).

A call answered as an event stream in a session gets a stream id; the stream opens with a priming event (an `id`,
a `retry` telling the client how long to wait before reconnecting, no data) and each of its events carries the id
`<stream>-<n>`. When the client's connection drops before the answer (a network gone for a moment, a proxy's
timeout), the call goes on, as MCP asks (a dropped stream is not a cancellation), and what it says from then on,
its answer too, is kept: the client reconnects with a GET carrying `Last-Event-ID` and is sent every event after
that one, then the rest as it comes, the answer last, and that response ends. The same serves a stream whose
connection the gateway ends itself (settings `sse_poll_after`: SEP-1699 polling). A stream whose events all reached
the connection is forgotten when the call ends.

Owns: the ids, the priming event, one session's table of streams kept for resumption (at most MAX_STREAMS, the
oldest forgotten; each at most MAX_EVENTS events, the oldest dropped; forgotten KEEP_S seconds after its call
ended, or once its answer was sent on a reconnection), and sending them again. A 2026-07-28 request has no
session, and no resumability (that era ends a call when its stream closes). Does not own HTTP: the call's stream on
its first connection (web/sse.py), the GET that reconnects (web/mcp_http.py).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Final

# How long a client waits before reconnecting to a stream that dropped (the SSE `retry` field), in milliseconds.
RETRY_MS: Final = 1000
# Events kept of one stream for its resumption once its connection dropped; past that the oldest are dropped (as a
# slow reader's are). While the connection holds, only the last LIVE_EVENTS: those a dropped connection may not have
# carried to the client.
MAX_EVENTS: Final = 1024
LIVE_EVENTS: Final = 64
# Streams one session keeps for resumption; past that the oldest is forgotten.
MAX_STREAMS: Final = 16
# Seconds a stream stays resumable after its call ended.
KEEP_S: Final = 60.0
# The `Last-Event-ID` of one of these streams: `<stream>-<n>`, both decimal.
MAX_ID_CHARS: Final = 40


class Replay:
    """One call stream's events by number, for a client that reconnects."""

    __slots__ = ("id", "_head", "events", "_numbers", "ended", "reading", "detached", "_more")

    def __init__(self, stream_id: str) -> None:
        self.id = stream_id
        self._head = stream_id.encode("ascii")
        # While the first connection holds, the last LIVE_EVENTS (trimmed by the deque itself: this is on every
        # streamed event's path); once it dropped, up to MAX_EVENTS.
        self.events: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=LIVE_EVENTS)
        self._numbers = itertools.count(1)
        # The call ended: its answer is the last event. None while it runs; then time.monotonic() of its end.
        self.ended: float | None = None
        # Whether a reconnection reads it now (one at a time).
        self.reading = False
        # Its first connection dropped: only now may a reconnection have it (each event goes on one stream only).
        self.detached = False
        self._more = asyncio.Event()

    def priming(self) -> bytes:
        """The stream's first event: its id (`<stream>-0`) and `retry`, no data."""
        return b"id: %s-0\nretry: %d\ndata:\n\n" % (self._head, RETRY_MS)

    def framed(self, event: bytes) -> bytes:
        """`event` (an encoded SSE event) with the stream's next id, kept for a reconnection."""
        number = next(self._numbers)
        framed = b"id: %s-%d\n%s" % (self._head, number, event)
        self.events.append((number, framed))
        if self.reading:
            self._more.set()
        return framed

    def detach(self) -> None:
        """The first connection dropped: what it did not carry waits for a reconnection."""
        if not self.detached:
            self.detached = True
            self.events = collections.deque(self.events, maxlen=MAX_EVENTS)

    def end(self) -> None:
        """The call ended (its answer, if it has one, is framed already)."""
        self.ended = time.monotonic()
        self._more.set()  # a reconnection waiting for more: there is no more

    def id_line(self) -> bytes:
        """The next id, for an event written without being kept (an answer that reached its connection)."""
        return b"id: %s-%d\n" % (self._head, next(self._numbers))

    async def send(self, write: Callable[[bytes], Awaitable[None]], after: int, keepalive: float,
                   keepalive_frame: bytes) -> None:
        """Write every event after number `after`, then the rest as it comes, until the call's end (the answer
        last); `keepalive_frame` whenever `keepalive` seconds pass without one."""
        while True:
            self._more.clear()
            pending = [(number, framed) for number, framed in self.events if number > after]
            if pending:
                after = pending[-1][0]
                await write(b"".join(framed for _, framed in pending))
                continue
            if self.ended is not None:
                return
            try:
                async with asyncio.timeout(keepalive):
                    await self._more.wait()
            except TimeoutError:
                await write(keepalive_frame)


class Replays:
    """One session's streams kept for resumption, by stream id (every session has one: a small thing)."""

    __slots__ = ("_streams", "_ids")

    def __init__(self) -> None:
        self._streams: collections.OrderedDict[str, Replay] = collections.OrderedDict()
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._streams)

    def waiting(self) -> int:
        """Streams whose connection dropped, kept for a reconnection."""
        self._expire()
        return sum(replay.detached for replay in self._streams.values())

    def open(self) -> Replay:
        """A new stream's replay (kept until its call ends and the client had all of it)."""
        self._expire()
        replay = Replay(str(next(self._ids)))
        self._streams[replay.id] = replay
        while len(self._streams) > MAX_STREAMS:
            self._streams.popitem(last=False)
        return replay

    def delivered(self, replay: Replay) -> None:
        """Every event of `replay` reached a connection: nothing is left to resume."""
        self._streams.pop(replay.id, None)

    def find(self, last_event_id: str | None) -> tuple[Replay, int] | None:
        """The stream a `Last-Event-ID` names and the number after which to send, or None: no such id, or a stream
        no longer kept."""
        self._expire()
        if last_event_id is None or len(last_event_id) > MAX_ID_CHARS:
            return None
        stream, _, number = last_event_id.strip().partition("-")
        replay = self._streams.get(stream)
        if replay is None or not replay.detached or not (number.isascii() and number.isdigit()):
            return None
        return replay, int(number)

    def _expire(self) -> None:
        now = time.monotonic()
        for stream in [stream for stream, replay in self._streams.items()
                       if replay.ended is not None and replay.ended + KEEP_S < now]:
            del self._streams[stream]
