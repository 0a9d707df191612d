"""The HTTP floor: the least an aiohttp endpoint does for one JSON-RPC call, run as its own process.

Owns the floor server: `POST /mcp` checks the bearer header (one constant-time compare, no
hashing table), reads the body, and answers a canned JSON-RPC reply shaped exactly like
gatewayd's answer to `echo.echo`. Like gatewayd it logs "listening on http://…" on stderr,
has no access log, and stops on SIGTERM. Run: `BENCH_FLOOR_TOKEN=… python -m bench.floor --port 0`.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web

from bench.wire import CANNED_REPLY

TOKEN_ENV = "BENCH_FLOOR_TOKEN"
PATH = "/mcp"
EXPECTED = web.AppKey("expected", bytes)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[[str, int, str], Coroutine[Any, Any, None]]


def authorized(request: web.Request) -> bool:
    """Whether the request carries the floor's bearer token (one constant-time compare, no hashing table)."""
    presented = request.headers.get("Authorization", "").encode()
    return hmac.compare_digest(presented, request.app[EXPECTED])


async def handle_post(request: web.Request) -> web.Response:
    """Answer any authorized POST with the canned reply."""
    if not authorized(request):
        return web.Response(status=401, text="invalid token\n")
    await request.read()
    return web.Response(body=CANNED_REPLY, content_type="application/json")


def floor_app(token: str, handler: Handler) -> web.Application:
    """An application answering `POST PATH` with `handler`, for the bearer `token`."""
    app = web.Application()
    app[EXPECTED] = f"Bearer {token}".encode()
    app.router.add_post(PATH, handler)
    return app


async def serve_app(app: web.Application, host: str, port: int, name: str) -> None:
    """Serve `app` until SIGTERM or SIGINT, logging "<name>: listening on http://…" once it listens."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        print(f"{name}: listening on http://{host}:{bound}{PATH}", file=sys.stderr, flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()


async def serve(host: str, port: int, token: str) -> None:
    """Serve until SIGTERM or SIGINT."""
    await serve_app(floor_app(token, handle_post), host, port, "floor")


def main(name: str = "floor", serve: Serve = serve) -> int:
    """The command line of a floor: `--host`, `--port`, the token from TOKEN_ENV."""
    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=sys.modules["__main__"].__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    token = os.environ.get(TOKEN_ENV)
    if not token:
        print(f"{name}: set {TOKEN_ENV}", file=sys.stderr)
        return 2
    asyncio.run(serve(args.host, args.port, token))
    return 0


if __name__ == "__main__":
    sys.exit(main())
