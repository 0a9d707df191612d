"""Tasks a 2025-11-25 child asks the gateway to host: its sampling and elicitation requests sent as tasks
(`params.task`: client-side tasks), which the gateway declares it takes at `initialize` (dialects.py).

Such a request is put to the caller of the call it belongs to as any relayed request (relay.py), without its `task`
(the caller answers it as the plain request it is), and the child is answered at once with a CreateTaskResult under
an id of the gateway's; the caller's answer, when it comes, completes the task (a refusal, a timeout or the call's
end fails it). The child then asks about it: `tasks/get` (how it stands), `tasks/result` (the answer, waited for
until there is one), `tasks/cancel` (the question is withdrawn: a legacy caller is told `notifications/cancelled`
for it, and nothing more is waited for), `tasks/list` (its hosted tasks). A task forgotten at its ttl withdraws its
question too.

Owns one child's table: at most MAX_HOSTED tasks at once (past that a request is put to the caller as a plain one,
answered when it is answered, as the spec lets a receiver do), each forgotten once its ttl has passed (DEFAULT_TTL
without one, at most MAX_TTL), or RESULT_KEEP seconds after it ended. Does not own relaying (relay.py), which call a
request belongs to (dialects.py), or the tasks of callers (tasks.py, modern_tasks.py).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from gatewayd.errors import INTERNAL_ERROR, INVALID_PARAMS, REQUEST_CANCELLED
from gatewayd.modern_tasks import timestamp
from gatewayd.tasks import CANCEL, GET, LIST, RELATED, RESULT, TERMINAL

# The child's requests about its hosted tasks.
METHODS: Final = frozenset({GET, RESULT, CANCEL, LIST})
# The requests a child may send as tasks (`tasks.requests` declared to it).
TASKABLE: Final = frozenset({"sampling/createMessage", "elicitation/create"})
# Hosted tasks of one child at once.
MAX_HOSTED: Final = 64
# Seconds a task lives without a ttl of the child's, and at most; and once it has ended.
DEFAULT_TTL: Final = 300.0
MAX_TTL: Final = 3600.0
RESULT_KEEP: Final = 60.0
# What waits for a task the child cancelled is told.
CANCELLED: Final = {"error": {"code": REQUEST_CANCELLED, "message": "the task was cancelled"}}
# Milliseconds the child is told to wait between polls.
POLL_INTERVAL_MS: Final = 250
ID_PREFIX: Final = "gwh-"
ID_BYTES: Final = 12

Reply = Callable[[dict[str, Any]], bool]
# Put a request to the call's caller: the reply to write now (a refusal), or None when `reply` will carry it; the
# future, when given, ends when the request is withdrawn.
Ask = Callable[[dict[str, Any], Reply, "asyncio.Future[None] | None"], "dict[str, Any] | None"]


@dataclass(eq=False)
class Hosted:
    """One request of the child, run as a task for it: how it stands, and the child's requests waiting for its end."""

    id: str
    created: float
    ttl_ms: int
    updated: float = 0.0
    status: str = "working"
    # The caller's reply, once it came: a JSON-RPC `result` or `error` member.
    outcome: dict[str, Any] | None = None
    # The child's `tasks/result` requests that wait for the outcome.
    waiting: list[dict[str, Any]] = field(default_factory=list)
    # time.monotonic() after which it is forgotten.
    expires: float = 0.0
    # Done once the task has ended: the question it put to the caller, if still open, is withdrawn (relay.py).
    ended: asyncio.Future[None] | None = None

    def view(self) -> dict[str, Any]:
        """The task as 2025-11-25 carries it (a Task)."""
        return {"taskId": self.id, "status": self.status, "createdAt": timestamp(self.created),
                "lastUpdatedAt": timestamp(self.updated or self.created), "ttl": self.ttl_ms,
                "pollInterval": POLL_INTERVAL_MS}


class HostedTasks:
    """The tasks one child asked the gateway to host; `reply` writes to that child a reply left for later."""

    def __init__(self, reply: Reply) -> None:
        self._reply = reply
        self._tasks: dict[str, Hosted] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def take(self, message: dict[str, Any], ask: Ask) -> dict[str, Any] | None:
        """The child's task-augmented request `message`: put to the caller (`ask`, without its `task`), and answered
        now with the task made for it — or, past MAX_HOSTED, answered as a plain request (None: later)."""
        self._expire()
        params = message["params"]
        plain = {**message, "params": {key: value for key, value in params.items() if key != "task"}}
        if len(self._tasks) >= MAX_HOSTED:
            return ask(plain, self._reply, None)
        now = time.time()
        ttl = _ttl_seconds(params.get("task"))
        task = Hosted(ID_PREFIX + secrets.token_urlsafe(ID_BYTES), now, int(ttl * 1000),
                      expires=time.monotonic() + ttl, ended=asyncio.get_running_loop().create_future())
        refused = ask(plain, lambda reply: self._ended(task, reply), task.ended)
        if refused is not None:
            return refused  # not asked at all: the child gets the refusal for its request, and no task
        self._tasks[task.id] = task
        return {"jsonrpc": "2.0", "id": message.get("id"), "result": {"task": task.view()}}

    def answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The reply to the child's `tasks/*` request now, or None for a `tasks/result` that waits for its task's
        end (written then)."""
        self._expire()
        method, request_id = message.get("method"), message.get("id")
        if method == LIST:
            return _result(request_id, {"tasks": [task.view() for task in self._tasks.values()]})
        params = message.get("params")
        task_id = params.get("taskId") if isinstance(params, dict) else None
        task = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            return {"jsonrpc": "2.0", "id": request_id, "error": {"code": INVALID_PARAMS, "message": "Unknown task"}}
        if method == GET:
            return _result(request_id, task.view())
        if method == CANCEL:
            if task.status not in TERMINAL:
                self._end(task, "cancelled", CANCELLED)
            return _result(request_id, task.view())
        if task.outcome is None:
            task.waiting.append(message)
            return None
        return self._outcome(task, request_id)

    def _ended(self, task: Hosted, reply: dict[str, Any]) -> bool:
        """The caller's reply to the request the task runs (or its refusal, timeout or end): the task's outcome."""
        if task.status in TERMINAL:
            return True  # cancelled meanwhile: nothing waits for it
        if "result" in reply:
            self._end(task, "completed", {"result": reply["result"]})
        else:
            error = reply.get("error") or {"code": INTERNAL_ERROR, "message": "not answered"}
            self._end(task, "failed", {"error": error})
        return True

    def _end(self, task: Hosted, status: str, outcome: dict[str, Any]) -> None:
        task.status, task.outcome, task.updated = status, outcome, time.time()
        task.expires = min(task.expires, time.monotonic() + RESULT_KEEP)
        _withdraw(task)
        waiting, task.waiting = task.waiting, []
        for request in waiting:
            self._reply(self._outcome(task, request.get("id")))

    def _outcome(self, task: Hosted, request_id: Any) -> dict[str, Any]:
        """`tasks/result`'s reply: the request's own result, naming its task, or its error."""
        outcome = task.outcome or {}
        if "result" in outcome:
            result = outcome["result"] if isinstance(outcome["result"], dict) else {}
            meta = result.get("_meta")
            related = {**(meta if isinstance(meta, dict) else {}), RELATED: {"taskId": task.id}}
            return _result(request_id, {**result, "_meta": related})
        return {"jsonrpc": "2.0", "id": request_id, "error": outcome.get("error")}

    def _expire(self) -> None:
        now = time.monotonic()
        for task in [task for task in self._tasks.values() if task.expires <= now]:
            del self._tasks[task.id]
            _withdraw(task)
            for request in task.waiting:
                self._reply({"jsonrpc": "2.0", "id": request.get("id"),
                             "error": {"code": INVALID_PARAMS, "message": "the task expired"}})


def _withdraw(task: Hosted) -> None:
    """The task ended: its question, if the caller has not answered it, is not wanted any more."""
    if task.ended is not None and not task.ended.done():
        task.ended.set_result(None)


def augmented(message: dict[str, Any]) -> bool:
    """Whether a request of the child asks to run as a task the gateway hosts."""
    params = message.get("params")
    return message.get("method") in TASKABLE and isinstance(params, dict) and isinstance(params.get("task"), dict)


def _ttl_seconds(task: Any) -> float:
    ttl = task.get("ttl") if isinstance(task, dict) else None
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl <= 0:
        return DEFAULT_TTL
    return min(ttl / 1000, MAX_TTL)


def _result(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}
