"""Something that happens once, and callbacks waiting for it: a session ending, a client going away.

`Once.add(callback)` runs the callback when it happens (at once if it already has) and returns a
function that takes it back; `fire()` runs every waiting callback, the first time only.
"""

from __future__ import annotations

from collections.abc import Callable

Callback = Callable[[], None]


def _nothing() -> None:
    return None


class Once:
    """A one-shot event with callbacks."""

    def __init__(self) -> None:
        # None once it has happened.
        self._waiting: list[Callback] | None = []

    @property
    def happened(self) -> bool:
        return self._waiting is None

    def add(self, callback: Callback) -> Callback:
        """Run `callback` when this happens; returns how to take that back."""
        if self._waiting is None:
            callback()
            return _nothing
        waiting = self._waiting
        waiting.append(callback)
        return lambda: waiting.remove(callback) if callback in waiting else None

    def fire(self) -> bool:
        """It happens: run the waiting callbacks. False when it had already happened."""
        if self._waiting is None:
            return False
        waiting, self._waiting = self._waiting, None
        for callback in waiting:
            callback()
        return True
