"""The MCP relay floor: the least an aiohttp process does to pass MCP Streamable HTTP through to a stdio MCP server.

Owns the MCP form of `bench/relay.py`, for measuring beside the peer gateways (`bench/beside.py`): `POST /mcp`
checks the bearer header, parses the body and passes it to its one stdio child unchanged but for an id of its own:
a request's answer comes back with the caller's id, as JSON or (with `BENCH_RELAY_SSE=1`) as one SSE event; a
notification is written to the child and answered 202. No session, policy, audit, limits, validation, tool-name
prefix or timer: it is what any gateway built as one asyncio process in front of a stdio child pays before doing
anything of its own, so it bounds what such a gateway can reach. The child's command is `BENCH_RELAY_CHILD` (a
shell-quoted command line). Logs "listening on http://…" and stops on SIGTERM, like the floors.
Run: `BENCH_FLOOR_TOKEN=… BENCH_RELAY_CHILD='python3 echo_server.py' python -m bench.mcprelay --port 0`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys

from aiohttp import web

from bench.floor import authorized, floor_app, main, serve_app
from bench.relay import CHILD, Child, stop_child

CHILD_ENV = "BENCH_RELAY_CHILD"
SSE_ENV = "BENCH_RELAY_SSE"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
SSE = web.AppKey("sse", bool)


async def handle_post(request: web.Request) -> web.Response:
    """Pass an authorized MCP message to the child; its answer back as JSON or one SSE event."""
    if not authorized(request):
        return web.Response(status=401, text="invalid token\n")
    message = json.loads(await request.read())
    child = request.app[CHILD]
    if "id" not in message:
        child.notify(message)
        return web.Response(status=202)
    body = json.dumps(await child.call(message), separators=(",", ":")).encode()
    if request.app[SSE]:
        return web.Response(body=b"event: message\ndata: " + body + b"\n\n", headers=SSE_HEADERS)
    return web.Response(body=body, content_type="application/json")


async def serve(host: str, port: int, token: str) -> None:
    """Start the child, serve until SIGTERM or SIGINT, stop the child."""
    argv = shlex.split(os.environ.get(CHILD_ENV, ""))
    if not argv:
        raise SystemExit(f"mcprelay: set {CHILD_ENV} to the stdio MCP server's command line")
    loop = asyncio.get_running_loop()
    transport, child = await loop.subprocess_exec(Child, *argv, stderr=asyncio.subprocess.DEVNULL)
    app = floor_app(token, handle_post)
    app[CHILD] = child
    app[SSE] = os.environ.get(SSE_ENV, "") == "1"
    try:
        await serve_app(app, host, port, "mcprelay")
    finally:
        await stop_child(transport, child)


if __name__ == "__main__":
    sys.exit(main("mcprelay", serve))
