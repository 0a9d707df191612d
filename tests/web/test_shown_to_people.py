"""What an agent wrote reaches a person escaped on the web channels: the approval page's API (its list and live
stream), the page as a browser renders it, and the elicitation message the caller's own user reads. The call
still runs with exactly the arguments the agent sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from playwright.async_api import Browser, expect

from gatewayd.web import console
from tests.daemon import FAULTSRV, python_command, write_config
from tests.stack import running_stack
from tests.test_display import NASTY, raw_unsafe
from tests.web.test_confirmation import ACCEPT_SSE, Stream
from tests.web.test_console import API, Events, bearer, console_config, decide, pending_id, start_call
from tests.web.test_console_browser import browser, chromium, open_page, sign_in  # noqa: F401 (fixtures)

ARGUMENTS: dict[str, Any] = {"note": NASTY, f"key{NASTY}": [NASTY], "path": "C:\\new"}
# Bound on one step in the browser.
STEP_TIMEOUT_MS = 10_000


def assert_shown(view: dict[str, Any]) -> None:
    """An approval's view: exact values, and a `shown` form a person can read safely."""
    assert view["arguments"] == ARGUMENTS
    shown = view["shown"]
    assert json.loads(shown["arguments"]) == ARGUMENTS  # the same value, as JSON
    assert raw_unsafe(shown["arguments"], allow="\n") == [] and "\\u202egnp.exe" in shown["arguments"]
    assert (shown["client"], shown["method"]) == ("agent", "calc.echo")


async def test_the_page_api_shows_an_agents_characters_escaped_and_the_call_gets_them_unchanged(
    tmp_path: Path,
) -> None:
    tokens = console_config(tmp_path)
    async with running_stack(tmp_path, sse_keepalive=0.2) as (client, state):
        call = start_call(client, tokens.agent, "calc.echo", ARGUMENTS)
        approval_id = await pending_id(state)
        listed = await (await client.get(f"{API}/pending", headers=bearer(tokens.operator))).json()
        [view] = listed["approvals"]
        assert_shown(view)

        response = await client.get(f"{API}/stream", headers={**bearer(tokens.operator), "Accept": "text/event-stream"})
        name, snapshot = await Events(response).next()
        response.close()
        assert name == "snapshot"
        assert_shown(snapshot["approvals"][0])

        status, body = await decide(client, tokens.operator, approval_id, "approve")
        assert status == 200 and body["approval"]["shown"]["decided_by"] == "operator alice (web page)"
        assert (await call)["result"] == ARGUMENTS


async def test_the_page_renders_only_the_escaped_form(tmp_path: Path, browser: Browser) -> None:  # noqa: F811
    tokens = console_config(tmp_path)
    async with running_stack(tmp_path) as (client, state):
        page, violations = await open_page(browser, client.base + console.PAGE_PATH)
        await sign_in(page, tokens.operator)
        call = start_call(client, tokens.agent, "calc.echo", ARGUMENTS)
        approval_id = await pending_id(state)
        item = page.locator(f'[data-approval-id="{approval_id}"]')
        await expect(item).to_contain_text("\\u202egnp.exe", timeout=STEP_TIMEOUT_MS)
        arguments = await item.locator('[data-field="arguments"]').text_content()
        assert arguments is not None and json.loads(arguments) == ARGUMENTS
        text = await item.inner_text()
        assert raw_unsafe(text, allow="\n\t") == [] and "calc.echo" in text
        assert violations == []
        await page.close()
        await decide(client, tokens.operator, approval_id, "deny")
        await call


async def test_the_elicitation_message_shows_an_agents_characters_escaped(tmp_path: Path) -> None:
    spy = python_command(str(FAULTSRV)) + '\nprotocol = "jsonrpc"\n[methods.echo]\nconfirm = true\n'
    tokens = write_config(tmp_path, {"spy": spy}, '[roles.agent]\nallow = ["spy.*"]\n', {"agent": ["agent"]})
    async with running_stack(tmp_path) as (client, _):
        auth = bearer(tokens["agent"])
        response = await client.post("/mcp", headers=auth, json={
            "jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {"elicitation": {}}, "clientInfo": {"name": "a"}}})
        session = {**auth, "Mcp-Session-Id": response.headers["Mcp-Session-Id"]}
        body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                "params": {"name": "spy__echo", "arguments": ARGUMENTS}}
        stream = Stream(await client.post("/mcp", json=body, headers={**session, "Accept": ACCEPT_SSE}))
        request = await stream.until("method", "elicitation/create")
        message = request["params"]["message"]
        assert raw_unsafe(message) == [] and "\\u202egnp.exe" in message and "spy.echo" in message
        yes = {"jsonrpc": "2.0", "id": request["id"], "result": {"action": "accept", "content": {"approve": True}}}
        assert (await client.post("/mcp", json=yes, headers=session)).status == 202
        answer = await stream.until("id", 7)
        assert answer["result"]["structuredContent"] == ARGUMENTS
