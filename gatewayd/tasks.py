"""MCP tasks (2025-11-25) through the gateway: whose task each is, and the ids each side sees.

A task-augmented `tools/call` (params carry `task`) goes to the tool's server with its `task` member; the child
answers with a CreateTaskResult. The gateway then remembers the task — its server, the child's id, the client and
session that created it, the tool and the arguments its call was decided with — under an id of its own
(`gw-<random>`), so two children's ids cannot collide and no client can guess another's, and translates ids both
ways: the child is only ever sent its own id, the client only ever sees the gateway's.

`tasks/get`, `tasks/result` and `tasks/cancel` find the task only for the client that created it; to anyone else
it does not exist (`-32602 Unknown task`, as for an id nobody made). Each runs through the pipeline decided as the
tool that created the task (`SERVER.TOOL`, with the arguments of that call, since policy rules are about them): a
client that may no longer call the tool cannot read its task either. The person who confirmed the creating call
is not asked again. `tasks/list` is answered from this table — the client's own tasks whose tools it may still
call, with the status the gateway last saw (from creation, `tasks/get`, `tasks/cancel` or the child's status
notifications) — rather than by asking every child: the table is what says whose a task is, and a child's list
would hold every client's tasks (the gateway pages it, paging.py). `notifications/tasks/status` from a child
reaches only the session that created
the task, with the id translated (one that arrives before the CreateTaskResult has been handled is held, a few
seconds and MAX_EARLY of them at most, until it has).

The table is bounded: MAX_TASKS_PER_CLIENT tasks of one client and MAX_TASKS in all (a task-augmented call beyond
that is refused before it is sent). An entry lives for the task's `ttl` (DEFAULT_TTL without one, never more than
MAX_TTL); once its status is terminal, TERMINAL_KEEP more seconds so its result can be fetched; it is dropped as
soon as `tasks/result` has answered or `tasks/cancel` ended it. Does not own the pipeline (gateway.py).
"""

from __future__ import annotations

import heapq
import itertools
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gatewayd import policy
from gatewayd.errors import InvalidParams, Overloaded
from gatewayd.policy import Decision, Principal
from gatewayd.sessions import Session

GET = "tasks/get"
RESULT = "tasks/result"
CANCEL = "tasks/cancel"
LIST = "tasks/list"
# The methods about one task, routed to the server that holds it.
FOLLOW_UPS = frozenset({GET, RESULT, CANCEL})
METHODS = FOLLOW_UPS | {LIST}
STATUS = "notifications/tasks/status"
TERMINAL = frozenset({"completed", "failed", "cancelled"})
# Where a result names the task it belongs to (its `_meta`).
RELATED = "io.modelcontextprotocol/related-task"

# Tasks the gateway remembers for one client, and in all.
MAX_TASKS_PER_CLIENT = 64
MAX_TASKS = 4096
# Seconds an entry lives when the child gave the task no `ttl`, and at most whatever it gave.
DEFAULT_TTL = 3600.0
MAX_TTL = 86400.0
# Seconds an entry outlives its task's terminal status, for `tasks/result`.
TERMINAL_KEEP = 60.0
# The gateway's task ids: this prefix and this many random bytes.
ID_PREFIX = "gw-"
ID_BYTES = 16
# What of a task id the caller sent is recorded.
MAX_ID_CHARS = 256
# Status notifications of tasks not yet in the table, kept (the newest ones) for when they are: a child may say its
# task's status before the gateway has handled the CreateTaskResult that came just before it.
MAX_EARLY = 256
EARLY_KEEP = 10.0
# The expiry heap is rebuilt from the live entries once it holds this many times as many items as there are entries,
# and at least HEAP_FLOOR (a task dropped early, by its result or its cancel, leaves its item until its time would
# have come).
HEAP_SLACK = 2
HEAP_FLOOR = 64

# The client's principal now (None: removed by a reload).
Principals = Callable[[str], Principal | None]


@dataclass
class Entry:
    """One task of one client on one server."""

    id: str
    server: str
    child_id: str
    client: str
    session: Session | None
    tool: str
    arguments: Any
    task: dict[str, Any]
    expires: float
    terminal: bool = field(default=False)

    @property
    def canonical(self) -> str:
        """What its follow-ups are decided as: the tool that created it."""
        return f"{self.server}.{self.tool}"


def unknown(task_id: Any) -> InvalidParams:
    """What a client is told for a task that does not exist or is not its own: one answer for both."""
    return InvalidParams(f"Unknown task: {str(task_id)[:200]}")


def created_task(result: Any) -> dict[str, Any] | None:
    """The task of a CreateTaskResult; None for any other result (a child that ran the call at once)."""
    task = result.get("task") if isinstance(result, dict) else None
    if isinstance(task, dict) and isinstance(task.get("taskId"), str) and task["taskId"]:
        return task
    return None


class Tasks:
    """The tasks children hold for clients, by the gateway's ids."""

    def __init__(self) -> None:
        self._by_id: dict[str, Entry] = {}
        self._by_child: dict[tuple[str, str], str] = {}
        # Each client's entries, oldest first: its count, and its `tasks/list`, without looking at anyone else's.
        self._of_client: dict[str, dict[str, Entry]] = {}
        # (expires, order, id), soonest first: what has expired is found without looking at every entry (4,000
        # entries took ~107 µs a look, twice on every task-augmented call). An item whose entry is gone, or whose
        # entry expires at another time now, is passed over.
        self._expiry: list[tuple[float, int, str]] = []
        self._order = itertools.count()
        # (server, child's id) → (when, the status notification's params), oldest first.
        self._early: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def admit(self, client: str) -> None:
        """Raise Overloaded when `client` (or everyone) holds as many tasks as the table takes."""
        self._expire()
        if len(self._of_client.get(client, ())) >= MAX_TASKS_PER_CLIENT:
            raise Overloaded(f"this client holds {MAX_TASKS_PER_CLIENT} tasks: wait for some to end, or cancel them",
                             {"max_tasks_per_client": MAX_TASKS_PER_CLIENT})
        if len(self._by_id) >= MAX_TASKS:
            raise Overloaded("the gateway holds too many tasks", {"max_tasks": MAX_TASKS})

    def created(self, server: str, tool: str, arguments: Any, client: str, session: Session | None,
                result: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
        """Remember the task a child created (raises Overloaded if the table filled meanwhile) and return the
        CreateTaskResult the client sees."""
        self.admit(client)
        entry = Entry(ID_PREFIX + secrets.token_urlsafe(ID_BYTES), server, task["taskId"], client, session, tool,
                      arguments, task, time.monotonic() + _ttl(task))
        self._by_id[entry.id] = entry
        self._by_child[(server, entry.child_id)] = entry.id
        self._of_client.setdefault(client, {})[entry.id] = entry
        self._expires_at(entry)
        self.seen(entry, task)
        early = self._early.pop((server, entry.child_id), None)
        if early is not None and early[0] + EARLY_KEEP > time.monotonic():
            self._tell(entry, early[1], None)
        return {**result, "task": {**task, "taskId": entry.id}}

    def find(self, client: str, task_id: Any) -> Entry | None:
        """The task `task_id` if it is `client`'s and still remembered; anyone else's is as good as unknown."""
        entry = self._by_id.get(task_id) if isinstance(task_id, str) else None
        if entry is None or entry.client != client:
            return None
        if entry.expires <= time.monotonic():
            self.drop(entry)
            return None
        return entry

    def seen(self, entry: Entry, task: Any) -> None:
        """The child said this of the task (a Task object): kept for `tasks/list`; a terminal status shortens its
        life to TERMINAL_KEEP."""
        if not isinstance(task, dict):
            return
        entry.task = {key: value for key, value in task.items() if key not in ("result", "_meta")}
        if task.get("status") in TERMINAL and not entry.terminal:
            entry.terminal = True
            soon = time.monotonic() + TERMINAL_KEEP
            if soon < entry.expires:
                entry.expires = soon
                self._expires_at(entry)

    def answered(self, entry: Entry, method: str, result: Any) -> Any:
        """What the client is answered for a follow-up `method` the child answered with `result`."""
        if method == RESULT:
            self.drop(entry)
            return _translate_related(result, entry)
        self.seen(entry, result)
        if method == CANCEL and entry.terminal:
            self.drop(entry)
        if isinstance(result, dict) and "taskId" in result:
            return {**result, "taskId": entry.id}
        return result

    def drop(self, entry: Entry) -> None:
        """Forget the task."""
        if self._by_id.pop(entry.id, None) is None:
            return
        self._by_child.pop((entry.server, entry.child_id), None)
        own = self._of_client.get(entry.client)
        if own is not None:
            own.pop(entry.id, None)
            if not own:
                del self._of_client[entry.client]

    def listed(self, principal: Principal, servers: Any) -> dict[str, Any]:
        """The answer to `tasks/list`: the client's own tasks, on servers it still has, whose tools it may still
        call, newest last, with the status last seen."""
        self._expire()
        tasks = [{**entry.task, "taskId": entry.id} for entry in self._of_client.get(principal.name, {}).values()
                 if entry.server in servers and policy.may_call(principal, entry.canonical) is not Decision.DENY]
        return {"tasks": tasks}

    def tell(self, server: str, message: dict[str, Any], principals: Principals | None = None) -> None:
        """A child's `notifications/tasks/status`, passed on to the session that created the task, if it still may
        call the task's tool."""
        params = message.get("params")
        child_id = params.get("taskId") if isinstance(params, dict) else None
        gw_id = self._by_child.get((server, child_id)) if isinstance(child_id, str) else None
        entry = self._by_id.get(gw_id) if gw_id is not None else None
        if not isinstance(params, dict) or not isinstance(child_id, str):
            return
        if entry is None:
            self._early.pop((server, child_id), None)
            self._early[(server, child_id)] = (time.monotonic(), params)
            while len(self._early) > MAX_EARLY:
                del self._early[next(iter(self._early))]
            return
        self._tell(entry, params, principals)

    def _tell(self, entry: Entry, params: dict[str, Any], principals: Principals | None) -> None:
        self.seen(entry, params)
        session = entry.session
        if session is None or session.ended:
            return
        if principals is not None:
            principal = principals(entry.client)
            if principal is None or policy.may_call(principal, entry.canonical) is Decision.DENY:
                return
        session.push({"jsonrpc": "2.0", "method": STATUS, "params": {**params, "taskId": entry.id}})

    def _expires_at(self, entry: Entry) -> None:
        if len(self._expiry) >= HEAP_SLACK * max(len(self._by_id), HEAP_FLOOR):
            self._expiry = [(each.expires, next(self._order), each.id) for each in self._by_id.values()
                            if each is not entry]
            heapq.heapify(self._expiry)
        heapq.heappush(self._expiry, (entry.expires, next(self._order), entry.id))

    def _expire(self) -> None:
        now = time.monotonic()
        while self._expiry and self._expiry[0][0] <= now:
            expires, _, task_id = heapq.heappop(self._expiry)
            entry = self._by_id.get(task_id)
            if entry is not None and entry.expires == expires:
                self.drop(entry)


def _ttl(task: dict[str, Any]) -> float:
    """Seconds the task's entry lives: its `ttl` (milliseconds) if it gave one, within MAX_TTL."""
    ttl = task.get("ttl")
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0:
        return DEFAULT_TTL
    return float(min(ttl / 1000, MAX_TTL))


def _translate_related(result: Any, entry: Entry) -> Any:
    """A task's result with the task it names in `_meta` under the gateway's id."""
    if not isinstance(result, dict):
        return result
    meta = result.get("_meta")
    if isinstance(meta, dict) and isinstance(meta.get(RELATED), dict):
        return {**result, "_meta": {**meta, RELATED: {**meta[RELATED], "taskId": entry.id}}}
    return result
