"""A child that floods the gateway with requests and does not read its stdin: the daemon's memory stays bounded.

Real children (tests/fixtures/floodsrv.py) on the real peer and process, in this test process, whose RSS is
measured. Answers to the child's requests stop once its stdin backlog passes the limit, and calls toward it are
refused at once meanwhile; its requests are answered at most at their rate; a call waiting for a stuck stdin
gives up at its own deadline.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gatewayd.errors import CallTimedOut, ToolServerUnavailable
from gatewayd.upstream.peer import CHILD_REQUEST_BURST, CHILD_REQUEST_RATE, Peer
from gatewayd.upstream.process import ChildProcess
from tests.waiting import POLL_INTERVAL, eventually

FLOODSRV = Path(__file__).resolve().parents[1] / "fixtures" / "floodsrv.py"
# How long the child floods; the daemon's memory is watched meanwhile.
FLOOD_SECONDS = 3.0
# A small limit, so the test reaches it in a moment (the daemon's is STDIN_BACKLOG_LIMIT).
BACKLOG_LIMIT = 256 * 1024
# Past the limit, one read of the child's stdout (asyncio reads at most 256 KiB) can still add its replies.
BACKLOG_SLACK = 1024 * 1024
# Growth of this process's RSS allowed while the child floods: allocator noise, far below the unbounded case
# (about 10 MiB a second on a 2-core machine).
RSS_GROWTH = 24 * 1024 * 1024
SAMPLE_INTERVAL = 0.05
# Bound on any one answer of the child once it reads; generous for a loaded 2-core machine.
ANSWER_TIMEOUT = 20.0
# A refused call is refused at once; a stuck call gives up at its own deadline (plus a loaded machine's slack).
FAST = 2.0
CALL_TIMEOUT = 0.5
BIG_PARAMS = {"pad": "x" * (1024 * 1024)}


@asynccontextmanager
async def flooding(*flags: str, **bounds: Any) -> AsyncIterator[tuple[ChildProcess, Peer]]:
    """The flooding child, with the peer on its pipes (`bounds`: the peer's limits)."""
    process = ChildProcess("flood", [sys.executable, str(FLOODSRV), *flags])
    peer = Peer(process, **bounds)
    await process.open(peer.lines)
    try:
        yield process, peer
    finally:
        await process.close(peer.flush)


def rss() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@asynccontextmanager
async def sampling(process: ChildProcess) -> AsyncIterator[list[tuple[int, int]]]:
    """(RSS, stdin backlog) every SAMPLE_INTERVAL while the block runs."""
    samples: list[tuple[int, int]] = []

    async def sample() -> None:
        while True:
            samples.append((rss(), process.backlog()))
            await asyncio.sleep(SAMPLE_INTERVAL)

    task = asyncio.create_task(sample())
    try:
        yield samples
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def once_answered(peer: Peer, timeout: float) -> Any:
    """Call `report` until the child takes the call (it is refused while the child does not read)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await peer.call("report", None, timeout=ANSWER_TIMEOUT)
        except ToolServerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(POLL_INTERVAL)


async def test_past_the_backlog_limit_replies_are_dropped_and_calls_refused_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.upstream.peer")
    before = rss()
    # The rate is lifted, so only the backlog limit bounds what is written.
    async with flooding("--for", str(FLOOD_SECONDS), stdin_backlog_limit=BACKLOG_LIMIT, request_rate=1e9,
                        request_burst=10**9) as (process, peer), sampling(process) as samples:
        await eventually(lambda: peer.dropped.replies > 0, what="replies dropped at the backlog limit")
        started = time.monotonic()
        with pytest.raises(ToolServerUnavailable) as refused:
            await peer.call("report", None, timeout=ANSWER_TIMEOUT)
        with pytest.raises(ToolServerUnavailable):
            await peer.notify("notifications/cancelled", {"requestId": 1})
        assert time.monotonic() - started < FAST
        wire = refused.value.to_wire()
        assert wire["code"] == -32011 and "is not reading what it is sent; report was not sent" in wire["message"]
        assert peer.dropped.calls == 2

        # Once the flood is over the child reads, its backlog drains, and it is called again.
        report = await once_answered(peer, FLOOD_SECONDS + ANSWER_TIMEOUT)
        peak_rss, peak_backlog = max(rss for rss, _ in samples), max(backlog for _, backlog in samples)
    assert report["sent"] > report["replies"] > 0
    assert peer.dropped.replies > 0 and peer.dropped.requests == 0
    assert peak_backlog <= BACKLOG_LIMIT + BACKLOG_SLACK, peak_backlog
    assert peak_rss - before < RSS_GROWTH, (peak_rss - before) / 2**20
    # One warning for the whole episode, however many replies were dropped, and one line when it is over.
    assert caplog.text.count("is not reading its stdin") == 1
    assert caplog.text.count("reads its stdin again") == 1


async def test_a_childs_requests_are_answered_at_most_at_their_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gatewayd.upstream.peer")
    started, before = time.monotonic(), rss()
    async with flooding("--for", str(FLOOD_SECONDS)) as (process, peer), sampling(process) as samples:
        first = await once_answered(peer, ANSWER_TIMEOUT)
        elapsed = time.monotonic() - started
        # Every request of the flood was read before that answer; every reply to one was written before this call.
        report = await peer.call("report", None, timeout=ANSWER_TIMEOUT)
        peak_rss = max(rss for rss, _ in samples)
    assert report["sent"] == first["sent"] > 10 * CHILD_REQUEST_BURST
    assert report["replies"] + peer.dropped.requests == report["sent"] and peer.dropped.replies == 0
    assert report["replies"] <= CHILD_REQUEST_BURST + CHILD_REQUEST_RATE * elapsed
    assert peak_rss - before < RSS_GROWTH, (peak_rss - before) / 2**20
    assert caplog.text.count("sends requests faster than 100 a second") == 1


async def test_a_call_waits_for_a_stuck_stdin_no_longer_than_its_deadline() -> None:
    async with flooding("--quiet") as (process, peer):
        # The first call fills the pipe and leaves most of its megabyte waiting in front of the child.
        with pytest.raises(CallTimedOut):
            await peer.call("report", BIG_PARAMS, timeout=CALL_TIMEOUT)
        assert process.backlog() > 0
        started = time.monotonic()
        async with asyncio.timeout(ANSWER_TIMEOUT):
            with pytest.raises(CallTimedOut):
                await peer.call("report", None, timeout=CALL_TIMEOUT)
        assert time.monotonic() - started < CALL_TIMEOUT + FAST
