"""The daemon's whole HTTP stack in-process on a real loopback socket, for fast web tests.

Same wiring and the same aiohttp runner as the daemon (`gatewayd.app.build`, `make_runner`);
only the process boundary is missing. Children are still real processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gatewayd.app import AdminSocket, build, listen_on, make_runner, observe
from gatewayd.config.loader import load_snapshot
from gatewayd.reloader import Reloader
from gatewayd.settings import Settings
from gatewayd.web.mcp_http import WebState

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
async def running_stack(config_dir: Path, **settings: Any) -> AsyncIterator[tuple[LocalClient, WebState]]:
    """A client talking to a full in-process gateway on `config_dir` (admin socket included, at
    `state.settings.admin_socket_path()`); stops its children after."""
    snapshot = load_snapshot(config_dir)
    state = build(Settings(config_dir=config_dir, **settings), snapshot)
    await state.gateway.audit.start()
    runner = make_runner(state)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = int(runner.addresses[0][1])
    listen_on(state, port)
    reloader = Reloader(state, snapshot, state.settings.reload_drain)
    observe(state, reloader)
    admin_socket = AdminSocket(state, reloader)
    await admin_socket.start(state.settings)
    client = LocalClient(port)
    try:
        yield client, state
    finally:
        await admin_socket.stop()
        await client.session.close()
        await state.gateway.drain(0)
        await runner.cleanup()
        await state.gateway.pool.stop_all()
        await state.gateway.audit.close()
