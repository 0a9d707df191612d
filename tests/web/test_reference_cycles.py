"""A call leaves nothing for the cyclic collector: what it made is freed by its reference counts.

The event loop stops for every run of Python's cyclic collector, and garbage that only the
collector can free ages through its generations first. An SSE answer that held its request in
a reference cycle left ~28 objects a call, and cost ~24 µs of collector time a call at 32 in
flight. The whole HTTP stack runs in this process (real children, real sockets), the collector
is paused, and whatever the calls left unreachable is kept and inspected by type.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.daemon import faultsrv_command, headers, python_command, write_config
from tests.stack import LocalClient, running_stack
from tests.waiting import eventually

# Calls of each kind in the window.
CALLS = 40
SSE = "application/json, text/event-stream"
CALC = python_command("-m", "gatewayd.examples.calc") + '\nprotocol = "jsonrpc"\n[methods.add]\n'
ROLES = '[roles.r]\nallow = ["calc.*", "fault.*"]\n[roles.gated]\nconfirm = ["calc.add"]\n'
# Modules whose objects a call makes on the serving side (the test's own client is aiohttp.client*).
SERVING = ("gatewayd", "aiohttp.web")


@contextmanager
def unreachable() -> Iterator[list[Any]]:
    """Pause the collector; on leaving, what became unreachable in between is in the list (kept only until then)."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    found: list[Any] = []
    try:
        yield found
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def serving(garbage: list[Any]) -> list[str]:
    """The distinct types of the serving side's objects among `garbage`."""
    return sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in garbage
                   if type(o).__module__.startswith(SERVING)})


async def post(client: LocalClient, token: str, body: Any, **extra: str) -> bytes:
    response = await client.post("/mcp", data=json.dumps(body), headers=headers(token, **extra))
    data = await response.read()
    assert response.status in (200, 202), data
    return data


async def test_no_kind_of_call_leaves_reference_cycles(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"calc": CALC, "fault": faultsrv_command("--mcp")}, ROLES, {"c": ["r"]})
    token = tokens["c"]
    async with running_stack(tmp_path, client_rate=100_000, client_burst=100_000) as (client, _):
        initialized = await client.post("/mcp", headers=headers(token, Accept=SSE), json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}},
        })
        session = {"Mcp-Session-Id": initialized.headers["Mcp-Session-Id"], "MCP-Protocol-Version": "2025-11-25"}
        await post(client, token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, **session)
        kinds: list[tuple[dict[str, Any], dict[str, str]]] = [
            ({"method": "calc.add", "params": {"a": 1, "b": 2}}, {}),
            ({"method": "calc.nosuch", "params": {}}, {}),
            ({"method": "tools/list"}, session),
            ({"method": "ping"}, session),
            ({"method": "tools/call", "params": {"name": "calc__add", "arguments": {"a": 1, "b": 2}}},
             {"Accept": SSE, **session}),
            # Streams progress and log events before its result: the open-stream path.
            ({"method": "tools/call", "params": {"name": "fault__progress", "arguments": {"steps": 2},
                                                 "_meta": {"progressToken": "p"}}}, {"Accept": SSE, **session}),
        ]
        for body, extra in kinds:  # the first of each starts children and fills caches
            await post(client, token, {"jsonrpc": "2.0", "id": 1, **body}, **extra)
        with unreachable() as garbage:
            for body, extra in kinds:
                for n in range(CALLS):
                    answer = await post(client, token, {"jsonrpc": "2.0", "id": n, **body}, **extra)
                    assert b'"id":%d' % n in answer
            for n in range(CALLS):  # a batch, and a notification (answered by nothing)
                batch = [{"jsonrpc": "2.0", "id": n, "method": "calc.add", "params": {"a": n, "b": 1}},
                         {"jsonrpc": "2.0", "method": "calc.add", "params": {"a": n, "b": 2}}]
                assert json.loads(await post(client, token, batch))[0]["result"] == n + 1
        left = serving(garbage)
    assert left == []


async def test_a_confirmed_call_leaves_no_reference_cycles(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"calc": CALC}, ROLES, {"c": ["gated"]})
    async with running_stack(tmp_path) as (client, state):
        approvals = state.approvals

        async def confirmed_call(n: int) -> None:
            call = asyncio.create_task(post(client, tokens["c"], {"jsonrpc": "2.0", "id": n, "method": "calc.add",
                                                                  "params": {"a": n, "b": 1}}))
            await eventually(lambda: bool(approvals.pending()), what="the call waits for a person")
            approvals.decide(approvals.pending()[0].id, approve=True, by="test", channel="gatewayctl")
            assert json.loads(await call)["result"] == n + 1

        await confirmed_call(0)
        with unreachable() as garbage:
            for n in range(CALLS):
                await confirmed_call(n)
        left = serving(garbage)
    assert left == []
