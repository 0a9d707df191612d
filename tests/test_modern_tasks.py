"""The tasks of MCP 2026-07-28 callers in memory (gatewayd/modern_tasks.py): what `tasks/get`, `tasks/update` and
`tasks/cancel` say of a call as it runs, asks, ends; whose a task is; the bounds.

The call is a real coroutine waiting on a future the test controls, run as a continuation (continuations.py); the
child is the `reply` callback that records what it is sent. The whole path through the daemon, with a real child,
is tests/e2e/test_tasks_modern.py and the conformance suite's tasks scenarios (tests/e2e/test_conformance.py).
"""

from __future__ import annotations

import asyncio
import heapq
import re
import time
from typing import Any, Final

import pytest

from gatewayd import relay
from gatewayd.continuations import Continuation, Continuations
from gatewayd.errors import (
    INVALID_PARAMS,
    MISSING_CLIENT_CAPABILITY,
    GatewayError,
    InvalidParams,
    MethodNotFound,
    MissingClientCapability,
)
from gatewayd.modern import TASKS_EXTENSION, Envelope
from gatewayd.modern_tasks import MAX_ROUNDS, READ_KEEP, RESULT_KEEP, Tasks
from tests.test_continuations import Child, declares

WITH: Final = Envelope("2026-07-28", {"elicitation": {}, "extensions": {TASKS_EXTENSION: {}}}, {}, None)
WITHOUT: Final = Envelope("2026-07-28", {"elicitation": {}}, {}, None)
ISO: Final = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ALLOWED: Final = ("elicitation",)


def ask(number: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": f"ask-{number}", "method": "elicitation/create",
            "params": {"message": f"question {number}", "requestedSchema": {"type": "object", "properties": {}},
                       "_meta": {"the-childs": "own"}}}


def finish(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "resultType": "complete"}


class Running:
    """One call held until the test answers it, made a task of `client`."""

    def __init__(self, tasks: Tasks, registry: Continuations, client: str = "ada", deadline: float = 30.0) -> None:
        self.release: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.continuation: Continuation = registry.start(client, self._held())
        made = tasks.create(client, self.continuation, deadline, finish)
        assert made is not None
        self.task = made
        self.id = made.id

    async def _held(self) -> dict[str, Any]:
        return await self.release

    async def ended(self) -> None:
        async with asyncio.timeout(5):
            await asyncio.gather(self.continuation.task, return_exceptions=True)


def get(tasks: Tasks, task_id: str, client: str = "ada") -> dict[str, Any]:
    return tasks.answer(client, "tasks/get", {"taskId": task_id}, WITH)


async def test_a_task_works_asks_is_answered_and_completes_with_its_result() -> None:
    tasks, registry, child = Tasks(), Continuations(), Child()
    running = Running(tasks, registry)
    seen = get(tasks, running.id)
    assert seen["status"] == "working" and seen["taskId"] == running.id
    assert ISO.match(seen["createdAt"]) and ISO.match(seen["lastUpdatedAt"])
    assert seen["ttlMs"] == int((30.0 + RESULT_KEEP) * 1000) and seen["pollIntervalMs"] > 0
    assert not {"result", "error", "inputRequests", "requestState"} & seen.keys()

    running.continuation.ask("s", ALLOWED, ask(1), declares, None, child.reply)
    running.continuation.ask("s", ALLOWED, ask(2), declares, None, child.reply)
    asking = get(tasks, running.id)
    assert asking["status"] == "input_required"
    first, second = asking["inputRequests"]
    # The child's own `_meta` is not the caller's business.
    assert asking["inputRequests"][first] == {"method": "elicitation/create", "params": {
        "message": "question 1", "requestedSchema": {"type": "object", "properties": {}}}}

    # One answer at a time: the other stays asked; a key never asked, or answered already, is passed over.
    assert tasks.answer("ada", "tasks/update", {"taskId": running.id, "inputResponses": {
        first: {"action": "accept", "content": {"confirm": True}}, "never-asked": {"ignored": True}}}, WITH) == {}
    assert child.replies == [{"jsonrpc": "2.0", "id": "ask-1",
                              "result": {"action": "accept", "content": {"confirm": True}}}]
    still = get(tasks, running.id)
    assert still["status"] == "input_required" and list(still["inputRequests"]) == [second]
    tasks.answer("ada", "tasks/update", {"taskId": running.id, "inputResponses": {
        first: {"action": "decline"}, second: {"action": "decline"}}}, WITH)
    assert [reply["id"] for reply in child.replies] == ["ask-1", "ask-2"]
    assert get(tasks, running.id)["status"] == "working"

    running.release.set_result({"jsonrpc": "2.0", "id": 7, "result": {"content": [{"type": "text", "text": "ok"}]}})
    await running.ended()
    done = get(tasks, running.id)
    assert done["status"] == "completed" and "inputRequests" not in done
    assert done["result"] == {"content": [{"type": "text", "text": "ok"}], "resultType": "complete"}
    assert done["lastUpdatedAt"] >= done["createdAt"]


async def test_a_call_ending_in_an_error_is_a_failed_task_and_a_tool_error_a_completed_one() -> None:
    tasks, registry = Tasks(), Continuations()
    failing, erring = Running(tasks, registry), Running(tasks, registry)
    failing.release.set_result({"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "backend gone"}})
    erring.release.set_result({"jsonrpc": "2.0", "id": 2, "result": {"content": [], "isError": True}})
    await failing.ended()
    await erring.ended()
    failed = get(tasks, failing.id)
    assert failed["status"] == "failed" and failed["error"] == {"code": -32603, "message": "backend gone"}
    assert "result" not in failed
    completed = get(tasks, erring.id)
    assert completed["status"] == "completed" and completed["result"]["isError"] is True


async def test_cancel_ends_the_call_answers_its_questions_and_is_acknowledged_again_once_terminal() -> None:
    tasks, registry, child = Tasks(), Continuations(), Child()
    running = Running(tasks, registry)
    running.continuation.ask("s", ALLOWED, ask(1), declares, None, child.reply)
    assert tasks.answer("ada", "tasks/cancel", {"taskId": running.id}, WITH) == {}
    await running.ended()
    assert running.continuation.task.cancelled()
    [reply] = child.replies
    assert reply["id"] == "ask-1" and reply["error"]["code"] == relay.ENDED
    assert get(tasks, running.id)["status"] == "cancelled"
    assert tasks.answer("ada", "tasks/cancel", {"taskId": running.id}, WITH) == {}
    # An update of a task that ended is acknowledged and changes nothing.
    assert tasks.answer("ada", "tasks/update", {"taskId": running.id, "inputResponses": {}}, WITH) == {}
    assert get(tasks, running.id)["status"] == "cancelled"


async def test_a_task_is_its_clients_alone_and_an_undeclared_caller_is_told_first_what_it_lacks() -> None:
    tasks, registry = Tasks(), Continuations()
    running = Running(tasks, registry)
    with pytest.raises(InvalidParams) as other:
        get(tasks, running.id, client="bob")
    unknown = str(other.value.message)
    with pytest.raises(InvalidParams) as nobody:
        get(tasks, "no-such-task")
    assert other.value.code == nobody.value.code == INVALID_PARAMS and "Unknown task" in unknown
    for method in ("tasks/get", "tasks/update", "tasks/cancel"):
        with pytest.raises(MissingClientCapability) as refused:
            tasks.answer("ada", method, {"taskId": "no-such-task"}, WITHOUT)
        assert refused.value.code == MISSING_CLIENT_CAPABILITY
        assert refused.value.data == {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}}
    with pytest.raises(InvalidParams, match="taskId"):
        tasks.answer("ada", "tasks/get", {"taskId": 7}, WITH)
    with pytest.raises(InvalidParams, match="inputResponses"):
        tasks.answer("ada", "tasks/update", {"taskId": running.id, "inputResponses": []}, WITH)
    running.continuation.abandon("test", "over")


async def test_a_client_that_may_no_longer_make_the_call_no_longer_has_its_task() -> None:
    tasks, registry = Tasks(), Continuations()
    running = Running(tasks, registry)
    allowed = [True]

    def still_allowed() -> None:
        if not allowed[0]:
            raise MethodNotFound("tools/call")

    running.continuation._still_allowed = still_allowed
    assert get(tasks, running.id)["status"] == "working"
    allowed[0] = False
    with pytest.raises(GatewayError) as gone:
        get(tasks, running.id)
    assert gone.value.code == INVALID_PARAMS
    await running.ended()
    assert running.continuation.abandoned == ("denied", "the client may no longer make this call")
    allowed[0] = True
    with pytest.raises(InvalidParams):
        get(tasks, running.id)
    # An ended task's result goes with the permission too.
    ended = Running(tasks, registry)
    ended.continuation._still_allowed = still_allowed
    ended.release.set_result({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
    await ended.ended()
    assert get(tasks, ended.id)["status"] == "completed"
    allowed[0] = False
    with pytest.raises(InvalidParams):
        get(tasks, ended.id)


async def test_past_the_clients_bound_its_oldest_finished_task_makes_room_and_with_none_the_call_stays_inline(
) -> None:
    tasks, registry = Tasks(max_per_client=2), Continuations()
    first, second = Running(tasks, registry), Running(tasks, registry)
    waiting: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
    held = registry.start("ada", waiting)
    assert tasks.create("ada", held, 30.0, finish) is None
    # Another client has room of its own.
    other = Running(tasks, registry, client="bob")
    first.release.set_result({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
    await first.ended()
    third = tasks.create("ada", held, 30.0, finish)
    assert third is not None and len(tasks) == 3
    with pytest.raises(InvalidParams):
        get(tasks, first.id)
    for running in (second, other):
        running.continuation.abandon("test", "over")
    held.abandon("test", "over")
    await registry.close()


async def test_a_task_is_forgotten_after_its_ttl_and_one_still_running_then_is_ended() -> None:
    tasks, registry = Tasks(), Continuations()
    running = Running(tasks, registry, deadline=-RESULT_KEEP)  # a ttl already passed
    with pytest.raises(InvalidParams):
        get(tasks, running.id)
    await running.ended()
    assert running.continuation.abandoned == ("expired", "the task outlived its ttl")


async def test_closing_ends_every_running_task() -> None:
    tasks, registry = Tasks(), Continuations()
    running = Running(tasks, registry)
    tasks.close()
    await running.ended()
    assert running.continuation.abandoned == ("shutdown", "the gateway is stopping") and len(tasks) == 0


async def test_a_modern_servers_questions_are_the_tasks_and_each_update_is_a_round_of_its_own_up_to_the_bound(
) -> None:
    tasks, registry = Tasks(), Continuations()
    asked = {"jsonrpc": "2.0", "id": 1, "result": {"resultType": "input_required", "requestState": "s1",
                                                   "inputRequests": {"name": {"method": "elicitation/create"}}}}
    rounds: list[tuple[dict[str, Any], Any]] = []

    async def answered(result: dict[str, Any]) -> dict[str, Any]:
        return result

    def ask_again(answers: dict[str, Any], said: Any) -> Continuation:
        rounds.append((answers, said))
        return registry.start("ada", answered(asked))

    running = Running(tasks, registry)
    running.task.ask_again = ask_again
    running.release.set_result(asked)
    await running.ended()
    seen = get(tasks, running.id)
    assert seen["status"] == "input_required" and seen["inputRequests"] == {"name": {"method": "elicitation/create"}}
    for number in range(MAX_ROUNDS):
        tasks.answer("ada", "tasks/update", {"taskId": running.id, "inputResponses": {"name": {"n": number}}}, WITH)
        async with asyncio.timeout(5):
            await running.task.continuation.task
    assert rounds[0] == ({"name": {"n": 0}}, "s1") and len(rounds) == MAX_ROUNDS
    failed = get(tasks, running.id)
    assert failed["status"] == "failed" and str(MAX_ROUNDS) in failed["error"]["message"]
    assert running.task.terminal() and tasks.status() == {"running": 0, "kept": 1}
    # Past the bound an update changes nothing.
    tasks.answer("ada", "tasks/update", {"taskId": running.id, "inputResponses": {"name": {}}}, WITH)
    assert len(rounds) == MAX_ROUNDS


async def test_an_ended_task_once_read_is_kept_a_minute_more_at_most_and_its_ttl_says_so() -> None:
    tasks, registry = Tasks(), Continuations()
    running = Running(tasks, registry)
    ttl = get(tasks, running.id)["ttlMs"]
    running.release.set_result({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})
    await running.ended()
    first = get(tasks, running.id)
    assert first["status"] == "completed" and first["ttlMs"] < ttl
    # Kept from the read on for READ_KEEP at most: the ttl counted from creation ends within it.
    assert running.task.expires - time.monotonic() <= READ_KEEP
    assert get(tasks, running.id)["ttlMs"] <= first["ttlMs"]
    running.task.expires = time.monotonic() - 1
    heapq.heappush(tasks._expiry, (running.task.expires, running.id))
    with pytest.raises(InvalidParams):
        get(tasks, running.id)
