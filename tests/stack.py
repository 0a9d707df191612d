"""The daemon's whole HTTP stack in-process on a real loopback socket, for fast web tests.

The very `gatewayd.app.Daemon` that `gatewayd` runs, started and stopped the same way; only the
process boundary (signals, systemd) is missing. Children are still real processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gatewayd.app import Daemon
from gatewayd.settings import Settings
from gatewayd.state import DaemonState

# Bound on any one request a test makes.
REQUEST_TIMEOUT = 60


class LocalClient:
    """An HTTP client bound to the in-process daemon: `post("/mcp", ...)`, `get`, `delete`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT))

    async def post(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.session.post(self.base + path, **kwargs)

    async def get(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.session.get(self.base + path, **kwargs)

    async def delete(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        return await self.session.delete(self.base + path, **kwargs)


@asynccontextmanager
async def running_daemon(config_dir: Path, **settings: Any) -> AsyncIterator[tuple[LocalClient, Daemon]]:
    """A client talking to a full in-process daemon on `config_dir` (admin socket included, at
    `daemon.settings.admin_socket_path()`), on a free loopback port; stopped after. The config is not
    watched unless `watch_config=True` is given: tests reload when they mean to."""
    settings.setdefault("watch_config", False)
    daemon = Daemon(Settings(config_dir=config_dir, host="127.0.0.1", port=0, **settings))
    url = await daemon.start()
    client = LocalClient(int(url.rsplit(":", 1)[1].split("/", 1)[0]))
    try:
        yield client, daemon
    finally:
        await client.session.close()
        # Calls a test leaves running are not waited for.
        await daemon.stop(grace=0)


@asynccontextmanager
async def running_stack(config_dir: Path, **settings: Any) -> AsyncIterator[tuple[LocalClient, DaemonState]]:
    """`running_daemon`, for tests that need only the daemon's state."""
    async with running_daemon(config_dir, **settings) as (client, daemon):
        yield client, daemon.state


async def serving(runner: web.AppRunner) -> int:
    """Set `runner` up and serve it on a free loopback port; that port (`runner.cleanup()` stops it)."""
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return int(runner.addresses[0][1])


def dechunked(body: bytes) -> bytes:
    """The content of a chunked HTTP/1.1 body, read raw up to and with its last, empty chunk."""
    out: list[bytes] = []
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return b"".join(out)
        out.append(body[:size])
        assert body[size:size + 2] == b"\r\n", "a chunk not followed by CRLF"
        body = body[size + 2:]
