"""The official MCP SDK client against the npm reference server `@modelcontextprotocol/server-everything`, behind
the real daemon: its tools listed (their `execution` kept) and called, a resource link a tool returns read back,
its resources and prompts listed and fetched.

Needs Node 22 (`make conformance-suite`) and the server (`make mcp-servers`); without them the test is skipped,
unless GATEWAYD_REQUIRE_CONFORMANCE=1 (CI), which makes that a failure.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.daemon import REPO, Daemon, write_config
from tests.e2e.test_conformance import NODE
from tests.e2e.test_mcp_sdk import SDK_READ_TIMEOUT, bearer

pytestmark = pytest.mark.asyncio(loop_scope="module")

EVERYTHING: Final = (REPO / ".mcp-servers" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist"
                     / "index.js")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def daemon(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Daemon, str]]:
    if not (NODE.exists() and EVERYTHING.exists()):
        message = "server-everything or Node 22 missing: make conformance-suite mcp-servers"
        if os.environ.get("GATEWAYD_REQUIRE_CONFORMANCE") == "1":
            pytest.fail(message)
        pytest.skip(message)
    root = tmp_path_factory.mktemp("everything")
    command = f'command = ["{NODE}", "{EVERYTHING}", "stdio"]\nrelay = ["sampling", "elicitation", "roots"]\n'
    tokens = write_config(root, {"everything": command}, '[roles.agent]\nallow = ["everything.*"]\n',
                          {"agent": ["agent"]})
    async with Daemon(root) as running:
        yield running, tokens["agent"]


@asynccontextmanager
async def client(daemon: tuple[Daemon, str]) -> AsyncIterator[Any]:
    running, token = daemon
    async with httpx2.AsyncClient(headers={"Authorization": bearer(token)},
                                  timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http:
        async with Client(streamable_http_client(running.url, http_client=http), mode="legacy",
                          read_timeout_seconds=SDK_READ_TIMEOUT) as sdk:
            yield sdk


async def test_its_tools_are_listed_with_their_execution_and_work(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        listed = {tool.name: tool for tool in (await sdk.list_tools()).tools}
        assert {"everything__echo", "everything__get-sum", "everything__get-resource-links"} <= set(listed)
        assert listed["everything__simulate-research-query"].execution.task_support == "required"
        echoed = await sdk.call_tool("everything__echo", {"message": "hi"})
        summed = await sdk.call_tool("everything__get-sum", {"a": 2, "b": 3})
    assert echoed.content[0].text == "Echo: hi"
    assert "5" in summed.content[0].text


async def test_a_resource_link_a_tool_returns_can_be_read(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        result = await sdk.call_tool("everything__get-resource-links", {"count": 1})
        [link] = [item for item in result.content if item.type == "resource_link"]
        read = await sdk.read_resource(str(link.uri))
    assert read.contents and str(read.contents[0].uri) == str(link.uri)


async def test_its_resources_and_prompts_are_listed_and_fetched(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        resources = (await sdk.list_resources()).resources
        prompts = {prompt.name for prompt in (await sdk.list_prompts()).prompts}
        simple = await sdk.get_prompt("everything__simple-prompt")
    assert any(str(resource.uri).startswith("demo://") for resource in resources)
    assert "everything__simple-prompt" in prompts and simple.messages
