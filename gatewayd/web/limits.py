"""Request limits that aiohttp does not enforce itself: read deadlines, a connection cap, per-client quotas.

Owns four things. (1) The header deadline: a request's headers must arrive within `header_timeout` of
the connection opening or, on a kept-alive connection, of the request's first byte; a slow-loris
client then gets 408 and is closed, without slowing anyone else (one timer per connection, no
task). (2) The whole-request deadline: the body must be complete within `request_timeout` of that
same start, or the handler is stopped and the client gets 408 and is closed. (3) The connection cap:
past `max_connections` a new connection gets 503 and is closed at once; open ones carry on.
(4) Per-client quotas, checked after authentication and before the gateway does any work: POSTs
carrying requests in flight (`max_concurrent`) and JSON-RPC messages per second (a token bucket,
`rate` and `burst`); over either → 429 with `Retry-After`.

Does not own idle keep-alive connections (aiohttp's `keepalive_timeout`), header sizes (aiohttp's
parser, given its limits by `gatewayd.app.make_runner`), body size, nesting or batch length
(mcp_http.py and jsonrpc.py), turning HttpError into a response (app.py), or the hooks into aiohttp's
server that it builds on (aiohttp_hooks.py, the only module touching aiohttp's internals).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from aiohttp import web

from gatewayd.config.models import ClientLimits
from gatewayd.errors import HttpError
from gatewayd.jsonrpc import Message, Request
from gatewayd.policy import Principal
from gatewayd.settings import Settings
from gatewayd.web import aiohttp_hooks

logger = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# When the request's body must be complete (event-loop time), set as aiohttp makes the request.
BODY_DEADLINE = web.RequestKey("body_deadline", float)
# The client whose slot a request holds, given back when the request ends.
SLOT_HOLDER = web.RequestKey("slot_holder", str)

# A refused client may try again soon: connections and call slots free up as others finish.
RETRY_AFTER_BUSY = 1


def _raw_response(status: int, reason: str, text: str, extra_headers: str = "") -> bytes:
    """A complete HTTP/1.1 response that closes the connection, for when no request object exists."""
    body = text.encode("ascii")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n{extra_headers}\r\n"
    )
    return head.encode("ascii") + body


HEADERS_TOO_SLOW = _raw_response(408, "Request Timeout", "request headers not received in time\n")
TOO_MANY_CONNECTIONS = _raw_response(
    503, "Service Unavailable", "too many connections\n", f"Retry-After: {RETRY_AFTER_BUSY}\r\n"
)


# -- connections: header and request deadlines, the connection cap ---------------------------------


@dataclass(frozen=True)
class ConnectionLimits:
    """The per-connection limits, from settings."""

    header_timeout: float
    request_timeout: float
    max_connections: int

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(settings.header_timeout, settings.request_timeout, settings.max_connections)


class LimitedProtocol(aiohttp_hooks.Connection):
    """aiohttp's HTTP/1.1 protocol plus the connection cap and the header and request clocks.

    The clock of a request starts when the connection opens (first request) or at the first byte
    after the previous response (later ones), so an idle kept-alive connection is left to
    aiohttp's keep-alive timeout. The header timer stops when aiohttp has parsed the request and
    makes its request object (`request_started`); the body deadline from there on is enforced by
    `middleware`.
    """

    def __init__(self, manager: LimitedServer, *, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._gate = manager
        self._event_loop = loop
        # Bytes of the next request have arrived: a timeout then owes the client a 408.
        self._partial = False
        self._started_at: float | None = None
        # When the current request's headers are due (None: none are awaited). The timer is armed lazily and
        # left armed when a request starts in time: on a busy keep-alive connection it fires once per
        # header_timeout and re-arms, instead of being created and cancelled for every request.
        self._header_deadline: float | None = None
        self._header_timer: asyncio.Handle | None = None

    def refusal(self) -> bytes | None:
        return None if self._gate.admit() else TOO_MANY_CONNECTIONS

    def opened(self) -> None:
        self._start_clock()

    def closed(self) -> None:
        self._gate.release()
        self._stop_clock()
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def receiving_request(self) -> None:
        self._partial = True
        if self._header_deadline is None:
            self._start_clock()

    def request_started(self, request: web.BaseRequest) -> None:
        """The header clock stops; the body must be complete by the request's BODY_DEADLINE."""
        self._stop_clock()
        # A request parsed while an earlier one was handled (pipelining) starts its clock now.
        started = self._started_at if self._started_at is not None else self._event_loop.time()
        self._partial = False
        self._started_at = None
        request[BODY_DEADLINE] = started + self._gate.limits.request_timeout

    def bad_request(self, reason: str) -> None:
        # A malformed or oversized request (400) is the client's mistake: one debug line, not a traceback at
        # ERROR for each one, so a flood of bad requests cannot flood the log.
        logger.debug("bad request from %s: %s", self.peer, reason[:200])

    def _start_clock(self) -> None:
        self._started_at = self._event_loop.time()
        self._header_deadline = self._started_at + self._gate.limits.header_timeout
        if self._header_timer is None:
            self._header_timer = self._event_loop.call_at(self._header_deadline, self._headers_due)

    def _stop_clock(self) -> None:
        self._header_deadline = None

    def _headers_due(self) -> None:
        # Headers that arrived in this same loop turn reach request_started on the next one (aiohttp
        # wakes its reader task first): decide after it, so a request that made it in time is served.
        self._header_timer = self._event_loop.call_soon(self._headers_too_slow)

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        deadline = self._header_deadline
        if not self.is_open or deadline is None:
            return
        if self._event_loop.time() < deadline:
            # The timer was armed for an earlier request; this one's clock runs on.
            self._header_timer = self._event_loop.call_at(deadline, self._headers_due)
            return
        logger.debug("closing a connection whose request headers took over %ss", self._gate.limits.header_timeout)
        # A client that sent nothing gets no answer (it may be about to send, and would misread one).
        self.close_now(HEADERS_TOO_SLOW if self._partial else b"")


class LimitedServer(aiohttp_hooks.Server):
    """aiohttp's low-level server, making LimitedProtocol connections and counting them."""

    connection_class = LimitedProtocol

    def __init__(self, args: aiohttp_hooks.ServerArgs, *, limits: ConnectionLimits) -> None:
        super().__init__(args)
        self.limits = limits
        self._open = 0
        self._refusing = False

    @property
    def open_connections(self) -> int:
        """Connections admitted and not yet closed."""
        return self._open

    def admit(self) -> bool:
        """Count a new connection in, or say it must be refused."""
        if self._open >= self.limits.max_connections:
            if not self._refusing:
                # Once per episode: under a flood, one line per refused connection would be a flood too.
                logger.warning("connection limit %d reached: refusing new connections", self.limits.max_connections)
                self._refusing = True
            return False
        self._open += 1
        return True

    def release(self) -> None:
        self._open -= 1
        if self._refusing and self._open < self.limits.max_connections:
            logger.info("connections below the limit again: accepting")
            self._refusing = False


class LimitedRunner(aiohttp_hooks.Runner):
    """An AppRunner whose server is a LimitedServer; aiohttp arguments for each connection pass through."""

    def __init__(
        self,
        app: web.Application,
        *,
        limits: ConnectionLimits,
        shutdown_timeout: float,
        handler_cancellation: bool,
        **protocol_kwargs: Any,
    ) -> None:
        super().__init__(
            app, shutdown_timeout=shutdown_timeout, handler_cancellation=handler_cancellation, **protocol_kwargs
        )
        self._limits = limits

    def make_server(self, args: aiohttp_hooks.ServerArgs) -> LimitedServer:
        return LimitedServer(args, limits=self._limits)


def on_disconnect(request: web.BaseRequest) -> Callable[[Callable[[], None]], Callable[[], None]]:
    """How to be told that the request's client disconnected: give it a callback, get back how to take that back.
    Served by a plain aiohttp server (its test utilities), a disconnect is never reported."""
    connection = aiohttp_hooks.connection_of(request)
    if connection is not None:
        return connection.on_lost
    return _never_told


def _never_told(callback: Callable[[], None]) -> Callable[[], None]:
    return _nothing


def _nothing() -> None:
    return None


# -- the body deadline and the per-client slot, around every request -----------------------------


class _DeadlineLift:
    """Called at the body's end: from then on the request's deadline no longer applies."""

    def __init__(self, scope: asyncio.Timeout) -> None:
        self._scope = scope
        self.active = True

    def __call__(self) -> None:
        if self.active and not self._scope.expired():
            self._scope.reschedule(None)


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Stop the handler with 408 if the body is not in by the request's deadline; free the client's slot after."""
    try:
        # No deadline when served by a plain aiohttp server (aiohttp's test utilities, say).
        return await _within_deadline(request, handler, request.get(BODY_DEADLINE))
    finally:
        holder = request.get(SLOT_HOLDER)
        if holder is not None:
            request.app[CLIENT_LIMITER].release(holder)


async def _within_deadline(request: web.Request, handler: Handler, deadline: float | None) -> web.StreamResponse:
    if deadline is None or request.content.is_eof():
        # The body is already in (the usual case for a small POST): no deadline is left to enforce, and no timer
        # needs arming and cancelling on every request.
        return await handler(request)
    scope = asyncio.timeout_at(deadline)
    lift = _DeadlineLift(scope)
    try:
        async with scope:
            # Called at once if the body is already complete (or there is none).
            aiohttp_hooks.when_body_read(request, lift)
            try:
                return await handler(request)
            finally:
                lift.active = False
    except TimeoutError:
        if not scope.expired():
            raise
    connection = aiohttp_hooks.connection_of(request)
    if connection is not None:
        connection.cut_after_response()
    logger.debug("request body from %s not complete by its deadline", request.remote)
    raise HttpError(408, "request body not received in time", {"Connection": "close"})


# -- per-client quotas -------------------------------------------------------------------------------


class _Quota(NamedTuple):  # a NamedTuple: one is made per request, and a frozen dataclass is slower to make
    max_concurrent: int
    rate: float
    burst: int


@dataclass
class _Bucket:
    tokens: float
    updated: float


class ClientLimiter:
    """Per-client in-flight counts and token buckets, keyed by client name.

    Limits are resolved on every call from the principal (so a reloaded policy applies at once);
    only the counts and buckets persist. A message count above the burst is admitted when the
    bucket holds a full burst and leaves it in debt, so the sustained rate still holds.
    """

    def __init__(self, defaults: _Quota, clock: Callable[[], float] = time.monotonic) -> None:
        self._defaults = defaults
        self._clock = clock
        self._in_flight: dict[str, int] = {}
        self._buckets: dict[str, _Bucket] = {}

    @classmethod
    def from_settings(cls, settings: Settings, clock: Callable[[], float] = time.monotonic) -> ClientLimiter:
        return cls(_Quota(settings.client_max_concurrent, settings.client_rate, settings.client_burst), clock)

    def in_flight(self, client: str) -> int:
        """POSTs of `client` holding a slot now."""
        return self._in_flight.get(client, 0)

    def admit(self, principal: Principal, messages: int, holds_slot: bool) -> None:
        """Take `messages` tokens and, if `holds_slot`, a slot for `principal`; raise HttpError(429) if over."""
        quota = self._quota(principal.limits)
        name = principal.name
        if holds_slot and self.in_flight(name) >= quota.max_concurrent:
            raise HttpError(
                429, f"too many requests in flight (limit {quota.max_concurrent})",
                {"Retry-After": str(RETRY_AFTER_BUSY)},
            )
        self._take(name, messages, quota)
        if holds_slot:
            self._in_flight[name] = self.in_flight(name) + 1

    def release(self, client: str) -> None:
        """Give back one slot of `client`."""
        left = self.in_flight(client) - 1
        if left > 0:
            self._in_flight[client] = left
        else:
            self._in_flight.pop(client, None)

    def _quota(self, overrides: ClientLimits) -> _Quota:
        defaults = self._defaults
        return _Quota(
            overrides.max_concurrent if overrides.max_concurrent is not None else defaults.max_concurrent,
            overrides.rate if overrides.rate is not None else defaults.rate,
            overrides.burst if overrides.burst is not None else defaults.burst,
        )

    def _take(self, name: str, messages: int, quota: _Quota) -> None:
        now = self._clock()
        bucket = self._buckets.get(name)
        if bucket is None:  # not setdefault: that would build a bucket on every call only to drop it
            bucket = self._buckets[name] = _Bucket(float(quota.burst), now)
        bucket.tokens = min(float(quota.burst), bucket.tokens + (now - bucket.updated) * quota.rate)
        bucket.updated = now
        needed = min(messages, quota.burst)
        if bucket.tokens < needed:
            wait = max(1, math.ceil((needed - bucket.tokens) / quota.rate))
            raise HttpError(
                429, f"rate limit: {quota.rate:g} messages/s, burst {quota.burst}", {"Retry-After": str(wait)}
            )
        bucket.tokens -= messages


CLIENT_LIMITER = web.AppKey("client_limiter", ClientLimiter)


def admit_post(request: web.Request, principal: Principal, messages: Sequence[Message]) -> None:
    """Charge a parsed POST to its client: a token per message, and a slot if it carries requests.

    Notifications and responses alone are answered at once with 202, so they hold no slot; a client
    at its concurrency limit can still send `notifications/cancelled`.
    """
    holds_slot = any(isinstance(message, Request) for message in messages)
    request.app[CLIENT_LIMITER].admit(principal, len(messages), holds_slot)
    if holds_slot:
        request[SLOT_HOLDER] = principal.name
