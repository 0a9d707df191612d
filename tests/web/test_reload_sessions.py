"""A reload tells exactly the sessions whose tools may look different: on their GET stream, at once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gatewayd.reloader import Reloader
from tests.daemon import FAULTSRV, python_command, write_config
from tests.stack import running_stack

SPY = '\nprotocol = "jsonrpc"\n[methods.echo]\n[methods.pid]\n'
ROLES = '[roles.x]\nallow = ["spy.echo"]\n[roles.y]\nallow = ["spy.echo"]\n'
# Bound on reading the list_changed event from the GET stream.
EVENT_TIMEOUT = 10.0


async def test_only_sessions_whose_grants_changed_hear_tools_list_changed(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"spy": python_command(str(FAULTSRV)) + SPY}, ROLES, {"x": ["x"], "y": ["y"]})
    # Short keep-alives: the GET stream notices its reader left at once, so the stack stops promptly.
    async with running_stack(tmp_path, sse_keepalive=0.2) as (client, state):
        sessions = {}
        for who in ("x", "y"):
            response = await client.post("/mcp", headers={"Authorization": f"Bearer {tokens[who]}"}, json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": who}}})
            sessions[who] = response.headers["Mcp-Session-Id"]
        headers = {"Authorization": f"Bearer {tokens['x']}", "Mcp-Session-Id": sessions["x"],
                   "Accept": "text/event-stream"}
        async with await client.get("/mcp", headers=headers) as stream:
            (tmp_path / "policies" / "roles.toml").write_text(ROLES.replace('[roles.x]\nallow = ["spy.echo"]',
                                                                            '[roles.x]\nallow = ["spy.*"]'))
            result = await Reloader(state, drain=1.0).reload("test")
            assert result.ok and result.roles.changed == ["x"]
            async with asyncio.timeout(EVENT_TIMEOUT):
                while not (line := await stream.content.readline()).startswith(b"data: "):
                    pass
            assert json.loads(line[6:]) == {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
        y = next(s for s in state.sessions.all() if s.client == "y")
        assert y.outbound.empty()  # y's grants and servers did not change: nothing to re-list

