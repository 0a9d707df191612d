"""A legacy tool server's questions during a modern (2026-07-28) call, as input-required results (continuations.py).

Against the real daemon, the conformance fixture (tests/fixtures/conformsrv.py, a legacy child) asks its client for
sampling, elicitation and roots during a call. A modern caller is answered with an input-required result carrying
the child's request, the call stays pending at the child, and the caller's retry sends the answers to the child:
the official SDK in `mode="2026-07-28"` answers through its callbacks. Bad retries are refused with -32602 (another
client's state, other arguments, a state used already); a call nobody comes back for is abandoned after the park
timeout and the child gets an error, never a hang; a client parking too many calls gets a clear error. Each question
is audited as a `relayed` record.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gatewayd.continuations import MAX_PARKED_PER_CLIENT
from tests.daemon import REPO, Daemon, gatewayctl, python_command, write_config
from tests.e2e.test_mcp_sdk import MODERN_VERSION, SDK_READ_TIMEOUT, TEST_DEADLINE, bearer, text_of
from tests.e2e.test_mcp_sdk_modern import headers, post, request
from tests.e2e.test_mcp_sdk_relay import elicit, roots, sample
from tests.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

FIXTURE: Final = REPO / "tests" / "fixtures" / "conformsrv.py"
CAPS: Final[dict[str, Any]] = {"elicitation": {"form": {}}, "sampling": {}, "roots": {}}
INVALID_PARAMS: Final = -32602
OVERLOADED: Final = -32014
TIMED_OUT: Final = -32001
# The park timeout of the second daemon: a continuation nobody retries is abandoned this soon.
PARK_TIMEOUT: Final = 1.0
ROLES: Final = '[roles.user]\nallow = ["ask.*", "quiet.*"]\n'


@dataclass
class Rig:
    daemon: Daemon
    root: Path
    tokens: dict[str, str]

    @property
    def audit(self) -> list[dict[str, Any]]:
        path = self.root / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def asked(self) -> list[dict[str, Any]]:
        """The replies the child got to its own requests."""
        path = self.root / "asked.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@asynccontextmanager
async def rig_of(root: Path, env: dict[str, str] | None = None) -> AsyncIterator[Rig]:
    asked = f'\nenv = {{ CONFORMSRV_ASKED_LOG = "{root / "asked.jsonl"}" }}\n'
    tokens = write_config(
        root,
        {"ask": python_command(str(FIXTURE)) + asked + 'relay = ["sampling", "elicitation", "roots"]\n',
         "quiet": python_command(str(FIXTURE)) + asked},
        roles=ROLES, clients={"user": ["user"], "other": ["user"], "greedy": ["user"]},
    )
    async with Daemon(root, env=env) as daemon:
        yield Rig(daemon, root, tokens)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    async with rig_of(tmp_path_factory.mktemp("mrtr-relay")) as made:
        yield made


@asynccontextmanager
async def sdk_client(rig: Rig, mode: str = MODERN_VERSION, **callbacks: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": bearer(rig.tokens["user"])},
                                  timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http:
        transport = streamable_http_client(rig.daemon.url, http_client=http)
        async with Client(transport, mode=mode, read_timeout_seconds=SDK_READ_TIMEOUT, **callbacks) as sdk:
            yield sdk


async def call(rig: Rig, client: str, name: str, arguments: dict[str, Any],
               **retry: Any) -> tuple[int, dict[str, Any]]:
    """A raw modern tools/call (with a retry's inputResponses and requestState, if given): (status, response)."""
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
            "io.modelcontextprotocol/clientCapabilities": CAPS}
    body = request("tools/call", {"name": name, "arguments": arguments, **retry}, meta)
    status, _, answer = await post(rig.daemon.url, body, headers(rig.tokens[client], "tools/call", name))
    return status, answer


SAMPLED: Final = {"role": "assistant", "content": {"type": "text", "text": "echo hi"}, "model": "m",
                  "stopReason": "endTurn"}


# -- the official SDK answers -------------------------------------------------------------------


# The same daemon, the same child: a modern caller is asked with an input-required result, a legacy one with the
# child's own request on its stream; either way the SDK's callback answers and the child gets the answer.
BOTH_ERAS: Final = pytest.mark.parametrize("mode", [MODERN_VERSION, "legacy"])


@BOTH_ERAS
@pytest.mark.filterwarnings("ignore:The roots capability is deprecated")
async def test_a_legacy_childs_sampling_is_answered_by_the_callers_callback(rig: Rig, mode: str) -> None:
    async with asyncio.timeout(TEST_DEADLINE), sdk_client(rig, mode, sampling_callback=sample) as sdk:
        assert sdk.protocol_version == (MODERN_VERSION if mode == MODERN_VERSION else "2025-11-25")
        result = await sdk.call_tool("ask__sampling", {"prompt": "hello"})
    assert not result.is_error and text_of(result) == "LLM response: echo hello"
    await eventually(lambda: any(r.get("event") == "relayed" and r["kind"] == "sampling" and r["outcome"] == "answered"
                                 and r["client"] == "user" for r in rig.audit), what="the relayed record")


@BOTH_ERAS
@pytest.mark.filterwarnings("ignore:The roots capability is deprecated")
async def test_a_legacy_childs_elicitation_and_roots_reach_the_caller(rig: Rig, mode: str) -> None:
    async with asyncio.timeout(TEST_DEADLINE), sdk_client(rig, mode, elicitation_callback=elicit,
                                                          list_roots_callback=roots) as sdk:
        listed = await sdk.call_tool("ask__roots", {})
        answered = await sdk.call_tool("ask__elicitation", {"message": "who?"})
        plain = await sdk.call_tool("ask__simple_text", {})
    assert text_of(listed) == 'Roots: [{"uri": "file:///work", "name": "work"}]'
    assert text_of(answered) == 'User response: action=accept, content={"username": "ada", "email": "ada@example.com"}'
    assert not plain.is_error


# -- what the wire says -------------------------------------------------------------------------


async def test_the_input_request_is_the_childs_request_and_the_retry_resumes_the_same_call(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        status, answer = await call(rig, "user", "ask__sampling", {"prompt": "hi"})
        assert status == 200, answer
        result = answer["result"]
        assert result["resultType"] == "input_required"
        [(key, asked)] = result["inputRequests"].items()
        assert asked["method"] == "sampling/createMessage"
        assert "_meta" not in asked["params"] and asked["params"]["maxTokens"] == 100
        state = result["requestState"]
        status, answer = await call(rig, "user", "ask__sampling", {"prompt": "hi"},
                                    inputResponses={key: SAMPLED}, requestState=state)
        assert status == 200, answer
        assert answer["id"] == 7 and answer["result"]["content"][0]["text"] == "LLM response: echo hi"
        # A state resumes its call once.
        status, answer = await call(rig, "user", "ask__sampling", {"prompt": "hi"},
                                    inputResponses={key: SAMPLED}, requestState=state)
        assert answer["error"]["code"] == INVALID_PARAMS and answer["error"]["data"]["reason"] == "used"


async def test_another_clients_state_or_other_arguments_are_refused_and_the_owner_still_can_retry(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        _, answer = await call(rig, "user", "ask__sampling", {"prompt": "hi"})
        [key] = answer["result"]["inputRequests"]
        state = answer["result"]["requestState"]
        _, stolen = await call(rig, "other", "ask__sampling", {"prompt": "hi"},
                               inputResponses={key: SAMPLED}, requestState=state)
        assert stolen["error"]["code"] == INVALID_PARAMS and stolen["error"]["data"]["reason"] == "not_this_call"
        _, altered = await call(rig, "user", "ask__sampling", {"prompt": "other"},
                                inputResponses={key: SAMPLED}, requestState=state)
        assert altered["error"]["code"] == INVALID_PARAMS and altered["error"]["data"]["reason"] == "not_this_call"
        _, answer = await call(rig, "user", "ask__sampling", {"prompt": "hi"},
                               inputResponses={key: SAMPLED}, requestState=state)
        assert answer["result"]["content"][0]["text"] == "LLM response: echo hi"


async def test_an_unanswered_question_gets_the_child_an_error(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        _, answer = await call(rig, "user", "ask__sampling", {"prompt": "left"})
        state = answer["result"]["requestState"]
        _, answer = await call(rig, "user", "ask__sampling", {"prompt": "left"}, inputResponses={},
                               requestState=state)
    result = answer["result"]
    assert result["isError"] and result["content"][0]["text"].startswith(f"Sampling error: {INVALID_PARAMS} ")


async def test_a_server_not_allowed_to_ask_is_refused_without_asking(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        _, answer = await call(rig, "user", "quiet__sampling", {"prompt": "hi"})
    result = answer["result"]
    assert result["resultType"] == "complete" and result["isError"]
    assert "may not ask clients for sampling" in result["content"][0]["text"]


async def test_a_client_parking_too_many_calls_is_told_and_the_child_answered(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        for n in range(MAX_PARKED_PER_CLIENT):
            _, answer = await call(rig, "greedy", "ask__sampling", {"prompt": f"p{n}"})
            assert answer["result"]["resultType"] == "input_required", answer
        status, answer = await call(rig, "greedy", "ask__sampling", {"prompt": "one too many"})
        assert answer["error"]["code"] == OVERLOADED, answer
        assert answer["error"]["data"]["limit"] == MAX_PARKED_PER_CLIENT
        # Another client is not held back by it.
        _, answer = await call(rig, "user", "ask__sampling", {"prompt": "mine"})
        assert answer["result"]["resultType"] == "input_required"
    await eventually(lambda: any(r.get("event") == "relayed" and r["outcome"] == "too_many"
                                 and r["client"] == "greedy" for r in rig.audit), what="the refused question")


async def test_a_parked_call_nobody_retries_is_abandoned_and_the_child_told(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    async with rig_of(tmp_path_factory.mktemp("mrtr-park"), {"GATEWAYD_RELAY_TIMEOUT": str(PARK_TIMEOUT)}) as park, \
            asyncio.timeout(TEST_DEADLINE):
        _, answer = await call(park, "user", "ask__sampling", {"prompt": "gone"})
        [key] = answer["result"]["inputRequests"]
        state = answer["result"]["requestState"]
        await eventually(lambda: any("error" in reply for reply in park.asked()), what="the child's error")
        [reply] = park.asked()
        assert reply["error"]["code"] == TIMED_OUT and f"within {PARK_TIMEOUT:g}s" in reply["error"]["message"]
        _, answer = await call(park, "user", "ask__sampling", {"prompt": "gone"},
                               inputResponses={key: SAMPLED}, requestState=state)
        assert answer["error"]["code"] == INVALID_PARAMS and answer["error"]["data"]["reason"] == "used"
        await eventually(lambda: any(r.get("event") == "relayed" and r["outcome"] == "timeout" for r in park.audit),
                         what="the timeout record")


# -- each retry decided again, and audited --------------------------------------------------------


async def test_each_resumed_round_has_its_own_record_under_the_calls_trace(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        _, answer = await call(rig, "user", "ask__sampling", {"prompt": "traced"})
        [key] = answer["result"]["inputRequests"]
        _, answer = await call(rig, "user", "ask__sampling", {"prompt": "traced"},
                               inputResponses={key: SAMPLED}, requestState=answer["result"]["requestState"])
        assert answer["result"]["content"][0]["text"] == "LLM response: echo hi"

    def rounds() -> list[dict[str, Any]]:
        traces = {r["trace_id"] for r in rig.audit if r.get("event") == "decision"
                  and r.get("params") == {"prompt": "traced"}}
        return [r for r in rig.audit if r.get("event") == "resumed" and r["trace_id"] in traces]

    await eventually(lambda: bool(rounds()), what="the resumed record")
    resumed = rounds()
    assert [(r["round"], r["outcome"], r["answers"], r["client"]) for r in resumed] == [(1, "resumed", 1, "user")]


async def test_a_retry_after_a_reload_took_the_permission_away_is_refused_and_the_child_told(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("mrtr-reauth")
    async with rig_of(root) as rigged, asyncio.timeout(TEST_DEADLINE):
        _, answer = await call(rigged, "user", "ask__sampling", {"prompt": "revoked"})
        [key] = answer["result"]["inputRequests"]
        (root / "policies" / "roles.toml").write_text('[roles.user]\nallow = ["quiet.*"]\n')
        code, _, err = await gatewayctl(root, "reload")
        assert code == 0, err
        _, retried = await call(rigged, "user", "ask__sampling", {"prompt": "revoked"},
                                inputResponses={key: SAMPLED}, requestState=answer["result"]["requestState"])
        # Exactly what a new call of a tool the client may not use gets: denied looks unknown.
        _, fresh = await call(rigged, "user", "ask__sampling", {"prompt": "revoked"})
        assert "error" in retried and retried["error"] == fresh["error"], (retried, fresh)
        # The child's question was answered with an error, not left waiting; the round is on record as denied.
        await eventually(lambda: any("error" in reply for reply in rigged.asked()), what="the child's error")
        await eventually(lambda: any(r.get("event") == "resumed" and r["outcome"] == "denied" for r in rigged.audit),
                         what="the denied round")
