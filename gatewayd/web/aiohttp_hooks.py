"""The only gatewayd module that touches aiohttp's internals: hooks into its HTTP server, in gatewayd terms.

aiohttp documents no way to see a connection open, its bytes arrive, a request's headers finish
parsing or its response go out, nor to refuse a connection before aiohttp takes it; limits.py needs all
of these. This module gets them from aiohttp's undocumented classes and gives limits.py (and anything
else) a small surface instead:

- `Connection`: one HTTP/1.1 connection, aiohttp's protocol with hooks to override (`refusal`,
  `opened`, `receiving_request`, `request_started`, `response_sent`, `bad_request`, `closed`) and a few
  services (`cut_after_response`, `close_now`, `on_lost`, `is_open`, `peer`).
- `Server`: aiohttp's low-level server, making `connection_class` connections and telling each when a
  request starts.
- `Runner`: aiohttp's AppRunner, serving the app through `make_server`'s Server, and the routes it is
  given as `direct` without the router (`Direct`).
- `connection_of(request)` and `when_body_read(request, callback)`, for code holding a request.
- `write_now(response, data)`: a streamed response's write, done at once when it needs no wait.

What it relies on, none of it documented (checked by tests/web/test_aiohttp_hooks.py, by name):

- `web.AppRunner._make_server()`: the coroutine `setup()` awaits to start and freeze the app and build
  its `web.Server`; that server's `request_handler` and `request_factory` attributes.
- `web.Server(handler, request_factory=..., handler_cancellation=..., **protocol_kwargs)`, and
  `Server.__call__` being the protocol factory the sites hand to the event loop.
- The request factory's arguments `(message, payload, protocol, writer, task)`, and that aiohttp calls
  it once a request's headers are parsed, just before its handler runs.
- `aiohttp.web_protocol.RequestHandler`: `__init__(manager, *, loop, **protocol_kwargs)`; its
  `connection_made`, `connection_lost` and `data_received`, which may be skipped entirely for a
  connection refused on arrival; `finish_response(request, response, start_time)`, awaited once each
  response is written; `log_exception(..., exc_info=...)`, called with an
  `aiohttp.http_exceptions.HttpProcessingError` (and its `message`) for a malformed or oversized
  request; `force_close()`; `transport`; `peername`.
- `BaseRequest.protocol` (the request's RequestHandler) and `StreamReader.on_eof(callback)` (called
  at once if the body is complete already).
- `WholeResponse`: that `finish_response` sends a response by `await resp.prepare(request)` then `await
  resp.write_eof()`, and reads nothing of it after but `keep_alive`; `StreamResponse`'s `_keep_alive`,
  `_eof_sent`, `_req`, `_payload_writer`, `_body_length`, `_status`, `_reason` and `_headers`; a request's
  `_payload_writer` (its StreamWriter, whose `drain()` waits while the transport's buffer is over its limit).
- `Connection.resume_reading`: that a protocol's transport and parser are paused only by `pause_reading` and
  `_pause_reading_for_buffer`, which set `_reading_paused` and `_buffer_paused` first (so with neither set,
  `resume_reading` has nothing to resume, and its parser nothing held back to emit).
- `Direct`: that `Application._handle` resolves a request's route with the router, sets it as the request's
  `_match_info` (a `UrlMappingMatchInfo(match_dict, route)` given the app by `add_app` and frozen), answers
  an `Expect` header, and awaits the route's handler wrapped in the app's new-style middlewares, the first
  outermost, each as `partial(middleware, handler=inner)`; the server awaiting what its request handler returns.
- `write_now`: that `StreamWriter.write(chunk)` of an uncompressed body without a declared length, with no
  `_on_chunk_sent` or `on_body_write` observer and its headers out (`_headers_written`), is
  `_write_chunked_payload(chunk)` when `chunked`, else `_write(chunk)`, then a drain that waits only while the
  protocol's `writing_paused`; a response's `_payload_writer` and `_eof_sent`.
- On Python 3.11: `RequestHandler.start` making each request's task with `self._loop.create_task(coro)` of a
  `RequestHandler._handle_request` coroutine, and awaiting it at once; the protocol's loop being its `_loop`
  attribute, not passed on to anything that needs the loop itself (its requests and bodies get the server's).
  See `_HandlersInline`.

How to check a new aiohttp: widen `TESTED` (and, to the same range, the requirement in pyproject.toml),
install it, run tests/web/test_aiohttp_hooks.py (each hook's shape, and each hook firing over a real
connection), then tests/web/test_limits.py (their use: deadlines, the connection cap, bad requests),
and read aiohttp's changes to web_protocol.py, web_server.py and web_runner.py for changed timing,
such as when the request factory is called.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from functools import partial
from typing import Any, ClassVar, NamedTuple, cast

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import SERVER_SOFTWARE, HttpVersion10, HttpVersion11
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import RawRequestMessage
from aiohttp.http_writer import StreamWriter
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_urldispatcher import PlainResource, UrlMappingMatchInfo

from gatewayd.once import Once

logger = logging.getLogger(__name__)

# The aiohttp versions gatewayd was checked against; pyproject.toml requires exactly this range. The floor is not
# this module's: `web.RequestKey` (limits.py) is new in aiohttp 3.14. With str keys instead, these hooks and
# limits.py's tests also held on 3.9.5, 3.11.18 and 3.13.5, but the `max_headers` count is enforced from 3.13.4 only.
TESTED = ">=3.14,<3.15"

_AppHandler = Callable[[BaseRequest], Awaitable[web.StreamResponse]]
_RouteHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_RequestFactory = Callable[
    [RawRequestMessage, StreamReader, RequestHandler, AbstractStreamWriter, "asyncio.Task[None]"], BaseRequest
]

# aiohttp's own methods, called directly on the hot path (each byte chunk, each response): cheaper than super().
_data_received = RequestHandler.data_received
_finish_response = RequestHandler.finish_response
_resume_reading = RequestHandler.resume_reading
# What `RequestHandler.start` runs for each request: its handler, then the response written.
_HANDLE_REQUEST = RequestHandler._handle_request.__code__
# A WholeResponse's body up to this size goes out in one write with its head (copied once); a larger one apart.
WHOLE_JOIN_BYTES = 64 * 1024
# From Python 3.12 aiohttp starts each request's task eagerly: it runs at once, in the loop turn that parsed it.
HANDLERS_INLINE = sys.version_info < (3, 12)


class _HandlersInline:
    """The event loop as one connection's aiohttp protocol sees it on Python 3.11: the same loop, except that a
    request's handler runs in the connection's own task (the one reading its requests) instead of in a task made
    for that request.

    aiohttp makes that task only to give each request a copy of the context variables (gatewayd sets none), and
    awaits it at once: on 3.11 it costs a task, two loop callbacks and a loop turn a request, ~400 of the ~9,000
    bytecodes a call runs (bench.opcount), ×1.03–1.05 calls/s at 1 and 8 in flight (bench.ab). A request's
    `asyncio.current_task()` is therefore its connection's task, the same for every request the connection
    carries: whatever cancels it (a stopped call, a client gone) must take its cancellation back (`uncancel`)
    when it is handled, as inflight.py and web/modern.py do, or it reaches the connection. Every other
    coroutine becomes a task as usual; every other attribute is the loop's own."""

    __slots__ = ("_loop", "time", "create_future", "call_at", "call_soon")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # What aiohttp's protocol uses of its loop per request: the loop's own bound methods, without a look-up.
        self.time = loop.time
        self.create_future = loop.create_future
        self.call_at = loop.call_at
        self.call_soon = loop.call_soon

    def create_task(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if getattr(coro, "cr_code", None) is _HANDLE_REQUEST:
            # `start` awaits this at once, and a coroutine is as awaitable as its task.
            return coro
        return self._loop.create_task(coro)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loop, name)


class Connection(RequestHandler):
    """One HTTP/1.1 connection: aiohttp's protocol, plus hooks a subclass overrides (here: every connection is
    served, a bad request logged at debug, nothing else done).

    A connection is between requests when it opens and again once a response is sent and that
    request's body has been read to its end (aiohttp reads and drops what a handler left); bytes
    arriving then are the next request's.
    """

    def __init__(self, server: Server, *, loop: asyncio.AbstractEventLoop, **protocol_kwargs: Any) -> None:
        super().__init__(server, loop=loop, **protocol_kwargs)
        if HANDLERS_INLINE:
            self._loop = cast(asyncio.AbstractEventLoop, _HandlersInline(loop))
        # Handed to aiohttp, and not yet closed.
        self._served = False
        # Between requests: bytes arriving start the next one.
        self._idle = False
        self._cut_after_response = False
        # The client goes away (a call waiting for approval is then withdrawn).
        self._lost = Once()

    # -- hooks --------------------------------------------------------------------------------------

    def refusal(self) -> bytes | None:
        """A connection arrived: None to serve it, or a whole raw HTTP response to send it before closing it.
        A refused connection is never handed to aiohttp (no task, no parser work), and none of the other
        hooks is called for it."""
        return None

    def opened(self) -> None:
        """aiohttp has taken the connection."""

    def receiving_request(self) -> None:
        """Bytes arrived between requests: the start of the next one (called for each chunk until it starts)."""

    def request_started(self, request: web.BaseRequest) -> None:
        """aiohttp parsed `request`'s headers and is about to handle it."""

    def response_sent(self, request: web.BaseRequest) -> None:
        """`request`'s response went out (or could not: the client left). Its body may still be arriving; aiohttp
        reads and drops the rest before the next request."""

    def bad_request(self, reason: str) -> None:
        """aiohttp refused a malformed or oversized request (400); it logs nothing itself about it."""
        logger.debug("bad request from %s: %s", self.peer, reason[:200])

    def closed(self) -> None:
        """The connection closed (a served one: `refusal` returned None); aiohttp has not let go of it yet."""

    # -- services -----------------------------------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """False once the connection has closed."""
        return self.transport is not None

    @property
    def peer(self) -> Any:
        """The client's address, for logs."""
        return self.peername

    def on_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` when this connection closes (at once if it has); returns how to cancel that."""
        if self.transport is None or self.transport.is_closing():
            self._lost.fire()
        return self._lost.add(callback)

    def cut_after_response(self) -> None:
        """Close the connection as soon as the current response is sent (no lingering read of the body)."""
        self._cut_after_response = True

    def close_now(self, farewell: bytes = b"") -> None:
        """Send `farewell` (a whole raw HTTP response, for when no request object exists), then close at once."""
        if farewell and self.transport is not None:
            self.transport.write(farewell)
        self.force_close()

    # -- aiohttp's methods, calling the hooks ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        refusal = self.refusal()
        if refusal is not None:
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(refusal)
            transport.close()
            return
        self._served = True
        self._idle = True
        super().connection_made(transport)
        self.opened()

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._served:
            # Refused: aiohttp never had it.
            return
        self._served = False
        self._idle = False
        self.closed()
        self._lost.fire()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._idle and data:
            self.receiving_request()
        _data_received(self, data)

    def resume_reading(self, resume_parser: bool = True) -> None:
        # A request's body resumes reading as it is read and again at its end (StreamReader), paused or not, and
        # aiohttp then feeds its parser no bytes and resumes a transport that reads already: ~150 bytecodes a
        # request. Nothing is paused unless one of these is set (the parser's pending messages set the second).
        if self._reading_paused or self._buffer_paused:
            _resume_reading(self, resume_parser)

    async def finish_response(
        self, request: BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        result = await _finish_response(self, request, resp, start_time)
        self.response_sent(request)
        if self._cut_after_response:
            self.force_close()
        else:
            # Bytes still arriving for this body (aiohttp reads and drops them) are not the next request's.
            request.content.on_eof(self._become_idle)
        return result

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            self.bad_request(exc.message)
            return
        super().log_exception(*args, **kwargs)

    def _become_idle(self) -> None:
        self._idle = True


class WholeResponse(web.StreamResponse):
    """A response whose whole body is in hand as bytes (a JSON-RPC answer), sent as aiohttp sends one: the status
    line, its headers, Content-Length, Date, Server and the Connection header aiohttp's keep-alive rules give, in
    one write of the transport (two for a body over WHOLE_JOIN_BYTES), instead of through aiohttp's header
    machinery and stream writer: ~600 fewer bytecodes a response (bench.opcount). Like aiohttp's own, `write_eof`
    returns once the transport has taken the bytes below its limit, so a client that does not read its answers
    keeps what waits on them (its slot: limits.py) held. Not for cookies, compression, chunking, a streamed body, a
    status without a body, or an app with `on_response_prepare` handlers (gatewayd has none): web.Response's."""

    def __init__(self, body: bytes, *, status: int = 200, content_type: str,
                 headers: dict[str, str] | None = None) -> None:
        if status < 200 or status in (204, 304):
            raise ValueError(f"a {status} response has no body")
        super().__init__(status=status, headers=headers)
        self._headers[hdrs.CONTENT_TYPE] = content_type
        self._whole = body

    async def prepare(self, request: BaseRequest) -> AbstractStreamWriter | None:
        if self._eof_sent:
            return None
        if self._payload_writer is not None:
            return self._payload_writer
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the client is gone")
        self._req = request
        writer = self._payload_writer = request._payload_writer
        head = self._head(request)
        body = self._whole if request.method != hdrs.METH_HEAD else b""
        if len(body) <= WHOLE_JOIN_BYTES:
            transport.write(head.encode("utf-8") + body)
        else:
            transport.write(head.encode("utf-8"))
            transport.write(body)
        return writer

    def _head(self, request: BaseRequest) -> str:
        """The status line and headers, and the blank line after them."""
        keep_alive = self._keep_alive
        if keep_alive is None:
            keep_alive = self._keep_alive = request.keep_alive
        version = request.version
        headers = self._headers
        if hdrs.CONTENT_LENGTH in headers:
            del headers[hdrs.CONTENT_LENGTH]  # the body's own length is the one sent
        fields = list(map("%s: %s".__mod__, headers.items()))
        # Checked as aiohttp's own serializer checks them: a line break in a header would split the response.
        given = "".join(fields)
        if "\r" in given or "\n" in given:
            raise ValueError("a response header holds a line break")
        lines = [f"HTTP/{version[0]}.{version[1]} {self._status} {self._reason}", *fields,
                 f"Content-Length: {len(self._whole)}"]
        if hdrs.DATE not in headers:
            lines.append(f"Date: {rfc822_formatted_time()}")
        if hdrs.SERVER not in headers:
            lines.append(f"Server: {SERVER_SOFTWARE}")
        if hdrs.CONNECTION not in headers:
            if keep_alive and version == HttpVersion10:
                lines.append("Connection: keep-alive")
            elif not keep_alive and version == HttpVersion11:
                lines.append("Connection: close")
        lines.append("\r\n")
        return "\r\n".join(lines)

    async def write_eof(self, data: bytes = b"") -> None:
        if self._eof_sent:
            return
        writer = self._payload_writer
        assert writer is not None and not data, "prepare() sends the whole body"
        await writer.drain()
        self._eof_sent = True
        self._req = None
        self._body_length = len(self._whole)
        self._payload_writer = None


class Direct:
    """The app's request handler, except that a request for one of its `routes` (a method and an exact path, no
    query) goes to that route's handler through the app's middlewares without the router.

    For every request aiohttp's `Application._handle` walks the router's index for the path, makes and freezes a
    match for it, and looks its middleware chain up: ~230 of the ~7,750 bytecodes a gatewayd call runs, ×1.03–1.06
    calls/s (bench.ab). A direct route's match and chain are made once: what its handler and middlewares see is the
    same (`request.app`, `request.match_info.route`); the match is shared by its requests, and is empty (a plain
    path has no parts) and frozen. Anything else, and a request with an `Expect` header (which `_handle` answers
    first), goes to the app's handler."""

    __slots__ = ("_app_handler", "_routes")

    def __init__(self, app: web.Application, app_handler: _AppHandler, routes: Iterable[tuple[str, str]]) -> None:
        self._app_handler = app_handler
        self._routes: dict[tuple[str, str], tuple[UrlMappingMatchInfo, _RouteHandler]] = {}
        for method, path in routes:
            route = _plain_route(app, method, path)
            match = UrlMappingMatchInfo({}, route)
            match.add_app(app)
            match.freeze()
            handler: _RouteHandler = route.handler
            for middleware in reversed(app.middlewares):
                if getattr(middleware, "__middleware_version__", None) != 1:
                    raise ValueError(f"{middleware!r} is an old-style middleware: {method} {path} cannot be direct")
                handler = partial(middleware, handler=handler)
            self._routes[(method, path)] = (match, handler)

    def __call__(self, request: BaseRequest) -> Awaitable[web.StreamResponse]:
        direct = self._routes.get((request.method, request.raw_path))
        if direct is None or hdrs.EXPECT in request.headers:
            return self._app_handler(request)
        match, handler = direct
        routed = cast(web.Request, request)  # the app's request factory makes web.Requests
        routed._match_info = match
        return handler(routed)


def _plain_route(app: web.Application, method: str, path: str) -> web.AbstractRoute:
    for route in app.router.routes():
        if route.method == method and isinstance(route.resource, PlainResource) and route.resource.canonical == path:
            return route
    raise ValueError(f"no route {method} {path} with a plain path to serve directly")


class ServerArgs(NamedTuple):
    """How aiohttp would make the app's server: what `Server` is made from (opaque outside this module)."""

    handler: _AppHandler
    request_factory: _RequestFactory
    handler_cancellation: bool
    protocol_kwargs: dict[str, Any]


class Server(web.Server):
    """aiohttp's low-level server, making `connection_class` connections and telling each when a request starts."""

    connection_class: ClassVar[type[Connection]] = Connection

    def __init__(self, args: ServerArgs) -> None:
        super().__init__(
            args.handler,
            request_factory=self._start_request,
            handler_cancellation=args.handler_cancellation,
            **args.protocol_kwargs,
        )
        self._app_request_factory = args.request_factory
        self._protocol_kwargs = args.protocol_kwargs
        self._event_loop = asyncio.get_running_loop()

    def __call__(self) -> RequestHandler:
        return self.connection_class(self, loop=self._event_loop, **self._protocol_kwargs)

    def _start_request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> BaseRequest:
        # aiohttp calls this once a request's headers are parsed, just before handling it.
        request = self._app_request_factory(message, payload, protocol, writer, task)
        if isinstance(protocol, Connection):
            protocol._idle = False
            protocol.request_started(request)
        return request


class Runner(web.AppRunner):
    """aiohttp's AppRunner (no signal handling), serving the app through `make_server`'s Server, and the routes in
    `direct` (method, path) without the router (`Direct`); the aiohttp arguments for each connection
    (`keepalive_timeout`, `max_line_size`, ...) pass through."""

    def __init__(
        self, app: web.Application, *, shutdown_timeout: float, handler_cancellation: bool,
        direct: Iterable[tuple[str, str]] = (), **protocol_kwargs: Any,
    ) -> None:
        super().__init__(
            app,
            handle_signals=False,
            shutdown_timeout=shutdown_timeout,
            handler_cancellation=handler_cancellation,
            **protocol_kwargs,
        )
        self._handler_cancellation = handler_cancellation
        self._protocol_kwargs = protocol_kwargs
        # Routes served without the router (Direct): the hot ones.
        self._direct = tuple(direct)

    def make_server(self, args: ServerArgs) -> Server:
        """The server for the app, made once when the runner is set up."""
        return Server(args)

    async def _make_server(self) -> web.Server:
        # AppRunner's server starts and freezes the app; only its handler and request factory are kept.
        plain = await super()._make_server()
        handler = plain.request_handler
        if self._direct:
            handler = Direct(self.app, handler, self._direct)
        return self.make_server(
            ServerArgs(handler, plain.request_factory, self._handler_cancellation, self._protocol_kwargs)
        )


def connection_of(request: web.BaseRequest) -> Connection | None:
    """The connection `request` came on; None when served by a plain aiohttp server (its test utilities)."""
    protocol = request.protocol
    return protocol if isinstance(protocol, Connection) else None


def write_now(response: web.StreamResponse, data: bytes) -> bool:
    """Write `data` on a prepared streamed response at once, as `await response.write(data)` would, when that needs
    no wait: its headers are out and its transport is under its high-water mark. False, with nothing written, when it
    would wait (or the response is not one this knows how to write): the caller then awaits `response.write`.
    Raises ConnectionResetError when the client is gone.

    For a stream that writes from a callback (an SSE notification as the child's line is read) instead of waking a
    task to write it: one loop turn and a task step less a notification."""
    if not data:
        return True  # as aiohttp writes nothing for it: an empty chunk would end a chunked body
    writer = response._payload_writer
    if (not isinstance(writer, StreamWriter) or response._eof_sent or not writer._headers_written
            or writer._compress is not None or writer._on_chunk_sent is not None or writer.on_body_write is not None
            or writer.length is not None or writer.protocol.writing_paused):
        return False
    if writer.chunked:
        writer._write_chunked_payload(data)
    else:
        writer._write(data)
    return True


def when_body_read(request: web.BaseRequest, callback: Callable[[], None]) -> None:
    """Call `callback` once `request`'s body has been read to its end (at once if it has, or there is none)."""
    request.content.on_eof(callback)
