"""What a session keeps of its call streams and its own GET stream for a client that reconnects
(gatewayd/resumable.py), in memory: the priming event, ids, what is kept while the connection holds and after it
dropped, which `Last-Event-ID` finds a stream, the bounds on streams and their age, sending the rest as it comes, and
which connection reads the session's stream. The whole paths through the daemon are in
tests/e2e/test_resumable_streams.py."""

from __future__ import annotations

import asyncio
import functools

import pytest

from gatewayd import resumable
from gatewayd.resumable import LIVE_EVENTS, MAX_EVENTS, MAX_STREAMS, RETRY_MS, Replays

EVENT = b"event: message\ndata: {}\n\n"


async def test_a_stream_is_primed_and_numbered_and_keeps_its_last_events_while_its_connection_holds() -> None:
    replays = Replays()
    replay = replays.open()
    assert replay.priming() == b"id: %s-0\nretry: %d\ndata:\n\n" % (replay.id.encode(), RETRY_MS)
    first = replay.framed(EVENT)
    assert first == b"id: %s-1\n" % replay.id.encode() + EVENT
    for _ in range(LIVE_EVENTS + 10):
        replay.framed(EVENT)
    # While its connection holds, the last LIVE_EVENTS: from 12 on, as a reconnection naming an older one is told.
    assert replay.last == LIVE_EVENTS + 11 and len(replay.since(0)) == LIVE_EVENTS and replay.missed(0) == 11
    assert replay.since(LIVE_EVENTS + 9) == [b"id: %s-%d\n" % (replay.id.encode(), number) + EVENT
                                              for number in (LIVE_EVENTS + 10, LIVE_EVENTS + 11)]
    assert replays.find(f"{replay.id}-3") == (replay, 3) and not replay.detached
    replay.detach()
    for _ in range(MAX_EVENTS + 5):
        replay.framed(EVENT)
    assert len(replay.since(0)) == MAX_EVENTS and replay.last == LIVE_EVENTS + 11 + MAX_EVENTS + 5
    # A reconnection naming an event from before the oldest kept is told how many it lost.
    oldest = replay.last - MAX_EVENTS + 1
    assert [replay.missed(after) for after in (oldest - 1, oldest + 3, oldest - 5)] == [0, 0, 4]
    assert replay.since(oldest - 5) == replay.since(oldest - 1) and len(replay.since(oldest + 3)) == MAX_EVENTS - 4


async def test_a_reconnection_lets_go_of_whoever_read_the_stream_and_keeps_what_it_did_not_carry() -> None:
    replay = Replays().open()
    let_go: list[str] = []
    replay.cut = lambda: let_go.append("first connection")  # as web/sse.py's stream sets it
    replay.framed(EVENT)
    second = functools.partial(let_go.append, "second")
    replay.take_over(second)
    # Each event goes on one stream only: the first connection is let go, and the stream kept whole from here.
    assert let_go == ["first connection"] and replay.detached and replay.cut is second
    third = functools.partial(let_go.append, "third")
    replay.take_over(third)
    assert let_go == ["first connection", "second"] and replay.cut is third
    # A reader that ended after it was let go leaves the newer one be.
    replay.let_go(second)
    assert replay.cut is third
    replay.let_go(third)
    assert replay.cut is None


async def test_only_a_well_formed_id_of_a_kept_stream_is_found() -> None:
    replays = Replays()
    replay = replays.open()
    replay.detach()
    assert replays.find(None) is None
    assert [replays.find(text) for text in (f"{replay.id}-x", f"{replay.id}-\u00b2", "99-1", f"{replay.id}",
                                            f"{replay.id}-1" + "0" * resumable.MAX_ID_CHARS)] == [None] * 5
    assert replays.find(f" {replay.id}-2 ") == (replay, 2)
    replays.delivered(replay)
    assert replays.find(f"{replay.id}-2") is None


async def test_past_max_streams_the_oldest_is_forgotten_and_an_ended_one_after_keep_s(
        monkeypatch: pytest.MonkeyPatch) -> None:
    replays = Replays()
    streams = [replays.open() for _ in range(MAX_STREAMS + 1)]
    for replay in streams:
        replay.detach()
    assert len(replays) == MAX_STREAMS and replays.find(f"{streams[0].id}-0") is None
    streams[1].end()
    monkeypatch.setattr(resumable, "KEEP_S", -1.0)  # ended longer ago than it is kept
    assert replays.find(f"{streams[1].id}-0") is None and replays.find(f"{streams[2].id}-0") is not None


class Reconnection:
    """A reconnecting GET as web/mcp_http.py makes it: what it writes, and what letting it go does."""

    def __init__(self, name: str = "reconnection") -> None:
        self.written: list[bytes] = []
        self.wrote = asyncio.Event()
        self.cut = functools.partial(self.written.append, f"{name} let go".encode())

    async def write(self, data: bytes) -> None:
        self.written.append(data)
        self.wrote.set()

    def read(self, replay: resumable.Replay, after: int, keepalive: float = 60.0) -> asyncio.Future[bool]:
        """Take the stream over and send it from `after`, in the background."""
        replay.take_over(self.cut)
        return asyncio.ensure_future(replay.send(self.write, after, keepalive, b": k\n\n", self.cut))

    async def written_to(self) -> None:
        await asyncio.wait_for(self.wrote.wait(), 5)
        self.wrote.clear()


async def test_a_reconnection_is_sent_what_follows_its_id_then_the_rest_as_it_comes_until_the_end() -> None:
    replay = Replays().open()
    replay.detach()
    for _ in range(3):
        replay.framed(EVENT)
    reconnection = Reconnection()
    sending = reconnection.read(replay, 1)
    await reconnection.written_to()
    assert reconnection.written == [b"".join(replay.since(1))]
    replay.framed(b"event: message\ndata: {\"id\":1}\n\n")
    await reconnection.written_to()  # sent as it comes
    replay.end()
    assert await asyncio.wait_for(sending, 5)
    assert reconnection.written[-1].startswith(b"id: %s-4\n" % replay.id.encode()) and len(reconnection.written) == 2


async def test_a_reconnection_taken_over_stops_sending() -> None:
    replay = Replays().open()
    first = Reconnection("first")
    replay.framed(EVENT)
    sending = first.read(replay, 0)
    await first.written_to()  # then it waits for more
    second = Reconnection("second")
    replay.take_over(second.cut)
    assert not await asyncio.wait_for(sending, 5)  # not all sent: the newer reconnection sends the rest
    assert first.written == [*replay.since(0), b"first let go"] and second.written == []


async def test_a_reconnection_waiting_for_more_is_kept_alive() -> None:
    replay = Replays().open()
    replay.detach()
    reconnection = Reconnection()
    sending = reconnection.read(replay, 0, keepalive=0.01)
    await reconnection.written_to()
    replay.end()
    await asyncio.wait_for(sending, 5)
    assert reconnection.written[0] == b": k\n\n"


async def test_only_streams_whose_connection_dropped_count_as_waiting() -> None:
    replays = Replays()
    live, dropped = replays.open(), replays.open()
    dropped.detach()
    assert (len(replays), replays.waiting(), live.detached) == (2, 1, False)


# -- the session's own GET stream --------------------------------------------------------------------------------------


def event(text: str) -> bytes:
    return b"data: " + text.encode() + b"\n\n"


def test_the_session_stream_numbers_its_events_and_names_only_its_own() -> None:
    own = resumable.SessionStream()
    assert own.opening(None) == b"id: 0-0\nretry: %d\ndata:\n\n" % resumable.RETRY_MS
    assert own.framed(event("a")) == b"id: 0-1\ndata: a\n\n"
    assert own.framed(event("b")) == b"id: 0-2\ndata: b\n\n"
    assert [own.after(named) for named in ("0-0", "0-2", " 0-1 ")] == [0, 2, 1]
    # Another stream's id, one not yet written, or no id of ours names nothing here.
    assert [own.after(named) for named in (None, "1-1", "0-3", "0-x", "0-", "0-1-1", "0-" + "9" * 40)] == [None] * 7


def test_a_reader_naming_an_event_is_sent_what_came_after_it_and_told_what_is_no_longer_kept() -> None:
    own = resumable.SessionStream()
    for number in range(1, resumable.LIVE_EVENTS + 4):
        own.framed(event(str(number)))
    last = resumable.LIVE_EVENTS + 3
    opening, lost = own.opening(last - 2), own.missed(last - 2)
    assert opening == (b"id: 0-%d\nretry: %d\ndata:\n\n" % (last - 2, resumable.RETRY_MS)
                       + b"".join(b"id: 0-%d\ndata: %d\n\n" % (number, number) for number in (last - 1, last)))
    assert lost == 0
    # The window crossed: the oldest events are gone, and how many is told.
    opening, lost = own.opening(0), own.missed(0)
    assert lost == 3 and opening.count(b"data: ") == resumable.LIVE_EVENTS
    assert b"id: 0-4\ndata: 4\n\n" in opening and b"data: 3\n" not in opening
    # A reader naming nothing has everything so far: its priming names the last event, and nothing follows.
    assert own.opening(None) == b"id: 0-%d\nretry: %d\ndata:\n\n" % (last, resumable.RETRY_MS)



async def test_one_reader_at_a_time_a_reconnection_naming_an_event_takes_over() -> None:
    own = resumable.SessionStream()
    let_go: list[str] = []
    first, second, third = (functools.partial(let_go.append, name) for name in ("first", "second", "third"))
    assert own.take(None, first) and own.cut is first
    # Nothing named: refused while the first reads.
    assert not own.take(None, second) and own.cut is first
    woken = asyncio.ensure_future(own.wait(resumable.KEEP_S))
    await asyncio.sleep(0)  # the first reader's pump waits
    assert own.take(0, second) and own.cut is second
    assert let_go == ["first"]  # its connection is let go (closed, in web/mcp_http.py)
    assert await woken  # and its pump wakes, to find it no longer reads the stream
    # The first reader stopping does not free the stream the second reads; the second's does.
    own.let_go(first)
    assert own.cut is second and not own.take(None, third)
    own.let_go(second)
    assert own.cut is None and own.take(None, third) and let_go == ["first"]


async def test_the_stream_waits_for_something_queued_or_its_keep_alive() -> None:
    own = resumable.SessionStream()
    assert not await own.wait(0.01)  # nothing: the keep-alive is due
    waiting = asyncio.ensure_future(own.wait(resumable.KEEP_S))
    await asyncio.sleep(0)  # it waits
    own.wake()
    assert await waiting
