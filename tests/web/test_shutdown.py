"""The daemon's stop order, on the very `Daemon` that `gatewayd` runs: stop accepting, drain, stop children."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gatewayd.errors import ShuttingDown
from tests.daemon import FAULTSRV, headers, python_command, write_config
from tests.stack import running_daemon
from tests.waiting import POLL_INTERVAL, eventually, process_gone

FAULT = python_command(str(FAULTSRV)) + '\nprotocol = "jsonrpc"\n[methods.sleep]\n[methods.pid]\n'
ROLES = '[roles.r]\nallow = ["fault.*"]\n'
GRACE = 30.0
# The stop ends soon after the call in flight: far sooner than GRACE, though its connection stays open.
STOPPED_WITHIN = 10.0


async def _refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


async def test_stop_refuses_new_connections_first_then_lets_the_call_in_flight_finish(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"fault": FAULT}, ROLES, {"c": ["r"]})
    async with running_daemon(tmp_path) as (client, daemon):
        auth = headers(tokens["c"])
        pid = await (await client.post("/mcp", headers=auth, json={
            "jsonrpc": "2.0", "id": 1, "method": "fault.pid", "params": {}})).json()
        slow = asyncio.ensure_future(client.post("/mcp", headers=auth, json={
            "jsonrpc": "2.0", "id": 2, "method": "fault.sleep", "params": {"seconds": 1.5}}))
        await eventually(lambda: len(daemon.state.inflight) == 1, what="the slow call is in flight")
        stopping = asyncio.ensure_future(daemon.stop(grace=GRACE))
        refused = await _refused(client.port)
        while not refused and not slow.done():
            await asyncio.sleep(POLL_INTERVAL)  # polling a condition: nothing tells us the listener closed
            refused = await _refused(client.port)
        assert refused, "the listener was still open when the call in flight finished"
        assert not stopping.done()
        answer = await (await slow).json()
        assert answer == {"jsonrpc": "2.0", "id": 2, "result": {"slept": 1.5}}
        # The drain waits for the call, not for the task it ran in: on Python 3.11 that is its kept-alive
        # connection's task (web/aiohttp_hooks.py), which would hold the stop for the whole grace.
        await asyncio.wait_for(stopping, STOPPED_WITHIN)
        await eventually(lambda: process_gone(pid["result"]), what="the child stopped after the drain")


async def test_a_call_still_running_after_the_grace_is_stopped_and_its_caller_told(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"fault": FAULT}, ROLES, {"c": ["r"]})
    async with running_daemon(tmp_path) as (client, daemon):
        slow = asyncio.ensure_future(client.post("/mcp", headers=headers(tokens["c"]), json={
            "jsonrpc": "2.0", "id": 3, "method": "fault.sleep", "params": {"seconds": 60}}))
        await eventually(lambda: len(daemon.state.inflight) == 1, what="the slow call is in flight")
        await asyncio.wait_for(daemon.stop(grace=0.2), STOPPED_WITHIN)
        answer = await (await slow).json()
        assert answer["id"] == 3 and answer["error"]["code"] == ShuttingDown.code
        assert len(daemon.state.inflight) == 0
