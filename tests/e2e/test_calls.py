"""What callers get, through the real daemon on the shipped examples: one result shape per route, and tool errors
labelled as the tool server's in the audit log and the metrics.

The shipped `calc` is a plain JSON-RPC server, the shipped `clock` an MCP server. Every combination of server kind ×
route (direct `server.method`, MCP `tools/call`) × success and tool failure is called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp

from gatewayd.config.edit import set_client_token
from gatewayd.errors import TOOL_ERROR
from gatewayd.tokens import hash_token, new_token
from tests.daemon import Daemon, faultsrv_command, gatewayctl, headers, rpc
from tests.waiting import eventually

MCP_VERSION = "2025-11-25"


async def initialize(http: aiohttp.ClientSession, url: str, token: str) -> str:
    """An MCP session for plain HTTP calls: its id."""
    body = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": MCP_VERSION, "capabilities": {}, "clientInfo": {"name": "test"}}}
    async with http.post(url, json=body, headers=headers(token)) as response:
        assert response.status == 200
        session: str = response.headers["Mcp-Session-Id"]
    return session


async def tools_call(http: aiohttp.ClientSession, url: str, token: str, session: str, name: str,
                     arguments: dict[str, Any]) -> dict[str, Any]:
    return await rpc(http, url, token, "tools/call", {"name": name, "arguments": arguments},
                     **{"Mcp-Session-Id": session, "MCP-Protocol-Version": MCP_VERSION})


def outcomes(config_dir: Path) -> list[dict[str, Any]]:
    trail = config_dir / "audit.jsonl"
    if not trail.exists():
        return []
    records = [json.loads(line) for line in trail.read_text().splitlines() if line.strip()]
    return [record for record in records if record["event"] == "outcome"]


async def test_one_result_shape_per_route(shipped: tuple[Daemon, str], http: aiohttp.ClientSession) -> None:
    """Direct: the server's own result, or a JSON-RPC error for any tool failure. tools/call: always a CallToolResult,
    `isError` for a tool failure, whatever the server's protocol."""
    daemon, token = shipped
    url = daemon.url
    # Direct, plain JSON-RPC server: its own result; its own error, verbatim.
    assert (await rpc(http, url, token, "calc.add", {"a": 2, "b": 3}))["result"] == 5
    error = (await rpc(http, url, token, "calc.divide", {"a": 1, "b": 0}))["error"]
    assert error == {"code": -32000, "message": "division by zero"}
    # Direct, MCP server: its own result (a CallToolResult); a tool failure is a JSON-RPC error too.
    result = (await rpc(http, url, token, "clock.now", {"timezone": "UTC"}))["result"]
    assert result["isError"] is False and result["structuredContent"]["timezone"] == "UTC"
    answer = await rpc(http, url, token, "clock.now", {"timezone": "Nowhere/Bogus"})
    assert "result" not in answer
    error = answer["error"]
    assert error["code"] == TOOL_ERROR and "Nowhere/Bogus" in error["message"]
    assert error["data"]["error_type"] == "tool_error" and error["data"]["retryable"] is False
    assert error["data"]["result"]["isError"] is True
    # tools/call, both servers: a CallToolResult; a tool failure is a result with isError, never an error.
    session = await initialize(http, url, token)
    calc = (await tools_call(http, url, token, session, "calc__add", {"a": 2, "b": 3}))["result"]
    assert calc == {"content": [{"type": "text", "text": "5"}], "structuredContent": {"result": 5}, "isError": False}
    failed = await tools_call(http, url, token, session, "calc__divide", {"a": 1, "b": 0})
    assert failed["result"]["isError"] is True and "division by zero" in failed["result"]["content"][0]["text"]
    assert failed["result"]["structuredContent"]["error"]["code"] == -32000
    clock = (await tools_call(http, url, token, session, "clock__now", {"timezone": "UTC"}))["result"]
    assert clock["isError"] is False and clock["structuredContent"]["timezone"] == "UTC"
    failed = await tools_call(http, url, token, session, "clock__now", {"timezone": "Nowhere/Bogus"})
    assert failed["result"]["isError"] is True and "Nowhere/Bogus" in failed["result"]["content"][0]["text"]


async def test_tool_errors_are_recorded_and_counted_as_the_tool_servers(
    shipped: tuple[Daemon, str], http: aiohttp.ClientSession
) -> None:
    daemon, token = shipped
    url = daemon.url
    assert (await rpc(http, url, token, "calc.add", {"a": "x", "b": 1}, id="bad"))["error"]["code"] == -32602
    assert (await rpc(http, url, token, "calc.divide", {"a": 1, "b": 0}, id="zero"))["error"]["code"] == -32000
    assert (await rpc(http, url, token, "clock.now", {"timezone": "Nowhere/Bogus"}, id="tz"))["error"]["code"] \
        == TOOL_ERROR
    session = await initialize(http, url, token)
    body = {"jsonrpc": "2.0", "id": "mcp", "method": "tools/call",
            "params": {"name": "calc__divide", "arguments": {"a": 1, "b": 0}}}
    async with http.post(url, json=body, headers=headers(token, **{"Mcp-Session-Id": session})) as response:
        assert (await response.json())["result"]["isError"] is True
    assert (await rpc(http, url, token, "calc.add", {"a": 1, "b": 1}, id="fine"))["result"] == 2
    await eventually(lambda: len(outcomes(daemon.config_dir)) >= 5, what="five outcome records")
    by_id = {record["request_id"]: record for record in outcomes(daemon.config_dir)}
    assert {key: by_id["bad"][key] for key in ("status", "error_code", "error_source")} == {
        "status": "tool_error", "error_code": -32602, "error_source": "tool_server"}
    assert {key: by_id["zero"][key] for key in ("status", "error_code", "error_source")} == {
        "status": "tool_error", "error_code": -32000, "error_source": "tool_server"}
    assert {key: by_id["tz"][key] for key in ("status", "error_code", "error_source")} == {
        "status": "tool_error", "error_code": TOOL_ERROR, "error_source": "tool_server"}
    # Through tools/call the caller got a result, not an error code.
    assert (by_id["mcp"]["status"], by_id["mcp"]["error_source"]) == ("tool_error", "tool_server")
    assert "error_code" not in by_id["mcp"]
    assert by_id["fine"]["status"] == "ok" and "error_source" not in by_id["fine"]
    code, metrics, err = await gatewayctl(daemon.config_dir, "metrics")
    assert code == 0, err
    assert 'gatewayd_calls_total{server="calc",method="add",outcome="tool_error"} 1' in metrics
    assert 'gatewayd_calls_total{server="calc",method="divide",outcome="tool_error"} 2' in metrics
    assert 'gatewayd_calls_total{server="clock",method="now",outcome="tool_error"} 1' in metrics
    assert 'outcome="internal"' not in metrics


async def test_a_gateway_error_is_recorded_as_the_gateways(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """A call the gateway could not complete (here: its server cannot start) is the gateway's error."""
    (tmp_path / "tools.d").mkdir()
    (tmp_path / "tools.d" / "gone.toml").write_text(
        faultsrv_command("--crash-on-start") + '\nprotocol = "jsonrpc"\n[methods.ping]\ndescription = "x"\n')
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "roles.toml").write_text('[roles.r]\nallow = ["gone.*"]\n')
    token = new_token()
    set_client_token(tmp_path / "policies" / "clients.toml", "c", hash_token(token), ["r"])
    async with Daemon(tmp_path) as daemon:
        error = (await rpc(http, daemon.url, token, "gone.ping", {}))["error"]
        assert error["code"] == -32011
        await eventually(lambda: len(outcomes(tmp_path)) >= 1, what="an outcome record")
    [record] = outcomes(tmp_path)
    assert (record["status"], record["error_code"], record["error_source"]) == (
        "tool_server_unavailable", -32011, "gateway")


RETRY = {"io.gatewayd/approval": "retry"}
# The plain JSON caller of the issue: it gives up on any request after this long.
CALLER_TIMEOUT = 5.0


async def test_a_json_caller_with_a_short_timeout_sends_a_gated_call_again_until_it_runs(
    shipped: tuple[Daemon, str]
) -> None:
    daemon, token = shipped
    run = {"command": "echo approved later"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALLER_TIMEOUT)) as http:
        first = await rpc(http, daemon.url, token, "shell.run", {**run, "_meta": RETRY}, id="first")
        error = first["error"]
        assert error["code"] == -32018 and error["data"]["retryable"] is True
        approval_id = error["data"]["approval_id"]
        assert error["data"]["approve_with"] == f"gatewayctl approve {approval_id}"
        assert error["data"]["approval_page"].endswith("/approvals")
    # The caller is gone, its connection closed: the approval still waits.
    code, out, err = await gatewayctl(daemon.config_dir, "approvals", "--json")
    assert code == 0, err
    [pending] = json.loads(out)
    assert (pending["id"], pending["state"], pending["arguments"]) == (approval_id, "pending", run)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALLER_TIMEOUT)) as http:
        again = await rpc(http, daemon.url, token, "shell.run", {**run, "_meta": RETRY}, id="again")
        assert again["error"]["code"] == -32018 and again["error"]["data"]["approval_id"] == approval_id
        # Other arguments are another call: another approval.
        other = await rpc(http, daemon.url, token, "shell.run", {"command": "echo other", "_meta": RETRY})
        assert other["error"]["code"] == -32018 and other["error"]["data"]["approval_id"] != approval_id
        code, out, err = await gatewayctl(daemon.config_dir, "approve", approval_id)
        assert code == 0, err
        ran = await rpc(http, daemon.url, token, "shell.run", {**run, "_meta": RETRY}, id="ran")
        assert ran["result"]["structuredContent"] == {"exit_code": 0, "output": "approved later\n"}
        # Once only: the same call again needs a new approval.
        next_time = await rpc(http, daemon.url, token, "shell.run", {**run, "_meta": RETRY}, id="next")
        assert next_time["error"]["code"] == -32018 and next_time["error"]["data"]["approval_id"] != approval_id
        # Denied: the call sent again is told so.
        denied_id = other["error"]["data"]["approval_id"]
        code, _, err = await gatewayctl(daemon.config_dir, "deny", denied_id, "--reason", "not that")
        assert code == 0, err
        denied = await rpc(http, daemon.url, token, "shell.run", {"command": "echo other", "_meta": RETRY})
        assert denied["error"]["code"] == -32015 and denied["error"]["data"]["reason"] == "not that"
    await eventually(lambda: any(r["request_id"] == "ran" for r in outcomes(daemon.config_dir)), what="outcome")
    used = [r for r in _records(daemon.config_dir) if r["event"] == "approval_used"]
    assert [(r["approval_id"], r["request_id"]) for r in used] == [(approval_id, "ran")]


def _records(config_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (config_dir / "audit.jsonl").read_text().splitlines() if line.strip()]
