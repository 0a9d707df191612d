"""MCP 2026-07-28's `Mcp-Param-*` headers: an argument the called tool marks `x-mcp-header` must be mirrored by its
header, exactly; a tool the client may not see is not looked at, so its schema tells nothing (denied looks unknown).

The check finds the called tool as the call is routed, not by listing every tool (web/modern.py); these tests pin
what it answers, with a real MCP child whose `custom_headers` tool marks `region` (tests/fixtures/conformsrv.py).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import pytest

from tests.daemon import REPO, python_command, write_config
from tests.stack import LocalClient, running_stack

FIXTURE: Final = REPO / "tests" / "fixtures" / "conformsrv.py"
VERSION: Final = "2026-07-28"
META: Final = {"io.modelcontextprotocol/protocolVersion": VERSION,
               "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"}}
ROLES: Final = '[roles.all]\nallow = ["test.*"]\n[roles.some]\nallow = ["test.logging_tool"]\n'
TOOL: Final = "test__custom_headers"
HEADER: Final = "Mcp-Param-Region"


class Modern:
    def __init__(self, client: LocalClient, tokens: dict[str, str]) -> None:
        self.client, self.tokens = client, tokens

    async def call(self, who: str, name: str, arguments: dict[str, Any], **extra: str) -> tuple[int, dict[str, Any]]:
        body = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": name, "arguments": arguments, "_meta": META}}
        sent = {"Authorization": f"Bearer {self.tokens[who]}", "Content-Type": "application/json",
                "Accept": "application/json", "MCP-Protocol-Version": VERSION, "Mcp-Method": "tools/call",
                "Mcp-Name": name, **extra}
        async with await self.client.post("/mcp", data=json.dumps(body), headers=sent) as response:
            answer: dict[str, Any] = await response.json()
            return response.status, answer


@pytest.fixture
async def modern(tmp_path: Path) -> AsyncIterator[Modern]:
    tokens = write_config(tmp_path, {"test": python_command(str(FIXTURE))}, ROLES, {"all": ["all"], "some": ["some"]})
    async with running_stack(tmp_path, audit_path="") as (client, _state):
        yield Modern(client, tokens)


def code(answer: dict[str, Any]) -> int | None:
    error = answer.get("error")
    return error.get("code") if isinstance(error, dict) else None


async def test_an_argument_mirrored_by_its_header_is_called(modern: Modern) -> None:
    status, answer = await modern.call("all", TOOL, {"region": "eu-west"}, **{HEADER: "eu-west"})
    assert status == 200 and answer["result"]["content"][0]["text"] == "region=eu-west"
    # A value that is not plain ASCII travels base64-encoded.
    encoded = "=?base64?" + base64.b64encode("süd".encode()).decode() + "?="
    status, answer = await modern.call("all", TOOL, {"region": "süd"}, **{HEADER: encoded})
    assert status == 200 and answer["result"]["content"][0]["text"] == "region=süd"
    # Neither the argument nor its header: nothing to mirror.
    status, answer = await modern.call("all", TOOL, {})
    assert status == 200 and "result" in answer


@pytest.mark.parametrize("arguments,sent", [
    ({"region": "eu-west"}, {HEADER: "us-east"}),     # says something else
    ({"region": "eu-west"}, {}),                      # missing
    ({}, {HEADER: "eu-west"}),                        # a header for an argument not sent
    ({"region": "eu-west"}, {HEADER: "=?base64?!!?="}),  # malformed base64
])
async def test_a_header_that_does_not_mirror_its_argument_is_refused(
    modern: Modern, arguments: dict[str, Any], sent: dict[str, str]
) -> None:
    status, answer = await modern.call("all", TOOL, arguments, **sent)
    assert (status, code(answer)) == (400, -32020)
    assert HEADER in answer["error"]["message"]


async def test_a_tool_the_client_may_not_see_answers_as_unknown_whatever_its_headers(modern: Modern) -> None:
    denied = await modern.call("some", TOOL, {"region": "eu-west"}, **{HEADER: "us-east"})
    unknown = await modern.call("some", "test__no_such_tool", {"region": "eu-west"}, **{HEADER: "us-east"})
    assert (denied[0], code(denied[1])) == (unknown[0], code(unknown[1])) == (400, -32602)
    assert denied[1]["error"]["message"].replace(TOOL, "<name>") \
        == unknown[1]["error"]["message"].replace("test__no_such_tool", "<name>")


async def test_a_tool_without_header_arguments_ignores_param_headers(modern: Modern) -> None:
    status, answer = await modern.call("some", "test__logging_tool", {}, **{HEADER: "anything"})
    assert status == 200 and "result" in answer
