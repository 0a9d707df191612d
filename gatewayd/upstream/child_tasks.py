"""A 2026-07-28 child's own tasks (the `io.modelcontextprotocol/tasks` extension, SEP-2663), driven to their end
within the call that made them, for whoever made the call.

A child that advertises the extension may answer a `tools/call` that declares it with a CreateTaskResult; the dialect
(dialects.py `_modern_call`) decides when to declare it, and hands such an answer here. The extension lets a client
"drive the polling flow internally and surface only the final result": the task is polled with `tasks/get` as often
as the child suggests (within MIN_TASK_POLL…MAX_TASK_POLL); the questions it lists while `input_required` are put to
the call's caller as the requests they are (relay.put: on a legacy caller's stream, a modern caller's input-required
result, or a task of the gateway's own) — each key once, at most MAX_INPUT_ROUNDS rounds — and answered with
`tasks/update`; each new `statusMessage` is told to the caller (a task of the gateway's shows it; a caller who asked
for progress hears it as a step). The call is answered as it would have been: `completed` its result, `failed` its
JSON-RPC error, `cancelled` (by the child) a tool failure saying so. A call that ends first — its deadline, its caller
going away, a question that cannot be asked — cancels the child's task (`tasks/cancel`, the dialect's, bounded).

Does not own when a task is asked for (dialects.py), the questions' rules (relay.py) or the gateway's own tasks
(modern_tasks.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any, Final

from gatewayd import relay
from gatewayd.errors import INTERNAL_ERROR, CallTimedOut, InputNotRelayed, UpstreamError
from gatewayd.upstream.api import Delivery
from gatewayd.upstream.connection import Connection

# A CreateTaskResult's `resultType`, and the statuses after which a task changes no more.
CREATED: Final = "task"
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
# Seconds between polls: what the child suggests (`pollIntervalMs`), within these bounds (a child suggesting minutes
# would hold its callers that long after the work is done), DEFAULT_TASK_POLL when it suggests nothing.
MIN_TASK_POLL: Final = 0.01
MAX_TASK_POLL: Final = 2.0
DEFAULT_TASK_POLL: Final = 0.5
# Rounds of questions one call of a modern child may put to its caller: its task's, or its input-required results
# (dialects.py `_answered`). A tool asks a person a few things, not without end.
MAX_INPUT_ROUNDS: Final = 8

# A request's params to the child, in the era's envelope and declaring the extension.
Params = Callable[[dict[str, Any], Delivery], dict[str, Any]]


class TaskDriver:
    """Drives the tasks of one server's modern child: `name` and `allowed` (its tools.d `relay`) for the questions,
    `params` for the requests, `cancel` to end a task left behind."""

    def __init__(self, name: str, allowed: Collection[str], params: Params,
                 cancel: Callable[[Connection, str], None]) -> None:
        self.name = name
        self._allowed = allowed
        self._params = params
        self._cancel = cancel

    async def drive(self, conn: Connection, task: dict[str, Any], deadline: float, how: Delivery) -> Any:
        """The call's answer, once the child's task `task` (its CreateTaskResult) has ended, within `deadline`
        (the loop's clock)."""
        task_id = task.get("taskId")
        if not isinstance(task_id, str) or not task_id:
            raise UpstreamError({"code": INTERNAL_ERROR,
                                 "message": f"tool server {self.name!r} answered with a task without a taskId"})
        loop = asyncio.get_running_loop()
        answered: set[str] = set()
        rounds = 0
        said: tuple[str, int] | None = None
        try:
            while (status := task.get("status")) not in TERMINAL:
                said = _tell_status(task, said, how)
                asked = task.get("inputRequests") if status == "input_required" else None
                fresh = {key: request for key, request in asked.items() if key not in answered} \
                    if isinstance(asked, dict) else {}
                if fresh:
                    rounds += 1
                    if rounds > MAX_INPUT_ROUNDS:
                        raise UpstreamError({"code": INTERNAL_ERROR, "message": f"tool server {self.name!r} asked "
                                             f"for input more than {MAX_INPUT_ROUNDS} times in one task"})
                    await self._answer(conn, task_id, fresh, deadline, how)
                    answered.update(fresh)
                else:
                    await asyncio.sleep(min(_poll_seconds(task), max(0.0, deadline - loop.time())))
                if loop.time() >= deadline:
                    raise CallTimedOut(f"tool server {self.name!r} did not finish its task in time",
                                       {"server": self.name})
                got = await conn.call("tasks/get", self._params({"taskId": task_id}, how),
                                      timeout=max(0.0, deadline - loop.time()), caller=how.caller)
                task = got if isinstance(got, dict) else {}
        except BaseException:
            if conn.alive:
                self._cancel(conn, task_id)
            raise
        _tell_status(task, said, how)
        return self._ended(task)

    async def _answer(self, conn: Connection, task_id: str, asked: dict[str, Any], deadline: float,
                      how: Delivery) -> None:
        """Put the task's new questions to the caller, and send the child the answers."""
        if how.caller is None:
            raise InputNotRelayed(self.name, asked)
        try:
            async with asyncio.timeout_at(deadline):
                answers = await relay.put(how.caller, self.name, self._allowed, asked)
        except TimeoutError:
            raise CallTimedOut(f"tool server {self.name!r} did not finish its task in time",
                               {"server": self.name}) from None
        update = {"taskId": task_id, "inputResponses": answers}
        await conn.call("tasks/update", self._params(update, how),
                        timeout=max(0.0, deadline - asyncio.get_running_loop().time()), caller=how.caller)

    def _ended(self, task: dict[str, Any]) -> Any:
        """An ended task as the call's answer."""
        status = task.get("status")
        if status == "failed":
            error = task.get("error")
            raise UpstreamError(error if isinstance(error, dict) else
                                {"code": INTERNAL_ERROR, "message": f"tool server {self.name!r}'s task failed"})
        if status == "cancelled":
            return {"content": [{"type": "text", "text": f"tool server {self.name!r} cancelled the task"}],
                    "isError": True}
        result = task.get("result")
        if not isinstance(result, dict):
            raise UpstreamError({"code": INTERNAL_ERROR,
                                 "message": f"tool server {self.name!r} completed its task without a result"})
        # Its `resultType` is the call's, as any complete result's (dialects.py `_result`).
        return {key: value for key, value in result.items() if key != "resultType"}


def _poll_seconds(task: dict[str, Any]) -> float:
    """Seconds until a child's task is polled again: its suggestion, within bounds."""
    suggested = task.get("pollIntervalMs")
    if not isinstance(suggested, int | float) or isinstance(suggested, bool):
        return DEFAULT_TASK_POLL
    return min(MAX_TASK_POLL, max(MIN_TASK_POLL, suggested / 1000))


def _tell_status(task: dict[str, Any], said: tuple[str, int] | None, how: Delivery) -> tuple[str, int] | None:
    """Tell the caller the task's `statusMessage` when it changed (a task of the gateway's shows it), and a caller who
    asked for progress as a step of progress; the message said last and its step."""
    message = task.get("statusMessage")
    if not isinstance(message, str) or (said is not None and said[0] == message):
        return said
    step = said[1] + 1 if said is not None else 1
    if how.caller is not None:
        how.caller.tell(message)
    if how.progress and how.on_event is not None:
        how.on_event({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": None, "progress": step, "message": message}})
    return message, step
