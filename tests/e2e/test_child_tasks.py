"""A 2026-07-28 child's own tasks (the tasks extension, SEP-2663), driven by the gateway for its callers, through the
real daemon with a real child that makes tasks (tests/fixtures/childtasks.py).

A tool the child runs only as a task answers every kind of caller (the child's -32021 is answered by sending the call
again declaring the extension, and from then on at once); a tool whose tools.d `task` allows it is told the
extension, and its task becomes the modern caller's own; a child that does not advertise the extension is never told
it; the questions a child's task lists reach a legacy caller on its stream, a modern caller as input-required
results, a task's caller through `tasks/get`, and the answers go back by `tasks/update`; a task the child fails or
cancels is the call's error or failure; a call that ends first — its deadline, a caller who cannot be asked, its own
task cancelled — cancels the child's task.
"""

from __future__ import annotations

import asyncio
import json
import time
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
from mcp_types import ElicitRequestParams, ElicitResult

from gatewayd.errors import INTERNAL_ERROR
from gatewayd.modern import TASKS_EXTENSION
from gatewayd.upstream.child_tasks import MAX_INPUT_ROUNDS
from tests.daemon import REPO, Daemon, python_command, rpc, write_config
from tests.e2e.test_mcp_sdk import MODERN_VERSION, SDK_READ_TIMEOUT, TEST_DEADLINE, bearer, text_of
from tests.e2e.test_mcp_sdk_modern import headers, post, request
from tests.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHILD: Final = REPO / "tests" / "fixtures" / "childtasks.py"
WITH: Final[dict[str, Any]] = {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}
WITHOUT: Final[dict[str, Any]] = {"elicitation": {}}
ROLES: Final = '[roles.user]\nallow = ["kid.*", "brief.*", "plain.*", "sloth.*", "talk.*"]\n'
# How often a test polls a task, and for how long at most.
POLL_S: Final = 0.05
POLL_DEADLINE: Final = 15.0
TERMINAL: Final = ("completed", "failed", "cancelled")


def child(root: Path, name: str, *flags: str, extra: str = "") -> str:
    return (python_command(str(CHILD), "--log", str(root / f"{name}.log"), *flags)
            + '\nrelay = ["elicitation"]\nera = "2026-07-28"\n' + extra)


@dataclass
class Rig:
    daemon: Daemon
    root: Path
    token: str

    def log(self, name: str) -> list[dict[str, Any]]:
        """What the child `name` was sent, in order."""
        path = self.root / f"{name}.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def audit(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in (self.root / "audit.jsonl").read_text().splitlines()]

    async def call(self, method: str, params: dict[str, Any], caps: dict[str, Any] = WITH) -> tuple[int, Any]:
        """A raw modern request: (HTTP status, the JSON-RPC response)."""
        meta = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                "io.modelcontextprotocol/clientCapabilities": caps}
        named = params.get("name", params.get("taskId"))
        status, _, answer = await post(self.daemon.url, request(method, params, meta),
                                       headers(self.token, method, named))
        return status, answer

    async def tool(self, name: str, arguments: dict[str, Any], caps: dict[str, Any] = WITH) -> dict[str, Any]:
        _, answer = await self.call("tools/call", {"name": name, "arguments": arguments}, caps)
        return dict(answer)

    async def direct(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """A plain JSON-RPC call of `server.method`, answered as JSON."""
        async with aiohttp.ClientSession() as http:
            return await rpc(http, self.daemon.url, self.token, method, params)

    async def until(self, task_id: str, *statuses: str, message: str | None = None) -> dict[str, Any]:
        """Poll the gateway's task until its status is one of `statuses` (or terminal), or its `statusMessage` is
        `message`, within POLL_DEADLINE."""
        deadline = time.monotonic() + POLL_DEADLINE
        while True:
            _, answer = await self.call("tasks/get", {"taskId": task_id})
            result = answer["result"]
            if result["status"] in statuses or result["status"] in TERMINAL or time.monotonic() > deadline \
                    or (message is not None and result.get("statusMessage") == message):
                return dict(result)
            await asyncio.sleep(POLL_S)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    root = tmp_path_factory.mktemp("child-tasks")
    optional = '[methods.long_job]\ntask = "optional"\n[methods.forever]\ntask = "optional"\n' \
               '[methods.ask_mid]\ntask = "optional"\n'
    servers = {"kid": child(root, "kid", extra=optional),
               "brief": child(root, "brief", extra='[methods.forever]\ntimeout = "1s"\n'),
               "plain": child(root, "plain", "--no-extension", extra=optional),
               # Tells of tool list changes on a listen it may end itself.
               "talk": child(root, "talk", "--listens"),
               # Suggests polling every ten minutes; its calls give up after 10 s.
               "sloth": child(root, "sloth", "--poll-ms", "600000", extra='call_timeout = "10s"\n')}
    tokens = write_config(root, servers, roles=ROLES, clients={"user": ["user"]})
    async with Daemon(root) as daemon:
        yield Rig(daemon, root, tokens["user"])


@asynccontextmanager
async def sdk(rig: Rig, mode: str, **callbacks: Any) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": bearer(rig.token)},
                                  timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http, \
            Client(streamable_http_client(rig.daemon.url, http_client=http), mode=mode,
                   read_timeout_seconds=SDK_READ_TIMEOUT, **callbacks) as client:
        yield client


def calls_of(rig: Rig, server: str, tool: str) -> list[bool]:
    """Whether each `tools/call` of `tool` the child got declared the extension."""
    return [entry["declared"] for entry in rig.log(server) if entry["method"] == "tools/call" and entry["tool"] == tool]


def text(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


async def test_a_tool_the_child_runs_only_as_a_task_answers_every_kind_of_caller(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        modern = (await rig.tool("kid__must_task", {"seconds": 0.2}, WITHOUT))["result"]
        assert modern["resultType"] == "complete" and text(modern).startswith("worked 0.2s as child-task-")
        direct = await rig.direct("kid.must_task", {"seconds": 0.1})
        assert text(direct["result"]).startswith("worked 0.1s as child-task-"), direct
        heard: list[tuple[float, str | None]] = []

        async def tell(progress: float, total: float | None, message: str | None) -> None:
            heard.append((progress, message))

        async with sdk(rig, "legacy") as legacy:
            result = await legacy.call_tool("kid__must_task", {"seconds": 0.4}, progress_callback=tell)
    assert not result.is_error and text_of(result).startswith("worked 0.4s as child-task-")
    # The child's task said how it went: its caller asked for progress, and heard each change once.
    assert heard == [(1, "started"), (2, "halfway")]
    # Refused once without the extension; every call after that declared it at once.
    assert calls_of(rig, "kid", "must_task") == [False, True, True, True]
    assert any(entry["method"] == "tasks/get" for entry in rig.log("kid"))
    # Its discovery says it tells of no changes: it is not asked to.
    assert not any(entry["method"] == "subscriptions/listen" for entry in rig.log("kid"))
    outcomes = [r["status"] for r in rig.audit() if r.get("method") == "kid.must_task" and r["event"] == "outcome"]
    assert outcomes == ["ok", "ok", "ok"]


async def test_a_long_tools_child_task_becomes_the_modern_callers_own(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        created = (await rig.tool("kid__long_job", {"seconds": 2}))["result"]
        assert created["resultType"] == "task" and not created["taskId"].startswith("child-task-")
        # While it works, the task says how, as the child's task says it.
        working = await rig.until(created["taskId"], "completed", message="halfway")
        assert working["status"] == "working" and working["statusMessage"] == "halfway"
        done = await rig.until(created["taskId"])
    assert done["status"] == "completed" and text(done["result"]).startswith("worked 2s as child-task-")
    assert "statusMessage" not in done
    assert calls_of(rig, "kid", "long_job") == [True]


async def test_a_child_that_does_not_advertise_the_extension_is_never_told_it(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        result = (await rig.tool("plain__long_job", {"seconds": 0.1}))["result"]
    assert result["resultType"] == "complete" and text(result) == "worked 0.1s inline"
    assert calls_of(rig, "plain", "long_job") == [False]


def answering(asked: list[str]) -> Any:
    async def elicit(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        if "name" in params.message:
            return ElicitResult(action="accept", content={"name": "Ada"})
        return ElicitResult(action="accept", content={"colour": "green"})
    return elicit


@pytest.mark.parametrize("mode", ["legacy", MODERN_VERSION])
async def test_a_child_tasks_questions_reach_an_sdk_caller_and_its_answers_the_task(rig: Rig, mode: str) -> None:
    asked: list[str] = []
    before = len([entry for entry in rig.log("kid") if entry["method"] == "tasks/update"])
    async with asyncio.timeout(TEST_DEADLINE), sdk(rig, mode, elicitation_callback=answering(asked)) as client:
        result = await client.call_tool("kid__ask_mid", {})
    assert text_of(result) == "hello Ada, who likes green"
    assert asked == ["What is your name?", "Your favourite colour?"]
    # Each question answered once, by its own key.
    updates = [entry for entry in rig.log("kid") if entry["method"] == "tasks/update"][before:]
    assert len(updates) == 2


async def test_a_child_tasks_questions_are_the_gateway_tasks_and_answered_by_update(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        # Asked only after the call became a task (`task_after`, 0.5 s).
        created = (await rig.tool("kid__ask_mid", {"after": 1.0}))["result"]
        assert created["resultType"] == "task", created
        for message, answer in (("What is your name?", {"name": "Bo"}), ("Your favourite colour?",
                                                                          {"colour": "red"})):
            asking = await rig.until(created["taskId"], "input_required")
            assert asking["status"] == "input_required", asking
            [(key, question)] = asking["inputRequests"].items()
            assert question["params"]["message"] == message
            _, ack = await rig.call("tasks/update", {"taskId": created["taskId"], "inputResponses": {
                key: {"action": "accept", "content": answer}}})
            assert ack["result"]["resultType"] == "complete"
        done = await rig.until(created["taskId"])
    assert done["status"] == "completed" and text(done["result"]) == "hello Bo, who likes red"


async def test_a_caller_that_cannot_be_asked_fails_and_the_childs_task_is_cancelled(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        status, answer = await rig.call("tools/call", {"name": "kid__ask_mid", "arguments": {}}, {})
        assert status == 400 and answer["error"]["code"] == -32021
        assert answer["error"]["data"] == {"requiredCapabilities": {"elicitation": {}}}
        direct = await rig.direct("kid.ask_mid", {})
        assert direct["error"]["code"] == -32601 and direct["error"]["data"]["asks"] == ["elicitation/create"]
    # Both of the child's tasks were cancelled, not left waiting for answers that will not come.
    await eventually(lambda: sum(entry["method"] == "cancelled" for entry in rig.log("kid")) >= 2,
                     what="the child's tasks cancelled")


async def test_a_task_the_child_fails_or_cancels_is_the_calls_error_or_failure(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        direct = await rig.direct("kid.fails", {})
        assert direct["error"] == {"code": -32050, "message": "disk full"}
        _, answer = await rig.call("tools/call", {"name": "kid__fails", "arguments": {}}, WITHOUT)
        assert answer["error"] == {"code": -32050, "message": "disk full"}
        async with sdk(rig, "legacy") as legacy:
            result = await legacy.call_tool("kid__gives_up", {})
    assert result.is_error and text_of(result) == "tool server 'kid' cancelled the task"


async def test_a_call_that_ends_first_cancels_the_childs_task(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        # Its deadline (1 s in tools.d).
        direct = await rig.direct("brief.forever", {})
        assert direct["error"]["code"] == -32012, direct
        await eventually(lambda: any(entry["method"] == "tasks/cancel" for entry in rig.log("brief"))
                         and any(entry["method"] == "cancelled" for entry in rig.log("brief")),
                         what="brief's task cancelled")
        # The gateway's task of it, cancelled by its caller.
        created = (await rig.tool("kid__forever", {}))["result"]
        assert created["resultType"] == "task"
        cancels = sum(entry["method"] == "tasks/cancel" for entry in rig.log("kid"))
        _, ack = await rig.call("tasks/cancel", {"taskId": created["taskId"]})
        assert ack["result"]["resultType"] == "complete"
        await eventually(lambda: sum(entry["method"] == "tasks/cancel" for entry in rig.log("kid")) > cancels,
                         what="kid's task cancelled")


async def test_a_child_asking_without_end_is_stopped_after_the_rounds_bound(rig: Rig) -> None:
    asked: list[str] = []
    async with asyncio.timeout(TEST_DEADLINE), sdk(rig, "legacy", elicitation_callback=answering(asked)) as client:
        with pytest.raises(MCPError) as stopped:
            await client.call_tool("kid__pester", {})
    assert stopped.value.error.code == INTERNAL_ERROR
    assert f"asked for input more than {MAX_INPUT_ROUNDS} times" in stopped.value.error.message
    assert len(asked) == MAX_INPUT_ROUNDS
    await eventually(lambda: any(entry["method"] == "cancelled" and entry["taskId"] == cancelled_task(rig)
                                 for entry in rig.log("kid")), what="the pestering task cancelled")


def cancelled_task(rig: Rig) -> str | None:
    """The task id of the child's last `pester` call."""
    ids = [entry["taskId"] for entry in rig.log("kid") if entry["method"] == "tasks/update"]
    return ids[-1] if ids else None


async def test_a_child_suggesting_a_long_poll_interval_is_polled_within_the_bound(rig: Rig) -> None:
    # Polled as it suggests (every ten minutes), the call would end at its 10 s timeout; within MAX_TASK_POLL it is
    # answered soon after its work is done.
    async with asyncio.timeout(TEST_DEADLINE):
        result = (await rig.tool("sloth__must_task", {"seconds": 0.1}, WITHOUT))["result"]
    assert result["resultType"] == "complete" and text(result).startswith("worked 0.1s as child-task-")


async def test_a_listen_the_child_ends_itself_is_opened_again(rig: Rig) -> None:
    def listens() -> int:
        return sum(entry["method"] == "subscriptions/listen" for entry in rig.log("talk"))

    async with asyncio.timeout(TEST_DEADLINE):
        assert text((await rig.direct("talk.quick", {"text": "hi"}))["result"]) == "quick: hi"  # starts it
        await eventually(lambda: listens() == 1, what="the first listen")
        ended = await rig.direct("talk.end_listens", {})
        assert text(ended["result"]) == "ended 1"
        # Opened again (after REOPEN_FIRST), not left ended until the child restarts.
        await eventually(lambda: listens() == 2, what="the listen opened again")
