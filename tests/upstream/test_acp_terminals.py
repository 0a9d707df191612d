"""What an ACP agent keeps and asks between its sessions' turns (gatewayd/upstream/acp.py), with the real fixture
agent and real commands: a session's terminal (`terminal_lifetime = "session"`) is there for its next turn; a
session the agent's owner table forgets has its terminals killed while the agent runs on; the child's end kills the
rest and lets go of what the agent waits for between turns; past MAX_BETWEEN_ASKS waiting at once, the next request
between turns is refused, and while any waits the agent is not stopped idle.

The host answering the agent's requests does what agents.py does once a policy allowed them (a permission: once
the test lets it): what is under test is how long what the dialect hands it lives, not the policy
(tests/e2e/test_acp.py has both).
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
    """Runs the agent's `terminal/*` in the set it is handed, as agents.py does once the policy allowed them; grants a
    permission once `granted` is set, counting those that wait."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """No permission granted yet, none waiting (an Event belongs to the loop of the test that first waits on it)."""
        self.granted = asyncio.Event()
        self.waiting = 0

    async def answer(self, server: str, message: dict[str, Any], terminals: Terminals | None) -> dict[str, Any]:
        method, params = str(message["method"]), message["params"]
        if method == "session/request_permission":
            self.waiting += 1
            try:
                await self.granted.wait()
            finally:
                self.waiting -= 1
            return {"jsonrpc": "2.0", "id": message["id"],
                    "result": {"outcome": {"outcome": "selected", "optionId": "yes"}}}
        assert terminals is not None
        arguments = {key: value for key, value in params.items() if key not in ("sessionId", "_meta")}
        try:
            result = await (terminals.create(arguments) if method == "terminal/create"
                            else terminals.handle(method, arguments))
        except GatewayError as exc:
            return {"jsonrpc": "2.0", "id": message["id"], "error": exc.to_wire()}
        return {"jsonrpc": "2.0", "id": message["id"], "result": result}

    def between_turns(self) -> Host:
        return self

    def tell(self, message: dict[str, Any]) -> str | None:
        return None


HOW = Delivery("alice", host=Host())


@pytest.fixture(autouse=True)
def host() -> Host:
    assert isinstance(HOW.host, Host)
    HOW.host.reset()
    return HOW.host


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


async def test_past_its_bound_a_request_between_turns_is_refused_and_those_waiting_keep_the_agent(
        keeper: ToolServer, host: Host, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.upstream.acp")
    monkeypatch.setattr(acp, "MAX_BETWEEN_ASKS", 3)
    session = await new_session(keeper, tmp_path)
    # The turn ends at once; then, between turns, the agent asks four times at once: three wait, the fourth is told.
    assert await said(keeper, session, "afterwards-times 4 permission") == []
    await eventually(lambda: host.waiting == 3 and "requests of this agent's sessions wait already" in caplog.text,
                     what="three permissions waiting and the fourth refused")
    assert keeper.kept_by() == "3 request(s) of its sessions between turns are being answered"
    host.granted.set()
    await eventually(lambda: host.waiting == 0 and keeper.kept_by() is None,
                     what="the three answered")
    told = await said(keeper, session, "echo now")
    [refused] = [text for text in told if text.startswith("error")]
    assert told.count("chose yes") == 3 and told[-1] == "now" and len(told) == 5
    assert refused.startswith("error -32601") and "3 requests of this agent's sessions wait already" in refused


async def test_a_request_waiting_between_turns_is_let_go_when_its_agent_stops(
        keeper: ToolServer, host: Host, tmp_path: Path) -> None:
    session = await new_session(keeper, tmp_path)
    assert await said(keeper, session, "afterwards permission") == []
    await eventually(lambda: host.waiting == 1, what="the permission between turns waits")
    async with asyncio.timeout(acp_terminals.KILL_WAIT * 2):
        await keeper.stop()
    assert host.waiting == 0


async def test_a_session_a_client_failed_to_load_leaves_nothing_to_answer_between_turns(
        keeper: ToolServer, tmp_path: Path) -> None:
    dialect = keeper.dialect
    assert isinstance(dialect, acp.AcpDialect)
    for number in range(3):
        # The fixture agent loads no session: each load fails, and the ids were never the client's.
        with pytest.raises(GatewayError):
            await keeper.call_method("session/load", {"sessionId": f"made-up-{number}", "cwd": str(tmp_path),
                                                      "mcpServers": []}, HOW)
    session = await new_session(keeper, tmp_path)
    assert set(dialect._hosts) == {session}  # what is answered between turns: the one session the client holds
