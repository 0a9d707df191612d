"""A tool server's in-flight slots: first come first served, bounded waits, cancellation loses no slot."""

from __future__ import annotations

import asyncio

import pytest

from gatewayd.deadlines import Deadlines
from gatewayd.upstream.server import Slots

BOUND = 5.0


async def waiting(slots: Slots, count: int) -> None:
    """Return once `count` waiters stand in line (each wait() call queues at once)."""
    for _ in range(100):
        if slots.queued >= count:
            return
        await asyncio.sleep(0)  # a loop turn lets the new tasks run up to their first await
    raise AssertionError(f"{count} waiters did not queue")


def full() -> Slots:
    """One slot, already taken."""
    slots = Slots(1, Deadlines())
    assert slots.take()
    return slots


async def cancel(task: asyncio.Task[bool]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def assert_free_again(slots: Slots) -> None:
    """Nobody is left in line: the slot given back is free for the next taker."""
    assert slots.queued == 0
    slots.give()
    assert slots.take() is True


async def test_free_slots_are_taken_then_refused() -> None:
    slots = Slots(2, Deadlines())
    assert [slots.take(), slots.take(), slots.take()] == [True, True, False]
    slots.give()
    assert slots.take() is True


async def test_freed_slots_go_to_waiters_in_arrival_order_not_to_newcomers() -> None:
    slots = full()
    order: list[int] = []

    async def waiter(n: int) -> None:
        assert await slots.wait(BOUND)
        order.append(n)

    tasks = [asyncio.create_task(waiter(n)) for n in range(3)]
    await waiting(slots, 3)
    for _ in range(3):
        slots.give()
        assert slots.take() is False  # the freed slot went to the first in line
    await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
    assert order == [0, 1, 2]
    assert_free_again(slots)


async def test_a_wait_ends_after_its_timeout_and_leaves_the_line() -> None:
    slots = full()
    assert await asyncio.wait_for(slots.wait(0.05), BOUND) is False
    assert_free_again(slots)


async def test_a_cancelled_waiter_leaves_the_line() -> None:
    slots = full()
    task = asyncio.create_task(slots.wait(BOUND))
    await waiting(slots, 1)
    await cancel(task)
    assert_free_again(slots)


async def test_a_slot_handed_to_a_waiter_cancelled_before_it_runs_is_passed_on() -> None:
    slots = full()
    first = asyncio.create_task(slots.wait(BOUND))
    second = asyncio.create_task(slots.wait(BOUND))
    await waiting(slots, 2)
    slots.give()  # to `first`, which is cancelled before it can resume
    await cancel(first)
    assert await asyncio.wait_for(second, BOUND) is True
    assert slots.take() is False
