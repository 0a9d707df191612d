"""Tasks of MCP 2026-07-28 callers (the `io.modelcontextprotocol/tasks` extension, SEP-2663): tool calls the gateway
runs on, for its caller to poll.

No tool server needs to know tasks: the gateway makes them. A `tools/call` of a tool whose tools.d `task` is
"optional" or "required", from a caller that declares the extension in that request, runs as a continuation
(continuations.py). What the call says within the `task_after` setting's seconds (0.5) is answered as for any call —
its result, its error, a modern child's input-required result, the confirmation gate's question — so a quick call
costs no polling and the questions a call must have answered before it can start are asked synchronously. A call
still running then becomes a task once it is decided: its caller gets a CreateTaskResult (the task exists before
that answer leaves), and `tasks/get` says how the call stands: `working` (its `statusMessage` naming the approval it
waits for, if it waits for a person); `input_required` with every question its server asked and nobody answered yet
(`inputRequests`, answered by `tasks/update`, any of them at a time) — or, when a modern (2026-07-28) server
answered the call with questions of its own (an input-required result), those, and `tasks/update` sends the call
again with the answers and the server's state (a round of its own through the pipeline, at most MAX_ROUNDS);
`completed` with its result (a tool's own failure included, `isError`); `failed` with the JSON-RPC error it ended
with; `cancelled` once `tasks/cancel` abandoned it (the child is told). `subscriptions/listen` streams that follow a
task hear each change (`notifications/tasks`, listeners.py). A call of a "required" tool by a modern caller without
the extension is refused with -32021 (gateway.py); legacy and direct callers run such a tool as any call.

Owns the table: each task bound to the client that made it — to anyone else it does not exist (-32602, as an id
nobody made), and neither does it once that client may no longer call its tool (each `tasks/get`, `tasks/update`
and `tasks/cancel` decides the call again: a reload may have taken the permission away). A task is kept for its
`ttlMs` (its call's deadline and RESULT_KEEP more, so its outcome can be read), MAX_TASKS_PER_CLIENT per client and
MAX_TASKS in all: past either, the client's oldest finished task makes room, and with none finished the call is
answered when it ends, as without the extension. Does not own the call (gateway.py), the questions
(continuations.py), or HTTP and the era's envelope (web/modern.py, modern.py).
"""

from __future__ import annotations

import heapq
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from gatewayd.continuations import Continuation
from gatewayd.errors import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    REQUEST_CANCELLED,
    GatewayError,
    InvalidParams,
    MissingClientCapability,
)
from gatewayd.listeners import TASKS_NOTIFICATION
from gatewayd.modern import INPUT_REQUIRED, TASKS_EXTENSION, Envelope, answers_of

logger = logging.getLogger(__name__)

GET: Final = "tasks/get"
UPDATE: Final = "tasks/update"
CANCEL: Final = "tasks/cancel"
# Seconds a task outlives its call's deadline, so its outcome can still be read; and once its caller has read it.
RESULT_KEEP: Final = 300.0
READ_KEEP: Final = 60.0
# How often a caller is told to poll, milliseconds.
POLL_INTERVAL_MS: Final = 500
# Tasks kept for one client, and in all: each may hold its call's result until its ttl.
MAX_TASKS_PER_CLIENT: Final = 64
MAX_TASKS: Final = 4096
# Rounds of questions a modern tool server may answer a task's call with (as child_tasks.MAX_INPUT_ROUNDS).
MAX_ROUNDS: Final = 8
# Random bytes of a task id: the id is the only thing naming a task in a request, so it must not be guessed.
ID_BYTES: Final = 18
# The `resultType` of a CreateTaskResult: the call goes on as a task.
RESULT_TYPE: Final = "task"


def timestamp(seconds: float) -> str:
    """ISO 8601 in UTC, to the millisecond."""
    whole = int(seconds)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{int((seconds - whole) * 1000):03d}Z"


AskAgain = Callable[[dict[str, Any], Any], Continuation]


class Watcher(Protocol):
    """Who hears a task's changes: a `subscriptions/listen` stream (listeners.Listener)."""

    def push(self, message: dict[str, Any] | None) -> None: ...


def unknown(task_id: str) -> InvalidParams:
    return InvalidParams(f"Unknown task: {task_id[:64]}")


@dataclass(eq=False)
class Task:
    """One call its caller polls: its id, whose it is, the call, and when it was made and last changed."""

    id: str
    client: str
    continuation: Continuation
    created: float
    updated: float
    expires: float  # time.monotonic() after which the task is forgotten
    ttl_ms: int
    # Finishes a result as the era carries it (modern.finish with the gateway's identity).
    finish: Callable[[dict[str, Any]], dict[str, Any]]
    # Sends the call again with the caller's answers and its tool server's state, after that server answered with
    # questions (a modern child's input-required result): the next round's continuation.
    ask_again: AskAgain | None = None
    # What the call waits for, when it waits for something a person can act on (a confirmation), else None:
    # the task's `statusMessage`.
    waiting: Callable[[], str | None] | None = None
    rounds: int = 0
    cancelled: bool = False
    # The `subscriptions/listen` streams following the task (listeners.py), each once: each change is pushed to
    # them. (A listener is a dataclass compared by value: these lists are searched by identity.)
    watchers: list[Watcher] = field(default_factory=list)

    def touch(self) -> None:
        self.updated = time.time()
        if self.watchers:
            self.tell()

    def tell(self) -> None:
        """Push the task as it stands to its watchers (`notifications/tasks`: the whole DetailedTask)."""
        notification = {"jsonrpc": "2.0", "method": TASKS_NOTIFICATION, "params": self.view()}
        for watcher in self.watchers:
            watcher.push(notification)

    def terminal(self) -> bool:
        return self.cancelled or (self.continuation.task.done() and self._asked() is None)

    def update(self, answers: dict[str, Any]) -> None:
        """The caller's answers: to the open questions of the running call, or, when its tool server answered with
        questions, the call's next round (at most MAX_ROUNDS)."""
        if self.cancelled:
            return
        if not self.continuation.task.done():
            self.continuation.answer_some(answers)
            return
        asked = self._asked()
        if asked is None or self.ask_again is None:
            return
        self.rounds += 1
        self.continuation = self.ask_again(answers, asked.get("requestState"))
        self.continuation.on_change = self.touch
        self.touch()

    def _asked(self) -> dict[str, Any] | None:
        """The call's input-required result, when its tool server answered with one that can still be answered:
        saying what it asks, within MAX_ROUNDS."""
        call = self.continuation.task
        if not call.done() or call.cancelled() or call.exception() is not None or self.rounds >= MAX_ROUNDS:
            return None
        result = call.result().get("result")
        if isinstance(result, dict) and result.get("resultType") == INPUT_REQUIRED \
                and isinstance(result.get("inputRequests"), dict):
            return result
        return None

    def view(self) -> dict[str, Any]:
        """The task as `tasks/get` answers it (a DetailedTask): its status and what goes with it."""
        status, detail = self._status()
        view = {"taskId": self.id, "status": status, "createdAt": timestamp(self.created),
                "lastUpdatedAt": timestamp(self.updated), "ttlMs": self.ttl_ms, "pollIntervalMs": POLL_INTERVAL_MS,
                **detail}
        note = None
        if status == "working":
            # What a person can act on first; else how the work goes, as its tool server said.
            note = (self.waiting() if self.waiting is not None else None) or self.continuation.status
        if note is not None:
            view["statusMessage"] = note
        return view

    def _status(self) -> tuple[str, dict[str, Any]]:
        continuation = self.continuation
        call = continuation.task
        if self.cancelled:
            return "cancelled", {}
        if call.done():
            return self._outcome()
        questions = continuation.outstanding()
        if questions:
            return "input_required", {"inputRequests": {q.key: q.input_request() for q in questions}}
        return "working", {}

    def _outcome(self) -> tuple[str, dict[str, Any]]:
        call = self.continuation.task
        if call.cancelled():
            _, reason = self.continuation.abandoned or ("", "the call was cancelled")
            return "failed", {"error": {"code": REQUEST_CANCELLED, "message": reason}}
        if call.exception() is not None:
            return "failed", {"error": {"code": INTERNAL_ERROR, "message": "internal error"}}
        answer = call.result()
        if "error" in answer:
            return "failed", {"error": answer["error"]}
        result = answer.get("result")
        if not isinstance(result, dict):
            result = {}
        if result.get("resultType") == INPUT_REQUIRED:
            asked = self._asked()
            if asked is None:
                return "failed", {"error": {"code": INVALID_PARAMS, "message": f"the tool server asked for input "
                                            f"more than {MAX_ROUNDS} times, or without saying what"}}
            # A modern tool server's questions: `tasks/update` brings the answers, and the call's next round.
            return "input_required", {"inputRequests": asked["inputRequests"]}
        return "completed", {"result": self.finish(result)}


class Tasks:
    """Every task of modern callers, by id; the order they expire in."""

    def __init__(self, max_per_client: int = MAX_TASKS_PER_CLIENT, max_tasks: int = MAX_TASKS) -> None:
        self.max_per_client = max_per_client
        self.max_tasks = max_tasks
        self._tasks: dict[str, Task] = {}
        self._by_client: dict[str, list[Task]] = {}
        self._expiry: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._tasks)

    def status(self) -> dict[str, int]:
        """For `gatewayctl status`: the tasks whose calls still run, and all those kept."""
        self._expire()
        return {"running": sum(not task.terminal() for task in self._tasks.values()), "kept": len(self._tasks)}

    def create(self, client: str, continuation: Continuation, deadline: float,
               finish: Callable[[dict[str, Any]], dict[str, Any]], ask_again: AskAgain | None = None,
               waiting: Callable[[], str | None] | None = None) -> Task | None:
        """Make the running call a task of `client`, kept until `deadline` seconds from now and RESULT_KEEP more;
        None when there is no room (no finished task of the client to make it)."""
        self._expire()
        if not self._room(client):
            logger.info("client=%s holds %d tasks (%d in all): the call is answered when it ends", client,
                        len(self._by_client.get(client, ())), len(self._tasks))
            return None
        now, keep = time.time(), deadline + RESULT_KEEP
        task = Task(secrets.token_urlsafe(ID_BYTES), client, continuation, now, now, time.monotonic() + keep,
                    int(keep * 1000), finish, ask_again, waiting)
        continuation.on_change = task.touch
        self._tasks[task.id] = task
        self._by_client.setdefault(client, []).append(task)
        heapq.heappush(self._expiry, (task.expires, task.id))
        return task

    def answer(self, client: str, method: str, params: Any, envelope: Envelope) -> dict[str, Any]:
        """`tasks/get`, `tasks/update` or `tasks/cancel` of `client`: the result (an empty one acknowledges). -32021
        for a caller that did not declare the extension (before its task is looked up), -32602 for a task it does
        not have."""
        if not envelope.declares_extension(TASKS_EXTENSION):
            raise MissingClientCapability(TASKS_EXTENSION, extension=True)
        task_id = params.get("taskId") if isinstance(params, dict) else None
        if not isinstance(task_id, str):
            raise InvalidParams("params.taskId must be the string a CreateTaskResult gave")
        task = self._find(client, task_id)
        if method == GET:
            if task.terminal():
                self._read(task)
            return task.view()
        if method == UPDATE:
            assert isinstance(params, dict)
            task.update(answers_of(params))
            return {}
        if not task.terminal():
            task.cancelled = True
            task.touch()
            task.continuation.abandon("cancelled", "the caller cancelled the task")
            logger.info("client=%s task %s cancelled", client, task.id[:8])
        return {}

    def watch(self, client: str, task_ids: list[str], watcher: Watcher) -> list[str]:
        """Push each change of the client's tasks among `task_ids` to `watcher` (as it stands now, at once); the
        ids followed: another client's task, or none, is passed over as an unknown one is."""
        followed = []
        for task_id in task_ids:
            try:
                task = self._find(client, task_id)
            except GatewayError:
                continue
            if all(other is not watcher for other in task.watchers):
                task.watchers.append(watcher)
            followed.append(task_id)
            task.tell()
        return followed

    def unwatch(self, task_ids: list[str], watcher: Watcher) -> None:
        """The watcher's stream ended."""
        for task_id in task_ids:
            task = self._tasks.get(task_id)
            if task is not None:
                task.watchers = [other for other in task.watchers if other is not watcher]

    def _find(self, client: str, task_id: str) -> Task:
        self._expire()
        task = self._tasks.get(task_id)
        if task is None or task.client != client:
            raise unknown(task_id)
        try:
            task.continuation.check()
        except GatewayError:
            # No longer the client's to call: its task, ended or not, is gone with its permission.
            task.continuation.abandon("denied", "the client may no longer make this call")
            self._drop(task)
            raise unknown(task_id) from None
        return task

    def _read(self, task: Task) -> None:
        """The caller has read the task's end: keep it READ_KEEP more at most (its result may be large, and 64 of a
        client's are kept), telling the ttl so."""
        sooner = time.monotonic() + READ_KEEP
        if sooner < task.expires:
            task.ttl_ms -= int((task.expires - sooner) * 1000)
            task.expires = sooner
            heapq.heappush(self._expiry, (sooner, task.id))

    def _room(self, client: str) -> bool:
        own = self._by_client.get(client, [])
        if len(own) < self.max_per_client and len(self._tasks) < self.max_tasks:
            return True
        finished = next((task for task in own if task.terminal()), None)
        if finished is None:
            return False
        self._drop(finished)
        return len(self._tasks) < self.max_tasks

    def _drop(self, task: Task) -> None:
        task.watchers.clear()
        if self._tasks.pop(task.id, None) is None:
            return
        own = self._by_client.get(task.client, [])
        if task in own:
            own.remove(task)
        if not own:
            self._by_client.pop(task.client, None)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._expiry and self._expiry[0][0] <= now:
            _, task_id = heapq.heappop(self._expiry)
            task = self._tasks.get(task_id)
            if task is not None and task.expires <= now:
                if not task.continuation.task.done():
                    task.continuation.abandon("expired", "the task outlived its ttl")
                self._drop(task)

    def close(self) -> None:
        """End every task's call and forget them all (the daemon stops: nobody could read their outcome after)."""
        for task in self._tasks.values():
            task.continuation.abandon("shutdown", "the gateway is stopping")
        self._tasks.clear()
        self._by_client.clear()
        self._expiry.clear()
