"""Coarse deadlines for waits on the call path: one loop timer for many of them.

asyncio keeps every `call_later` as its own handle in a heap: made, pushed and cancelled again
for each use. A call's upstream deadline and its SSE stream's first keep-alive were two of those
per call, and they almost never fire; without them a loaded daemon spent ~8% less CPU per SSE
call. Here deadlines fall into ticks of TICK seconds: adding or cancelling one is a dict
operation, and the loop holds a single timer, for the earliest tick that has deadlines. A
deadline fires at most TICK late, never early. Not thread-safe: use it from its loop's thread.

Also `set_within`: the one bounded wait for an `asyncio.Event` (a child's exit, the drain's last call).
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from typing import Any

# Granularity: a deadline fires up to this late. Far below any timeout an operator can set that matters.
TICK = 0.05


def _forgotten(*_: Any) -> None:
    """What a deadline calls once it fired or was cancelled: nothing."""


async def set_within(event: asyncio.Event, timeout: float | None) -> bool:
    """Whether `event` is set within `timeout` seconds (None: whenever it is)."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


class Deadline:
    """One pending deadline; `cancel()` it once the wait is over."""

    __slots__ = ("_bucket", "_callback", "_args")

    def __init__(self, bucket: dict[Deadline, None], callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._bucket = bucket
        self._callback = callback
        self._args = args

    def cancel(self) -> None:
        """Forget the deadline; harmless after it fired or was cancelled."""
        self._bucket.pop(self, None)
        self._take()

    def _take(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """The callback and its arguments, forgotten here once taken: it runs at most once."""
        taken = self._callback, self._args
        # The callback is often a bound method of whatever holds this deadline: dropping it breaks that
        # reference cycle, so the holder (an SSE answer, and through it its whole request) is freed by its
        # reference count at once instead of by the cyclic collector, as asyncio's own handles do. Measured:
        # each SSE call left ~28 objects for the collector, whose runs then cost ~24 µs a call at 32 in flight.
        self._callback = _forgotten
        self._args = ()
        return taken


class Deadlines:
    """Deadlines of one event loop, kept in TICK-wide buckets behind one loop timer."""

    def __init__(self) -> None:
        self._buckets: dict[int, dict[Deadline, None]] = {}
        self._ticks: list[int] = []  # heap of the ticks in _buckets (a cancelled-empty bucket stays until due)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_tick: int | None = None

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Deadline:
        """Call `callback(*args)` once `delay` seconds have passed (up to TICK later), unless cancelled first."""
        loop = asyncio.get_running_loop()
        tick = math.ceil((loop.time() + delay) / TICK)
        bucket = self._buckets.get(tick)
        if bucket is None:
            bucket = self._buckets[tick] = {}
            heapq.heappush(self._ticks, tick)
            if self._timer_tick is None or tick < self._timer_tick:
                self._arm(loop, tick)
        deadline = Deadline(bucket, callback, args)
        bucket[deadline] = None
        return deadline

    @property
    def pending(self) -> int:
        """Deadlines neither fired nor cancelled."""
        return sum(len(bucket) for bucket in self._buckets.values())

    def release(self) -> None:
        """Drop the buckets that cancellations emptied, and the loop timer kept for them, now rather than when due.
        Their owner calls this once it has stopped: that timer holds these deadlines (and so a stopped child's server)
        for up to the longest timeout it had set (bench/soak.py: ~450 of them at once, under sessions each with a child
        of its own, for a call timeout of 30 s). Deadlines still pending keep a timer for the earliest of them."""
        self._buckets = {tick: bucket for tick, bucket in self._buckets.items() if bucket}
        self._ticks = sorted(self._buckets)
        if self._ticks and self._ticks[0] == self._timer_tick:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_tick = None
        if self._ticks:
            self._arm(asyncio.get_running_loop(), self._ticks[0])

    def _arm(self, loop: asyncio.AbstractEventLoop, tick: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_tick = tick
        self._timer = loop.call_at(tick * TICK, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = self._timer_tick = None
        now = loop.time()
        while self._ticks and self._ticks[0] * TICK <= now:
            bucket = self._buckets.pop(heapq.heappop(self._ticks))
            for deadline in list(bucket):
                if deadline not in bucket:  # cancelled by a callback before it
                    continue
                del bucket[deadline]
                callback, args = deadline._take()
                try:
                    callback(*args)
                except Exception as exc:  # one failing callback must not cost the others their deadline
                    loop.call_exception_handler({"message": "deadline callback failed", "exception": exc})
        if self._ticks:
            self._arm(loop, self._ticks[0])
