"""MCP tasks through the real gateway pipeline, behind scripted upstreams (tasks.py).

Two MCP-like servers `a` and `b` whose children create tasks for task-augmented calls and answer `tasks/*`, and
clients that must see only their own tasks, under the gateway's ids, never the children's.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gatewayd import tasks
from gatewayd.approvals import Approvals
from gatewayd.audit import AuditLog
from gatewayd.calls import CallContext
from gatewayd.catalog import Catalog
from gatewayd.config.loader import load_snapshot
from gatewayd.confirmation import ConfirmationGate
from gatewayd.gateway import Gateway
from gatewayd.inflight import Inflight
from gatewayd.jsonrpc import Request
from gatewayd.metrics import Metrics
from gatewayd.policy import Grant, Principal
from gatewayd.records import Records
from gatewayd.sessions import Session, Sessions
from gatewayd.upstream.api import ANYONE, Delivery, Upstream
from gatewayd.upstream.server import ToolServer
from tests.daemon import python_command, write_config
from tests.test_gateway import Scripted, in_memory_gateway
from tests.waiting import eventually


@dataclass
class TaskServer(Scripted):
    """A child that creates a task (always id `t1`, `t2`, … — the same ids on every server) for a task-augmented
    call, and answers `tasks/get`, `tasks/result`, `tasks/cancel` about it."""

    statuses: dict[str, str] = field(default_factory=dict)

    async def call_tool(self, tool: str, arguments: Any, delivery: Delivery = ANYONE) -> Any:
        if delivery.task is None:
            return await super().call_tool(tool, arguments, delivery)
        self.received.append(("tool", tool, {"arguments": arguments, "task": delivery.task}))
        child_id = f"t{len(self.statuses) + 1}"
        self.statuses[child_id] = "working"
        return {"task": {"taskId": child_id, "status": "working", "ttl": delivery.task.get("ttl"),
                         "createdAt": "2025-11-25T00:00:00Z", "lastUpdatedAt": "2025-11-25T00:00:00Z"}}

    async def call_surface(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        self.received.append(("surface", method, params))
        child_id = params["taskId"]
        if method == tasks.RESULT:
            return {"content": [{"type": "text", "text": "done"}], "isError": False,
                    "_meta": {tasks.RELATED: {"taskId": child_id}}}
        if method == tasks.CANCEL:
            self.statuses[child_id] = "cancelled"
        return {"taskId": child_id, "status": self.statuses[child_id], "ttl": None}


@dataclass
class Rig:
    gateway: Gateway
    servers: dict[str, TaskServer]
    audit: AuditLog
    trail: Path
    sessions: Sessions

    async def request(self, principal: Principal, method: str, params: Any = None,
                      session: Session | None = None) -> dict[str, Any]:
        servers: dict[str, Upstream] = dict(self.servers)
        ctx = CallContext(principal, servers, session=session)
        return await self.gateway.dispatch(ctx, Request(1, method, params))

    async def start(self, principal: Principal, server: str = "a", session: Session | None = None,
                    ttl: int | None = None) -> str:
        task: dict[str, Any] = {} if ttl is None else {"ttl": ttl}
        answer = await self.request(principal, "tools/call", {"name": f"{server}__work", "arguments": {"n": 1},
                                                              "task": task}, session)
        task_id = answer["result"]["task"]["taskId"]
        assert isinstance(task_id, str)
        return task_id

    async def records(self) -> list[dict[str, Any]]:
        await self.audit.flush()
        return [json.loads(line) for line in self.trail.read_text().splitlines()]


ALICE = Principal("alice", (Grant("alice", "p.toml", allow=("a.work", "b.work")),))
BOB = Principal("bob", (Grant("bob", "p.toml", allow=("a.work", "b.work")),))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    trail = tmp_path / "audit.jsonl"
    servers = {"a": TaskServer("a", ["work"]), "b": TaskServer("b", ["work"])}
    async with in_memory_gateway(trail) as (gateway, audit_log):
        yield Rig(gateway, servers, audit_log, trail, Sessions(10, 3600))


async def test_initialize_declares_tasks(rig: Rig) -> None:
    assert rig.gateway.initialize_result("2025-11-25")["capabilities"]["tasks"] == {
        "list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


async def test_the_task_goes_to_the_child_and_ids_are_translated_both_ways(rig: Rig) -> None:
    first = await rig.start(ALICE, "a", ttl=60000)
    second = await rig.start(ALICE, "b")
    # Both children chose `t1`: the client sees two different gateway ids, neither the child's.
    assert first != second and first.startswith(tasks.ID_PREFIX) and second.startswith(tasks.ID_PREFIX)
    assert rig.servers["a"].received == [("tool", "work", {"arguments": {"n": 1}, "task": {"ttl": 60000}})]
    got = (await rig.request(ALICE, "tasks/get", {"taskId": second}))["result"]
    assert got == {"taskId": second, "status": "working", "ttl": None}
    assert rig.servers["b"].received[-1] == ("surface", "tasks/get", {"taskId": "t1"})
    assert rig.servers["a"].received[-1][1] == "work"  # a was not asked
    result = (await rig.request(ALICE, "tasks/result", {"taskId": first}))["result"]
    assert result["_meta"] == {tasks.RELATED: {"taskId": first}}
    assert rig.servers["a"].received[-1] == ("surface", "tasks/result", {"taskId": "t1"})
    # Decided, and recorded, as the tool that created the task.
    decisions = [r for r in await rig.records() if "decision" in r]  # ordinary calls: in their outcome records
    assert [(d["route"], d["method"], d["decision"]) for d in decisions] == [
        ("tools/call", "a.work", "allow"), ("tools/call", "b.work", "allow"), ("tasks/get", "b.work", "allow"),
        ("tasks/result", "a.work", "allow")]


@pytest.mark.parametrize("method", ["tasks/get", "tasks/result", "tasks/cancel"])
async def test_only_the_creator_reaches_its_task(rig: Rig, method: str) -> None:
    task_id = await rig.start(ALICE)
    sent = list(rig.servers["a"].received)
    theirs = (await rig.request(BOB, method, {"taskId": task_id}))["error"]
    nobodys = (await rig.request(BOB, method, {"taskId": "gw-nothing"}))["error"]
    childs = (await rig.request(ALICE, method, {"taskId": "t1"}))["error"]  # the child's own id means nothing
    assert theirs["code"] == nobodys["code"] == childs["code"] == -32602
    assert theirs["message"].replace(task_id, "ID") == nobodys["message"].replace("gw-nothing", "ID")
    assert rig.servers["a"].received == sent
    assert "result" in await rig.request(ALICE, method, {"taskId": task_id})


async def test_a_client_that_may_no_longer_call_the_tool_cannot_read_its_task(rig: Rig) -> None:
    task_id = await rig.start(ALICE)
    narrowed = Principal("alice", (Grant("alice", "p.toml", allow=("b.work",)),))
    assert (await rig.request(narrowed, "tasks/result", {"taskId": task_id}))["error"]["code"] == -32602
    assert (await rig.request(narrowed, "tasks/list"))["result"] == {"tasks": []}


async def test_list_shows_only_the_callers_tasks(rig: Rig) -> None:
    mine = [await rig.start(ALICE, "a"), await rig.start(ALICE, "b")]
    theirs = await rig.start(BOB, "a")
    listed = (await rig.request(ALICE, "tasks/list", {}))["result"]["tasks"]
    assert [task["taskId"] for task in listed] == mine
    assert listed[0]["status"] == "working"
    assert [task["taskId"] for task in (await rig.request(BOB, "tasks/list"))["result"]["tasks"]] == [theirs]


async def test_the_table_is_bounded_per_client_and_refuses_before_the_child_is_asked(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "MAX_TASKS_PER_CLIENT", 2)
    monkeypatch.setattr(tasks, "MAX_TASKS", 3)
    await rig.start(ALICE)
    last = await rig.start(ALICE)
    sent = len(rig.servers["a"].received)
    refused = await rig.request(ALICE, "tools/call", {"name": "a__work", "arguments": {}, "task": {}})
    assert refused["error"]["data"]["max_tasks_per_client"] == 2
    assert len(rig.servers["a"].received) == sent
    await rig.start(BOB)
    assert "error" in await rig.request(BOB, "tools/call", {"name": "a__work", "arguments": {}, "task": {}})
    assert len(rig.gateway.tasks) == 3
    # A task that ended (its result fetched) makes room.
    await rig.request(ALICE, "tasks/result", {"taskId": last})
    assert await rig.start(ALICE)


async def test_a_terminal_status_ends_the_entry(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    cancelled = await rig.start(ALICE)
    answer = (await rig.request(ALICE, "tasks/cancel", {"taskId": cancelled}))["result"]
    assert answer["status"] == "cancelled" and answer["taskId"] == cancelled
    assert (await rig.request(ALICE, "tasks/get", {"taskId": cancelled}))["error"]["code"] == -32602
    # Completed: kept TERMINAL_KEEP seconds for its result (here none), then unknown.
    monkeypatch.setattr(tasks, "TERMINAL_KEEP", 0.0)
    done = await rig.start(ALICE)
    rig.servers["a"].statuses["t2"] = "completed"
    assert (await rig.request(ALICE, "tasks/get", {"taskId": done}))["result"]["status"] == "completed"
    assert (await rig.request(ALICE, "tasks/result", {"taskId": done}))["error"]["code"] == -32602
    assert len(rig.gateway.tasks) == 0


async def test_an_entry_lives_for_the_tasks_ttl(rig: Rig) -> None:
    task_id = await rig.start(ALICE, ttl=1)
    entry = rig.gateway.tasks.find("alice", task_id)
    assert entry is not None
    entry.expires = 0.0  # its 1 ms have passed
    assert (await rig.request(ALICE, "tasks/get", {"taskId": task_id}))["error"]["code"] == -32602


def _created(table: tasks.Tasks, client: str, ttl_ms: int, status: str = "working") -> str:
    made = table.created("s", "tool", {}, client, None, {}, {"taskId": f"child-{len(table)}-{ttl_ms}", "status": status,
                                                               "ttl": ttl_ms})
    return str(made["task"]["taskId"])


async def test_expired_entries_go_among_thousands_that_live_on() -> None:
    table = tasks.Tasks()
    for index in range(3000):
        _created(table, f"c{index % 60}", 3_600_000)
    short = [_created(table, "brief", 1) for _ in range(5)]
    ended = _created(table, "brief", 3_600_000, status="completed")  # terminal: kept TERMINAL_KEEP, not an hour
    assert len(table) == 3006

    def admitted() -> bool:
        table.admit("someone")
        return len(table) == 3001

    await eventually(admitted, what="the five 1 ms tasks expired")
    assert all(table.find("brief", task_id) is None for task_id in short)
    entry = table.find("brief", ended)
    assert entry is not None and entry.expires <= time.monotonic() + tasks.TERMINAL_KEEP
    listed = table.listed(Principal("c7", (Grant("r", "p.toml", allow=("s.*",)),)), {"s": None})
    assert len(listed["tasks"]) == 50 and all(task["taskId"].startswith(tasks.ID_PREFIX) for task in listed["tasks"])


def test_tasks_ended_early_do_not_pile_up_in_the_expiry_order() -> None:
    table = tasks.Tasks()
    lasting = [_created(table, "keeper", 3_600_000) for _ in range(10)]
    for _ in range(20_000):  # made and fetched at once, each leaving an hour's expiry behind
        task_id = _created(table, "busy", 3_600_000)
        entry = table.find("busy", task_id)
        assert entry is not None
        table.drop(entry)
    assert len(table) == 10
    assert len(table._expiry) <= tasks.HEAP_SLACK * max(len(table), tasks.HEAP_FLOOR) + 1
    assert [table.find("keeper", task_id) is not None for task_id in lasting] == [True] * 10


async def test_the_status_notification_reaches_only_the_creating_session(rig: Rig) -> None:
    mine = rig.sessions.create("alice", {})
    other = rig.sessions.create("alice", {})
    task_id = await rig.start(ALICE, "b", session=mine)
    status = {"jsonrpc": "2.0", "method": tasks.STATUS, "params": {"taskId": "t1", "status": "completed"}}
    rig.gateway.tasks.tell("a", status)  # a's t1 is nobody's
    assert mine.outbound.empty()
    rig.gateway.tasks.tell("b", status)
    assert mine.outbound.get_nowait() == {"jsonrpc": "2.0", "method": tasks.STATUS,
                                          "params": {"taskId": task_id, "status": "completed"}}
    assert mine.outbound.empty() and other.outbound.empty()
    listed = (await rig.request(ALICE, "tasks/list"))["result"]["tasks"]
    assert listed[0]["status"] == "completed"
    # Nobody who may no longer call the tool hears of it.
    rig.gateway.tasks.tell("b", status, lambda _client: None)
    assert mine.outbound.empty()


async def test_a_status_said_before_the_task_is_recorded_still_reaches_its_session(rig: Rig) -> None:
    mine = rig.sessions.create("alice", {})
    status = {"jsonrpc": "2.0", "method": tasks.STATUS, "params": {"taskId": "t1", "status": "completed"}}
    rig.gateway.tasks.tell("a", status)  # the child spoke before its CreateTaskResult was handled
    task_id = await rig.start(ALICE, "a", session=mine)
    assert mine.outbound.get_nowait() == {"jsonrpc": "2.0", "method": tasks.STATUS,
                                          "params": {"taskId": task_id, "status": "completed"}}
    listed = (await rig.request(ALICE, "tasks/list"))["result"]["tasks"]
    assert listed[0]["status"] == "completed"


async def test_a_call_without_task_is_unchanged(rig: Rig) -> None:
    answer = await rig.request(ALICE, "tools/call", {"name": "a__work", "arguments": {"n": 1}})
    assert answer["result"]["isError"] is False
    assert rig.servers["a"].deliveries[-1].task is None
    bad = await rig.request(ALICE, "tools/call", {"name": "a__work", "arguments": {}, "task": "x"})
    assert bad["error"]["code"] == -32602
    assert len(rig.gateway.tasks) == 0


async def test_a_task_of_a_real_child_end_to_end(tmp_path: Path) -> None:
    """A stdio child (tests/fixtures/tasksrv.py) behind a real ToolServer, through the gateway: the `task` member
    reaches it, its `execution` is listed verbatim, its status notification reaches the creating session."""
    fixture = Path(__file__).parent / "fixtures" / "tasksrv.py"
    write_config(tmp_path, {"t": python_command(str(fixture))})
    trail = tmp_path / "audit.jsonl"
    audit_log = AuditLog(trail)
    await audit_log.start()
    records = Records(audit_log, Metrics())
    gateway = Gateway(Catalog("__"), records, ConfirmationGate(Approvals(), records), Inflight())
    server = ToolServer("t", load_snapshot(tmp_path).servers["t"], tmp_path,
                        on_surface_event=lambda name, message: gateway.tasks.tell(name, message))
    principal = Principal("alice", (Grant("alice", "p.toml", allow=("t.work",)),))
    session = Sessions(10, 3600).create("alice", {})
    ctx = CallContext(principal, {"t": server}, session=session)

    async def ask(method: str, params: Any) -> Any:
        answer = await gateway.dispatch(ctx, Request(1, method, params))
        assert "result" in answer, answer
        return answer["result"]

    try:
        [tool] = (await ask("tools/list", {}))["tools"]
        assert tool["execution"] == {"taskSupport": "optional"}
        created = await ask("tools/call", {"name": "t__work", "arguments": {"n": 7}, "task": {"ttl": 60000}})
        task_id = created["task"]["taskId"]
        assert task_id.startswith(tasks.ID_PREFIX) and created["task"]["ttl"] == 60000
        await eventually(lambda: not session.outbound.empty(), what="the status notification")
        note = session.outbound.get_nowait()
        assert note is not None and note["params"]["taskId"] == task_id and note["params"]["status"] == "completed"
        assert (await ask("tasks/get", {"taskId": task_id}))["taskId"] == task_id
        result = await ask("tasks/result", {"taskId": task_id})
        assert result["content"][0]["text"] == '{"n": 7}'
        assert result["_meta"][tasks.RELATED] == {"taskId": task_id}
        assert (await ask("tools/call", {"name": "t__work", "arguments": {}}))["content"][0]["text"] == "now"
    finally:
        await server.stop()
        await audit_log.close()
