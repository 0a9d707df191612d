"""MCP tasks end to end through the real daemon over HTTP (gatewayd/tasks.py, its wiring in gatewayd/app.py).

A task-augmented `tools/call` to the tasks fixture (tests/fixtures/tasksrv.py) creates a task under a gateway id;
`tasks/get`, `tasks/list`, `tasks/result` and `tasks/cancel` answer about it for the client that created it, and the
child's `notifications/tasks/status` reach that session's GET stream with the gateway's id. Another client cannot
see or touch the task: every answer it gets is the answer about a task nobody made.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import pytest
import pytest_asyncio

from tests.daemon import REPO, Daemon, python_command, write_config
from tests.e2e.test_mcp_sdk import (
    LEGACY_VERSION,
    SESSION_HEADER,
    TEST_DEADLINE,
    VERSION_HEADER,
    bearer,
    http_session,
    mcp_post,
    raw_session,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

TASKSRV: Final = REPO / "tests" / "fixtures" / "tasksrv.py"
# The answer about a task nobody made (and about anyone else's).
UNKNOWN_TASK: Final = -32602
# How long a status notification may take to reach the GET stream.
STATUS_DEADLINE: Final = 10.0


@dataclass
class Rig:
    daemon: Daemon
    owner: str
    other: str


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    root = tmp_path_factory.mktemp("tasks")
    tokens = write_config(root, {"tasks": python_command(str(TASKSRV))},
                          '[roles.agent]\nallow = ["tasks.*"]\n', {"owner": ["agent"], "other": ["agent"]})
    async with Daemon(root) as daemon:
        yield Rig(daemon, tokens["owner"], tokens["other"])


class Client:
    """One raw MCP session of one token: numbered requests, and its GET stream's messages as they come."""

    def __init__(self, http: aiohttp.ClientSession, url: str, token: str, session_id: str) -> None:
        self.http, self.url, self.token, self.session_id = http, url, token, session_id
        self.ids = iter(range(1, 10_000))
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def ask(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": next(self.ids), "method": method, "params": params}
        return (await mcp_post(self.http, self.url, self.token, message, self.session_id)).response

    async def result(self, method: str, params: dict[str, Any]) -> Any:
        answer = await self.ask(method, params)
        assert "result" in answer, answer
        return answer["result"]

    async def listen(self, opened: asyncio.Event) -> None:
        """Read the session's GET stream into `events` until cancelled."""
        headers = {"Authorization": bearer(self.token), "Accept": "text/event-stream",
                   SESSION_HEADER: self.session_id, VERSION_HEADER: LEGACY_VERSION}
        async with self.http.get(self.url, headers=headers) as stream:
            assert stream.status == 200
            opened.set()
            async for line in stream.content:
                if line.startswith(b"data:") and line[5:].strip():
                    await self.events.put(json.loads(line[5:]))

    async def status(self, task_id: str) -> dict[str, Any]:
        """The next status notification of task `task_id` on the GET stream."""
        async with asyncio.timeout(STATUS_DEADLINE):
            while True:
                event = await self.events.get()
                if event.get("method") == "notifications/tasks/status" and event["params"]["taskId"] == task_id:
                    return event["params"]  # type: ignore[no-any-return]


@asynccontextmanager
async def connect(rig: Rig, token: str) -> AsyncIterator[Client]:
    async with asyncio.timeout(TEST_DEADLINE), http_session() as http:
        client = Client(http, rig.daemon.url, token, await raw_session(http, rig.daemon.url, token))
        opened = asyncio.Event()
        listening = asyncio.create_task(client.listen(opened))
        try:
            await asyncio.wait_for(opened.wait(), STATUS_DEADLINE)
            yield client
        finally:
            listening.cancel()
            await asyncio.gather(listening, return_exceptions=True)


async def create(client: Client, arguments: dict[str, Any]) -> dict[str, Any]:
    created = await client.result("tools/call", {"name": "tasks__work", "arguments": arguments,
                                                 "task": {"ttl": 60_000}})
    task: dict[str, Any] = created["task"]
    assert task["taskId"].startswith("gw-") and task["status"] == "working"
    return task


async def test_a_task_is_created_followed_listed_and_its_result_fetched(rig: Rig) -> None:
    async with connect(rig, rig.owner) as owner:
        task = await create(owner, {"n": 1})
        task_id = task["taskId"]
        # The child's status notification reaches the creating session's GET stream, under the gateway's id.
        status = await owner.status(task_id)
        got = await owner.result("tasks/get", {"taskId": task_id})
        listed = await owner.result("tasks/list", {})
        result = await owner.result("tasks/result", {"taskId": task_id})
    assert status["status"] == "completed"
    assert got["taskId"] == task_id and got["status"] == "completed"
    assert [(item["taskId"], item["status"]) for item in listed["tasks"]] == [(task_id, "completed")]
    assert result["content"] == [{"type": "text", "text": '{"n": 1}'}]
    assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}


async def test_a_task_is_cancelled_and_its_session_told(rig: Rig) -> None:
    async with connect(rig, rig.owner) as owner:
        task_id = (await create(owner, {"hold": True}))["taskId"]
        working = await owner.result("tasks/get", {"taskId": task_id})
        cancelled = await owner.result("tasks/cancel", {"taskId": task_id})
        status = await owner.status(task_id)
    assert working["status"] == "working"
    assert cancelled["taskId"] == task_id and cancelled["status"] == "cancelled"
    assert status["status"] == "cancelled"


async def test_another_client_cannot_see_or_touch_a_task(rig: Rig) -> None:
    async with connect(rig, rig.owner) as owner, connect(rig, rig.other) as other:
        task_id = (await create(owner, {"hold": True}))["taskId"]
        nobodys = "gw-" + "0" * (len(task_id) - 3)
        answers = {method: [await other.ask(method, {"taskId": name}) for name in (task_id, nobodys)]
                   for method in ("tasks/get", "tasks/result", "tasks/cancel")}
        listed = await other.result("tasks/list", {})
        # The owner's task was not touched: still working, and only the owner's session hears of it.
        still = await owner.result("tasks/get", {"taskId": task_id})
        await owner.result("tasks/cancel", {"taskId": task_id})
        await owner.status(task_id)
    for method, (theirs, unknown) in answers.items():
        assert theirs["error"]["code"] == UNKNOWN_TASK, (method, theirs)
        # The same answer, but for the id it names.
        assert json.dumps(theirs["error"]).replace(task_id, nobodys) == json.dumps(unknown["error"]), method
    assert listed["tasks"] == []
    assert still["status"] == "working"
    heard = [other.events.get_nowait() for _ in range(other.events.qsize())]
    assert not [event for event in heard if event.get("method") == "notifications/tasks/status"], heard
