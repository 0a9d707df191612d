"""The daemon's whole HTTP stack in-process, on the pytest-aiohttp test server, for fast web tests.

Same wiring as the daemon (`gatewayd.app.build`); only the process boundary is missing.
Children are still real processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from gatewayd.app import build, listen_on
from gatewayd.config.loader import load_snapshot
from gatewayd.settings import Settings
from gatewayd.web.app import create_app
from gatewayd.web.mcp_http import WebState

ClientFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


@asynccontextmanager
async def running_stack(config_dir: Path, **settings: Any) -> AsyncIterator[tuple[TestClient[Any, Any], WebState]]:
    """An HTTP test client talking to a full in-process gateway on `config_dir`; stops its children after."""
    state = build(Settings(config_dir=config_dir, **settings), load_snapshot(config_dir))
    server = TestServer(create_app(state), host="127.0.0.1")
    client: TestClient[Any, Any] = TestClient(server)
    await client.start_server()
    assert server.port is not None
    listen_on(state, server.port)
    try:
        yield client, state
    finally:
        await client.close()
        await state.gateway.pool.stop_all()
