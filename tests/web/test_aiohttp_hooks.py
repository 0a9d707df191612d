"""The fence around aiohttp's internals (gatewayd/web/aiohttp_hooks.py): the aiohttp range it declares is the one
pyproject.toml requires and the installed one is in it; each private attribute it relies on exists with the shape
it expects; and over a real loopback connection each hook fires when it says. An aiohttp upgrade that breaks a hook
fails here, by the hook's name."""

from __future__ import annotations

import asyncio
import inspect
import tomllib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import base_protocol, web, web_protocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_writer import StreamWriter
from aiohttp.streams import EmptyStreamReader, StreamReader
from aiohttp.test_utils import make_mocked_request
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_urldispatcher import UrlMappingMatchInfo
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from gatewayd.web import aiohttp_hooks
from tests.stack import dechunked, serving
from tests.waiting import eventually

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# Bound on every wait for the server to answer or close.
DEADLINE = 5.0
# Requests sent in one write: more than aiohttp queues on a connection before it stops reading (32).
PIPELINED = 80
# A body many times aiohttp's read buffer (its StreamReader pauses reading past 2 × 64 KiB), under its 1 MiB limit.
LARGE_BODY = 1000 * 1024
# Chunks a streaming handler writes at once before its client, reading nothing, must have made it stop (a few MiB
# fill a loopback connection's buffers), and how large each is.
MAX_CHUNKS = 4096
CHUNK = b"x" * 16 * 1024


# -- the declared range ------------------------------------------------------------------------------


def test_pyproject_requires_exactly_the_range_the_fence_was_checked_against() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    requirements = [Requirement(text) for text in dependencies]
    (aiohttp_requirement,) = [requirement for requirement in requirements if requirement.name == "aiohttp"]
    assert aiohttp_requirement.specifier == SpecifierSet(aiohttp_hooks.TESTED)
    # An upper bound: a new aiohttp is taken only once the fence has been checked against it.
    assert any(spec.operator == "<" for spec in aiohttp_requirement.specifier)


def test_the_installed_aiohttp_is_in_the_range() -> None:
    assert Version(aiohttp.__version__) in SpecifierSet(aiohttp_hooks.TESTED), aiohttp.__version__


# -- each private attribute, by name -----------------------------------------------------------------


def parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(function).parameters)


def test_app_runner_make_server_is_the_coroutine_setup_awaits() -> None:
    assert inspect.iscoroutinefunction(web.AppRunner._make_server)
    assert list(parameters(web.AppRunner._make_server)) == ["self"]
    # That setup() serves through it is seen below: the runner's server is the one make_server made.


def test_server_takes_a_request_factory_and_handler_cancellation() -> None:
    found = parameters(web.Server.__init__)
    assert list(found)[:2] == ["self", "handler"]
    for name in ("request_factory", "handler_cancellation"):
        assert found[name].kind is inspect.Parameter.KEYWORD_ONLY, name
    assert any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in found.values())


async def test_server_keeps_the_handler_and_request_factory_it_was_given() -> None:
    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response()

    server = web.Server(handler, handler_cancellation=False)
    assert server.request_handler is handler
    # The default factory: its arguments are the ones aiohttp calls a request factory with.
    assert callable(server.request_factory)
    assert list(parameters(server.request_factory)) == ["message", "payload", "protocol", "writer", "task"]


def test_request_handler_methods_the_connection_overrides() -> None:
    assert list(parameters(RequestHandler.__init__))[:2] == ["self", "manager"]
    assert parameters(RequestHandler.__init__)["loop"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(parameters(RequestHandler.connection_made)) == ["self", "transport"]
    assert list(parameters(RequestHandler.connection_lost)) == ["self", "exc"]
    assert list(parameters(RequestHandler.data_received)) == ["self", "data"]
    assert inspect.iscoroutinefunction(RequestHandler.finish_response)
    assert list(parameters(RequestHandler.finish_response)) == ["self", "request", "resp", "start_time"]
    assert [parameter.kind for parameter in parameters(RequestHandler.log_exception).values()] == [
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD,
    ]
    assert list(parameters(RequestHandler.force_close)) == ["self"]


def test_request_handler_handles_each_request_in_a_coroutine_of_its_own() -> None:
    # What _HandlersInline recognises (on Python 3.11) and runs in the connection's task.
    assert inspect.iscoroutinefunction(RequestHandler._handle_request)
    assert list(parameters(RequestHandler._handle_request)) == ["self", "request", "start_time", "request_handler"]


def test_request_handler_has_a_transport_and_the_attributes_the_connection_adds_are_free() -> None:
    slots = {name for cls in RequestHandler.__mro__ for name in getattr(cls, "__slots__", ())}
    assert "transport" in slots
    added = {"_served", "_idle", "_cut_after_response", "_lost"}
    assert not added & (slots | set(dir(RequestHandler)))


def test_reading_is_paused_only_with_one_of_two_flags_set() -> None:
    # What Connection.resume_reading relies on to skip a resume when nothing is paused: aiohttp pauses its
    # transport (and its parser) only in these two methods, each setting its flag first.
    slots = {name for cls in RequestHandler.__mro__ for name in getattr(cls, "__slots__", ())}
    assert {"_reading_paused", "_buffer_paused"} <= slots
    assert list(parameters(RequestHandler.resume_reading)) == ["self", "resume_parser"]
    for method, flag in ((RequestHandler.pause_reading, "_reading_paused"),
                         (RequestHandler._pause_reading_for_buffer, "_buffer_paused")):
        source = inspect.getsource(method)
        assert source.index(f"self.{flag} = True") < source.index("self._pause_transport_reading()"), method
    # And nowhere else in the server's protocol: those two are the only callers of the method that pauses the
    # transport, which nothing else pauses, and the parser is paused only in the first.
    sources = [inspect.getsource(module) for module in (base_protocol, web_protocol)]
    assert sum(source.count("self._pause_transport_reading()") for source in sources) == 2
    assert sum(source.count("self.transport.pause_reading()") for source in sources) == 1
    assert "self.transport.pause_reading()" in inspect.getsource(base_protocol.BaseProtocol._pause_transport_reading)
    assert sum(source.count("self._parser.pause_reading()") for source in sources) == 1
    assert "self._parser.pause_reading()" in inspect.getsource(RequestHandler.pause_reading)


def test_requests_know_their_protocol_and_bodies_report_their_end() -> None:
    assert isinstance(inspect.getattr_static(web.BaseRequest, "protocol"), property)
    for reader in (StreamReader, EmptyStreamReader):
        assert list(parameters(reader.on_eof)) == ["self", "callback"]


def test_parse_errors_carry_a_message() -> None:
    assert HttpProcessingError(message="bad line").message == "bad line"


# -- the hooks over a real connection --------------------------------------------------------------


class Recording(aiohttp_hooks.Connection):
    """Writes each hook's call into its server's log."""

    def __init__(self, server: RecordingServer, *, loop: asyncio.AbstractEventLoop, **kwargs: Any) -> None:
        super().__init__(server, loop=loop, **kwargs)
        self.server = server

    def refusal(self) -> bytes | None:
        self.server.log.append("refusal")
        return self.server.refuse_with

    def opened(self) -> None:
        self.server.log.append("opened")

    def receiving_request(self) -> None:
        self.server.log.append("receiving_request")

    def request_started(self, request: web.BaseRequest) -> None:
        self.server.log.append(f"request_started {request.path}")

    def response_sent(self, request: web.BaseRequest) -> None:
        self.server.log.append(f"response_sent {request.path}")

    def bad_request(self, reason: str) -> None:
        self.server.log.append("bad_request")

    def closed(self) -> None:
        self.server.log.append("closed")
        self.server.closed.set()


class RecordingServer(aiohttp_hooks.Server):
    connection_class = Recording

    def __init__(self, args: aiohttp_hooks.ServerArgs) -> None:
        super().__init__(args)
        self.log: list[str] = []
        self.refuse_with: bytes | None = None
        self.closed = asyncio.Event()


class RecordingRunner(aiohttp_hooks.Runner):
    def make_server(self, args: aiohttp_hooks.ServerArgs) -> RecordingServer:
        return RecordingServer(args)


class Seen:
    """What the handlers saw of their connection."""

    def __init__(self) -> None:
        self.connection: aiohttp_hooks.Connection | None = None
        self.body_read = False
        self.lost = asyncio.Event()
        self.tasks: list[asyncio.Task[Any] | None] = []
        # What a held request waits for before it reads its body.
        self.release = asyncio.Event()

    def read_to_the_end(self) -> None:
        self.body_read = True


async def serve(seen: Seen) -> tuple[RecordingRunner, int]:
    async def echo(request: web.Request) -> web.Response:
        seen.connection = aiohttp_hooks.connection_of(request)
        assert seen.connection is not None and seen.connection.is_open
        seen.tasks.append(asyncio.current_task())
        seen.connection.on_lost(seen.lost.set)
        body = await request.read()
        aiohttp_hooks.when_body_read(request, seen.read_to_the_end)
        return web.Response(body=body)

    async def cut(request: web.Request) -> web.Response:
        connection = aiohttp_hooks.connection_of(request)
        assert connection is not None
        connection.cut_after_response()
        return web.Response(text="bye")

    async def held(request: web.Request) -> web.Response:
        seen.connection = aiohttp_hooks.connection_of(request)
        async with asyncio.timeout(DEADLINE):
            await seen.release.wait()
        return web.Response(body=await request.read())

    app = web.Application()
    app.router.add_post("/echo", echo)
    app.router.add_post("/held", held)
    app.router.add_get("/cut", cut)
    runner = RecordingRunner(app, shutdown_timeout=1.0, handler_cancellation=False, access_log=None)
    return runner, await serving(runner)


@pytest.fixture
async def served() -> AsyncIterator[tuple[RecordingServer, int, Seen]]:
    seen = Seen()
    runner, port = await serve(seen)
    server = runner.server
    assert isinstance(server, RecordingServer)
    try:
        yield server, port, seen
    finally:
        await runner.cleanup()


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    async with asyncio.timeout(DEADLINE):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        return int(lines[0].split(" ")[1]), await reader.readexactly(length)


async def closed_by_server(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(DEADLINE):
        return await reader.read()


async def test_hooks_fire_in_order_for_kept_alive_requests_and_the_close(
    served: tuple[RecordingServer, int, Seen],
) -> None:
    server, port, seen = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for body in (b"hi", b"again"):
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert await read_response(reader) == (200, body)
    assert isinstance(seen.connection, Recording) and seen.body_read
    first, second = seen.tasks
    assert first is not None and second is not None
    if aiohttp_hooks.HANDLERS_INLINE:
        # On Python 3.11 no task is made per request: both ran in the connection's, which goes on to the next.
        assert first is second and not first.done()
    else:
        assert first is not second
    writer.close()
    async with asyncio.timeout(DEADLINE):
        await server.closed.wait()
        await seen.lost.wait()
    assert server.log == [
        "refusal", "opened",
        "receiving_request", "request_started /echo", "response_sent /echo",
        "receiving_request", "request_started /echo", "response_sent /echo",
        "closed",
    ]
    assert not seen.connection.is_open


async def test_requests_pipelined_past_aiohttp_s_queue_are_all_answered_in_order(
    served: tuple[RecordingServer, int, Seen],
) -> None:
    # More than aiohttp queues (32) in one write: it pauses reading for its queue and resumes as it drains.
    _, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    bodies = [b"request %d" % index for index in range(PIPELINED)]
    writer.write(b"".join(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                          for body in bodies))
    for body in bodies:
        assert await read_response(reader) == (200, body)
    writer.close()


async def test_a_body_past_the_read_buffer_pauses_reading_and_arrives_whole(
    served: tuple[RecordingServer, int, Seen],
) -> None:
    _, port, seen = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = bytes(range(256)) * (LARGE_BODY // 256)
    writer.write(b"POST /held HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body))
    writer.write(body)
    # The handler reads nothing until aiohttp has stopped reading the socket for it (its buffer is full).
    await eventually(lambda: seen.connection is not None and seen.connection._reading_paused, DEADLINE,
                     "reading paused")
    seen.release.set()
    assert await read_response(reader) == (200, body)
    # The connection reads on: the next request is answered.
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nnext")
    assert await read_response(reader) == (200, b"next")
    writer.close()


async def test_a_refused_connection_gets_the_refusal_and_nothing_else(
    served: tuple[RecordingServer, int, Seen],
) -> None:
    server, port, _ = served
    server.refuse_with = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await closed_by_server(reader) == server.refuse_with
    writer.close()
    assert server.log == ["refusal"]


async def test_a_malformed_request_goes_to_bad_request(served: tuple[RecordingServer, int, Seen]) -> None:
    server, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    # A header field over aiohttp's default 8190 bytes.
    writer.write(b"GET /cut HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"x" * 9000 + b"\r\n\r\n")
    status, _ = await read_response(reader)
    assert status == 400
    await closed_by_server(reader)
    writer.close()
    assert "bad_request" in server.log


async def test_cut_after_response_closes_once_the_response_is_sent(served: tuple[RecordingServer, int, Seen]) -> None:
    _, port, _ = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /cut HTTP/1.1\r\nHost: x\r\n\r\n")
    assert await read_response(reader) == (200, b"bye")
    assert await closed_by_server(reader) == b""
    writer.close()


async def test_close_now_sends_its_farewell_then_closes(served: tuple[RecordingServer, int, Seen]) -> None:
    server, port, seen = served
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n!")
    assert await read_response(reader) == (200, b"!")
    assert seen.connection is not None
    seen.connection.close_now(b"farewell")
    assert await closed_by_server(reader) == b"farewell"
    writer.close()
    async with asyncio.timeout(DEADLINE):
        await server.closed.wait()



# -- routes served without the router ------------------------------------------------------------------


def test_a_match_is_made_from_a_route_given_the_app_frozen_and_set_on_the_request() -> None:
    # What Direct makes once per route, as Application._handle makes one per request.
    assert list(parameters(UrlMappingMatchInfo.__init__)) == ["self", "match_dict", "route"]
    assert list(parameters(UrlMappingMatchInfo.add_app)) == ["self", "app"]
    assert list(parameters(UrlMappingMatchInfo.freeze)) == ["self"]
    # A request's match is its `_match_info`, read by `match_info` and `app` (none of them cached before its handler).
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response()

    app = web.Application()
    match = UrlMappingMatchInfo({}, app.router.add_post("/x", handler))
    match.add_app(app)
    match.freeze()
    request = make_mocked_request("POST", "/x")
    request._match_info = match
    assert request.match_info is match and request.app is app and match.handler is handler


class Routed:
    """What the handlers and the middleware saw of each request."""

    def __init__(self) -> None:
        self.matches: list[web.UrlMappingMatchInfo] = []
        self.order: list[str] = []


def routed_app(routed: Routed) -> web.Application:
    @web.middleware
    async def outer(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        routed.order.append("outer")
        response: web.StreamResponse = await handler(request)
        response.headers["X-Outer"] = "1"
        return response

    @web.middleware
    async def inner(request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        routed.order.append("inner")
        response: web.StreamResponse = await handler(request)
        return response

    async def echo(request: web.Request) -> web.Response:
        assert request.app is app
        routed.matches.append(request.match_info)
        routed.order.append("echo")
        return web.Response(body=await request.read())

    app = web.Application(middlewares=[outer, inner])
    app.router.add_post("/echo", echo)
    return app


async def exchange(port: int, raw: bytes) -> tuple[int, bytes, bytes]:
    """Send one raw request on a new connection; the status, the head and the body of its answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        async with asyncio.timeout(DEADLINE):
            head = await reader.readuntil(b"\r\n\r\n")
            if b" 100 " in head.split(b"\r\n", 1)[0]:
                head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")))
        async with asyncio.timeout(DEADLINE):
            return status, head, await reader.readexactly(length)
    finally:
        writer.close()


async def test_a_direct_route_is_served_through_the_middlewares_with_the_same_match_every_time() -> None:
    routed = Routed()
    app = routed_app(routed)
    runner = aiohttp_hooks.Runner(app, shutdown_timeout=1.0, handler_cancellation=False, access_log=None,
                                  direct=[("POST", "/echo")])
    port = await serving(runner)
    try:
        for body in (b"one", b"two"):
            status, head, answer = await exchange(
                port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            assert (status, answer) == (200, body) and b"X-Outer: 1" in head
        assert routed.order == ["outer", "inner", "echo"] * 2
        first, second = routed.matches
        assert first is second  # made once, not per request
        assert first.route.method == "POST" and first.route.resource is not None
        assert first.route.resource.canonical == "/echo" and dict(first) == {}
        assert first.apps == (app,)

        # With a query, an Expect header, another method or another path: the router's answers, as without Direct.
        status, head, answer = await exchange(
            port, b"POST /echo?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n!")
        assert (status, answer) == (200, b"!") and b"X-Outer: 1" in head
        status, _, answer = await exchange(
            port, b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n?")
        assert (status, answer) == (200, b"?")
        assert len(routed.matches) == 4 and not {id(match) for match in routed.matches[2:]} & {id(first)}
        assert (await exchange(port, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"))[0] == 405
        assert (await exchange(port, b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"))[0] == 404
    finally:
        await runner.cleanup()


def test_a_direct_route_must_exist_with_a_plain_path_and_new_style_middlewares() -> None:
    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response()

    app = routed_app(Routed())
    app.router.add_post("/item/{name}", handler)
    with pytest.raises(ValueError, match="no route GET /echo"):
        aiohttp_hooks.Direct(app, handler, [("GET", "/echo")])
    with pytest.raises(ValueError, match="no route POST /item/{name}"):
        aiohttp_hooks.Direct(app, handler, [("POST", "/item/{name}")])

    async def old_style(app: web.Application, handler: Any) -> Any:
        return handler

    legacy = web.Application(middlewares=[old_style])  # type: ignore[list-item]
    legacy.router.add_post("/echo", handler)
    with pytest.raises(ValueError, match="old-style middleware"):
        aiohttp_hooks.Direct(legacy, handler, [("POST", "/echo")])


# -- writing a stream's chunk at once ----------------------------------------------------------------


def test_a_stream_writer_writes_a_chunk_as_write_now_does() -> None:
    # What write_now does in place of `await writer.write(chunk)` when that would not wait.
    source = inspect.getsource(StreamWriter.write)
    assert "self._write_chunked_payload(chunk)" in source and "self._write(chunk)" in source
    assert "await self.drain()" in source
    assert "protocol._paused" in inspect.getsource(StreamWriter.drain)
    assert isinstance(inspect.getattr_static(base_protocol.BaseProtocol, "writing_paused"), property)
    for name in ("_write_chunked_payload", "_write"):
        assert list(parameters(getattr(StreamWriter, name))) == ["self", "chunk"]
    made = inspect.getsource(StreamWriter.__init__)
    for name in ("_headers_written", "_on_chunk_sent", "on_body_write"):
        assert f"self.{name}" in made, name
    for name in ("_compress", "length", "chunked"):
        assert hasattr(StreamWriter, name), name


class Streamed:
    """What a streaming handler did: how many chunks it wrote at once, and when its client stopped keeping up."""

    def __init__(self) -> None:
        self.at_once = 0
        self.held_back = asyncio.Event()
        self.before_headers: bool | None = None


async def stream_server(streamed: Streamed) -> tuple[web.AppRunner, int]:
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        # Right after `prepare`: written at once only if aiohttp has sent the headers (it may hold them back until
        # the first write). Nothing is written for an empty chunk (in a chunked body it would be the end).
        streamed.before_headers = aiohttp_hooks.write_now(response, b"<early>")
        assert aiohttp_hooks.write_now(response, b"")
        await response.write(b"<start>")
        assert aiohttp_hooks.write_now(response, b"")
        while streamed.at_once < MAX_CHUNKS and aiohttp_hooks.write_now(response, CHUNK):
            streamed.at_once += 1
        streamed.held_back.set()
        await response.write(b"<end>")  # waits for the client, as write_now would not
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/stream", stream)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=DEADLINE)
    return runner, await serving(runner)


@pytest.mark.parametrize("version", ["1.1", "1.0"])
async def test_write_now_writes_until_the_client_falls_behind_and_everything_arrives(version: str) -> None:
    streamed = Streamed()
    runner, port = await stream_server(streamed)
    # Room for the whole answer in the client's buffer: it is read in one go.
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2 * MAX_CHUNKS * len(CHUNK))
    try:
        writer.write(f"GET /stream HTTP/{version}\r\nHost: x\r\n\r\n".encode())
        # The client reads nothing until the server's writes have filled what the connection holds.
        async with asyncio.timeout(DEADLINE):
            await streamed.held_back.wait()
        assert 0 < streamed.at_once < MAX_CHUNKS, "write_now never declined: it would buffer without bound"
        async with asyncio.timeout(DEADLINE):
            # HTTP/1.0: the body ends with the connection; HTTP/1.1: with the last, empty chunk.
            raw = await (reader.read() if version == "1.0" else reader.readuntil(b"\r\n0\r\n\r\n"))
    finally:
        writer.close()  # a handler still waiting for this client then ends, and the cleanup with it
        await runner.cleanup()
    head, _, body = raw.partition(b"\r\n\r\n")
    if version == "1.1":
        assert b"Transfer-Encoding: chunked" in head
        body = dechunked(body)
    early = b"<early>" if streamed.before_headers else b""
    assert body == early + b"<start>" + CHUNK * streamed.at_once + b"<end>"
