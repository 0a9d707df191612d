"""A network that goes away without a word, for tests: a TCP relay in front of the real daemon whose clients' side can
be dropped while the daemon's side is held open. To the gateway the connections live on, and what it writes to them
goes nowhere, as when a laptop changes networks or a NAT forgets a flow."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from yarl import URL

from tests.daemon import Daemon


class Outage:
    """The relay: clients connect to `url`; `drop()` takes every connection so far away from them."""

    def __init__(self) -> None:
        # The daemon's port, once it runs (the relay listens first: the daemon must accept the relay's Host).
        self.port = 0
        self._links: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._pipes: set[asyncio.Task[None]] = set()
        self._dropped: set[asyncio.StreamWriter] = set()
        self.host = self.url = ""

    async def __aenter__(self) -> Outage:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        self.host = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        self.url = f"http://{self.host}/mcp"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for pipe in self._pipes:
            pipe.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        for client, daemon in self._links:
            client.transport.abort()
            daemon.transport.abort()

    def drop(self) -> None:
        """Every client's connection goes, without a word to the daemon."""
        for client, daemon in self._links:
            self._dropped.add(daemon)
            client.transport.abort()

    async def _link(self, reader: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        daemon_reader, daemon = await asyncio.open_connection("127.0.0.1", self.port)
        self._links.append((client, daemon))
        for source, sink in ((reader, daemon), (daemon_reader, client)):
            pipe = asyncio.ensure_future(self._pipe(source, sink, daemon))
            self._pipes.add(pipe)
            pipe.add_done_callback(self._pipes.discard)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    daemon: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                if daemon in self._dropped:
                    continue  # the daemon's side is held open, read and unheard
                sink.write(data)
                await sink.drain()
        except ConnectionError:
            pass
        if daemon not in self._dropped:
            sink.close()


@asynccontextmanager
async def behind_outage(config_dir: Path, *args: str) -> AsyncIterator[tuple[Outage, Daemon]]:
    """The real daemon on `config_dir` (with `args`), and the relay in front of it."""
    async with Outage() as outage, Daemon(config_dir, "--allowed-hosts", outage.host, *args) as running:
        outage.port = URL(running.url).port or 0
        yield outage, running
