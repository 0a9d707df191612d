"""Track: the calls in flight, so a client's `notifications/cancelled` or the daemon's shutdown can stop one.

Owns the registry of running calls by (client, session, request id), turning a stop by the gateway
itself into the error the caller gets instead of a result (a cancel by anyone else propagates),
refusing new calls once the daemon is stopping, and draining: calls in flight get a grace period,
then are stopped. Does not own what a call does (gateway.py) or its records (records.py).
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType
from typing import Any

from gatewayd.calls import Call, CallContext, request_key
from gatewayd.deadlines import set_within
from gatewayd.errors import GatewayError, RequestCancelled, ShuttingDown

logger = logging.getLogger(__name__)

# A call stopped at shutdown unwinds within this long (its error is then written as aiohttp shuts down).
CANCEL_GRACE = 5.0


class Tracked:
    """One call in flight, entered around its confirmation and forwarding; once the gateway stops it, the error
    its caller gets instead of a result. (A class with __enter__/__exit__ rather than contextlib: this is on
    every call's path, and a generator-based manager costs more.)"""

    __slots__ = ("_inflight", "key", "reason", "task")

    def __init__(self, inflight: Inflight, key: tuple[str, str, str]) -> None:
        self._inflight = inflight
        self.key = key
        self.reason: GatewayError | None = None
        task = asyncio.current_task()
        assert task is not None
        self.task = task

    def stop(self, reason: GatewayError) -> None:
        """Stop the call; its caller gets `reason`."""
        if self.reason is None:
            self.reason = reason
            self.task.cancel()

    def __enter__(self) -> Tracked:
        self._inflight.add(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._inflight.remove(self)
        # Our own stop (the client's cancel, or shutdown) becomes an answer; anyone else's cancel propagates.
        if kind is asyncio.CancelledError and self.reason is not None and self.task.uncancel() == 0:
            raise self.reason from None


class Inflight:
    """Every call in flight, by the key its client would cancel it with."""

    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str, str], Tracked] = {}
        self._calls: set[Tracked] = set()
        self.closing = False
        # Set once no call is left, while draining. Drained by the calls, not their tasks: a request's handler may
        # run in its connection's task (web/aiohttp_hooks.py), which goes on after the call, to the next request.
        self._emptied: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._calls)

    def track(self, call: Call) -> Tracked:
        """Enter around the part of a call that may be stopped. Raises ShuttingDown once the daemon is stopping."""
        if self.closing:
            raise ShuttingDown("gatewayd is shutting down; retry shortly")
        return Tracked(self, request_key(call.ctx, call.request_id))

    def add(self, entry: Tracked) -> None:
        self._by_key[entry.key] = entry
        self._calls.add(entry)

    def remove(self, entry: Tracked) -> None:
        self._calls.discard(entry)
        if self._by_key.get(entry.key) is entry:
            del self._by_key[entry.key]
        if self._emptied is not None and not self._calls:
            self._emptied.set()

    def cancel(self, ctx: CallContext, params: Any) -> None:
        """A client's `notifications/cancelled`: stop its call with that request id, if it is still running."""
        if not isinstance(params, dict) or "requestId" not in params:
            return
        entry = self._by_key.get(request_key(ctx, params["requestId"]))
        if entry is not None:
            logger.info("client=%s cancelled request %.64r", ctx.principal.name, params["requestId"])
            entry.stop(RequestCancelled("the request was cancelled by the client"))

    async def drain(self, grace: float) -> None:
        """Refuse new calls; give those in flight `grace` seconds, then stop them (each gets an error answer)."""
        self.closing = True
        if not self._calls:
            return
        emptied = self._emptied = asyncio.Event()
        logger.info("waiting up to %gs for %d calls in flight", grace, len(self._calls))
        if await set_within(emptied, grace):
            return
        left = list(self._calls)
        logger.warning("cancelling %d calls still running after %gs", len(left), grace)
        for entry in left:
            entry.stop(ShuttingDown("gatewayd stopped before the call finished"))
        if not await set_within(emptied, CANCEL_GRACE):
            logger.warning("%d calls still running %gs after they were cancelled", len(self._calls), CANCEL_GRACE)
