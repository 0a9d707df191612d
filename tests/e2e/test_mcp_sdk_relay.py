"""The official MCP SDK answering a tool server's own requests, relayed by the gateway (gatewayd/relay.py).

Against the real daemon, the conformance fixture (tests/fixtures/conformsrv.py) asks its client for sampling,
elicitation and roots during its tool calls. An SDK client with the matching callbacks is asked and its answer
reaches the child, which returns it in its result. A client that did not declare the capability, or a server
whose tools.d file does not list it in `relay`, gets the child's error instead: the child is answered with an
error at once, never left waiting. Every relayed request is in the audit log. The timeout, cancel, disconnect,
session end and call-finished endings are tested in memory (tests/test_relay.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    CallToolResult,
    CreateMessageResult,
    ElicitResult,
    ListRootsResult,
    Root,
    TextContent,
)

from tests.daemon import REPO, Daemon, python_command, write_config
from tests.e2e.test_mcp_sdk import SDK_READ_TIMEOUT, bearer

pytestmark = pytest.mark.asyncio(loop_scope="module")

FIXTURE: Final = REPO / "tests" / "fixtures" / "conformsrv.py"
REFUSED: Final = -32601
# The audit log is written by its own thread: looked at this many times, 50 ms apart.
AUDIT_POLLS: Final = 100


@dataclass
class Rig:
    daemon: Daemon
    token: str
    asked_log: Path
    audit: Path

    def asked(self) -> list[dict[str, Any]]:
        """Every reply the fixture children got to their own requests, in order."""
        if not self.asked_log.exists():
            return []
        return [json.loads(line) for line in self.asked_log.read_text().splitlines()]

    async def relayed(self, match: Callable[[dict[str, Any]], bool]) -> bool:
        """Whether a `relayed` audit record matching `match` is written (waited for: records are queued)."""
        for _ in range(AUDIT_POLLS):
            if self.audit.exists() and any(
                    record.get("event") == "relayed" and match(record)
                    for record in map(json.loads, self.audit.read_text().splitlines())):
                return True
            await asyncio.sleep(0.05)
        return False


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    root = tmp_path_factory.mktemp("relay")
    asked_log = root / "asked.jsonl"
    env = f'\nenv = {{ CONFORMSRV_ASKED_LOG = "{asked_log}" }}\n'
    tokens = write_config(
        root,
        {"ask": python_command(str(FIXTURE)) + env + 'relay = ["sampling", "elicitation", "roots"]\n',
         "quiet": python_command(str(FIXTURE)) + env},
        roles='[roles.agent]\nallow = ["ask.*", "quiet.*"]\n',
        clients={"agent": ["agent"]},
    )
    audit = root / "audit.jsonl"  # the default audit_path
    async with Daemon(root) as daemon:
        yield Rig(daemon, tokens["agent"], asked_log, audit)


@asynccontextmanager
async def client(rig: Rig, **callbacks: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": bearer(rig.token)},
                                  timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http:
        async with Client(streamable_http_client(rig.daemon.url, http_client=http), mode="legacy",
                          read_timeout_seconds=SDK_READ_TIMEOUT, **callbacks) as sdk:
            yield sdk


def text(result: CallToolResult) -> str:
    [content] = result.content
    assert isinstance(content, TextContent), content
    return content.text


async def sample(_context: Any, params: Any) -> CreateMessageResult:
    prompt = params.messages[0].content.text
    return CreateMessageResult(role="assistant", content=TextContent(type="text", text=f"echo {prompt}"),
                               model="test-model", stop_reason="endTurn")


async def roots(_context: Any) -> ListRootsResult:
    return ListRootsResult(roots=[Root(uri="file:///work", name="work")])


async def elicit(_context: Any, _params: Any) -> ElicitResult:
    return ElicitResult(action="accept", content={"username": "ada", "email": "ada@example.com"})


async def test_sampling_reaches_the_client_and_its_answer_the_child(rig: Rig) -> None:
    async with client(rig, sampling_callback=sample) as sdk:
        result = await sdk.call_tool("ask__sampling", {"prompt": "hello"})
    assert not result.is_error and text(result) == "LLM response: echo hello"
    assert await rig.relayed(lambda record: record["kind"] == "sampling" and record["outcome"] == "answered"
                             and record["server"] == "ask" and record["client"] == "agent")


async def test_roots_and_elicitation_are_relayed(rig: Rig) -> None:
    async with client(rig, list_roots_callback=roots, elicitation_callback=elicit) as sdk:
        listed = await sdk.call_tool("ask__roots", {})
        answered = await sdk.call_tool("ask__elicitation", {"message": "who?"})
    assert text(listed) == 'Roots: [{"uri": "file:///work", "name": "work"}]'
    assert text(answered) == 'User response: action=accept, content={"username": "ada", "email": "ada@example.com"}'


async def test_a_capability_the_client_did_not_declare_is_refused_to_the_child(rig: Rig) -> None:
    async with client(rig) as sdk:
        result = await sdk.call_tool("ask__sampling", {"prompt": "hello"})
    assert result.is_error and text(result).startswith(f"Sampling error: {REFUSED} ")
    assert "did not declare sampling" in text(result)


async def test_a_server_not_allowed_to_ask_is_refused(rig: Rig) -> None:
    asked = len(rig.asked())
    async with client(rig, sampling_callback=sample) as sdk:
        result = await sdk.call_tool("quiet__sampling", {"prompt": "hello"})
    assert result.is_error and "may not ask clients for sampling" in text(result)
    [reply] = rig.asked()[asked:]
    assert reply["error"]["code"] == REFUSED
    assert await rig.relayed(lambda record: record["server"] == "quiet" and record["outcome"] == "not_allowed")
