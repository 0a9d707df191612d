"""Bounded waiting for tests: poll a condition until a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

# How often a condition is re-checked; short, so tests finish as soon as it holds.
POLL_INTERVAL = 0.01


async def eventually(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Return as soon as `condition()` holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout}s")
        await asyncio.sleep(POLL_INTERVAL)


def process_gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie waiting for init counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Gone, or being reaped as it is read (the kernel answers ESRCH then).
        return True
