"""Tasks of MCP 2026-07-28 callers through the real daemon (gatewayd/modern_tasks.py), with a real child that knows
nothing of tasks (tests/fixtures/taskjobs.py).

A long call of a tool whose tools.d `task` allows it becomes a task its caller polls, and its audit record is
written when it ends; a quick one is answered inline; a "required" tool refuses a modern caller without the extension
(-32021) and runs inline for a legacy one; a task's questions reach its caller through `tasks/get` and its answers
the child through `tasks/update`; `tasks/cancel` ends the call at the child; a task is its client's alone, and goes
with the client's permission. The conformance suite's tasks scenarios run in tests/e2e/test_conformance.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import aiohttp
import httpx2
import pytest
import pytest_asyncio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gatewayd.modern import TASKS_EXTENSION
from tests.daemon import REPO, Daemon, gatewayctl, pending_approvals, python_command, rpc, status, write_config
from tests.e2e.test_mcp_sdk import MODERN_VERSION, SDK_READ_TIMEOUT, TEST_DEADLINE, bearer, text_of
from tests.e2e.test_mcp_sdk_modern import headers, post, request
from tests.fixtures import taskjobs
from tests.waiting import eventually

pytestmark = pytest.mark.asyncio(loop_scope="module")

WITH: Final[dict[str, Any]] = {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}
WITHOUT: Final[dict[str, Any]] = {"elicitation": {}}
ROLES: Final = ('[roles.user]\nallow = ["jobs.*", "old.*", "modern.*", "gated.*"]\nconfirm = ["gated.slow_compute"]\n'
                '[roles.user.confirmation."gated.slow_compute"]\ntimeout = "30s"\nchannels = ["web"]\n')
# A child of 2025-11-25 that makes a task of a call sent with `task`, and whose `must` runs only as one
# (tests/fixtures/tasksrv.py).
OLD_TASKS: Final = REPO / "tests" / "fixtures" / "tasksrv.py"
# A child of 2026-07-28 whose `slow_then_ask` answers with questions only after a second (tests/fixtures/modernsrv.py).
MODERN: Final = (python_command(str(REPO / "tests" / "fixtures" / "modernsrv.py"))
                 + '\nrelay = ["elicitation"]\nera = "2026-07-28"\n[methods.slow_then_ask]\ntask = "optional"\n')
# How often a test polls a task, and for how long at most (the fixture's jobs take about a second).
POLL_S: Final = 0.05
POLL_DEADLINE: Final = 15.0
TERMINAL: Final = ("completed", "failed", "cancelled")


@dataclass
class Rig:
    daemon: Daemon
    root: Path
    tokens: dict[str, str]

    def audit(self) -> list[dict[str, Any]]:
        path = self.root / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    async def call(self, method: str, params: dict[str, Any], caps: dict[str, Any] = WITH, client: str = "user",
                   name: str | None = None) -> tuple[int, dict[str, Any]]:
        """A raw modern request: (HTTP status, the JSON-RPC response)."""
        meta = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                "io.modelcontextprotocol/clientCapabilities": caps}
        named = name if name is not None else params.get("name", params.get("taskId"))
        status, _, answer = await post(self.daemon.url, request(method, params, meta),
                                       headers(self.tokens[client], method, named))
        return status, answer

    async def tool(self, tool: str, arguments: dict[str, Any], caps: dict[str, Any] = WITH) -> dict[str, Any]:
        _, answer = await self.call("tools/call", {"name": f"jobs__{tool}", "arguments": arguments}, caps)
        return answer

    async def task(self, task_id: str, client: str = "user") -> dict[str, Any]:
        _, answer = await self.call("tasks/get", {"taskId": task_id}, client=client)
        return answer

    async def until(self, task_id: str, *statuses: str) -> dict[str, Any]:
        """Poll the task until its status is one of `statuses` (or terminal), within POLL_DEADLINE."""
        deadline = time.monotonic() + POLL_DEADLINE
        while True:
            answer = await self.task(task_id)
            result = answer["result"]
            if result["status"] in statuses or result["status"] in TERMINAL or time.monotonic() > deadline:
                return dict(result)
            await asyncio.sleep(POLL_S)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    root = tmp_path_factory.mktemp("modern-tasks")
    servers = {"jobs": taskjobs.tools_d(), "old": python_command(str(OLD_TASKS), "--must"), "modern": MODERN,
               "gated": taskjobs.tools_d()}
    tokens = write_config(root, servers, roles=ROLES,
                          clients={"user": ["user"], "other": ["user"]})
    async with Daemon(root) as daemon:
        yield Rig(daemon, root, tokens)


async def test_a_long_call_becomes_a_task_its_caller_polls_and_its_audit_record_comes_when_it_ends(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        created = (await rig.tool("slow_compute", {"seconds": 1, "label": "long"}))["result"]
        assert created["resultType"] == "task" and created["status"] == "working"
        assert not {"result", "error", "inputRequests", "requestState", "task", "ttl"} & created.keys()
        task_id = created["taskId"]
        # The task exists before its CreateTaskResult is answered.
        at_once = (await rig.task(task_id))["result"]
        assert at_once["taskId"] == task_id and at_once["resultType"] == "complete"
        assert not any(r.get("method") == "jobs.slow_compute" and r["event"] == "outcome" for r in rig.audit())
        done = await rig.until(task_id)
    assert done["status"] == "completed" and done["result"]["content"][0]["text"] == "long: computed for 1s"
    assert done["result"]["resultType"] == "complete"
    await eventually(lambda: any(r.get("method") == "jobs.slow_compute" and r["event"] == "outcome"
                                 and r["status"] == "ok" for r in rig.audit()), what="the task's call's outcome")


async def test_a_quick_call_of_a_task_tool_is_answered_inline_with_or_without_the_extension(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        for caps in (WITH, WITHOUT):
            result = (await rig.tool("slow_compute", {"seconds": 0, "label": "quick"}, caps))["result"]
            assert result["resultType"] == "complete" and text_of_raw(result) == "quick: computed for 0s"
        # A tool without a `task` is never a task; a caller's 2025-11-25 `task` hint is passed over, not sent on to
        # a child that would make a task of its own of the call.
        _, answer = await rig.call("tools/call", {"name": "jobs__greet", "arguments": {"name": "Ada"},
                                                  "task": {"ttl": 60000}})
        assert answer["result"]["resultType"] == "complete" and text_of_raw(answer["result"]) == "Hello, Ada!"
        _, answer = await rig.call("tools/call", {"name": "old__work", "arguments": {}, "task": {"ttl": 60000}})
    assert answer["result"]["resultType"] == "complete" and "task" not in answer["result"]
    assert text_of_raw(answer["result"]) == "now"


def text_of_raw(result: dict[str, Any]) -> str:
    return str(result["content"][0]["text"])


async def test_a_required_task_tool_refuses_a_modern_caller_without_the_extension_and_runs_for_a_legacy_one(
    rig: Rig,
) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        status, answer = await rig.call("tools/call", {"name": "jobs__failing_job", "arguments": {}}, WITHOUT)
        assert status == 400 and answer["error"]["code"] == -32021
        assert answer["error"]["data"] == {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
        async with httpx2.AsyncClient(headers={"Authorization": bearer(rig.tokens["user"])},
                                      timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http, \
                Client(streamable_http_client(rig.daemon.url, http_client=http), mode="legacy",
                       read_timeout_seconds=SDK_READ_TIMEOUT) as legacy:
            result = await legacy.call_tool("jobs__failing_job", {})
    assert result.is_error and text_of(result) == "the job failed: nothing to process"
    await eventually(lambda: any(r.get("method") == "jobs.failing_job" and r["event"] == "outcome"
                                 and r["status"] == "missing_client_capability" for r in rig.audit()),
                     what="the refusal's outcome")


async def test_a_tasks_questions_reach_its_caller_and_its_answers_the_child(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        created = (await rig.tool("confirm_delete", {"filename": "notes.txt"}))["result"]
        assert created["resultType"] == "task"
        asking = await rig.until(created["taskId"], "input_required")
        assert asking["status"] == "input_required"
        [(key, question)] = asking["inputRequests"].items()
        assert question["method"] == "elicitation/create" and question["params"]["message"] == "Delete notes.txt?"
        _, ack = await rig.call("tasks/update", {"taskId": created["taskId"], "inputResponses": {
            key: {"action": "accept", "content": {"confirm": True}}}})
        assert ack["result"] == {"resultType": "complete", "_meta": ack["result"]["_meta"]}
        done = await rig.until(created["taskId"])
    assert done["status"] == "completed"
    assert text_of_raw(done["result"]) == "notes.txt: deleted (nothing was really deleted)"


async def test_cancelling_a_task_ends_its_call_at_the_child(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        created = (await rig.tool("slow_compute", {"seconds": 600, "label": "endless"}))["result"]
        _, ack = await rig.call("tasks/cancel", {"taskId": created["taskId"]})
        assert ack["result"]["resultType"] == "complete" and "status" not in ack["result"]
        assert (await rig.task(created["taskId"]))["result"]["status"] == "cancelled"
    # The call ended at once (the child was told), not at its 30 s deadline.
    await eventually(lambda: any(r.get("method") == "jobs.slow_compute" and r["event"] == "outcome"
                                 and r["status"] == "cancelled" for r in rig.audit()), what="the cancelled outcome")
    # The operator sees the tasks: the cancelled one is kept, not running.
    tasks = (await status(rig.root))["tasks"]
    assert tasks["kept"] >= 1 and tasks["running"] < tasks["kept"]
    code, out, _ = await gatewayctl(rig.root, "status")
    assert code == 0 and f"tasks {tasks['running']} running/{tasks['kept']} kept" in out.splitlines()[0]
    code, out, _ = await gatewayctl(rig.root, "metrics")
    assert code == 0 and f"gatewayd_tasks_kept {tasks['kept']}" in out.splitlines()
    assert f"gatewayd_tasks_running {tasks['running']}" in out.splitlines()


async def test_a_task_is_its_clients_alone_and_goes_with_its_clients_permission(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        created = (await rig.tool("slow_compute", {"seconds": 600, "label": "mine"}))["result"]
        task_id = created["taskId"]
        for client in ("other", "user"):
            status, answer = await rig.call("tasks/get", {"taskId": task_id if client == "other" else "made-up"},
                                            client=client)
            assert status == 400 and answer["error"]["code"] == -32602, answer
        status, answer = await rig.call("tasks/get", {"taskId": task_id}, WITHOUT)
        assert status == 400 and answer["error"]["code"] == -32021
        # The client loses the tool: its task is as unknown as one never made.
        (rig.root / "policies" / "roles.toml").write_text('[roles.user]\nallow = ["jobs.greet"]\n')
        code, _, err = await gatewayctl(rig.root, "reload")
        assert code == 0, err
        status, answer = await rig.call("tasks/get", {"taskId": task_id})
        assert status == 400 and answer["error"]["code"] == -32602
        (rig.root / "policies" / "roles.toml").write_text(ROLES)
        code, _, err = await gatewayctl(rig.root, "reload")
        assert code == 0, err
        status, answer = await rig.call("tasks/get", {"taskId": task_id})
    assert status == 400 and answer["error"]["code"] == -32602


async def test_discovery_advertises_the_extension(rig: Rig) -> None:
    _, answer = await rig.call("server/discover", {}, name="")
    capabilities = answer["result"]["capabilities"]
    assert capabilities["extensions"] == {TASKS_EXTENSION: {}} and "tasks" not in capabilities


async def test_a_listen_stream_following_a_task_hears_each_change_until_it_completes(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        created = (await rig.tool("confirm_delete", {"filename": "heard.txt"}))["result"]
        task_id = created["taskId"]
        meta = {"io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
                "io.modelcontextprotocol/clientCapabilities": WITH}
        body = request("subscriptions/listen", {"notifications": {"taskIds": [task_id, "not-a-task"]}}, meta)
        frames: list[dict[str, Any]] = []
        async with aiohttp.ClientSession() as http, \
                http.post(rig.daemon.url, data=json.dumps(body),
                          headers=headers(rig.tokens["user"], "subscriptions/listen")) as stream:
            assert stream.content_type == "text/event-stream", "\n".join(rig.daemon.logs[-30:])
            lines = stream.content.__aiter__()

            async def next_frame() -> dict[str, Any]:
                while True:
                    line = await lines.__anext__()
                    if line.startswith(b"data:"):
                        frames.append(json.loads(line[5:]))
                        return frames[-1]

            ack = await next_frame()
            assert ack["method"] == "notifications/subscriptions/acknowledged"
            # Only the client's own task is followed; it is told as it stands at once.
            assert ack["params"]["notifications"] == {"taskIds": [task_id]}
            seen = await next_frame()
            while seen["params"]["status"] != "input_required":
                seen = await next_frame()
            assert seen["method"] == "notifications/tasks" and seen["params"]["taskId"] == task_id
            assert seen["params"]["_meta"] == {"io.modelcontextprotocol/subscriptionId": 7}
            [key] = seen["params"]["inputRequests"]
            await rig.call("tasks/update", {"taskId": task_id, "inputResponses": {
                key: {"action": "accept", "content": {"confirm": False}}}})
            while seen["params"]["status"] != "completed":
                seen = await next_frame()
    assert text_of_raw(seen["params"]["result"]) == "heard.txt: kept (nothing was really deleted)"
    status, answer = await rig.call("subscriptions/listen", {"notifications": {"taskIds": [task_id]}}, WITHOUT)
    assert status == 400 and answer["error"]["code"] == -32021


async def test_a_modern_childs_questions_after_its_call_became_a_task_are_the_tasks_and_answered_by_update(
    rig: Rig,
) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        _, answer = await rig.call("tools/call", {"name": "modern__slow_then_ask", "arguments": {}})
        created = answer["result"]
        assert created["resultType"] == "task", created
        asking = await rig.until(created["taskId"], "input_required")
        assert asking["status"] == "input_required"
        assert asking["inputRequests"]["user_name"]["method"] == "elicitation/create"
        _, ack = await rig.call("tasks/update", {"taskId": created["taskId"], "inputResponses": {
            "user_name": {"action": "accept", "content": {"name": "Ada"}}}})
        assert ack["result"]["resultType"] == "complete"
        done = await rig.until(created["taskId"])
    assert done["status"] == "completed" and text_of_raw(done["result"]) == "After the wait: hello, Ada!"
    # Each round is a call of its own through the pipeline: decided, and audited, again.
    await eventually(lambda: [r["status"] for r in rig.audit() if r.get("method") == "modern.slow_then_ask"
                              and r["event"] == "outcome"] == ["input_required", "ok"], what="both rounds' outcomes")


async def test_a_task_waiting_for_a_persons_approval_says_so_and_runs_once_approved(rig: Rig) -> None:
    # No elicitation declared: the caller itself cannot be asked, an operator approves.
    only_tasks: dict[str, Any] = {"extensions": {TASKS_EXTENSION: {}}}
    async with asyncio.timeout(TEST_DEADLINE):
        _, answer = await rig.call("tools/call", {"name": "gated__slow_compute", "arguments": {
            "seconds": 0, "label": "gated"}}, only_tasks)
        created = answer["result"]
        assert created["resultType"] == "task", created
        [pending] = await pending_approvals(rig.root)
        waiting = (await rig.task(created["taskId"]))["result"]
        assert waiting["status"] == "working"
        assert waiting["statusMessage"].startswith(f"waiting for a person's approval ({pending['id']}): "
                                                   f"gatewayctl approve {pending['id']} or at http://")
        code, _, err = await gatewayctl(rig.root, "approve", pending["id"])
        assert code == 0, err
        done = await rig.until(created["taskId"])
    assert done["status"] == "completed" and "statusMessage" not in done
    assert text_of_raw(done["result"]) == "gated: computed for 0s"


async def test_a_legacy_childs_task_only_tool_answers_callers_that_ask_for_no_task(rig: Rig) -> None:
    """`must` declares `taskSupport: "required"` and refuses a call without `task`: the gateway runs such a call
    through a task of its own and waits for its result, whoever calls."""
    async with asyncio.timeout(TEST_DEADLINE):
        _, answer = await rig.call("tools/call", {"name": "old__must", "arguments": {"n": 1}}, WITHOUT)
        assert text_of_raw(answer["result"]) == '{"n": 1}'
        async with aiohttp.ClientSession() as session:
            direct = await rpc(session, rig.daemon.url, rig.tokens["user"], "old.must", {"n": 2})
        assert text_of_raw(direct["result"]) == '{"n": 2}'
        async with httpx2.AsyncClient(headers={"Authorization": bearer(rig.tokens["user"])},
                                      timeout=httpx2.Timeout(10, read=SDK_READ_TIMEOUT)) as http, \
                Client(streamable_http_client(rig.daemon.url, http_client=http), mode="legacy",
                       read_timeout_seconds=SDK_READ_TIMEOUT) as legacy:
            result = await legacy.call_tool("old__must", {"n": 3})
    assert not result.is_error and text_of(result) == '{"n": 3}'


async def test_a_task_of_the_gateways_own_at_a_legacy_child_is_cancelled_when_its_call_ends_first(rig: Rig) -> None:
    async with asyncio.timeout(TEST_DEADLINE):
        async with aiohttp.ClientSession() as session:
            held = await rpc(session, rig.daemon.url, rig.tokens["user"], "old.must",
                             {"hold": True, "_meta": {"io.gatewayd/timeoutMs": 300}})
        assert held["error"]["code"] == -32012, held
        # The child's task does not run on for nobody: the gateway cancelled it.
        await rig.daemon.wait_log(r"tasksrv: cancelled t\d+")


async def test_with_task_after_zero_every_call_of_a_task_tool_is_a_task_once_decided(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"jobs": taskjobs.tools_d()}, roles=ROLES, clients={"user": ["user"]})
    async with Daemon(tmp_path, "--task-after", "0") as daemon:
        other = Rig(daemon, tmp_path, tokens)
        async with asyncio.timeout(TEST_DEADLINE):
            created = (await other.tool("slow_compute", {"seconds": 0, "label": "at once"}))["result"]
            assert created["resultType"] == "task"
            done = await other.until(created["taskId"])
            # A tool without a `task` stays inline whatever the setting.
            greeted = (await other.tool("greet", {"name": "Ada"}))["result"]
    assert done["status"] == "completed" and text_of_raw(done["result"]) == "at once: computed for 0s"
    assert greeted["resultType"] == "complete"
