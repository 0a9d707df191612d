"""A session its client left without DELETE ends by itself once its idle timeout has passed, with its per-session
child, though no other session is created to notice it (gatewayd/sessions.py `Sessions.sweep`); a session in use
does not. Through the real daemon and a real per-session child.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import aiohttp

from tests.daemon import Daemon, headers, write_config
from tests.e2e.test_calls import MCP_VERSION, initialize, tools_call
from tests.e2e.test_child_exits import PER_SESSION
from tests.waiting import eventually, process_gone

# Long enough that a tool call (the kept session's use) never takes it on a loaded machine.
IDLE_S = 1.0
# Generous for a loaded 2-core machine: the session ends within IDLE_S and half of it.
EXPIRY_DEADLINE = 10.0


def child_pids(pid: int) -> set[int]:
    """The children of `pid`, read from /proc: no `gatewayctl status` round trip (a second or more while the machine
    is loaded), during which the kept session would go unused past its idle timeout."""
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as children:
            found.update(int(child) for child in children.read().split())
    return found


async def test_a_session_left_without_delete_ends_with_its_child(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = write_config(tmp_path, {"mine": PER_SESSION}, '[roles.r]\nallow = ["mine.*"]\n', {"alice": ["r"]})
    # The kept session is called as fast as answers come: above the default rate limit.
    async with Daemon(tmp_path, f"--session-idle-timeout={IDLE_S}", "--client-rate=100000", "--client-burst=100000") \
            as daemon:
        assert daemon.proc is not None
        token, pid = tokens["alice"], daemon.proc.pid
        left = await initialize(http, daemon.url, token)
        answer = await tools_call(http, daemon.url, token, left, "mine__echo", {"n": 1})
        assert answer["result"]["structuredContent"] == {"n": 1}
        [left_child] = child_pids(pid)
        kept = await initialize(http, daemon.url, token)
        answer = await tools_call(http, daemon.url, token, kept, "mine__echo", {"n": 1})
        assert answer["result"]["structuredContent"] == {"n": 1}
        [kept_child] = child_pids(pid) - {left_child}
        deadline = time.monotonic() + EXPIRY_DEADLINE
        while not process_gone(left_child):
            assert time.monotonic() < deadline, "the left session's child still runs"
            # The kept session is in use all along: it must outlive the other.
            await tools_call(http, daemon.url, token, kept, "mine__echo", {"n": 2})
        # The ended session's id is as good as unknown now; the kept one still answers, on its own child.
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "mine__echo", "arguments": {}}}
        async with http.post(daemon.url, json=body, headers=headers(
                token, **{"Mcp-Session-Id": left, "MCP-Protocol-Version": MCP_VERSION})) as response:
            assert response.status == 404
        answer = await tools_call(http, daemon.url, token, kept, "mine__echo", {"n": 3})
        assert answer["result"]["structuredContent"] == {"n": 3}
        await eventually(lambda: child_pids(pid) == {kept_child}, what="only the kept session's child is left")
        await daemon.wait_log(r"session of client=alice ended: unused for 1s")
