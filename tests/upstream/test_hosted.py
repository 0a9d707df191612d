"""The tasks a 2025-11-25 child asks the gateway to host (gatewayd/upstream/hosted.py): its sampling or elicitation
request sent as a task is answered at once with a task of the gateway's, the caller's answer completes it, and the
child's `tasks/get`, `tasks/result` (waiting for the end), `tasks/cancel` and `tasks/list` are answered from the
table; a cancelled or expired task withdraws its question; a refusal makes no task; past MAX_HOSTED a request is put
as a plain one; an expired task is unknown, and what waited for it is told. The end-to-end run with
server-everything's `*-async` tools is tests/e2e/test_mcp_everything.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gatewayd.errors import INVALID_PARAMS, REQUEST_CANCELLED
from gatewayd.tasks import RELATED
from gatewayd.upstream import hosted
from gatewayd.upstream.hosted import MAX_HOSTED, HostedTasks
from tests.waiting import eventually


class Child:
    """What the child is written later (`reply`), and the requests put to the caller with how to answer them."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.asked: list[tuple[dict[str, Any], hosted.Reply]] = []
        # What would end each question put to the caller before its answer (its task's end).
        self.withdrawn: list[asyncio.Future[None] | None] = []
        self.table = HostedTasks(self.reply)

    def reply(self, message: dict[str, Any]) -> bool:
        self.written.append(message)
        return True

    def ask(self, message: dict[str, Any], reply: hosted.Reply,
            withdrawn: asyncio.Future[None] | None) -> dict[str, Any] | None:
        self.asked.append((message, reply))
        self.withdrawn.append(withdrawn)
        return None

    def sample(self, request_id: int, task: dict[str, Any] | None = None) -> dict[str, Any] | None:
        params: dict[str, Any] = {"messages": [], "maxTokens": 5}
        if task is not None:
            params["task"] = task
        message = {"jsonrpc": "2.0", "id": request_id, "method": "sampling/createMessage", "params": params}
        assert hosted.augmented(message) is (task is not None)
        return self.table.take(message, self.ask)

    def about(self, method: str, task_id: str, request_id: int = 90) -> dict[str, Any] | None:
        return self.table.answer({"jsonrpc": "2.0", "id": request_id, "method": method, "params": {"taskId": task_id}})


async def test_a_request_sent_as_a_task_is_answered_with_one_and_its_answer_completes_it() -> None:
    child = Child()
    created = child.sample(1, {"ttl": 60000})
    assert created is not None and created["id"] == 1
    task = created["result"]["task"]
    assert task["taskId"].startswith("gwh-") and task["status"] == "working" and task["ttl"] == 60000
    [(put, answer)] = child.asked
    assert "task" not in put["params"] and put["id"] == 1  # put to the caller as the plain request it is
    assert child.about("tasks/get", task["taskId"])["result"]["status"] == "working"  # type: ignore[index]
    # The child asks for the result before there is one: answered when it comes.
    assert child.about("tasks/result", task["taskId"], 91) is None
    answer({"jsonrpc": "2.0", "id": 1, "result": {"role": "assistant", "content": {"type": "text", "text": "hi"}}})
    [written] = child.written
    assert written["id"] == 91 and written["result"]["content"]["text"] == "hi"
    assert written["result"]["_meta"] == {RELATED: {"taskId": task["taskId"]}}
    assert child.about("tasks/get", task["taskId"])["result"]["status"] == "completed"  # type: ignore[index]
    listed = child.table.answer({"jsonrpc": "2.0", "id": 92, "method": "tasks/list"})
    assert [t["taskId"] for t in listed["result"]["tasks"]] == [task["taskId"]]  # type: ignore[index]


async def test_a_refused_or_failed_request_and_a_cancelled_task() -> None:
    child = Child()

    def refuse(message: dict[str, Any], _reply: hosted.Reply, _withdrawn: asyncio.Future[None] | None) \
            -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": message["id"], "error": {"code": -32601, "message": "not relayed"}}

    refused = child.table.take({"jsonrpc": "2.0", "id": 1, "method": "elicitation/create",
                                "params": {"message": "?", "requestedSchema": {}, "task": {}}}, refuse)
    assert refused == {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "not relayed"}}
    assert len(child.table) == 0  # no task made for it
    failed = child.sample(2, {})["result"]["task"]["taskId"]  # type: ignore[index]
    child.asked[-1][1]({"jsonrpc": "2.0", "id": 2, "error": {"code": -32001, "message": "timed out"}})
    assert child.about("tasks/result", failed) == {"jsonrpc": "2.0", "id": 90,
                                                   "error": {"code": -32001, "message": "timed out"}}
    cancelled = child.sample(3, {})["result"]["task"]["taskId"]  # type: ignore[index]
    assert child.about("tasks/result", cancelled, 93) is None
    withdrawn = child.withdrawn[-1]
    assert withdrawn is not None and not withdrawn.done()
    assert child.about("tasks/cancel", cancelled)["result"]["status"] == "cancelled"  # type: ignore[index]
    assert withdrawn.done(), "the question put to the caller is withdrawn"
    assert child.written[-1]["id"] == 93 and child.written[-1]["error"]["code"] == REQUEST_CANCELLED
    # The caller's answer coming after all changes nothing.
    child.asked[-1][1]({"jsonrpc": "2.0", "id": 3, "result": {}})
    assert child.about("tasks/get", cancelled)["result"]["status"] == "cancelled"  # type: ignore[index]
    assert child.about("tasks/get", "gwh-made-up")["error"]["code"] == INVALID_PARAMS  # type: ignore[index]


async def test_past_max_hosted_a_request_is_put_as_a_plain_one() -> None:
    child = Child()
    for request_id in range(MAX_HOSTED):
        assert child.sample(request_id, {}) is not None
    assert child.sample(MAX_HOSTED, {}) is None  # answered later, as the caller answers it
    assert child.withdrawn[-1] is None  # no task of the gateway's: only the call's end ends it
    put, answer = child.asked[-1]
    assert "task" not in put["params"]
    answer({"jsonrpc": "2.0", "id": MAX_HOSTED, "result": {"ok": True}})
    assert child.written == [{"jsonrpc": "2.0", "id": MAX_HOSTED, "result": {"ok": True}}]


async def test_an_expired_task_is_unknown_and_what_waited_for_it_is_told() -> None:
    child = Child()
    task_id = child.sample(1, {"ttl": 200})["result"]["task"]["taskId"]  # type: ignore[index]
    assert child.about("tasks/result", task_id, 91) is None

    def unknown() -> bool:
        answer = child.about("tasks/get", task_id)
        return answer is not None and "error" in answer

    await eventually(unknown, what="the task expired")
    assert child.about("tasks/get", task_id)["error"]["code"] == INVALID_PARAMS  # type: ignore[index]
    assert child.written == [{"jsonrpc": "2.0", "id": 91, "error": {"code": INVALID_PARAMS,
                                                                      "message": "the task expired"}}]
    withdrawn = child.withdrawn[-1]
    assert withdrawn is not None and withdrawn.done(), "an expired task's question is withdrawn too"
