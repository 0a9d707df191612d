"""Resumable streams of MCP 2025-11-25 sessions (Streamable HTTP resumability, SEP-1699): a call's stream, and the
session's own GET stream.

A call answered as an event stream in a session gets a stream id; the stream opens with a priming event (an `id`,
a `retry` telling the client how long to wait before reconnecting, no data) and each of its events carries the id
`<stream>-<n>`. When the client's connection drops before the answer (a network gone for a moment, a proxy's
timeout), the call goes on, as MCP asks (a dropped stream is not a cancellation), and what it says from then on,
its answer too, is kept: the client reconnects with a GET carrying `Last-Event-ID` and is sent every event after
that one, then the rest as it comes, the answer last, and that response ends. The same serves a stream whose
connection the gateway ends itself (settings `sse_poll_after`: SEP-1699 polling), and one whose connection the
gateway still holds (a network gone without a word: the connection is let go, the client says it lost it). A stream
whose events all reached the connection is forgotten when the call ends.

The session's own GET stream (what the session hears outside its calls: lists changed, resources updated, task
statuses, a child's questions outside a call) is stream `0`: primed and numbered the same way, its last LIVE_EVENTS
events kept. A GET naming one of them takes the stream over from the connection that read it (a client whose
network dropped reconnects while the gateway still holds the old connection, which may never say it is gone), and is
sent what came after that event, then the stream goes on. A GET without one is refused while another connection
reads the stream, unless that connection is gone.

Owns: the ids, the priming event, one session's table of streams kept for resumption (at most MAX_STREAMS, the
oldest forgotten; each at most MAX_EVENTS events, the oldest dropped; forgotten KEEP_S seconds after its call
ended, or once its answer was sent on a reconnection), the session stream's window and reader, and sending them
again. A 2026-07-28 request has no session, and no resumability (that era ends a call when its stream closes). Does
not own HTTP: the call's stream on its first connection (web/sse.py), the GETs (web/mcp_http.py).
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
# The session's own GET stream's id (its calls' streams are numbered from 1).
SESSION_STREAM: Final = "0"


# How the connection reading a stream is let go: closing it at once (a write waiting on it ends).
Cut = Callable[[], None]


class _Read:
    """A stream one connection reads at a time: `cut` lets that one go. A client that names the stream again lost
    that connection, though the gateway may not know it yet (a network gone without a word): the newer one takes
    over."""

    __slots__ = ("cut",)

    def __init__(self) -> None:
        self.cut: Cut | None = None

    def _hand_to(self, cut: Cut) -> None:
        """`cut`'s connection reads the stream from now on: the one that read it until now is let go."""
        previous, self.cut = self.cut, cut
        if previous is not None:
            previous()

    def let_go(self, cut: Cut) -> None:
        """The reader `cut` lets go stopped reading (equal, not the same: a bound method is made anew each time)."""
        if self.cut == cut:
            self.cut = None


class _Numbered(_Read):
    """A stream whose events carry the ids `<stream>-<n>`, its last ones kept for a reconnection (the oldest dropped
    past `kept`). An event's number follows from the last one's and its place: nothing is made per event but its
    framed bytes, and nothing at all until the first."""

    __slots__ = ("_head", "_kept", "_events", "last")

    def __init__(self, stream_id: str, kept: int) -> None:
        super().__init__()
        self._head = stream_id.encode("ascii")
        self._kept = kept
        self._events: collections.deque[bytes] | None = None
        # The number of the last event framed (0: none yet).
        self.last = 0

    def priming(self, after: int = 0) -> bytes:
        """A priming event: the id of event `after` (the last one its reader has), `retry`, no data."""
        return b"id: %s-%d\nretry: %d\ndata:\n\n" % (self._head, after, RETRY_MS)

    def framed(self, event: bytes) -> bytes:
        """`event` (an encoded SSE event) with the stream's next id, kept for a reconnection."""
        self.last += 1
        framed = b"id: %s-%d\n%s" % (self._head, self.last, event)
        if self._events is None:
            self._events = collections.deque(maxlen=self._kept)
        self._events.append(framed)
        return framed

    def since(self, after: int) -> list[bytes]:
        """The events kept whose number is above `after`, oldest first."""
        events = self._events or ()
        return list(itertools.islice(events, max(0, after - (self.last - len(events))), None))

    def missed(self, after: int) -> int:
        """Events after number `after` no longer kept: a reconnection naming it gets the rest."""
        return max(0, self.last - len(self._events or ()) - after)

    def _keep(self, kept: int) -> None:
        """Keep up to `kept` events from now on."""
        self._kept = kept
        if self._events is not None:
            self._events = collections.deque(self._events, maxlen=kept)


class Replay(_Numbered):
    """One call stream's events by number, for a client that reconnects."""

    __slots__ = ("id", "ended", "detached", "_more")

    def __init__(self, stream_id: str) -> None:
        # While the first connection holds, the last LIVE_EVENTS (trimmed by the deque itself: this is on every
        # streamed event's path); once it dropped, up to MAX_EVENTS.
        super().__init__(stream_id, LIVE_EVENTS)
        self.id = stream_id
        # The call ended: its answer is the last event. None while it runs; then time.monotonic() of its end.
        self.ended: float | None = None
        # Its first connection dropped, or was let go: only now may a reconnection read it (each event goes on one
        # stream only).
        self.detached = False
        self._more = asyncio.Event()

    def framed(self, event: bytes) -> bytes:
        framed = super().framed(event)
        if self.detached:
            self._more.set()
        return framed

    def detach(self) -> None:
        """The first connection dropped: what it did not carry waits for a reconnection."""
        if not self.detached:
            self.detached = True
            self._keep(MAX_EVENTS)

    def take_over(self, cut: Cut) -> None:
        """A reconnection reads the stream from now on (its first connection, or an earlier reconnection, let go),
        and `cut` lets it go in turn; what the one before did not carry waits for this one."""
        self._hand_to(cut)
        self.detach()
        self._more.set()  # an earlier reconnection's `send` ends

    def end(self) -> None:
        """The call ended (its answer, if it has one, is framed already)."""
        self.ended = time.monotonic()
        self._more.set()  # a reconnection waiting for more: there is no more

    def id_line(self) -> bytes:
        """The next event's id, for an answer written without being kept (the stream is forgotten once it reached
        its connection; if it did not, it is framed under the same id)."""
        return b"id: %s-%d\n" % (self._head, self.last + 1)

    async def send(self, write: Callable[[bytes], Awaitable[None]], after: int, keepalive: float,
                   keepalive_frame: bytes, reader: Cut) -> bool:
        """While `reader` (its `take_over` argument) reads the stream: write every event after number `after`, then
        the rest as it comes, until the call's end (the answer last), and say it was all sent (True); False once
        another reconnection took over. `keepalive_frame` whenever `keepalive` seconds pass without an event."""
        while self.cut is reader:
            self._more.clear()
            pending = self.since(after)
            if pending:
                after = self.last
                await write(b"".join(pending))
                continue
            if self.ended is not None:
                return True
            try:
                async with asyncio.timeout(keepalive):
                    await self._more.wait()
            except TimeoutError:
                await write(keepalive_frame)
        return False


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
        named = _parse(last_event_id)
        replay = self._streams.get(named[0]) if named is not None else None
        if named is None or replay is None:
            return None
        return replay, named[1]

    def _expire(self) -> None:
        now = time.monotonic()
        for stream in [stream for stream, replay in self._streams.items()
                       if replay.ended is not None and replay.ended + KEEP_S < now]:
            del self._streams[stream]


def _parse(last_event_id: str | None) -> tuple[str, int] | None:
    """The stream and event number a `Last-Event-ID` names, or None: no id of ours."""
    if last_event_id is None or len(last_event_id) > MAX_ID_CHARS:
        return None
    stream, _, number = last_event_id.strip().partition("-")
    return (stream, int(number)) if number.isascii() and number.isdigit() else None


class SessionStream(_Numbered):
    """A session's own GET stream (stream 0): its event ids, the last LIVE_EVENTS events it wrote, and the connection
    that reads it. Every session has one, most never read: nothing is allocated until it carries an event."""

    __slots__ = ("_waiter",)

    def __init__(self) -> None:
        super().__init__(SESSION_STREAM, LIVE_EVENTS)
        # What the reader's pump waits on while nothing is queued.
        self._waiter: asyncio.Future[None] | None = None

    def after(self, last_event_id: str | None) -> int | None:
        """The number a reconnecting client's `Last-Event-ID` names on this stream, or None."""
        named = _parse(last_event_id)
        return named[1] if named is not None and named[0] == SESSION_STREAM and named[1] <= self.last else None

    def take(self, after: int | None, cut: Cut) -> bool:
        """Whether `cut`'s connection reads the stream from now on: not while another one reads it, unless this one
        names an event of it (then the other is let go)."""
        if self.cut is not None and after is None:
            return False
        self._hand_to(cut)
        self.wake()  # an older reader's pump ends
        return True

    def let_go(self, cut: Cut) -> None:
        """The reader `cut` lets go stopped, or its connection closed: the stream is free, and its pump ends."""
        super().let_go(cut)
        self.wake()

    def opening(self, after: int | None) -> bytes:
        """What a new reader is sent first: the priming event (the id of the last event it has: `after`, or every
        event so far), then the events after `after` still kept."""
        start = self.last if after is None else after
        return self.priming(start) + b"".join(self.since(start))

    def wake(self) -> None:
        """Something was queued for the stream, or its reader changed."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout: float) -> bool:
        """Until something is queued or the reader changes (True), or `timeout` seconds pass (False). The caller
        looked at the queue just before (no await between): nothing queued since is missed."""
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            return False
        finally:
            if self._waiter is waiter:  # a newer reader's pump may wait by now
                self._waiter = None
        return True
