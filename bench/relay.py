"""The relay floor: the least a Python aiohttp process does to put one call through a stdio child.

Owns the relay server: `POST /mcp` checks the bearer header as the HTTP floor does, reads and
parses the body, sends the call to the calc child on its stdin under an id of its own, waits
for the child's line with that id, restores the caller's id and answers. Nothing else: no
policy, audit, limits, sessions, validation, timer or write coalescing. It is what gatewayd's
architecture (one asyncio process in front of a stdio child) costs before any of gatewayd's
own work, so `gatewayd ÷ floor-relay` is what that work costs and `floor-relay ÷ floor-http`
what the child's round trip costs. Logs "listening on http://…" and stops on SIGTERM, like
the HTTP floor. Run: `BENCH_FLOOR_TOKEN=… python -m bench.relay --port 0`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from typing import Any

from aiohttp import web

from bench.floor import authorized, floor_app, main, serve_app

CHILD_ARGV = ("python3", "-m", "gatewayd.examples.calc")
# A child line longer than this is a broken child: the relay stops reading it.
MAX_LINE_BYTES = 1024 * 1024
# Time for the child to exit after its stdin closes, before it is killed.
CHILD_EXIT_DEADLINE = 5.0


class Child(asyncio.SubprocessProtocol):
    """The calc child's pipes: lines out, answers matched to waiting calls by id."""

    def __init__(self) -> None:
        self.stdin: asyncio.WriteTransport | None = None
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.ids = itertools.count(1)
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.SubprocessTransport)
        stdin = transport.get_pipe_transport(0)
        assert isinstance(stdin, asyncio.WriteTransport)
        self.stdin = stdin

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd != 1:
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        if len(self._buffer) > MAX_LINE_BYTES:
            raise OSError(f"the child wrote a line over {MAX_LINE_BYTES} bytes")
        for line in lines:
            message = json.loads(line)
            future = self.pending.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(message)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)
        for future in self.pending.values():
            if not future.done():
                future.set_exception(OSError("the child exited"))

    def notify(self, message: dict[str, Any]) -> None:
        """Send a notification as it came: it has no id to rewrite and no answer."""
        assert self.stdin is not None
        self.stdin.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send `message` under the relay's own id; the child's answer, with the caller's id back."""
        assert self.stdin is not None
        caller_id, own_id = message.get("id"), next(self.ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.pending[own_id] = future
        self.stdin.write(json.dumps({**message, "id": own_id}, separators=(",", ":")).encode() + b"\n")
        # No timer per call, which the least relay would not have: the driver bounds every call it makes, and
        # a child that exits fails what is pending (process_exited).
        answer: dict[str, Any] = await future
        answer["id"] = caller_id
        return answer


CHILD = web.AppKey("child", Child)


async def handle_post(request: web.Request) -> web.Response:
    """Relay an authorized `server.method` call to the child as `method`."""
    if not authorized(request):
        return web.Response(status=401, text="invalid token\n")
    message = json.loads(await request.read())
    message["method"] = message["method"].partition(".")[2]
    answer = await request.app[CHILD].call(message)
    return web.Response(body=json.dumps(answer, separators=(",", ":")).encode(), content_type="application/json")


async def serve(host: str, port: int, token: str) -> None:
    """Start the child, serve until SIGTERM or SIGINT, stop the child."""
    loop = asyncio.get_running_loop()
    transport, child = await loop.subprocess_exec(Child, *CHILD_ARGV, stderr=asyncio.subprocess.DEVNULL)
    app = floor_app(token, handle_post)
    app[CHILD] = child
    try:
        await serve_app(app, host, port, "relay")
    finally:
        await stop_child(transport, child)


async def stop_child(transport: asyncio.SubprocessTransport, child: Child) -> None:
    """Close the child's stdin and wait for it to exit; kill it after CHILD_EXIT_DEADLINE."""
    stdin = transport.get_pipe_transport(0)
    if stdin is not None:
        stdin.close()
    try:
        async with asyncio.timeout(CHILD_EXIT_DEADLINE):
            await asyncio.shield(child.exited)
    except TimeoutError:
        transport.kill()
        async with asyncio.timeout(CHILD_EXIT_DEADLINE):
            await child.exited
    transport.close()


if __name__ == "__main__":
    sys.exit(main("relay", serve))
