"""aiohttp_hooks.WholeResponse over real loopback connections: byte for byte the head aiohttp's own response would
send (status line, headers, keep-alive rules for HTTP/1.1 and HTTP/1.0, HEAD), large bodies intact, a header with a
line break never sent, and a client that does not read keeping the response unfinished."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gatewayd.web import aiohttp_hooks
from tests.stack import serving

DEADLINE = 5.0
BODY = b'{"jsonrpc":"2.0","id":1,"result":{}}'
HEADERS = {"Mcp-Session-Id": "abc"}
# More than the loopback socket's buffers take: the rest waits in the transport until the client reads.
UNREAD_BYTES = 64 * 1024 * 1024


class Watched(aiohttp_hooks.Connection):
    def response_sent(self, request: web.BaseRequest) -> None:
        assert isinstance(request, web.Request)
        request.app[SENT].set()


class WatchedServer(aiohttp_hooks.Server):
    connection_class = Watched


class WatchedRunner(aiohttp_hooks.Runner):
    def make_server(self, args: aiohttp_hooks.ServerArgs) -> WatchedServer:
        return WatchedServer(args)


SENT = web.AppKey("sent", asyncio.Event)
HANDLED = web.AppKey("handled", asyncio.Event)
CONNECTIONS = web.AppKey("connections", list)


def _size(request: web.BaseRequest) -> int:
    return int(request.query.get("size", "0"))


async def whole(request: web.Request) -> web.StreamResponse:
    request.app[CONNECTIONS].append(aiohttp_hooks.connection_of(request))
    request.app[HANDLED].set()
    body = b"x" * _size(request) if "size" in request.query else BODY
    return aiohttp_hooks.WholeResponse(body, content_type="application/json", headers=HEADERS)


async def plain(request: web.Request) -> web.StreamResponse:
    return web.Response(body=BODY, content_type="application/json", headers=HEADERS)


async def counted(request: web.Request) -> web.StreamResponse:
    return aiohttp_hooks.WholeResponse(BODY, content_type="application/json", headers={"Content-Length": "1"})


async def broken(request: web.Request) -> web.StreamResponse:
    return aiohttp_hooks.WholeResponse(BODY, content_type="application/json",
                                       headers={"Mcp-Session-Id": "abc\r\nX-Injected: 1"})


@pytest.fixture
async def port() -> AsyncIterator[tuple[int, web.Application]]:
    app = web.Application()
    app[SENT] = asyncio.Event()
    app[HANDLED] = asyncio.Event()
    app[CONNECTIONS] = []
    app.router.add_post("/whole", whole)
    app.router.add_get("/whole", whole)
    app.router.add_post("/plain", plain)
    app.router.add_get("/plain", plain)
    app.router.add_post("/broken", broken)
    app.router.add_post("/counted", counted)
    runner = WatchedRunner(app, shutdown_timeout=1.0, handler_cancellation=False, access_log=None)
    try:
        yield await serving(runner), app
    finally:
        await runner.cleanup()


async def exchange(port: int, request: bytes, *, then: bytes | None = None) -> tuple[list[bytes], bool]:
    """Send `request` (and `then` on the same connection, if given); the raw responses, and whether the server closed
    the connection after the last."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    responses = []
    async with asyncio.timeout(DEADLINE):
        for message in (request, then) if then is not None else (request,):
            writer.write(message)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(fields(head)["content-length"])
            body = b"" if message.startswith(b"HEAD") else await reader.readexactly(length)
            responses.append(head + body)
        writer.write_eof()
        closed = await reader.read() == b""
    writer.close()
    return responses, closed


def fields(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {name.lower(): value for name, value in (line.split(": ", 1) for line in lines if line)}


def without_date(response: bytes) -> tuple[bytes, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    named = fields(head + b"\r\n")
    assert "date" in named
    del named["date"]
    return status, named, body


@pytest.mark.parametrize("request_line, extra, closes", [
    (b"POST {} HTTP/1.1", b"", False),
    (b"POST {} HTTP/1.1", b"Connection: close\r\n", True),
    (b"POST {} HTTP/1.0", b"", True),
    (b"POST {} HTTP/1.0", b"Connection: keep-alive\r\n", False),
    (b"HEAD {} HTTP/1.1", b"", False),
])
async def test_a_whole_response_is_the_head_and_body_aiohttp_would_send(
    port: tuple[int, web.Application], request_line: bytes, extra: bytes, closes: bool,
) -> None:
    number, _ = port
    seen = {}
    for path in ("/whole", "/plain"):
        line = request_line.replace(b"{}", path.encode())
        request = line + b"\r\nHost: x\r\nContent-Length: 0\r\n" + extra + b"\r\n"
        # A connection kept alive serves a second request; one that is not is closed after the first.
        responses, closed = await exchange(number, request, then=None if closes else request)
        assert closed
        seen[path] = [without_date(response) for response in responses]
    assert seen["/whole"] == seen["/plain"]
    status, named, body = seen["/whole"][0]
    assert status.endswith(b" 200 OK") and named["mcp-session-id"] == "abc"
    assert body == (b"" if request_line.startswith(b"HEAD") else BODY)
    assert ("connection" in named) == (extra == b"Connection: keep-alive\r\n" or (closes and b"1.1" in request_line))


async def test_a_large_whole_body_arrives_intact(port: tuple[int, web.Application]) -> None:
    number, _ = port
    size = aiohttp_hooks.WHOLE_JOIN_BYTES * 3 + 7
    request = b"POST /whole?size=%d HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" % size
    [response], _ = await exchange(number, request)
    assert response.endswith(b"\r\n\r\n" + b"x" * size)


async def test_a_whole_response_says_its_own_length_once(port: tuple[int, web.Application]) -> None:
    number, _ = port
    [response], _ = await exchange(number, b"POST /counted HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.lower().count(b"content-length:") == 1 and body == BODY


async def test_a_header_with_a_line_break_is_never_sent(port: tuple[int, web.Application]) -> None:
    number, _ = port
    reader, writer = await asyncio.open_connection("127.0.0.1", number)
    writer.write(b"POST /broken HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    async with asyncio.timeout(DEADLINE):
        received = await reader.read()
    writer.close()
    # The connection is closed without a response, as aiohttp's own serializer refuses such a header.
    assert b"X-Injected" not in received


async def test_a_client_that_does_not_read_keeps_its_response_unfinished(port: tuple[int, web.Application]) -> None:
    number, app = port
    reader, writer = await asyncio.open_connection("127.0.0.1", number)
    writer.write(b"POST /whole?size=%d HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n" % UNREAD_BYTES)
    async with asyncio.timeout(DEADLINE):
        await app[HANDLED].wait()
        [connection] = app[CONNECTIONS]
        transport = connection.transport
        assert transport is not None
        # What the socket did not take waits in the transport, over its limit: the response is not finished.
        low, high = transport.get_write_buffer_limits()
        assert transport.get_write_buffer_size() > high
        assert not app[SENT].is_set()
        head = await reader.readuntil(b"\r\n\r\n")
        assert await reader.readexactly(int(fields(head)["content-length"])) == b"x" * UNREAD_BYTES
        await app[SENT].wait()
    writer.close()
