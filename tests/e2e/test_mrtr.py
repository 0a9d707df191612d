"""Input-required results (MCP 2026-07-28, SEP-2322) through the real daemon, and a tool server of that era.

A child written with the official SDK's `MCPServer` (tests/fixtures/modernsrv.py) is probed with `server/discover`
and spoken to statelessly; the legacy children beside it (calc) get `initialize`. The SDK client pinned to
2026-07-28 and a legacy one use both. A modern child's input-required result reaches a modern caller with the
gateway's own sealed `requestState`, and the retry reaches the child with the child's state; a forged, altered or
another client's state is refused with -32602. The confirmation gate asks a modern caller that declared elicitation
with an input-required result: answered by the client's elicitation callback, or by an operator (`gatewayctl
approve`/`deny`), or expired; a used state cannot run the call a second time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CreateMessageResult, ElicitRequestParams, ElicitResult, TextContent

from tests.daemon import REPO, Daemon, gatewayctl, pending_approvals, python_command, write_config
from tests.e2e.test_mcp_sdk import (
    LEGACY_VERSION,
    MODERN_VERSION,
    SDK_READ_TIMEOUT,
    TEST_DEADLINE,
    bearer,
    calc_config,
    text_of,
)
from tests.e2e.test_mcp_sdk_modern import headers, post, request
from tests.waiting import POLL_INTERVAL

pytestmark = pytest.mark.asyncio(loop_scope="module")

MODERN_CHILD: Final = REPO / "tests" / "fixtures" / "modernsrv.py"
CONFIRM_DENIED: Final = -32015
CONFIRM_EXPIRED: Final = -32016
INVALID_PARAMS: Final = -32602
METHOD_NOT_FOUND: Final = -32601
GATE_KEY: Final = "io.gatewayd/approval"
# Operators answer within this (an approval's timeout); `hasty`'s role gives a person one second.
ROLES: Final = """
[roles.user]
allow = ["modern.*", "calc.*"]
confirm = ["calc.add"]

[roles.user.confirmation."calc.add"]
channels = ["client", "web"]
timeout = "60s"

[roles.hasty]
allow = ["calc.*"]
confirm = ["calc.add"]

[roles.hasty.confirmation."calc.add"]
channels = ["client"]
timeout = "1s"

[roles.careful]
allow = ["modern.*"]
confirm = ["modern.multi_round"]

[roles.careful.confirmation."modern.multi_round"]
channels = ["client", "web"]
timeout = "60s"
"""
CAPS: Final[dict[str, Any]] = {"elicitation": {"form": {}}, "sampling": {}, "roots": {}}


@dataclass
class Gateway:
    daemon: Daemon
    root: Path
    user: str
    other: str
    hasty: str
    careful: str

    @property
    def url(self) -> str:
        return self.daemon.url

    def audit(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.root / "audit.jsonl").read_text().splitlines() if line.strip()]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateway]:
    root = tmp_path_factory.mktemp("mrtr")
    tokens = write_config(
        root,
        {"modern": python_command(str(MODERN_CHILD)) + '\nrelay = ["sampling", "elicitation", "roots"]\n',
         "calc": calc_config()},
        roles=ROLES, clients={"user": ["user"], "other": ["user"], "hasty": ["hasty"], "careful": ["careful"]},
    )
    async with Daemon(root) as daemon:
        yield Gateway(daemon, root, tokens["user"], tokens["other"], tokens["hasty"], tokens["careful"])


@asynccontextmanager
async def client(gateway: Gateway, token: str, mode: str, **callbacks: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": bearer(token)},
                                  timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http:
        transport = streamable_http_client(gateway.url, http_client=http)
        async with Client(transport, mode=mode, read_timeout_seconds=SDK_READ_TIMEOUT, **callbacks) as sdk:
            yield sdk


def meta(capabilities: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": CAPS if capabilities is None else capabilities}


async def call(gateway: Gateway, token: str, name: str, arguments: dict[str, Any],
               **retry: Any) -> tuple[int, dict[str, Any]]:
    """A raw modern tools/call (with the retry's inputResponses and requestState, if given): (status, response)."""
    body = request("tools/call", {"name": name, "arguments": arguments, **retry}, meta())
    status, _, answer = await post(gateway.url, body, headers(token, "tools/call", name))
    return status, answer


# -- a child of the modern era -----------------------------------------------------------------


@pytest.mark.parametrize("mode", [MODERN_VERSION, "legacy"])
async def test_a_modern_child_serves_both_eras_of_callers(gateway: Gateway, mode: str) -> None:
    steps: list[float] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append(progress)

    async with asyncio.timeout(TEST_DEADLINE), client(gateway, gateway.user, mode) as sdk:
        assert sdk.protocol_version == (MODERN_VERSION if mode != "legacy" else LEGACY_VERSION)
        names = {tool.name for tool in (await sdk.list_tools()).tools}
        assert {"modern__add", "modern__count", "modern__elicitation", "calc__add"} <= names
        assert text_of(await sdk.call_tool("modern__add", {"a": 20, "b": 22})) == "42"
        assert text_of(await sdk.call_tool("modern__count", {"n": 3}, progress_callback=progress)) == "counted to 3"
        assert steps == [1, 2, 3]


async def test_a_modern_childs_questions_reach_a_modern_caller_and_its_answers_come_back(gateway: Gateway) -> None:
    asked: list[str] = []

    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        if "name" in params.message:
            return ElicitResult(action="accept", content={"name": "Ada"})
        return ElicitResult(action="accept", content={"color": "green", "ok": True})

    async with asyncio.timeout(TEST_DEADLINE), client(gateway, gateway.user, MODERN_VERSION,
                                                      elicitation_callback=elicit) as sdk:
        assert text_of(await sdk.call_tool("modern__elicitation", {})) == "Hello, Ada!"
        assert text_of(await sdk.call_tool("modern__multi_round", {})) == "Your favorite color is green"
        assert text_of(await sdk.call_tool("modern__request_state", {})).startswith("state-ok")
        # The SDK's own era-independent question (Resolve/Elicit) works through the gateway too.
        assert text_of(await sdk.call_tool("modern__confirm", {"path": "/x"})) == "accepted ok=True"
    assert asked == ["What is your name?", "Step 1: What is your name?", "Step 2: What is your favorite color?",
                     "Please confirm", "Really delete /x?"]


async def test_the_gateway_seals_a_childs_state_and_refuses_it_altered_or_from_another_client(
        gateway: Gateway) -> None:
    status, first = await call(gateway, gateway.user, "modern__request_state", {})
    result = first["result"]
    assert status == 200 and result["resultType"] == "input_required" and list(result["inputRequests"]) == ["confirm"]
    state = result["requestState"]
    assert state.startswith("gw1.")
    answers = {"confirm": {"action": "accept", "content": {"ok": True}}}
    tampered = state[:-3] + ("AAA" if not state.endswith("AAA") else "BBB")
    for token, sent, arguments in ((gateway.user, tampered, {}), (gateway.other, state, {}),
                                   (gateway.user, state, {"extra": 1}), (gateway.user, "v1.forged", {})):
        status, refused = await call(gateway, token, "modern__request_state", arguments, inputResponses=answers,
                                     requestState=sent)
        assert (status, refused["error"]["code"]) == (400, INVALID_PARAMS), refused
    status, done = await call(gateway, gateway.user, "modern__request_state", {}, inputResponses=answers,
                              requestState=state)
    assert done["result"]["resultType"] == "complete"
    assert done["result"]["content"][0]["text"].startswith("state-ok")


# -- the confirmation gate ----------------------------------------------------------------------


# The same daemon asks a caller of either era: a modern one with an input-required result, a legacy one with an
# elicitation on the call's stream; the SDK's elicitation callback answers both.
@pytest.mark.parametrize("mode", [MODERN_VERSION, "legacy"])
async def test_the_gate_asks_the_caller_and_its_yes_runs_the_call_once(gateway: Gateway, mode: str) -> None:
    asked: list[str] = []

    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": True})

    async with asyncio.timeout(TEST_DEADLINE), client(gateway, gateway.user, mode,
                                                      elicitation_callback=elicit) as sdk:
        assert text_of(await sdk.call_tool("calc__add", {"a": 2, "b": 3})) == "5"
    assert len(asked) == 1 and "calc.add" in asked[0] and '"a": 2' in asked[0]


@pytest.mark.parametrize("mode", [MODERN_VERSION, "legacy"])
async def test_the_gates_no_is_denied(gateway: Gateway, mode: str) -> None:
    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="decline")

    async with asyncio.timeout(TEST_DEADLINE), client(gateway, gateway.user, mode,
                                                      elicitation_callback=elicit) as sdk:
        with pytest.raises(MCPError) as refused:
            await sdk.call_tool("calc__add", {"a": 2, "b": 4})
    assert refused.value.error.code == CONFIRM_DENIED


async def gate_question(gateway: Gateway, token: str, arguments: dict[str, Any]) -> str:
    """Make a gated call; the gate's question is asked: the requestState to retry with."""
    status, first = await call(gateway, token, "calc__add", arguments)
    result = first["result"]
    assert status == 200 and result["resultType"] == "input_required", first
    question = result["inputRequests"][GATE_KEY]
    assert question["method"] == "elicitation/create" and "calc.add" in question["params"]["message"]
    return str(result["requestState"])


@pytest.mark.parametrize("verb, code", [("approve", None), ("deny", CONFIRM_DENIED)])
async def test_an_operator_decides_and_the_retry_runs_or_is_denied(gateway: Gateway, verb: str,
                                                                    code: int | None) -> None:
    arguments = {"a": 7, "b": 1 if code is None else 2}
    state = await gate_question(gateway, gateway.user, arguments)
    # Retried before anyone decided, without an answer: asked again, same approval.
    status, again = await call(gateway, gateway.user, "calc__add", arguments, requestState=state)
    assert again["result"]["resultType"] == "input_required"
    [pending] = [view for view in await pending_approvals(gateway.root) if view["arguments"] == arguments]
    exit_code, _, err = await gatewayctl(gateway.root, verb, pending["id"])
    assert exit_code == 0, err
    status, answered = await call(gateway, gateway.user, "calc__add", arguments, requestState=state)
    if code is None:
        assert answered["result"]["content"][0]["text"] == "8"
    else:
        assert answered["error"]["code"] == code
    # Used: the same state never runs the call again.
    status, replayed = await call(gateway, gateway.user, "calc__add", arguments, requestState=state)
    assert (status, replayed["error"]["code"]) == (400, INVALID_PARAMS)
    assert replayed["error"]["data"]["reason"] == "used"


async def test_an_unanswered_question_expires(gateway: Gateway) -> None:
    arguments = {"a": 1, "b": 1}
    state = await gate_question(gateway, gateway.hasty, arguments)
    [pending] = [view for view in await pending_approvals(gateway.root) if view["client"] == "hasty"]

    async def expired() -> bool:
        code, out, _ = await gatewayctl(gateway.root, "approvals", "--json")
        return not any(view["id"] == pending["id"] for view in json.loads(out))

    async with asyncio.timeout(TEST_DEADLINE):
        while True:
            if await expired():
                break
            await asyncio.sleep(POLL_INTERVAL)
    answers = {GATE_KEY: {"action": "accept", "content": {"approve": True}}}
    status, late = await call(gateway, gateway.hasty, "calc__add", arguments, inputResponses=answers,
                              requestState=state)
    assert late["error"]["code"] == CONFIRM_EXPIRED


# -- a modern child's questions, put to a legacy caller --------------------------------------------


async def test_a_modern_childs_questions_reach_a_legacy_caller_on_its_stream(gateway: Gateway) -> None:
    asked: list[str] = []

    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        if "name" in params.message:
            return ElicitResult(action="accept", content={"name": "Ada"})
        return ElicitResult(action="accept", content={"color": "green", "ok": True})

    async def sample(_context: Any, params: Any) -> CreateMessageResult:
        return CreateMessageResult(role="assistant", content=TextContent(type="text", text="Paris"),
                                   model="test-model", stop_reason="endTurn")

    async with asyncio.timeout(TEST_DEADLINE), client(gateway, gateway.user, "legacy", elicitation_callback=elicit,
                                                      sampling_callback=sample) as sdk:
        assert sdk.protocol_version == LEGACY_VERSION
        assert text_of(await sdk.call_tool("modern__elicitation", {})) == "Hello, Ada!"
        assert text_of(await sdk.call_tool("modern__multi_round", {})) == "Your favorite color is green"
        assert text_of(await sdk.call_tool("modern__sampling", {})) == "The model said: Paris"
    assert asked == ["What is your name?", "Step 1: What is your name?", "Step 2: What is your favorite color?"]


async def test_a_legacy_caller_that_cannot_be_asked_gets_an_error_not_a_question(gateway: Gateway) -> None:
    async with asyncio.timeout(TEST_DEADLINE), client(gateway, gateway.user, "legacy") as sdk:
        with pytest.raises(MCPError) as refused:
            await sdk.call_tool("modern__sampling", {})
    assert "did not declare sampling" in str(refused.value)


async def test_a_modern_childs_questions_during_a_legacy_prompt_reach_its_caller(gateway: Gateway) -> None:
    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        assert params.message == "What context should the prompt use?"
        return ElicitResult(action="accept", content={"context": "tests"})

    async with asyncio.timeout(TEST_DEADLINE), client(gateway, gateway.user, "legacy", elicitation_callback=elicit) \
            as sdk:
        prompt = await sdk.get_prompt("modern__prompt")
    assert [getattr(message.content, "text", None) for message in prompt.messages] == ["Use this context: tests"]


async def legacy_json(gateway: Gateway, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A legacy session that declared every capability, and one request of it answered as plain JSON."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TEST_DEADLINE)) as http:
        base = {"Authorization": bearer(gateway.user), "Content-Type": "application/json",
                "Accept": "application/json"}
        opened = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": LEGACY_VERSION, "capabilities": CAPS, "clientInfo": {"name": "json"}}}
        async with http.post(gateway.url, json=opened, headers=base) as response:
            assert response.status == 200
            session = response.headers["Mcp-Session-Id"]
        sent = {**base, "Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY_VERSION}
        async with http.post(gateway.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                             headers=sent) as response:
            assert response.status == 202
        async with http.post(gateway.url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                             headers=sent) as response:
            assert response.status == 200 and response.content_type == "application/json"
            answer: dict[str, Any] = await response.json()
            return answer


@pytest.mark.parametrize("method, params", [
    ("tools/call", {"name": "modern__elicitation", "arguments": {}}),
    ("prompts/get", {"name": "modern__prompt"}),
])
async def test_a_legacy_caller_answered_as_json_gets_an_error_not_a_modern_question(
        gateway: Gateway, method: str, params: dict[str, Any]) -> None:
    answer = await legacy_json(gateway, method, params)
    error = answer["error"]
    assert error["code"] == METHOD_NOT_FOUND, answer
    assert error["data"]["error_type"] == "input_not_relayed" and error["data"]["asks"] == ["elicitation/create"]
    assert "Accept: text/event-stream" in error["message"] and "'modern'" in error["message"]


# -- a confirm-gated tool whose modern server asks in rounds ---------------------------------------


async def test_a_gated_call_of_a_modern_child_is_approved_once_for_all_its_rounds(gateway: Gateway) -> None:
    asked: list[str] = []

    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        if "modern.multi_round" in params.message:
            return ElicitResult(action="accept", content={"approve": True})
        if "name" in params.message:
            return ElicitResult(action="accept", content={"name": "Ada"})
        return ElicitResult(action="accept", content={"color": "blue"})

    async with asyncio.timeout(TEST_DEADLINE), client(gateway, gateway.careful, MODERN_VERSION,
                                                      elicitation_callback=elicit) as sdk:
        assert text_of(await sdk.call_tool("modern__multi_round", {})) == "Your favorite color is blue"
    assert [message for message in asked if "modern.multi_round" in message] == asked[:1]
    assert asked[1:] == ["Step 1: What is your name?", "Step 2: What is your favorite color?"]
    carried = [r for r in gateway.audit() if r.get("event") == "approval_carried" and r["client"] == "careful"]
    used = [r for r in gateway.audit() if r.get("event") == "approval_decided" and r["client"] == "careful"]
    assert len(carried) == 2 and {r["approval_id"] for r in carried} == {used[-1]["approval_id"]}


async def test_a_round_that_carries_an_approval_cannot_be_sent_twice(gateway: Gateway) -> None:
    status, first = await call(gateway, gateway.careful, "modern__multi_round", {})
    gate = first["result"]
    assert status == 200 and list(gate["inputRequests"]) == [GATE_KEY]
    status, round1 = await call(gateway, gateway.careful, "modern__multi_round", {},
                                inputResponses={GATE_KEY: {"action": "accept", "content": {"approve": True}}},
                                requestState=gate["requestState"])
    asked = round1["result"]
    assert list(asked["inputRequests"]) == ["step1"], round1
    answers = {"step1": {"action": "accept", "content": {"name": "Ada"}}}
    status, round2 = await call(gateway, gateway.careful, "modern__multi_round", {}, inputResponses=answers,
                                requestState=asked["requestState"])
    assert list(round2["result"]["inputRequests"]) == ["step2"], round2
    status, replayed = await call(gateway, gateway.careful, "modern__multi_round", {}, inputResponses=answers,
                                  requestState=asked["requestState"])
    assert (status, replayed["error"]["code"]) == (400, INVALID_PARAMS), replayed
    assert replayed["error"]["data"]["reason"] == "used"
