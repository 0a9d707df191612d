"""A session's roots reach its own child: the npm `@modelcontextprotocol/server-filesystem` behind the real daemon with
`isolation = "session"` and `relay = ["roots"]`, driven by the official SDK with a roots callback.

server-filesystem asks its client for roots at start-up and whenever told they changed, outside any call, and then
serves exactly those directories. Each SDK session gets a child of its own (upstream/fleet.py), whose requests go to
that session's client on its GET stream: so each session's server sees that session's roots, and only those; a
`notifications/roots/list_changed` from the client makes its child ask again; the child stops when the session ends.
A shared child is never given a session's roots (it keeps its command-line directory).

Needs Node 22 (`make conformance-suite`) and the servers (`make mcp-servers`); without them the test is skipped,
unless GATEWAYD_REQUIRE_CONFORMANCE=1 (CI), which makes that a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import ListRootsResult, Root

from tests.daemon import REPO, Daemon, gatewayctl, python_command, write_config
from tests.e2e.test_conformance import NODE
from tests.e2e.test_mcp_sdk import SDK_READ_TIMEOUT, bearer
from tests.waiting import process_gone

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              # Roots are deprecated by the 2026-07-28 revision; the 2025 era this test speaks has them.
              pytest.mark.filterwarnings("ignore:The roots capability is deprecated")]

FILESYSTEM: Final = (REPO / ".mcp-servers" / "node_modules" / "@modelcontextprotocol" / "server-filesystem" / "dist"
                     / "index.js")
ROOTS_ASKER: Final = REPO / "tests" / "fixtures" / "rootsasker.py"
# How long a session's roots may take to reach its child (asked at the child's start, answered on the GET stream).
ROOTS_DEADLINE: Final = 15.0


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Daemon, str, Path]]:
    if not (NODE.exists() and FILESYSTEM.exists()):
        message = "server-filesystem or Node 22 missing: make conformance-suite mcp-servers"
        if os.environ.get("GATEWAYD_REQUIRE_CONFORMANCE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("roots")
    for name in ("fallback", "a", "a2", "b"):
        (root / name).mkdir()
    command = f'command = ["{NODE}", "{FILESYSTEM}", "{root / "fallback"}"]\nrelay = ["roots"]\n'
    asker = python_command(str(ROOTS_ASKER)) + '\nrelay = ["roots"]\nisolation = "session"\n'
    tokens = write_config(root, {"fs": command + 'isolation = "session"\n', "shared": command, "asker": asker},
                          '[roles.agent]\nallow = ["fs.*", "shared.*", "asker.*"]\n', {"agent": ["agent"]})
    async with Daemon(root) as running:
        yield running, tokens["agent"], root


class Roots:
    """A client's roots, which the test changes."""

    def __init__(self, *paths: Path) -> None:
        self.paths = list(paths)

    async def __call__(self, context: Any) -> ListRootsResult:
        return ListRootsResult(roots=[Root(uri=path.as_uri(), name=path.name) for path in self.paths])


@asynccontextmanager
async def session(rig: tuple[Daemon, str, Path], roots: Roots) -> AsyncIterator[Any]:
    running, token, _ = rig
    async with httpx2.AsyncClient(headers={"Authorization": bearer(token)},
                                  timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http:
        async with Client(streamable_http_client(running.url, http_client=http), mode="legacy",
                          read_timeout_seconds=SDK_READ_TIMEOUT, list_roots_callback=roots) as sdk:
            yield sdk


async def allowed(sdk: Any, tool: str = "fs__list_allowed_directories") -> str:
    result = await sdk.call_tool(tool, {})
    return str(result.content[0].text)


async def until_allowed(sdk: Any, path: Path) -> str:
    """The server's allowed directories once they name `path` (the roots answer may land after the first call)."""
    text = ""
    deadline = time.monotonic() + ROOTS_DEADLINE
    while time.monotonic() < deadline:
        text = await allowed(sdk)
        if str(path) in text:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"the server never served {path}: {text}")


async def children(config_dir: Path, server: str) -> list[dict[str, Any]]:
    code, out, err = await gatewayctl(config_dir, "status", "--json")
    assert code == 0, err
    return list(json.loads(out)["servers"][server]["children"])


async def test_each_session_s_server_serves_that_session_s_roots_and_only_those(
        rig: tuple[Daemon, str, Path]) -> None:
    _, _, root = rig
    async with session(rig, Roots(root / "a")) as first, session(rig, Roots(root / "b")) as second:
        text_a = await until_allowed(first, root / "a")
        text_b = await until_allowed(second, root / "b")
        rows = await children(root, "fs")
        code, shown, _ = await gatewayctl(root, "status")
    assert code == 0 and shown.count("  fs [session ") == 2
    assert str(root / "b") not in text_a and str(root / "fallback") not in text_a
    assert str(root / "a") not in text_b
    assert len(rows) == 2 and {row["client"] for row in rows} == {"agent"}
    assert len({row["pid"] for row in rows}) == 2


async def test_a_roots_change_reaches_the_session_s_child(rig: tuple[Daemon, str, Path]) -> None:
    _, _, root = rig
    roots = Roots(root / "a")
    async with session(rig, roots) as sdk:
        await until_allowed(sdk, root / "a")
        roots.paths = [root / "a2"]
        await sdk.send_roots_list_changed()
        text = await until_allowed(sdk, root / "a2")
    assert str(root / "a") + "\n" not in text + "\n"


async def test_a_session_s_roots_answer_reaches_its_child_after_the_call_in_flight_ended(
        rig: tuple[Daemon, str, Path]) -> None:
    """The child asks for roots during a call and ends the call at once: the question is the session's, not the
    call's, so its answer still reaches the child (it was cut off with the call when the call was guessed)."""
    _, _, root = rig
    async with session(rig, Roots(root / "b")) as sdk:
        assert await allowed(sdk, "asker__ask_roots") == "asked"
        deadline = time.monotonic() + ROOTS_DEADLINE
        while (said := await allowed(sdk, "asker__roots")) == "none":
            assert time.monotonic() < deadline, "the child never got the session's roots"
            await asyncio.sleep(0.05)
    assert json.loads(said) == [{"uri": (root / "b").as_uri(), "name": "b"}]


async def test_a_session_s_child_stops_when_the_session_ends(rig: tuple[Daemon, str, Path]) -> None:
    _, _, root = rig
    async with session(rig, Roots(root / "a")) as sdk:
        await until_allowed(sdk, root / "a")
        [row] = await children(root, "fs")
        pid = int(row["pid"])
    deadline = time.monotonic() + ROOTS_DEADLINE
    while not (process_gone(pid) and not await children(root, "fs")):
        assert time.monotonic() < deadline, "the ended session's child still runs"
        await asyncio.sleep(0.05)


async def test_a_shared_child_never_gets_a_session_s_roots(rig: tuple[Daemon, str, Path]) -> None:
    _, _, root = rig
    async with session(rig, Roots(root / "a")) as sdk:
        text = await allowed(sdk, "shared__list_allowed_directories")
    assert str(root / "fallback") in text and str(root / "a") not in text
