"""The official MCP SDK client against the npm reference server `@modelcontextprotocol/server-everything`, behind
the real daemon: every tool it lists for a client with sampling, elicitation (form and url) and roots callbacks is
listed through the gateway too, and each one is called and works; a resource link a tool returns is read back; its
resources and prompts are listed and fetched; its task tool runs as a task.

server-everything registers its sampling, elicitation, roots and task tools only for a client that declared those
capabilities (`registerConditionalTools`), judged on the gateway's own `initialize` (RELAYED_CAPABILITIES). Its
`*-async` tools need a client that runs sampling/elicitation *as tasks* (`tasks.requests` in its capabilities): the
SDK (`mcp` 2.3.0) cannot — its `ClientSession._build_capabilities` never declares `tasks` — so server-everything does
not list them to that client directly; the gateway declares them and hosts those tasks itself
(gatewayd/upstream/hosted.py), so through it they are listed and work with that same client. The SDK has no task
API: the research task is driven with the SDK session's typed `send_request` and the spec's task request models.

Needs Node 22 (`make conformance-suite`) and the server (`make mcp-servers`); without them the test is skipped,
unless GATEWAYD_REQUIRE_CONFORMANCE=1 (CI), which makes that a failure.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    BlobResourceContents,
    CallToolRequestParams,
    CallToolResult,
    CreateMessageResult,
    CreateTaskResult,
    ElicitResult,
    EmbeddedResource,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    ImageContent,
    ListRootsResult,
    ResourceLink,
    Root,
    TaskMetadata,
    TextContent,
    TextResourceContents,
)

from tests.daemon import REPO, Daemon, write_config
from tests.e2e.test_conformance import NODE
from tests.e2e.test_mcp_sdk import SDK_READ_TIMEOUT, bearer

pytestmark = pytest.mark.asyncio(loop_scope="module")

EVERYTHING: Final = (REPO / ".mcp-servers" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist"
                     / "index.js")
PREFIX: Final = "everything__"
# A task is polled this often, and given this long to complete (server-everything's research takes ~4 s).
TASK_POLL: Final = 0.2
TASK_DEADLINE: Final = 30.0
ROOT: Final = Root(uri="file:///work/project", name="project")
# What the fake user answers server-everything's elicitation form with (its required fields and then some).
FORM: Final[dict[str, Any]] = {"name": "Ada", "check": True, "email": "ada@example.com", "integer": 7}
UNCOMPRESSED: Final = b"hello from the gateway\n" * 20
# Its tools that send sampling and elicitation as tasks of the client's, listed to a client that hosts them.
ASYNC: Final = ("trigger-sampling-request-async", "trigger-elicitation-request-async")


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


class User:
    """The person and model behind the SDK client's callbacks: answers every question, remembers what it was asked."""

    def __init__(self) -> None:
        self.sampled: list[Any] = []
        self.elicited: list[Any] = []
        self.rooted = 0

    async def sample(self, _context: Any, params: Any) -> CreateMessageResult:
        self.sampled.append(params)
        prompt = params.messages[0].content.text
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text=f"sampled: {prompt}"),
                                   model="test-model", stop_reason="endTurn")

    async def elicit(self, _context: Any, params: Any) -> ElicitResult:
        self.elicited.append(params)
        if getattr(params, "mode", "form") == "url":
            return ElicitResult(action="accept")
        properties = params.requested_schema.get("properties", {})
        if "interpretation" in properties:
            return ElicitResult(action="accept", content={"interpretation": "historical"})
        return ElicitResult(action="accept", content=FORM)

    async def roots(self, _context: Any) -> ListRootsResult:
        self.rooted += 1
        return ListRootsResult(roots=[ROOT])

    def callbacks(self) -> dict[str, Any]:
        return {"sampling_callback": self.sample, "elicitation_callback": self.elicit,
                "list_roots_callback": self.roots}


@asynccontextmanager
async def client(daemon: tuple[Daemon, str], user: User | None = None) -> AsyncIterator[Client]:
    running, token = daemon
    callbacks = (user or User()).callbacks()
    async with httpx2.AsyncClient(headers={"Authorization": bearer(token)},
                                  timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http:
        async with Client(streamable_http_client(running.url, http_client=http), mode="legacy",
                          read_timeout_seconds=SDK_READ_TIMEOUT, **callbacks) as sdk:
            yield sdk


def texts(result: CallToolResult) -> list[str]:
    assert not result.is_error, result
    return [item.text for item in result.content if isinstance(item, TextContent)]


async def test_the_tools_listed_are_those_it_lists_to_the_sdk_directly(daemon: tuple[Daemon, str]) -> None:
    direct = StdioServerParameters(command=str(NODE), args=[str(EVERYTHING), "stdio"])
    async with Client(direct, mode="legacy", **User().callbacks()) as sdk:
        own = {tool.name: tool for tool in (await sdk.list_tools()).tools}
    async with client(daemon) as sdk:
        listed = {tool.name: tool for tool in (await sdk.list_tools()).tools}
    # The conditional tools are there: the gateway declared to the child what it relays, and that it hosts the
    # sampling and elicitation it relays as tasks, which the SDK does not declare: those two `*-async` tools more.
    assert set(listed) == {PREFIX + name for name in [*own, *ASYNC]}
    assert {"get-roots-list", "trigger-sampling-request", "trigger-elicitation-request", "trigger-url-elicitation",
            "simulate-research-query"} <= set(own)
    assert not any(name.endswith("-async") for name in own)
    for name, tool in own.items():
        assert listed[PREFIX + name].input_schema == tool.input_schema
        assert listed[PREFIX + name].execution == tool.execution
    execution = listed[PREFIX + "simulate-research-query"].execution
    assert execution is not None and execution.task_support == "required"


async def test_plain_tools_answer(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        echoed = await sdk.call_tool(PREFIX + "echo", {"message": "hi"})
        summed = await sdk.call_tool(PREFIX + "get-sum", {"a": 2, "b": 3})
        env = await sdk.call_tool(PREFIX + "get-env", {})
        image = await sdk.call_tool(PREFIX + "get-tiny-image", {})
        annotated = await sdk.call_tool(PREFIX + "get-annotated-message", {"messageType": "error"})
        structured = await sdk.call_tool(PREFIX + "get-structured-content", {"location": "Chicago"})
    assert texts(echoed) == ["Echo: hi"]
    assert "5" in texts(summed)[0]
    assert isinstance(json.loads(texts(env)[0]), dict)
    [png] = [item for item in image.content if isinstance(item, ImageContent)]
    assert png.mime_type == "image/png" and base64.b64decode(png.data).startswith(b"\x89PNG")
    [error] = annotated.content
    assert error.annotations is not None and error.annotations.priority == 1.0
    assert structured.structured_content is not None and "temperature" in structured.structured_content


async def test_a_resource_link_a_tool_returns_can_be_read(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        result = await sdk.call_tool(PREFIX + "get-resource-links", {"count": 1})
        [link] = [item for item in result.content if isinstance(item, ResourceLink)]
        read = await sdk.read_resource(str(link.uri))
    assert read.contents and str(read.contents[0].uri) == str(link.uri)


async def test_an_embedded_resource_reference_can_be_read_again(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        result = await sdk.call_tool(PREFIX + "get-resource-reference", {"resourceType": "Text", "resourceId": 2})
        [embedded] = [item for item in result.content if isinstance(item, EmbeddedResource)]
        read = await sdk.read_resource(str(embedded.resource.uri))
    assert isinstance(embedded.resource, TextResourceContents)
    [again] = read.contents
    assert isinstance(again, TextResourceContents) and again.text == embedded.resource.text


async def test_a_gzipped_file_comes_back_as_a_resource_that_can_be_read(daemon: tuple[Daemon, str]) -> None:
    data = "data:text/plain;base64," + base64.b64encode(UNCOMPRESSED).decode()
    async with client(daemon) as sdk:
        result = await sdk.call_tool(PREFIX + "gzip-file-as-resource",
                                     {"name": "hello.txt.gz", "data": data, "outputType": "resourceLink"})
        [link] = [item for item in result.content if isinstance(item, ResourceLink)]
        read = await sdk.read_resource(str(link.uri))
    [blob] = read.contents
    assert isinstance(blob, BlobResourceContents)
    assert gzip.decompress(base64.b64decode(blob.blob)) == UNCOMPRESSED


async def test_the_toggles_switch_on_and_off(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        logging_on = texts(await sdk.call_tool(PREFIX + "toggle-simulated-logging", {}))
        logging_off = texts(await sdk.call_tool(PREFIX + "toggle-simulated-logging", {}))
        updates_on = texts(await sdk.call_tool(PREFIX + "toggle-subscriber-updates", {}))
        updates_off = texts(await sdk.call_tool(PREFIX + "toggle-subscriber-updates", {}))
    assert logging_on[0].startswith("Started") and logging_off[0].startswith("Stopped")
    assert updates_on[0].startswith("Started") and updates_off[0].startswith("Stopped")


async def test_a_long_running_operation_reports_progress(daemon: tuple[Daemon, str]) -> None:
    steps: list[tuple[float, float | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append((progress, total))

    async with client(daemon) as sdk:
        result = await sdk.call_tool(PREFIX + "trigger-long-running-operation", {"duration": 0.6, "steps": 3},
                                     progress_callback=progress)
    assert "completed" in texts(result)[0]
    assert steps == [(1, 3), (2, 3), (3, 3)]


async def test_sampling_is_put_to_the_caller(daemon: tuple[Daemon, str]) -> None:
    user = User()
    async with client(daemon, user) as sdk:
        result = await sdk.call_tool(PREFIX + "trigger-sampling-request", {"prompt": "a haiku", "maxTokens": 20})
    [asked] = user.sampled
    prompt = asked.messages[0].content.text
    assert prompt.endswith("a haiku") and asked.max_tokens == 20
    assert f"sampled: {prompt}" in texts(result)[0]


async def test_sampling_it_sends_as_a_task_is_hosted_by_the_gateway_and_put_to_the_caller(
    daemon: tuple[Daemon, str],
) -> None:
    user = User()
    async with client(daemon, user) as sdk:
        result = await sdk.call_tool(PREFIX + "trigger-sampling-request-async", {"prompt": "a limerick",
                                                                                 "maxTokens": 30})
    [asked] = user.sampled
    prompt = asked.messages[0].content.text
    assert prompt.endswith("a limerick") and asked.max_tokens == 30
    answer = texts(result)[0]
    # The child polled the gateway's task until it completed, then read its result.
    assert answer.startswith("[COMPLETED] Async sampling completed!"), answer
    assert "Task created: gwh-" in answer and f"sampled: {prompt}" in answer


async def test_elicitation_it_sends_as_a_task_is_hosted_by_the_gateway_and_put_to_the_caller(
    daemon: tuple[Daemon, str],
) -> None:
    user = User()
    async with client(daemon, user) as sdk:
        result = await sdk.call_tool(PREFIX + "trigger-elicitation-request-async", {})
    [asked] = user.elicited
    assert asked.requested_schema["properties"]
    answer = "\n".join(texts(result))
    assert answer.startswith("[COMPLETED] User provided the requested information!\nUser inputs:\n- Name: Ada"), answer
    assert "Task created: gwh-" in answer


async def test_a_form_elicitation_is_put_to_the_caller(daemon: tuple[Daemon, str]) -> None:
    user = User()
    async with client(daemon, user) as sdk:
        result = await sdk.call_tool(PREFIX + "trigger-elicitation-request", {})
    [asked] = user.elicited
    assert "name" in asked.requested_schema["properties"]
    answer = "\n".join(texts(result))
    assert answer.startswith("✅ User provided the requested information!") and "ada@example.com" in answer


async def test_a_url_elicitation_is_put_to_the_caller(daemon: tuple[Daemon, str]) -> None:
    user = User()
    async with client(daemon, user) as sdk:
        result = await sdk.call_tool(PREFIX + "trigger-url-elicitation",
                                     {"url": "https://example.com/consent", "elicitationId": "consent-1"})
    [asked] = user.elicited
    assert asked.mode == "url" and asked.url == "https://example.com/consent" and asked.elicitation_id == "consent-1"
    assert '"action": "accept"' in "\n".join(texts(result))


async def test_the_roots_it_lists_are_the_callers(daemon: tuple[Daemon, str]) -> None:
    user = User()
    async with client(daemon, user) as sdk:
        result = await sdk.call_tool(PREFIX + "get-roots-list", {})
    answer = texts(result)[0]
    assert "1. project" in answer and f"URI: {ROOT.uri}" in answer


async def create_task(sdk: Client, arguments: dict[str, Any]) -> CreateTaskResult:
    """A task-augmented `tools/call` of simulate-research-query. Sent through the SDK session's dispatcher: its typed
    `send_request` checks a `tools/call` answer against CallToolResult and so refuses the CreateTaskResult."""
    params = CallToolRequestParams(name=PREFIX + "simulate-research-query", arguments=arguments,
                                   task=TaskMetadata(ttl=60_000))
    raw = await sdk.session._dispatcher.send_raw_request(  # the SDK has no public way (see above)
        "tools/call", params.model_dump(by_alias=True, mode="json", exclude_none=True), {"timeout": SDK_READ_TIMEOUT})
    return CreateTaskResult.model_validate(raw)


async def run_task(sdk: Client, arguments: dict[str, Any]) -> tuple[list[str], CallToolResult]:
    """Run simulate-research-query as a task: create it, poll `tasks/get` until it needs the client or ends, then
    fetch its result with `tasks/result` (which also carries any question the task has for the client)."""
    created = await create_task(sdk, arguments)
    task_id = created.task.task_id
    assert task_id.startswith("gw-")
    seen: list[str] = [created.task.status]
    deadline = time.monotonic() + TASK_DEADLINE
    while seen[-1] not in ("completed", "failed", "cancelled", "input_required"):
        assert time.monotonic() < deadline, seen
        await anyio.sleep(TASK_POLL)
        got = await sdk.session.send_request(GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)),
                                             GetTaskResult)
        seen.append(got.status)
    payload = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task_id))
    result = await sdk.session.send_request(payload, CallToolResult)
    return seen, result


async def test_a_research_query_runs_as_a_task(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        seen, result = await run_task(sdk, {"topic": "gateways"})
    assert seen[0] == "working" and seen[-1] == "completed"
    assert texts(result)[0].startswith("# Research Report: gateways")


async def test_an_ambiguous_research_query_asks_its_caller_during_tasks_result(daemon: tuple[Daemon, str]) -> None:
    user = User()
    async with client(daemon, user) as sdk:
        seen, result = await run_task(sdk, {"topic": "python", "ambiguous": True})
    assert "input_required" in seen
    [asked] = user.elicited
    assert "python" in asked.message
    report = texts(result)[0]
    assert report.startswith("# Research Report: python (historical)"), report[:200]


async def test_its_resources_and_prompts_are_listed_and_fetched(daemon: tuple[Daemon, str]) -> None:
    async with client(daemon) as sdk:
        resources = (await sdk.list_resources()).resources
        prompts = {prompt.name for prompt in (await sdk.list_prompts()).prompts}
        simple = await sdk.get_prompt(PREFIX + "simple-prompt")
    assert any(str(resource.uri).startswith("demo://") for resource in resources)
    assert PREFIX + "simple-prompt" in prompts and simple.messages
