"""Coarse deadlines on a real event loop: never early, at most a tick late, cancellable, in order."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

from gatewayd.deadlines import TICK, Deadlines, set_within

# Generous: these tests check order and cancellation, not the machine's scheduling latency.
BOUND = 5.0


async def test_a_deadline_fires_after_its_delay_never_before() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    fired: asyncio.Future[float] = loop.create_future()
    start = loop.time()
    deadlines.call_later(0.12, lambda: fired.set_result(loop.time()))
    at = await asyncio.wait_for(fired, BOUND)
    assert at - start >= 0.12 - 1e-6
    assert deadlines.pending == 0


async def test_deadlines_fire_in_time_order_whatever_the_order_added() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    order: list[float] = []
    done = asyncio.Event()
    for delay in (0.3, 0.05, 0.2, 0.05 + TICK / 10, 0.1):
        deadlines.call_later(delay, order.append, delay)
    deadlines.call_later(0.35, done.set)
    await asyncio.wait_for(done.wait(), BOUND)
    assert order[-3:] == [0.1, 0.2, 0.3] and sorted(order[:2]) == [0.05, 0.05 + TICK / 10]
    assert loop.time() > 0  # the loop kept running: nothing raised out of the timer


async def test_a_cancelled_deadline_never_fires() -> None:
    deadlines = Deadlines()
    fired: list[str] = []
    done = asyncio.Event()
    deadlines.call_later(0.05, fired.append, "cancelled").cancel()
    keep = deadlines.call_later(0.05, fired.append, "kept")
    deadlines.call_later(0.15, done.set)
    await asyncio.wait_for(done.wait(), BOUND)
    assert fired == ["kept"]
    keep.cancel()  # after it fired: harmless


async def test_a_callback_may_cancel_another_due_at_the_same_tick() -> None:
    deadlines = Deadlines()
    fired: list[str] = []
    done = asyncio.Event()
    later: list[Any] = []

    def first() -> None:
        fired.append("first")
        later[0].cancel()

    deadlines.call_later(0.05, first)
    later.append(deadlines.call_later(0.05, fired.append, "second"))
    deadlines.call_later(0.15, done.set)
    await asyncio.wait_for(done.wait(), BOUND)
    assert fired == ["first"]


async def test_a_failing_callback_costs_the_others_nothing() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        deadlines = Deadlines()
        done = asyncio.Event()

        def boom() -> None:
            raise RuntimeError("boom")

        deadlines.call_later(0.05, boom)
        deadlines.call_later(0.05, done.set)
        await asyncio.wait_for(done.wait(), BOUND)
        assert [str(context["exception"]) for context in reported] == ["boom"]
    finally:
        loop.set_exception_handler(None)


async def test_an_earlier_deadline_added_later_is_not_held_up_by_a_far_one() -> None:
    loop = asyncio.get_running_loop()
    deadlines = Deadlines()
    fired: asyncio.Future[float] = loop.create_future()
    far = deadlines.call_later(3600, fired.set_result, -1.0)
    start = loop.time()
    deadlines.call_later(0.05, lambda: fired.set_result(loop.time()))
    at = await asyncio.wait_for(fired, BOUND)
    assert 0.05 - 1e-6 <= at - start < BOUND
    far.cancel()
    assert deadlines.pending == 0


class _Holder:
    """Holds its own deadline, whose callback is one of its methods: the shape of an SSE answer."""

    def __init__(self, deadlines: Deadlines, delay: float, fired: asyncio.Event) -> None:
        self.fired = fired
        self.deadline = deadlines.call_later(delay, self.fire)

    def fire(self) -> None:
        self.fired.set()


async def test_a_deadline_done_with_keeps_no_cycle_with_its_holder() -> None:
    # The holder must go with its last reference, not wait for the cyclic collector (paused here to tell).
    deadlines = Deadlines()
    fired = asyncio.Event()
    gc.disable()
    try:
        cancelled = _Holder(deadlines, 3600, fired)
        cancelled.deadline.cancel()
        gone = weakref.ref(cancelled)
        del cancelled
        assert gone() is None
        holder = _Holder(deadlines, 0.05, fired)
        await asyncio.wait_for(fired.wait(), BOUND)
        gone = weakref.ref(holder)
        del holder
        assert gone() is None
    finally:
        gc.enable()


async def test_set_within_says_whether_the_event_came_in_time() -> None:
    event = asyncio.Event()
    assert not await set_within(event, TICK)  # never set: the wait ends at its timeout
    asyncio.get_running_loop().call_soon(event.set)
    assert await set_within(event, 5.0)
    assert await set_within(event, 0)  # already set: at once, whatever the timeout


async def test_released_deadlines_let_go_of_their_timer_and_keep_what_is_pending() -> None:
    loop = asyncio.get_running_loop()
    owner = Deadlines()
    far = owner.call_later(30.0, lambda: None)
    far.cancel()
    # A cancelled deadline's bucket keeps the loop's timer, and through it the deadlines, until its tick is due.
    assert owner._timer is not None
    owner.release()
    assert owner._timer is None and owner.pending == 0
    held = weakref.ref(owner)
    del owner, far
    gc.collect()
    assert held() is None, "the loop's timer still holds the released deadlines"
    # What is still pending keeps a timer for the earliest of it, and fires.
    deadlines = Deadlines()
    fired = loop.create_future()
    deadlines.call_later(0.05, fired.set_result, "kept")
    gone = deadlines.call_later(0.02, lambda: None)
    gone.cancel()
    deadlines.release()
    assert deadlines.pending == 1
    assert await asyncio.wait_for(fired, BOUND) == "kept"
