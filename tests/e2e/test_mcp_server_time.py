"""A real MCP server from PyPI, `mcp-server-time`, behind the gateway.

The gateway supervises it from a tools.d file like any other child; a hand-written HTTP client, the
official SDK client and a plain JSON-RPC call all reach its tools, and what they are told about the
tools is exactly what the server itself declares (asked directly over stdio, without the gateway).
One daemon serves the module; nothing here changes its state.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import pytest
import pytest_asyncio
import tomli_w

from tests.daemon import Daemon, rpc, write_config
from tests.e2e.test_mcp_sdk import (
    LEGACY_VERSION,
    SESSION_HEADER,
    TEST_DEADLINE,
    VERSION_HEADER,
    bearer,
    http_session,
    mcp_post,
    raw_session,
    sdk_client,
    text_of,
)

TIME_SERVER: Final = Path(sys.executable).parent / "mcp-server-time"
TIME_ARGV: Final = [str(TIME_SERVER), "--local-timezone", "UTC"]
TOOLS: Final = ["time__convert_time", "time__get_current_time"]
# How far the tool's clock may be from ours: it runs on this machine, so only scheduling delays count.
CLOCK_SLACK: Final = timedelta(minutes=5)

# The server is a test dependency (pyproject's `test` extra): missing, these tests fail rather than skip.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass
class TimeGateway:
    url: str
    token: str
    declared: dict[str, dict[str, Any]]  # the server's own tools/list entries, by its tool name


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def time_gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[TimeGateway]:
    root = tmp_path_factory.mktemp("time")
    # Importing the server's dependencies takes a second or two (more on a loaded machine): start it
    # with the daemon, and ask a second copy for its tools meanwhile.
    server = tomli_w.dumps(
        {"command": TIME_ARGV, "start": "eager", "startup_timeout": "30s", "call_timeout": "20s"}
    )
    tokens = write_config(
        root, {"time": server}, roles='[roles.clock]\nallow = ["time.*"]\n', clients={"agent": ["clock"]}
    )
    declared = asyncio.ensure_future(declared_tools())
    try:
        async with Daemon(root) as daemon:
            async with asyncio.timeout(TEST_DEADLINE):
                tools = await declared
            yield TimeGateway(daemon.url, tokens["agent"], tools)
    finally:
        declared.cancel()
        await asyncio.gather(declared, return_exceptions=True)


async def declared_tools() -> dict[str, dict[str, Any]]:
    """The tools mcp-server-time itself lists over stdio (a separate process, no gateway), by name."""
    proc = await asyncio.create_subprocess_exec(
        *TIME_ARGV, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    assert proc.stdin is not None and proc.stdout is not None
    client_info = {"name": "test", "version": "1"}
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": LEGACY_VERSION, "capabilities": {}, "clientInfo": client_info}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    try:
        async with asyncio.timeout(TEST_DEADLINE):
            proc.stdin.write(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
            await proc.stdin.drain()
            while line := await proc.stdout.readline():
                message = json.loads(line)
                if message.get("id") == 2:
                    return {tool["name"]: tool for tool in message["result"]["tools"]}
        raise AssertionError("mcp-server-time exited without answering tools/list")
    finally:
        proc.stdin.close()
        try:
            async with asyncio.timeout(10):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


def check_current_time(structured: Any) -> None:
    """A get_current_time result for UTC that is about now."""
    assert isinstance(structured, dict), structured
    assert structured["timezone"] == "UTC"
    stamp = datetime.fromisoformat(structured["datetime"])
    assert stamp.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - stamp) < CLOCK_SLACK
    assert structured["day_of_week"] == stamp.strftime("%A")
    assert structured["is_dst"] is False


async def test_raw_http_client_lists_and_calls_the_time_tools(time_gateway: TimeGateway) -> None:
    url, token, declared = time_gateway.url, time_gateway.token, time_gateway.declared
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        session_id = await raw_session(http, url, token)
        listed = await mcp_post(http, url, token, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, session_id)
        called = await mcp_post(http, url, token, {
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "time__get_current_time", "arguments": {"timezone": "UTC"}},
        }, session_id)
        ending = {"Authorization": bearer(token), SESSION_HEADER: session_id, VERSION_HEADER: LEGACY_VERSION}
        async with http.delete(url, headers=ending) as ended:
            assert ended.status == 204
    assert listed.status == 200
    tools = listed.response["result"]["tools"]
    assert [tool["name"] for tool in tools] == TOOLS
    # Everything the server declares (schemas with $defs, output schemas, annotations) passes through as is.
    for tool in tools:
        original = tool["name"].removeprefix("time__")
        assert tool == {**declared[original], "name": tool["name"]}
    assert called.status == 200
    assert called.response["id"] == 2
    result = called.response["result"]
    assert result["isError"] is False
    check_current_time(result["structuredContent"])
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]


async def test_sdk_client_lists_and_calls_the_time_tools(time_gateway: TimeGateway) -> None:
    declared = time_gateway.declared
    async with asyncio.timeout(TEST_DEADLINE):
        async with sdk_client(time_gateway.url, bearer(time_gateway.token)) as client:
            listed = (await client.list_tools()).tools
            # The SDK checks structuredContent against each tool's outputSchema, so these also prove it arrived intact.
            now = await client.call_tool("time__get_current_time", {"timezone": "UTC"})
            converted = await client.call_tool(
                "time__convert_time", {"source_timezone": "UTC", "time": "12:30", "target_timezone": "UTC"}
            )
            failed = await client.call_tool("time__get_current_time", {"timezone": "Nowhere/Bogus"})
    assert [tool.name for tool in listed] == TOOLS
    for tool in listed:
        original = declared[tool.name.removeprefix("time__")]
        assert tool.input_schema == original["inputSchema"]
        assert tool.output_schema == original["outputSchema"]
        assert tool.description == original["description"]
    assert now.is_error is False
    check_current_time(now.structured_content)
    assert converted.is_error is False
    assert converted.structured_content is not None
    assert converted.structured_content["time_difference"] == "+0.0h"
    assert converted.structured_content["source"]["datetime"].endswith("T12:30:00+00:00")
    # The server's own tool failure reaches the client as an isError result, not a protocol error.
    assert failed.is_error is True
    assert "Nowhere/Bogus" in text_of(failed)


async def test_direct_jsonrpc_call_of_the_time_server(time_gateway: TimeGateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        body = await rpc(http, time_gateway.url, time_gateway.token, "time.get_current_time", {"timezone": "UTC"})
    assert body["id"] == 1
    assert body["result"]["isError"] is False
    check_current_time(body["result"]["structuredContent"])
