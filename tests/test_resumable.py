"""What a session keeps of its call streams for a client that reconnects (gatewayd/resumable.py), in memory: the
priming event, ids, what is kept while the connection holds and after it dropped, which `Last-Event-ID` finds a
stream, the bounds on streams and their age, and sending the rest as it comes. The whole path through the daemon is
tests/e2e/test_resumable_streams.py."""

from __future__ import annotations

import asyncio

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
    assert [number for number, _ in replay.events] == list(range(12, LIVE_EVENTS + 12))
    # While its connection holds no reconnection may have it: each event goes on one stream only.
    assert replays.find(f"{replay.id}-3") is None
    replay.detach()
    for _ in range(MAX_EVENTS + 5):
        replay.framed(EVENT)
    assert len(replay.events) == MAX_EVENTS and replay.events[-1][0] == LIVE_EVENTS + 11 + MAX_EVENTS + 5
    assert replays.find(f"{replay.id}-3") == (replay, 3)


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


async def test_a_reconnection_is_sent_what_follows_its_id_then_the_rest_as_it_comes_until_the_end() -> None:
    replay = Replays().open()
    replay.detach()
    for _ in range(3):
        replay.framed(EVENT)
    written: list[bytes] = []
    wrote = asyncio.Event()

    async def write(data: bytes) -> None:
        written.append(data)
        wrote.set()

    replay.reading = True  # as the reconnecting GET marks it (web/mcp_http.py): the one reader
    sending = asyncio.ensure_future(replay.send(write, 1, keepalive=60.0, keepalive_frame=b": k\n\n"))
    await asyncio.wait_for(wrote.wait(), 5)
    assert written == [b"".join(framed for number, framed in replay.events if number > 1)]
    wrote.clear()
    replay.framed(b"event: message\ndata: {\"id\":1}\n\n")
    await asyncio.wait_for(wrote.wait(), 5)  # sent as it comes
    replay.end()
    await asyncio.wait_for(sending, 5)
    assert written[-1].startswith(b"id: %s-4\n" % replay.id.encode()) and len(written) == 2


async def test_a_reconnection_waiting_for_more_is_kept_alive() -> None:
    replay = Replays().open()
    replay.detach()
    written: list[bytes] = []
    alive = asyncio.Event()

    async def write(data: bytes) -> None:
        written.append(data)
        alive.set()

    replay.reading = True
    sending = asyncio.ensure_future(replay.send(write, 0, keepalive=0.01, keepalive_frame=b": k\n\n"))
    await asyncio.wait_for(alive.wait(), 5)
    replay.end()
    await asyncio.wait_for(sending, 5)
    assert written[0] == b": k\n\n"


async def test_only_streams_whose_connection_dropped_count_as_waiting() -> None:
    replays = Replays()
    live, dropped = replays.open(), replays.open()
    dropped.detach()
    assert (len(replays), replays.waiting(), live.detached) == (2, 1, False)
