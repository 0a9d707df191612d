"""An ACP agent's kept terminals (`terminal_lifetime = "session"`, gatewayd/upstream/acp.py), with the real fixture
agent and real commands: a session's terminal is there for its next turn; a session the agent's owner table forgets
has its terminals killed while the agent runs on; the child's end kills the rest.

The host answering the agent's requests does what agents.py does once a policy allowed them: what is under test is
how long the set of terminals the dialect hands it lives, not the policy (tests/e2e/test_acp.py has both).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd import terminals as acp_terminals
from gatewayd.config.models import ServerConfig
from gatewayd.errors import GatewayError
from gatewayd.terminals import Terminals
from gatewayd.upstream import acp
from gatewayd.upstream.api import Delivery
from gatewayd.upstream.server import ToolServer
from tests.e2e.test_acp import AGENT, background, started
from tests.waiting import eventually, process_gone


class Host:
    """Runs the agent's `terminal/*` in the set it is handed, as agents.py does once the policy allowed them."""

    async def answer(self, server: str, message: dict[str, Any], terminals: Terminals | None) -> dict[str, Any]:
        assert terminals is not None
        method, params = str(message["method"]), message["params"]
        arguments = {key: value for key, value in params.items() if key not in ("sessionId", "_meta")}
        try:
            result = await (terminals.create(arguments) if method == "terminal/create"
                            else terminals.handle(method, arguments))
        except GatewayError as exc:
            return {"jsonrpc": "2.0", "id": message["id"], "error": exc.to_wire()}
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}


HOW = Delivery("alice", host=Host())


@pytest.fixture
async def keeper(tmp_path: Path) -> AsyncIterator[ToolServer]:
    config = ServerConfig.model_validate({"command": [sys.executable, str(AGENT)], "protocol": "acp",
                                          "terminals": True, "terminal_lifetime": "session", "idle_timeout": 0})
    server = ToolServer("keeper", config, tmp_path)
    yield server
    await server.stop()


async def new_session(server: ToolServer, cwd: Path) -> str:
    return str((await server.call_method("session/new", {"cwd": str(cwd), "mcpServers": []}, HOW))["sessionId"])


async def said(server: ToolServer, session: str, text: str) -> list[str]:
    heard: list[str] = []
    how = Delivery("alice", host=HOW.host,
                   on_event=lambda message: heard.append(message["params"]["update"]["content"]["text"]))
    result = await server.call_method("session/prompt", {"sessionId": session,
                                                         "prompt": [{"type": "text", "text": text}]}, how)
    assert result == {"stopReason": "end_turn"}
    return heard


async def test_a_forgotten_session_s_terminals_are_killed_while_its_agent_runs_on(
        keeper: ToolServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acp, "MAX_SESSIONS", 1)
    first = await new_session(keeper, tmp_path)
    assert await said(keeper, first, background(tmp_path / "first.pid")) == ["made term-1"]
    pid = await started(tmp_path / "first.pid")
    assert (await said(keeper, first, "peek term-1"))[0].endswith("exit running")
    # A second session: the agent's owner table (of one, here) forgets the first, and no one can reach its terminal.
    second = await new_session(keeper, tmp_path)
    await eventually(lambda: process_gone(pid), what="the forgotten session's terminal ends")
    assert await said(keeper, second, background(tmp_path / "second.pid")) == ["made term-1"]
    kept = await started(tmp_path / "second.pid")
    await keeper.stop()
    await eventually(lambda: process_gone(kept), what="the stopped agent's kept terminal ends")


async def test_an_agent_waiting_between_turns_on_a_kept_terminal_is_let_go_when_it_stops(
        keeper: ToolServer, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.upstream.acp")
    session = await new_session(keeper, tmp_path)
    assert await said(keeper, session, background(tmp_path / "watched.pid")) == ["made term-1"]
    pid = await started(tmp_path / "watched.pid")
    # The turn ends at once; the agent then waits for the command's exit, outside any turn: answered, not refused.
    assert await said(keeper, session, "watch term-1") == []
    await eventually(lambda: "terminal/wait_for_exit between turns" in caplog.text, what="the wait between turns")
    assert "refused" not in caplog.text
    # The agent stops while it waits: the wait is let go with it, and the terminal killed.
    async with asyncio.timeout(acp_terminals.KILL_WAIT * 2):
        await keeper.stop()
    await eventually(lambda: process_gone(pid), what="the kept terminal ends with its agent")
