"""How the peer's lines reach the child's stdin: a lone call at once, calls that come together in one write, a
large argument's line made from its bytes yet the same line.

The real calc child on a real ChildProcess; its `write` is wrapped to record each write (what the pipe is given,
the thing these tests judge), the peer itself is untouched.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from gatewayd import jsonrpc, jsontext
from gatewayd.errors import ToolServerUnavailable
from gatewayd.upstream.peer import SINGLE_TURNS, Peer
from gatewayd.upstream.process import ChildProcess, Line
from tests.waiting import eventually

# Bound on each call; generous for a loaded 2-core machine.
CALL_TIMEOUT = 20.0
BURST = 5


@asynccontextmanager
async def recorded() -> AsyncIterator[tuple[Peer, list[bytes]]]:
    """A peer on the calc child, and each write to the child's stdin, in order."""
    process = ChildProcess("calc", [sys.executable, "-m", "gatewayd.examples.calc"])
    peer = Peer(process)
    await process.open(peer.lines)
    writes: list[bytes] = []
    write = process.write

    def recording(data: bytes) -> None:
        writes.append(data)
        write(data)

    process.write = recording  # type: ignore[method-assign]
    try:
        yield peer, writes
    finally:
        await process.close(peer.flush)


def lines_in(writes: list[bytes]) -> list[int]:
    """The number of lines in each write."""
    return [data.count(b"\n") for data in writes]


async def echo(peer: Peer, n: int) -> None:
    assert await peer.call("echo", {"n": n}, timeout=CALL_TIMEOUT) == {"n": n}


async def burst(peer: Peer) -> None:
    """BURST calls begun in the same loop turn."""
    await asyncio.gather(*(echo(peer, n) for n in range(BURST)))


async def test_a_lone_call_is_written_before_its_loop_turn_ends() -> None:
    async with recorded() as (peer, writes):
        call = asyncio.ensure_future(echo(peer, 1))
        # One yield runs the call's first step (which sends its line) and comes back before that turn's end.
        await asyncio.sleep(0)
        assert lines_in(writes) == [1]
        await call


async def test_calls_that_come_together_go_out_together_until_they_come_alone_again() -> None:
    async with recorded() as (peer, writes):
        await burst(peer)
        # The first line went at once, as a lone call's would; the rest of the turn's lines in one write.
        assert lines_in(writes) == [1, BURST - 1]
        writes.clear()
        await burst(peer)
        assert lines_in(writes) == [BURST]  # calls are coming together: the whole turn in one write
        writes.clear()
        for n in range(SINGLE_TURNS):
            await echo(peer, n)
        assert lines_in(writes) == [1] * SINGLE_TURNS
        writes.clear()
        call = asyncio.ensure_future(echo(peer, 1))
        await asyncio.sleep(0)
        assert lines_in(writes) == [1]  # alone for SINGLE_TURNS turns: at once again
        await call


# Every kind of character JSON escapes or leaves, of every UTF-8 length, in a string over the large limit.
MIXED = 'ab"\\\n\t\x01é\u2028€\U0001f600<'


@pytest.mark.parametrize("size", [jsontext.LARGE_STRING + 1, 3 * jsontext.LARGE_STRING + 7])
async def test_a_large_argument_s_line_is_the_plain_encoding_s_and_reaches_the_child_intact(size: int) -> None:
    text = (MIXED * (size // len(MIXED) + 1))[:size]
    params = {"text": text, "n": 1.5, "nested": [{"k": text[:10]}, None, True]}
    async with recorded() as (peer, writes):
        assert await peer.call("echo", params, timeout=CALL_TIMEOUT, large=True) == params
    sent = {"jsonrpc": "2.0", "id": 1, "method": "echo", "params": params}
    assert writes == [jsonrpc.dumps(sent) + b"\n"]


async def test_a_large_argument_that_json_cannot_carry_is_refused_as_the_plain_encoding_refuses_it() -> None:
    async with recorded() as (peer, writes):
        for bad in ("\ud800", float("nan")):
            params = {"text": "x" * (jsontext.LARGE_STRING + 1), "bad": bad}
            with pytest.raises(ValueError):
                jsonrpc.dumps(params)
            with pytest.raises(ValueError):
                await peer.call("echo", params, timeout=CALL_TIMEOUT, large=True)
        assert writes == [] and peer.in_flight == 0
        await echo(peer, 2)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_stopped_or_exited_child_leaves_none_of_its_pipes_open() -> None:
    # Its stdout is a pipe of the daemon's own (read in the loop's callback), not asyncio's subprocess transport's.
    before = open_fds()
    for n in range(3):
        async with recorded() as (peer, _):
            await echo(peer, n)
    exited = ChildProcess("quits", [sys.executable, "-c", "print('{}')"])
    lines: list[Line] = []
    await exited.open(lines.extend)
    assert await exited.wait_exited(CALL_TIMEOUT)
    await exited.close()
    assert lines == [b"{}"]
    with pytest.raises(ToolServerUnavailable, match="could not start"):
        await ChildProcess("missing", ["/nonexistent/tool-server"]).open(lines.extend)
    await eventually(lambda: open_fds() == before, what="every pipe of the children closed")
