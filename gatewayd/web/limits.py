"""Request and connection limits that aiohttp does not enforce itself: read deadlines, connection caps, per-client
quotas, and the process limits they depend on.

Owns six things. (1) The header deadline: a request's headers must arrive within `header_timeout` of
the connection opening or, on a kept-alive connection, of the request's first byte; a slow-loris
client then gets 408 and is closed, without slowing anyone else (one timer per connection, no
task). (2) The whole-request deadline: the body must be complete within `request_timeout` of that
same start, or the handler is stopped and the client gets 408 and is closed. (3) The connection caps:
past `max_connections` a new connection gets 503 and is closed at once; open ones carry on. A
connection is unauthenticated until one of its requests presents a valid token (`authenticated`);
those count in a share of `max_unauthenticated_connections`, wait between requests at most
`unauthenticated_idle_timeout`, and a new connection that finds the share (or everything) full closes
the unauthenticated one waiting longest instead of being refused (LimitedServer). (4) Per-client
quotas, checked after authentication and before the gateway does any work: POSTs carrying requests in
flight (`max_concurrent`) and JSON-RPC messages per second (a token bucket, `rate` and `burst`); over
either → 429 with `Retry-After`. (5) The open-file limit, fitted to the connection cap at start
(`fit_open_file_limit`). (6) The rate at which the event loop's own error reports (a failing accept)
reach the log (`LoopErrorLimit`).

Does not own idle keep-alive connections that authenticated (aiohttp's `keepalive_timeout`), header sizes
(aiohttp's parser, given its limits by `gatewayd.app.make_runner`), body size, nesting or batch length
(mcp_http.py and jsonrpc.py), turning HttpError into a response (app.py), or the hooks into aiohttp's
server that it builds on (aiohttp_hooks.py, the only module touching aiohttp's internals).
"""

from __future__ import annotations

import asyncio
import logging
import math
import resource
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
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

# What a JSON-RPC message of a tool call usually weighs, at most: a client allowed N messages a second is allowed
# N times this many bytes a second, if that is more than its byte rate.
MESSAGE_BYTES = 4096
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


# -- connections: header and request deadlines, the connection cap, the unauthenticated share -------


@dataclass(frozen=True)
class ConnectionLimits:
    """The per-connection limits, from settings (`max_connections` lowered if the open-file limit cannot hold it)."""

    header_timeout: float
    request_timeout: float
    max_connections: int
    max_unauthenticated: int
    unauthenticated_idle_timeout: float

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        return cls(settings.header_timeout, settings.request_timeout, settings.max_connections,
                   settings.max_unauthenticated_connections, settings.unauthenticated_idle_timeout)


# A connection is admitted before its first bytes are read (asyncio takes a burst of connections in one go), so a
# newcomer may close an unauthenticated one only once it has waited this long: a client of a burst of connections,
# its request already sent, is then told 503 instead of being closed unanswered. An idle socket is older than this.
EVICTION_GRACE = 0.1


class LimitedProtocol(aiohttp_hooks.Connection):
    """aiohttp's HTTP/1.1 protocol plus the connection cap, the unauthenticated share and the header and request
    clocks.

    The clock of a request starts when the connection opens (first request) or at the first byte
    after the previous response (later ones), so an idle kept-alive connection is left to
    aiohttp's keep-alive timeout. The header timer stops when aiohttp has parsed the request and
    makes its request object (`request_started`); the body deadline from there on is enforced by
    `middleware`. Until `authenticated`, the server also keeps the connection in its unauthenticated
    share whenever none of its requests is being answered (LimitedServer).
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
        # One of its requests presented a valid token (`authenticated`): an ordinary connection from then on.
        self.authenticated = False
        # In the server's counts. An evicted connection is counted out at once, before it has finished closing.
        self.counted = False
        # Run once the current response has been written out (or the connection closed): a client's slot is held
        # until then, so answers it does not read count against it.
        self._after_response: list[Callable[[], None]] = []

    def after_response(self, callback: Callable[[], None]) -> None:
        """Call `callback` once the current response is written out, or the connection closes."""
        self._after_response.append(callback)

    def _responded(self) -> None:
        callbacks, self._after_response = self._after_response, []
        for callback in callbacks:
            callback()

    def refusal(self) -> bytes | None:
        return None if self._gate.admit(self) else TOO_MANY_CONNECTIONS

    def opened(self) -> None:
        self._start_clock()

    def closed(self) -> None:
        self._responded()
        self._gate.release(self)
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
        if not self.authenticated:
            self._gate.answering(self)
        self._stop_clock()
        # A request parsed while an earlier one was handled (pipelining) starts its clock now.
        started = self._started_at if self._started_at is not None else self._event_loop.time()
        self._partial = False
        self._started_at = None
        request[BODY_DEADLINE] = started + self._gate.limits.request_timeout

    def response_sent(self, request: web.BaseRequest) -> None:
        self._responded()
        if not self.authenticated:
            self._gate.waiting(self)

    def bad_request(self, reason: str) -> None:
        # A malformed or oversized request (400) is the client's mistake: one debug line, not a traceback at
        # ERROR for each one, so a flood of bad requests cannot flood the log.
        logger.debug("bad request from %s: %s", self.peer, reason[:200])

    def authenticate(self) -> None:
        """A request on this connection presented a valid token."""
        self._gate.authenticated(self)
        self.authenticated = True

    def shed(self, farewell: bytes) -> None:
        """Close the connection between requests; `farewell` is sent only if the next one had begun to arrive (a
        client that sent nothing gets no answer: it may be about to send, and would misread one)."""
        self.close_now(farewell if self._partial else b"")

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
        self.shed(HEADERS_TOO_SLOW)


class LimitedServer(aiohttp_hooks.Server):
    """aiohttp's low-level server, making LimitedProtocol connections, counting them and keeping unauthenticated
    ones to their share.

    A connection is unauthenticated until one of its requests presents a valid token. Those not being
    answered right now (idle, or still sending a request's headers) wait in one queue, longest-waiting
    first: a new connection that finds the share (or all connections) full closes the queue's head instead
    of being refused (if it has waited EVICTION_GRACE), so idle sockets cannot lock out a client, who sends
    its request at once. One timer for the whole queue closes those that waited
    `unauthenticated_idle_timeout`. Authenticated connections are never closed for anyone. Every step is
    O(1), and none is taken for an authenticated connection.
    """

    connection_class = LimitedProtocol

    def __init__(self, args: aiohttp_hooks.ServerArgs, *, limits: ConnectionLimits) -> None:
        super().__init__(args)
        self.limits = limits
        self._running_loop = asyncio.get_running_loop()
        self._open = 0
        self._unauthenticated = 0
        # Unauthenticated connections between requests, each with since when (event-loop time), longest first.
        self._waiting: OrderedDict[LimitedProtocol, float] = OrderedDict()
        self._sweep: asyncio.Handle | None = None
        self._refusing = False
        self._evicting = False

    @property
    def open_connections(self) -> int:
        """Connections admitted and not yet closed."""
        return self._open

    @property
    def unauthenticated_connections(self) -> int:
        """Open connections none of whose requests has presented a valid token yet."""
        return self._unauthenticated

    def admit(self, connection: LimitedProtocol) -> bool:
        """Count a new connection in (closing the longest-waiting unauthenticated one to make room if need be), or
        say it must be refused."""
        limits = self.limits
        if self._open >= limits.max_connections:
            if not self._evict():
                self._refuse()
                return False
        elif self._unauthenticated >= limits.max_unauthenticated:
            # Over the share, the one waiting longest makes room. If none has waited EVICTION_GRACE, this is a burst of
            # clients still sending their first request: they are let in (the connection cap bounds them, and within
            # moments each has authenticated or runs into its idle deadline).
            self._evict()
        elif self._refusing or self._evicting:
            # The episode ends only when a newcomer finds room: under steady pressure each warning stays one line.
            logger.info("connections below their limits again")
            self._refusing = self._evicting = False
        self._open += 1
        self._unauthenticated += 1
        connection.counted = True
        self._wait(connection)
        return True

    def release(self, connection: LimitedProtocol) -> None:
        """The connection closed."""
        if connection.counted:
            self._count_out(connection)

    def authenticated(self, connection: LimitedProtocol) -> None:
        """A request on `connection` presented a valid token: it leaves the unauthenticated share for good."""
        if connection.counted:
            self._leave_share(connection)

    def answering(self, connection: LimitedProtocol) -> None:
        """A request on an unauthenticated connection is being answered: it is not idle, and not evicted."""
        self._waiting.pop(connection, None)

    def waiting(self, connection: LimitedProtocol) -> None:
        """An unauthenticated connection's response went out: it waits again, from now."""
        if connection.counted:
            self._wait(connection)

    def _wait(self, connection: LimitedProtocol) -> None:
        now = self._running_loop.time()
        self._waiting[connection] = now
        # Kept in the order it started waiting, so the head is always the one waiting longest.
        self._waiting.move_to_end(connection)
        if self._sweep is None:
            self._sweep = self._running_loop.call_at(now + self.limits.unauthenticated_idle_timeout, self._sweep_due)

    def _count_out(self, connection: LimitedProtocol) -> None:
        connection.counted = False
        self._open -= 1
        if not connection.authenticated:
            self._leave_share(connection)

    def _leave_share(self, connection: LimitedProtocol) -> None:
        self._unauthenticated -= 1
        self._waiting.pop(connection, None)

    def _evict(self) -> bool:
        if not self._waiting or next(iter(self._waiting.values())) > self._running_loop.time() - EVICTION_GRACE:
            return False
        if not self._evicting:
            # Once per episode (until a newcomer finds room): one line per eviction would be a flood of its own.
            logger.warning("connections at their limit (%d open of %d, %d unauthenticated of %d): each new one "
                           "closes the unauthenticated one waiting longest", self._open, self.limits.max_connections,
                           self._unauthenticated, self.limits.max_unauthenticated)
            self._evicting = True
        victim = next(iter(self._waiting))
        self._count_out(victim)
        victim.shed(TOO_MANY_CONNECTIONS)
        return True

    def _refuse(self) -> None:
        if not self._refusing:
            # Once per episode, as above.
            logger.warning("connection limit reached (%d open of %d, %d unauthenticated of %d), none idle to close: "
                           "refusing new connections", self._open, self.limits.max_connections,
                           self._unauthenticated, self.limits.max_unauthenticated)
            self._refusing = True

    def _sweep_due(self) -> None:
        # As for the header timer: a request whose headers arrived in this loop turn starts on the next one.
        self._sweep = self._running_loop.call_soon(self._close_idle)

    def _close_idle(self) -> None:
        self._sweep = None
        timeout = self.limits.unauthenticated_idle_timeout
        cutoff = self._running_loop.time() - timeout
        while self._waiting:
            connection, since = next(iter(self._waiting.items()))
            if since > cutoff:
                self._sweep = self._running_loop.call_at(since + timeout, self._sweep_due)
                return
            logger.debug("closing an unauthenticated connection from %s idle for %ss", connection.peer, timeout)
            self._count_out(connection)
            connection.shed(HEADERS_TOO_SLOW)


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
        # Read when the runner is set up; `fit_open_file_limit` may lower the connection cap before that.
        self.limits = limits

    def make_server(self, args: aiohttp_hooks.ServerArgs) -> LimitedServer:
        return LimitedServer(args, limits=self.limits)


def authenticated(request: web.BaseRequest) -> None:
    """`request` presented a valid token (a client's, an operator's or a scraper's): its connection is an ordinary
    one from now on, out of the unauthenticated share and its idle deadline. Called after every successful token
    check, so it costs an attribute read once the connection is marked."""
    connection = aiohttp_hooks.connection_of(request)
    if isinstance(connection, LimitedProtocol) and not connection.authenticated:
        connection.authenticate()


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


# -- the open-file limit, fitted to the connection cap -----------------------------------------------

# Descriptors the daemon holds besides client connections and tool server pipes: stdio, the event loop's selector
# and wake-up pipe, the listening sockets, the audit log, the files and watcher of a reload, the admin socket and a
# few gatewayctl connections on it.
FD_BASE_RESERVE = 64
# asyncio accepts up to a listener's backlog (aiohttp's TCPSite: 128) in one go before any is admitted or refused,
# so a burst of connections holds that many descriptors past the cap for a moment.
FD_ACCEPT_BURST = 128
# A tool server child's stdin, stdout and stderr pipes, twice: after a reload the old child drains beside its
# replacement.
FDS_PER_TOOL_SERVER = 2 * 3
# For tool servers a later reload adds: the limit is fitted once, at start.
FD_SLACK = 64


def descriptor_reserve(tool_servers: int) -> int:
    """Descriptors kept back from client connections for everything else the daemon holds open."""
    return FD_BASE_RESERVE + FD_ACCEPT_BURST + FD_SLACK + FDS_PER_TOOL_SERVER * tool_servers


def fit_open_file_limit(runner: web.AppRunner, tool_servers: int) -> None:
    """Make the open-file limit and the connection cap agree, before `runner` is set up: the soft RLIMIT_NOFILE is
    raised to what `max_connections` and the reserve need (as far as the hard limit allows); if that still falls
    short, the runner's connection cap is lowered to what fits, with one WARNING. Running out of descriptors instead
    would stop the admin socket and every tool server start as well as HTTP."""
    if not isinstance(runner, LimitedRunner):
        return
    cap = runner.limits.max_connections
    reserve = descriptor_reserve(tool_servers)
    available = _raise_open_file_limit(cap + reserve)
    if available >= cap + reserve:
        return
    fitted = max(1, available - reserve)
    logger.warning(
        "open-file limit %d leaves room for %d client connections, not max_connections=%d (%d descriptors are kept "
        "for the admin socket, the audit log and %d tool servers): serving at most %d; to serve %d, raise the limit "
        "to at least %d (LimitNOFILE= in the systemd unit, or ulimit -n)",
        available, fitted, cap, reserve, tool_servers, fitted, cap, cap + reserve,
    )
    runner.limits = replace(runner.limits, max_connections=fitted)


def _raise_open_file_limit(wanted: int) -> int:
    """Raise the soft open-file limit to `wanted` if it is lower, as far as the hard limit allows; return it then.
    Only as far as needed, not to the hard limit: tool servers inherit it, and some programs do work for every
    descriptor number below it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted if soft == resource.RLIM_INFINITY else soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target <= soft:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        logger.debug("could not raise the open-file limit from %d to %d: %s", soft, target, exc)
        return soft
    logger.info("raised the open-file limit from %d to %d", soft, target)
    return target


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
    """Stop the handler with 408 if the body is not in by the request's deadline; free the client's slot once its
    answer has been written out (an answer the client does not read keeps holding the slot)."""
    try:
        # No deadline when served by a plain aiohttp server (aiohttp's test utilities, say).
        return await _within_deadline(request, handler, request.get(BODY_DEADLINE))
    finally:
        holder = request.get(SLOT_HOLDER)
        if holder is not None:
            limiter = request.app[CLIENT_LIMITER]
            connection = aiohttp_hooks.connection_of(request)
            if isinstance(connection, LimitedProtocol):
                connection.after_response(lambda: limiter.release(holder))
            else:
                limiter.release(holder)


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


class _Quota(NamedTuple):
    max_concurrent: int
    rate: float
    burst: int


class _Bucket:
    """A token bucket: `rate` a second up to `burst`. More than a whole burst is admitted on a full bucket and leaves
    it in debt, so the sustained rate still holds."""

    __slots__ = ("rate", "burst", "tokens", "updated", "unit")

    def __init__(self, rate: float, burst: int, now: float, unit: str) -> None:
        self.rate, self.burst, self.tokens, self.updated, self.unit = rate, burst, float(burst), now, unit

    def take(self, amount: int, now: float) -> None:
        """Take `amount`, or raise HttpError(429) saying how long to wait."""
        rate, burst = self.rate, self.burst
        tokens = min(burst, self.tokens + (now - self.updated) * rate)
        self.updated = now
        needed = min(amount, burst)
        if tokens < needed:
            self.tokens = tokens
            wait = max(1, math.ceil((needed - tokens) / rate))
            raise HttpError(429, f"rate limit: {rate:g} {self.unit}/s, burst {burst}", {"Retry-After": str(wait)})
        self.tokens = tokens - amount


class _Client:
    """One client's POSTs holding a slot and its two buckets, with the limits their quotas were resolved from."""

    __slots__ = ("limits", "max_concurrent", "in_flight", "messages", "bytes")

    def __init__(self, limits: ClientLimits, messages: _Quota, bytes_quota: _Quota, now: float) -> None:
        self.limits = limits
        self.max_concurrent = messages.max_concurrent
        self.in_flight = 0
        self.messages = _Bucket(messages.rate, messages.burst, now, "messages")
        self.bytes = _Bucket(bytes_quota.rate, bytes_quota.burst, now, "bytes")


class ClientLimiter:
    """Per-client in-flight counts and token buckets, keyed by client name.

    A client's quotas are resolved from its principal's limits when those are first seen, and again when a reloaded
    policy gives it others (so they apply at once): one identity check a request, not a resolution. The counts and
    buckets persist across reloads.
    """

    def __init__(self, defaults: _Quota, clock: Callable[[], float] = time.monotonic,
                 bytes_rate: float = math.inf, bytes_burst: int = 2**62) -> None:
        self._defaults = defaults
        self._clock = clock
        self._bytes = _Quota(0, bytes_rate, bytes_burst)
        self._clients: dict[str, _Client] = {}

    @classmethod
    def from_settings(cls, settings: Settings, clock: Callable[[], float] = time.monotonic) -> ClientLimiter:
        return cls(_Quota(settings.client_max_concurrent, settings.client_rate, settings.client_burst), clock,
                   settings.client_bytes_rate, max(settings.client_bytes_burst, settings.max_body_bytes))

    def admit_bytes(self, principal: Principal, size: int) -> None:
        """Charge `size` request bytes to `principal`; raise HttpError(429) when over its byte rate."""
        self._client(principal).bytes.take(size, self._clock())

    def in_flight(self, client: str) -> int:
        """POSTs of `client` holding a slot now."""
        known = self._clients.get(client)
        return 0 if known is None else known.in_flight

    def admit(self, principal: Principal, messages: int, holds_slot: bool) -> None:
        """Take `messages` tokens and, if `holds_slot`, a slot for `principal`; raise HttpError(429) if over."""
        client = self._client(principal)
        if holds_slot and client.in_flight >= client.max_concurrent:
            raise HttpError(
                429, f"too many requests in flight (limit {client.max_concurrent})",
                {"Retry-After": str(RETRY_AFTER_BUSY)},
            )
        client.messages.take(messages, self._clock())
        if holds_slot:
            client.in_flight += 1

    def release(self, client: str) -> None:
        """Give back one slot of `client`."""
        known = self._clients.get(client)
        if known is not None and known.in_flight > 0:
            known.in_flight -= 1

    def _client(self, principal: Principal) -> _Client:
        client = self._clients.get(principal.name)
        if client is None or client.limits is not principal.limits:
            client = self._resolve(principal, client)
        return client

    def _resolve(self, principal: Principal, known: _Client | None) -> _Client:
        """`principal`'s quotas from its limits over the defaults. A client allowed more messages is allowed
        MESSAGE_BYTES for each of them, if that is more than its byte quota: lifting a client's message rate lifts
        its byte rate with it."""
        overrides, defaults, byte_defaults = principal.limits, self._defaults, self._bytes
        messages = _Quota(
            overrides.max_concurrent if overrides.max_concurrent is not None else defaults.max_concurrent,
            overrides.rate if overrides.rate is not None else defaults.rate,
            overrides.burst if overrides.burst is not None else defaults.burst,
        )
        rate = overrides.bytes_rate if overrides.bytes_rate is not None else byte_defaults.rate
        burst = overrides.bytes_burst if overrides.bytes_burst is not None else byte_defaults.burst
        bytes_quota = _Quota(0, max(rate, messages.rate * MESSAGE_BYTES), max(burst, messages.burst * MESSAGE_BYTES))
        if known is None:
            known = self._clients[principal.name] = _Client(overrides, messages, bytes_quota, self._clock())
            return known
        known.limits, known.max_concurrent = overrides, messages.max_concurrent
        known.messages.rate, known.messages.burst = messages.rate, messages.burst
        known.bytes.rate, known.bytes.burst = bytes_quota.rate, bytes_quota.burst
        return known


CLIENT_LIMITER = web.AppKey("client_limiter", ClientLimiter)


def close_unless_read(request: web.BaseRequest, response: web.StreamResponse) -> None:
    """A refusal sent before the request's body was read closes the connection: reading and dropping megabytes the
    answer does not need (aiohttp's lingering read) would cost the daemon more than the client's reconnect."""
    if not request.can_read_body or request.content.is_eof():
        return
    response.headers["Connection"] = "close"
    connection = aiohttp_hooks.connection_of(request)
    if connection is not None:
        connection.cut_after_response()


def admit_body(request: web.Request, principal: Principal, size: int) -> None:
    """Charge a POST's body bytes to its client, before they are read if the length was declared."""
    request.app[CLIENT_LIMITER].admit_bytes(principal, size)


def admit_post(request: web.Request, principal: Principal, messages: Sequence[Message]) -> None:
    """Charge a parsed POST to its client: a token per message, and a slot if it carries requests.

    Notifications and responses alone are answered at once with 202, so they hold no slot; a client
    at its concurrency limit can still send `notifications/cancelled`.
    """
    holds_slot = any(isinstance(message, Request) for message in messages)
    request.app[CLIENT_LIMITER].admit(principal, len(messages), holds_slot)
    if holds_slot:
        request[SLOT_HOLDER] = principal.name


def give_back_slot(request: web.Request) -> None:
    """The request became a stream bounded by a limit of its own (a `subscriptions/listen`, as a session's GET stream
    is): it is no call in flight, and gives its client's slot back now."""
    holder = request.pop(SLOT_HOLDER, None)
    if holder is not None:
        request.app[CLIENT_LIMITER].release(holder)


# -- the event loop's error reports ------------------------------------------------------------------

# asyncio logs what it cannot raise (an accept failing for want of descriptors, an exception in a callback) with a
# traceback at ERROR, once per occurrence; Python 3.11 retries a failing accept up to the backlog in each loop turn,
# hundreds of lines a second. This many reports of one kind are logged in full per window...
LOOP_REPORTS_PER_WINDOW = 5
# ...and the rest only counted, in one line when the window ends.
LOOP_REPORT_WINDOW = 60.0
# Reports are of one kind when their messages start alike, up to any repr in them (which carries ids and times).
LOOP_REPORT_KIND_CHARS = 80
# Kinds tallied at once; reports of further kinds share one tally, so odd messages cannot grow the table.
LOOP_REPORT_KINDS = 64
OTHER_KINDS = "(other kinds)"


@dataclass
class _Tally:
    logged: int = 0
    suppressed: int = 0


class LoopErrorLimit:
    """An event loop exception handler logging at most `per_window` reports of each kind in each `window` seconds
    (through the handler it replaces, else the loop's default one), then one line counting the rest."""

    def __init__(
        self,
        previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None = None,
        per_window: int = LOOP_REPORTS_PER_WINDOW,
        window: float = LOOP_REPORT_WINDOW,
    ) -> None:
        self._previous = previous
        self._per_window = per_window
        self._window = window
        self._tallies: dict[str, _Tally] = {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        tally = self._tally(loop, _report_kind(context))
        if tally.logged >= self._per_window:
            tally.suppressed += 1
            return
        tally.logged += 1
        if self._previous is not None:
            self._previous(loop, context)
        else:
            loop.default_exception_handler(context)

    def _tally(self, loop: asyncio.AbstractEventLoop, kind: str) -> _Tally:
        tally = self._tallies.get(kind)
        if tally is None and len(self._tallies) >= LOOP_REPORT_KINDS:
            kind = OTHER_KINDS
            tally = self._tallies.get(kind)
        if tally is None:
            tally = self._tallies[kind] = _Tally()
            # A kind's window opens with its first report; a kind that stops recurring is forgotten when it ends.
            loop.call_later(self._window, self._window_over, kind)
        return tally

    def _window_over(self, kind: str) -> None:
        tally = self._tallies.pop(kind)
        if tally.suppressed:
            logger.error("%d more event loop error reports %r in the last %gs were not logged",
                         tally.suppressed, kind, self._window)


def _report_kind(context: dict[str, Any]) -> str:
    stem = str(context.get("message", "")).split("<", 1)[0][:LOOP_REPORT_KIND_CHARS].strip()
    exception = context.get("exception")
    return f"{stem} ({type(exception).__name__})" if exception is not None else stem


def limit_loop_error_reports() -> None:
    """Wrap the running loop's exception handler in a LoopErrorLimit (once: a second call leaves it as it is)."""
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    if not isinstance(previous, LoopErrorLimit):
        loop.set_exception_handler(LoopErrorLimit(previous))
