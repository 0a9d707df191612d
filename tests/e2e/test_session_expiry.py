"""A session its client left without DELETE ends by itself once its idle timeout has passed, with its per-session
child, though no other session is created to notice it (gatewayd/sessions.py `Sessions.sweep`); a session in use
does not. Through the real daemon and a real per-session child.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp

from tests.daemon import Daemon, headers, status, write_config
from tests.e2e.test_calls import MCP_VERSION, initialize, tools_call
from tests.e2e.test_child_exits import PER_SESSION, children
from tests.waiting import process_gone

IDLE_S = 0.5
# Generous for a loaded 2-core machine: the session ends within IDLE_S and half of it.
EXPIRY_DEADLINE = 10.0


async def test_a_session_left_without_delete_ends_with_its_child(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = write_config(tmp_path, {"mine": PER_SESSION}, '[roles.r]\nallow = ["mine.*"]\n', {"alice": ["r"]})
    # The kept session is called as fast as answers come: above the default rate limit.
    async with Daemon(tmp_path, f"--session-idle-timeout={IDLE_S}", "--client-rate=100000", "--client-burst=100000") \
            as daemon:
        token = tokens["alice"]
        left, kept = await initialize(http, daemon.url, token), await initialize(http, daemon.url, token)
        for session in (left, kept):
            answer = await tools_call(http, daemon.url, token, session, "mine__echo", {"n": 1})
            assert answer["result"]["structuredContent"] == {"n": 1}
        running = await children(tmp_path)
        assert len(running) == 2
        [left_child] = [pid for owner, pid in running.items() if left.startswith(owner)]
        [kept_child] = [pid for owner, pid in running.items() if kept.startswith(owner)]
        deadline = time.monotonic() + EXPIRY_DEADLINE
        while not process_gone(left_child):
            assert time.monotonic() < deadline, "the left session's child still runs"
            # The kept session is in use all along: it must outlive the other.
            await tools_call(http, daemon.url, token, kept, "mine__echo", {"n": 2})
        await daemon.wait_log(r"session of client=alice ended: unused for 0\.5s")
        shown = await status(tmp_path)
        assert shown["sessions"] == 1
        assert [row["pid"] for row in shown["servers"]["mine"]["children"]] == [kept_child]
        # The ended session's id is as good as unknown now; the kept one still answers.
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "mine__echo", "arguments": {}}}
        async with http.post(daemon.url, json=body, headers=headers(
                token, **{"Mcp-Session-Id": left, "MCP-Protocol-Version": MCP_VERSION})) as response:
            assert response.status == 404
        answer = await tools_call(http, daemon.url, token, kept, "mine__echo", {"n": 3})
        assert answer["result"]["structuredContent"] == {"n": 3}
