"""Calls in flight stopped by their client or the shutdown, seen from the task they run in. On Python 3.11 that task
is a kept-alive connection's, which goes on to its next request (web/aiohttp_hooks.py): a stop must leave it as it
found it."""

from __future__ import annotations

import asyncio

import pytest

from gatewayd import calls
from gatewayd.calls import CallContext
from gatewayd.errors import RequestCancelled, ShuttingDown
from gatewayd.inflight import Inflight
from gatewayd.policy import Principal

DEADLINE = 5.0
# A timeout that must expire: the second request's own.
SHORT = 0.01


def _call(request_id: str) -> calls.Call:
    ctx = CallContext(Principal("client", ()), {})
    return calls.direct(ctx, calls.DIRECT, request_id, "s.sleep", {})


async def test_a_call_stopped_by_its_client_leaves_its_task_able_to_time_out_again() -> None:
    inflight = Inflight()
    started = asyncio.Event()

    async def connection() -> None:
        # The first request: its call is stopped by the client's notifications/cancelled.
        with pytest.raises(RequestCancelled):
            with inflight.track(_call("a")):
                started.set()
                await asyncio.Event().wait()
        # The next request on the same connection: a timeout of its own is still a timeout, not a cancellation.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(SHORT):
                await asyncio.Event().wait()
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0

    running = asyncio.ensure_future(connection())
    async with asyncio.timeout(DEADLINE):
        await started.wait()
        inflight.cancel(CallContext(Principal("client", ()), {}), {"requestId": "a"})
        await running


async def test_the_drain_ends_with_the_calls_not_with_the_task_they_ran_in() -> None:
    inflight = Inflight()
    tracked, release, next_request = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def connection() -> None:
        with inflight.track(_call("a")):
            tracked.set()
            await release.wait()
        await next_request.wait()  # a kept-alive connection waits for its next request

    running = asyncio.ensure_future(connection())
    async with asyncio.timeout(DEADLINE):
        await tracked.wait()
    assert len(inflight) == 1
    draining = asyncio.ensure_future(inflight.drain(grace=DEADLINE * 10))
    release.set()
    async with asyncio.timeout(DEADLINE):
        await draining
    assert not running.done()
    next_request.set()
    await running
    with pytest.raises(ShuttingDown):
        inflight.track(_call("b"))
