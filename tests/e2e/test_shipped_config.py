"""The shipped tools.d/ and policies/ work out of the box: every example tool is listed and callable."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.daemon import Daemon, gatewayctl, headers, pending_approvals, rpc
from tests.e2e.test_mcp_sdk import sse_messages
from tests.e2e.test_mcp_sdk_modern import headers as modern_headers
from tests.e2e.test_mcp_sdk_modern import post, request


async def test_direct_call_to_the_shipped_calc(shipped: tuple[Daemon, str], http: aiohttp.ClientSession) -> None:
    daemon, token = shipped
    body = await rpc(http, daemon.url, token, "calc.add", {"a": 2, "b": 3})
    assert body == {"jsonrpc": "2.0", "id": 1, "result": 5}


async def test_shipped_clock_is_started_eagerly_and_answers(
    shipped: tuple[Daemon, str], http: aiohttp.ClientSession
) -> None:
    daemon, token = shipped
    await daemon.wait_log(r"server=clock gen=1 pid=\d+ ready")
    body = await rpc(http, daemon.url, token, "clock.now", {"timezone": "UTC"})
    assert body["result"]["structuredContent"]["timezone"] == "UTC"


async def test_shipped_shell_run_waits_for_an_operator(
    shipped: tuple[Daemon, str], http: aiohttp.ClientSession
) -> None:
    daemon, token = shipped
    call = asyncio.create_task(rpc(http, daemon.url, token, "shell.run", {"command": "echo approved"}))
    [pending] = await pending_approvals(daemon.config_dir)
    assert (pending["client"], pending["method"], pending["arguments"]) == ("laptop", "shell.run",
                                                                             {"command": "echo approved"})
    code, out, _ = await gatewayctl(daemon.config_dir, "approve", pending["id"])
    assert code == 0 and "approved" in out
    body = await call
    assert body["result"]["structuredContent"] == {"exit_code": 0, "output": "approved\n"}
    # Single use: approving again changes nothing and says so.
    code, _, err = await gatewayctl(daemon.config_dir, "approve", pending["id"])
    assert code == 1 and "already approved" in err


async def test_shipped_shell_run_denied_never_runs(
    shipped: tuple[Daemon, str], http: aiohttp.ClientSession
) -> None:
    daemon, token = shipped
    call = asyncio.create_task(rpc(http, daemon.url, token, "shell.run", {"command": "echo never"}))
    [pending] = await pending_approvals(daemon.config_dir)
    code, out, _ = await gatewayctl(daemon.config_dir, "deny", pending["id"], "--reason", "not today")
    assert code == 0 and "denied" in out
    error = (await call)["error"]
    assert error["code"] == -32015
    assert error["data"]["approval_id"] == pending["id"] and error["data"]["reason"] == "not today"


async def test_an_operator_may_allow_the_same_shell_run_again_for_a_while(
    shipped: tuple[Daemon, str], http: aiohttp.ClientSession
) -> None:
    daemon, token = shipped
    command = {"command": "echo again"}
    call = asyncio.create_task(rpc(http, daemon.url, token, "shell.run", command))
    [pending] = await pending_approvals(daemon.config_dir)
    code, out, err = await gatewayctl(daemon.config_dir, "approve", pending["id"], "--for", "10m")
    assert code == 0 and "again for 600s" in out, err
    assert (await call)["result"]["structuredContent"]["output"] == "again\n"
    assert (await rpc(http, daemon.url, token, "shell.run", command, id=2))["result"]["isError"] is False
    code, out, _ = await gatewayctl(daemon.config_dir, "approvals")
    assert f"gatewayctl revoke {pending['id']}" in out and "no calls are waiting" in out
    code, out, _ = await gatewayctl(daemon.config_dir, "revoke", pending["id"])
    assert code == 0
    code, _, err = await gatewayctl(daemon.config_dir, "revoke", pending["id"])
    assert code == 1 and "no standing approval" in err
    code, _, err = await gatewayctl(daemon.config_dir, "approve", "x", "--for", "2h")
    assert code == 1 and "at most 3600" in err


async def test_the_shipped_notebook_agent_keeps_a_conversation_and_asks_before_forgetting(
    shipped: tuple[Daemon, str], http: aiohttp.ClientSession
) -> None:
    daemon, token = shipped
    # Its isolation is per MCP session: a session first.
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    async with http.post(daemon.url, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
                         headers=headers(token)) as response:
        session = response.headers["Mcp-Session-Id"]
    opened = await rpc(http, daemon.url, token, "notebook.session/new", {"cwd": "/tmp", "mcpServers": []},
                       **{"Mcp-Session-Id": session})
    notebook = opened["result"]["sessionId"]

    async def said(text: str) -> list[str]:
        body = {"jsonrpc": "2.0", "id": 2, "method": "notebook.session/prompt",
                "params": {"sessionId": notebook, "prompt": [{"type": "text", "text": text}]}}
        async with http.post(daemon.url, json=body, headers=headers(
                token, **{"Mcp-Session-Id": session, "Accept": "application/json, text/event-stream"})) as response:
            *updates, answer = sse_messages(await response.text())
        assert answer["result"] == {"stopReason": "end_turn"}
        return [update["params"]["update"]["content"]["text"] for update in updates
                if update["method"] == "session/update"]

    assert await said("note buy milk") == ["Noted (1 so far)."]
    forgetting = asyncio.create_task(said("forget"))
    [pending] = await pending_approvals(daemon.config_dir)
    assert pending["method"] == "notebook.session/request_permission" and "Forget 1 notes" in str(pending["arguments"])
    code, _, err = await gatewayctl(daemon.config_dir, "approve", pending["id"])
    assert code == 0, err
    assert await forgetting == ["Forgotten."]
    assert await said("notes") == ["No notes yet."]


async def test_the_shipped_countdown_is_a_task_a_2026_caller_polls(shipped: tuple[Daemon, str]) -> None:
    daemon, token = shipped
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}

    async def ask(method: str, params: dict[str, object], name: str) -> dict[str, object]:
        _, _, answer = await post(daemon.url, request(method, params, meta), modern_headers(token, method, name))
        result = answer["result"]
        assert isinstance(result, dict), answer
        return result

    created = await ask("tools/call", {"name": "clock__countdown", "arguments": {"seconds": 2}}, "clock__countdown")
    assert created["resultType"] == "task"
    task_id = str(created["taskId"])
    said: list[object] = []
    async with asyncio.timeout(15):
        while True:  # polled, as a caller of a task does
            seen = await ask("tasks/get", {"taskId": task_id}, task_id)
            if seen["status"] != "working":
                break
            if "statusMessage" in seen and seen["statusMessage"] not in said:
                said.append(seen["statusMessage"])
            await asyncio.sleep(0.05)
    assert seen["status"] == "completed", seen
    # While it worked, the task said how far it was, as the countdown reports it (its caller asked for no progress).
    assert said and set(said) <= {"1/2", "2/2"}, said
