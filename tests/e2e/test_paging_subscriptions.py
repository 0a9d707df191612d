"""The gateway's own pages and subscriptions that survive, through the daemon's whole HTTP stack and a real child.

Server `sub` (tests/fixtures/subsrv.py) offers 25 tools and 25 resources, pages its own lists by 10 and logs every
subscribe and unsubscribe it gets with its pid. The daemon pages by 7: the official SDK walks `tools/list` and
`resources/list` across pages to exactly the one-page lists. A session's subscription is renewed on each new child
(admin restart, crash), is ended at the child when the last session holding it is deleted, and a client whose read
grant a reload took away hears no more updates.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gatewayd.reloader import Reloader
from gatewayd.state import DaemonState
from tests.daemon import python_command, write_config
from tests.stack import LocalClient, running_stack
from tests.waiting import eventually

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "subsrv.py"
VERSION = "2025-11-25"
ITEMS = 25
PAGE = 7
WATCHED = "sub://item/03"
ROLES = '[roles.all]\nallow = ["sub.*"]\n[roles.calls]\nallow = ["sub.touch", "sub.tool_00"]\n'
# Bounds every test body and each read of a GET stream.
TEST_DEADLINE = 60.0
READ_DEADLINE = 10.0


def _config(tmp_path: Path, extra: str = "") -> dict[str, str]:
    return write_config(tmp_path, {"sub": _server(tmp_path, extra)}, ROLES, {"reader": ["all"], "other": ["all"]})


def _server(tmp_path: Path, extra: str = "") -> str:
    return (python_command(str(FIXTURE)) + f'\nenv = {{ SUBSRV_LOG = "{tmp_path / "subs.log"}", '
            f'SUBSRV_BROKEN = "{tmp_path / "broken"}" }}\n' + extra)


def _log(tmp_path: Path) -> list[tuple[int, str, str]]:
    path = tmp_path / "subs.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(pid), what, uri) for pid, what, uri in (line.split(" ", 2) for line in lines)]


class Session:
    """One MCP session over raw HTTP, with its GET stream open for the notifications it is sent."""

    def __init__(self, http: LocalClient, token: str) -> None:
        self.http, self.token, self.id = http, token, ""
        self._stream: Any = None

    async def open(self, stream: bool = True) -> Session:
        response = await self.http.post("/mcp", headers={"Authorization": f"Bearer {self.token}"}, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert response.status == 200, await response.text()
        self.id = response.headers["Mcp-Session-Id"]
        if not stream:
            return self
        self._stream = await self.http.get("/mcp", headers={**self._headers(), "Accept": "text/event-stream"})
        assert self._stream.status == 200
        return self

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Mcp-Session-Id": self.id, "MCP-Protocol-Version": VERSION}

    async def __call__(self, method: str, params: Any = None) -> dict[str, Any]:
        response = await self.http.post("/mcp", headers={**self._headers(), "Accept": "application/json"},
                                        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}})
        answer: dict[str, Any] = await response.json()
        return answer

    async def notification(self) -> dict[str, Any]:
        """The next message on the GET stream."""
        async with asyncio.timeout(READ_DEADLINE):
            while not (line := await self._stream.content.readline()).startswith(b"data: "):
                pass
        message: dict[str, Any] = json.loads(line[6:])
        return message

    async def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
        response = await self.http.delete("/mcp", headers=self._headers())
        assert response.status in (200, 204)


@asynccontextmanager
async def daemon(tmp_path: Path, extra: str = "") -> AsyncIterator[tuple[LocalClient, DaemonState, dict[str, str]]]:
    tokens = _config(tmp_path, extra)
    async with asyncio.timeout(TEST_DEADLINE), running_stack(tmp_path, list_page_size=PAGE,
                                                             sse_keepalive=0.2) as (client, state):
        yield client, state, tokens


async def test_the_sdk_pages_tools_and_resources_through_the_gateway(tmp_path: Path) -> None:
    async with daemon(tmp_path) as (local, _state, tokens):
        headers = {"Authorization": f"Bearer {tokens['reader']}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(20)) as http, \
                Client(streamable_http_client(f"{local.base}/mcp", http_client=http), mode="legacy") as client:
            pages, names, cursor = 0, [], None
            while True:
                listed = await client.list_tools(cursor=cursor, cache_mode="bypass")
                pages += 1
                assert len(listed.tools) <= PAGE
                names += [tool.name for tool in listed.tools]
                cursor = listed.next_cursor
                if cursor is None:
                    break
            expected = sorted(["sub__crash", "sub__touch", *(f"sub__tool_{i:02d}" for i in range(ITEMS))])
            assert names == expected and pages == -(-len(expected) // PAGE)
            uris, cursor = [], None
            while True:
                resources = await client.list_resources(cursor=cursor, cache_mode="bypass")
                uris += [str(resource.uri) for resource in resources.resources]
                cursor = resources.next_cursor
                if cursor is None:
                    break
            assert uris == [f"sub://item/{i:02d}" for i in range(ITEMS)]


async def test_a_foreign_or_tampered_cursor_is_refused(tmp_path: Path) -> None:
    async with daemon(tmp_path) as (local, _state, tokens):
        reader, other = await Session(local, tokens["reader"]).open(), await Session(local, tokens["other"]).open()
        first = (await reader("tools/list"))["result"]
        cursor = first["nextCursor"]
        assert (await reader("tools/list", {"cursor": cursor}))["result"]["tools"][0]["name"] == "sub__tool_06"
        tampered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
        for session, params in ((other, {"cursor": cursor}), (reader, {"cursor": tampered}),
                                (reader, {"cursor": "x"}), (reader, {"cursor": 7})):
            error = (await session("tools/list", params))["error"]
            assert error["code"] == -32602 and error["message"].startswith("Invalid cursor")
        # A cursor is for the list it came from.
        assert (await reader("resources/list", {"cursor": cursor}))["error"]["code"] == -32602
        await reader.close()
        await other.close()


async def test_a_subscription_is_renewed_on_each_new_child_and_ended_with_its_last_session(tmp_path: Path) -> None:
    async with daemon(tmp_path) as (local, state, tokens):
        mine, theirs = await Session(local, tokens["reader"]).open(), await Session(local, tokens["other"]).open()
        for session in (mine, theirs):
            assert (await session("resources/subscribe", {"uri": WATCHED}))["result"] == {}
        server = state.generation.servers["sub"]
        first = server.pid
        await _touched(mine)

        await server.restart()  # an admin restart: the next call starts a new child, subscribed again at once
        assert (await mine("tools/call", {"name": "sub__tool_00", "arguments": {}}))["result"]["isError"] is False
        second = server.pid
        assert second is not None and second != first
        await eventually(lambda: (second, "subscribe", WATCHED) in _log(tmp_path), what="subscribed again")
        await _touched(mine)

        await mine("tools/call", {"name": "sub__crash", "arguments": {}})  # the child dies mid-call
        await eventually(lambda: server.pid is None, what="the child gone")
        server.reset()  # no crash backoff to wait out
        await mine("tools/call", {"name": "sub__tool_00", "arguments": {}})
        third = server.pid
        await eventually(lambda: (third, "subscribe", WATCHED) in _log(tmp_path), what="subscribed after a crash")
        assert [entry for entry in _log(tmp_path) if entry[0] == third] == [(third, "subscribe", WATCHED)]
        await _touched(mine)

        await mine.close()  # theirs still holds it: the child keeps it
        await theirs("tools/call", {"name": "sub__tool_00", "arguments": {}})
        assert (third, "unsubscribe", WATCHED) not in _log(tmp_path)
        await theirs.close()  # the last holder is gone
        await eventually(lambda: (third, "unsubscribe", WATCHED) in _log(tmp_path), what="unsubscribed")


async def test_a_child_sessions_hold_subscriptions_at_runs_on_idle_and_starts_again_on_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.upstream.server")
    async with daemon(tmp_path, 'idle_timeout = "1s"\n') as (local, state, tokens):
        mine = await Session(local, tokens["reader"]).open()
        assert (await mine("resources/subscribe", {"uri": WATCHED}))["result"] == {}
        server = state.generation.servers["sub"]
        first = server.pid
        # Idle, but its subscriber hears of changes only while it runs: kept.
        await eventually(lambda: "idle for 1s, kept: sessions hold subscriptions at it" in caplog.text,
                         what="the idle child kept")
        assert server.pid == first
        await _touched(mine)

        await mine("tools/call", {"name": "sub__crash", "arguments": {}})  # the child dies
        # A new child starts once the crash backoff has passed, without a call, and is subscribed again.
        await eventually(lambda: server.pid not in (None, first) and (server.pid, "subscribe", WATCHED)
                         in _log(tmp_path), what="started again and subscribed")
        await _touched(mine)

        # A reload that changes the server: its new child starts at once, subscribed.
        (tmp_path / "tools.d" / "sub.toml").write_text(_server(tmp_path, 'idle_timeout = "2s"\n'))
        assert (await Reloader(state, drain=1.0).reload("test")).ok
        renewed = state.generation.servers["sub"]
        assert renewed is not server
        await eventually(lambda: renewed.pid is not None and (renewed.pid, "subscribe", WATCHED) in _log(tmp_path),
                         what="the reloaded server's child subscribed")
        assert (await mine.notification())["method"] == "notifications/tools/list_changed"
        await _touched(mine)

        # Its last subscriber gone, the child idles out as any other.
        await mine.close()
        await eventually(lambda: renewed.pid is None, what="the idle child stopped")


async def test_a_child_that_cannot_start_for_its_subscribers_ends_failed_within_its_restarts(tmp_path: Path) -> None:
    async with daemon(tmp_path, "max_restarts = 2\n") as (local, state, tokens):
        mine = await Session(local, tokens["reader"]).open()
        assert (await mine("resources/subscribe", {"uri": WATCHED}))["result"] == {}
        server = state.generation.servers["sub"]
        (tmp_path / "broken").touch()
        await mine("tools/call", {"name": "sub__crash", "arguments": {}})
        # Started again for its subscriber after each backoff (0.5 s, 1 s), each start failing: failed after the
        # third crash, and not tried again.
        await eventually(lambda: server.state.value == "failed", what="the server failed")
        assert server.restarts == 2 and server.pid is None
        await mine.close()


async def _touched(session: Session) -> None:
    """Make the child say the watched URI changed; the session hears it on its GET stream."""
    answer = await session("tools/call", {"name": "sub__touch", "arguments": {}})
    assert answer["result"]["content"][0]["text"] == "1", answer
    assert await session.notification() == {"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                             "params": {"uri": WATCHED}}


async def test_a_reload_that_takes_the_read_grant_away_stops_the_updates(tmp_path: Path) -> None:
    async with daemon(tmp_path) as (local, state, tokens):
        # Without a GET stream, what this session is sent stays in its queue, for the test to look at.
        mine = await Session(local, tokens["reader"]).open(stream=False)
        theirs = await Session(local, tokens["other"]).open()
        for session in (mine, theirs):
            assert (await session("resources/subscribe", {"uri": WATCHED}))["result"] == {}
        (tmp_path / "policies" / "roles.toml").write_text(ROLES + '[roles.less]\nallow = ["sub.touch"]\n')
        clients = (tmp_path / "policies" / "clients.toml").read_text()
        (tmp_path / "policies" / "clients.toml").write_text(
            clients.replace('roles = [\n    "all",\n]', 'roles = [\n    "less",\n]', 1))
        assert (await Reloader(state, drain=1.0).reload("test")).ok
        assert state.generation.principal("reader") is not None
        assert "result" in await mine("tools/call", {"name": "sub__touch", "arguments": {}})
        # The other client still may read, and hears it; the one that lost its grant does not (one broadcast tells
        # both at once).
        assert (await theirs.notification())["params"] == {"uri": WATCHED}
        held = next(s for s in state.sessions.all() if s.id == mine.id)
        told = [held.outbound.get_nowait() for _ in range(held.outbound.qsize())]
        assert told == [{"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}]  # from the reload alone
        await mine.close()
        await theirs.close()
