"""The call pipeline in memory (route → decide → track → confirm → forward → record), behind a scripted upstream.

The gateway is the thing under test, so it is the real one, wired as the daemon wires it (catalog, records
to a real audit file, the confirmation gate, the in-flight registry); only its upstream is a script that
implements the `Upstream` interface and remembers what reached it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gatewayd import approvals
from gatewayd.approvals import Approvals
from gatewayd.audit import AuditLog
from gatewayd.calls import CallContext
from gatewayd.catalog import Catalog
from gatewayd.confirmation import ConfirmationGate
from gatewayd.gateway import Gateway
from gatewayd.inflight import Inflight
from gatewayd.jsonrpc import Notification, Request
from gatewayd.metrics import Metrics
from gatewayd.policy import Grant, Principal
from gatewayd.records import Records
from gatewayd.upstream.api import ANYONE, Delivery, ToolDef, Upstream
from tests.waiting import eventually


@dataclass
class Scripted:
    """An upstream that answers from a script: each method's result, and an event a slow method waits on."""

    name: str
    tools_offered: list[str]
    confirm: frozenset[str] = frozenset()
    results: dict[str, Any] = field(default_factory=dict)
    slow: dict[str, asyncio.Event] = field(default_factory=dict)
    received: list[tuple[str, str, Any]] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    notifies: bool = True
    # Its tools.d `prefix` (None: its name).
    exposed: str | None = None
    # Its child's pid, as ToolServer has it (None: no child running).
    pid: int | None = None
    # Whether its tool list is known without asking (declared, or listed by a running child), as ToolServer's is;
    # `asked` counts the times it was asked instead.
    known: bool = False
    asked: int = 0
    _list: list[ToolDef] | None = None

    @property
    def prefix(self) -> str:
        return self.name if self.exposed is None else self.exposed

    def needs_confirmation(self, method: str) -> bool:
        return method in self.confirm

    def is_dangerous(self, method: str) -> bool:
        return method in self.confirm

    def task_mode(self, method: str) -> str:
        return "never"

    def deadline_for(self, method: str) -> float:
        return 30.0

    async def has_tool(self, method: str) -> bool:
        self.asked += 1
        return method in self.tools_offered

    async def tools(self) -> list[ToolDef]:
        return [ToolDef(tool, f"the {tool} tool", {"type": "object"}) for tool in self.tools_offered]

    def tools_known(self) -> list[ToolDef] | None:
        if not self.known:
            return None  # a new list each time: always asked
        if self._list is None:
            self._list = [ToolDef(tool, f"the {tool} tool", {"type": "object"}) for tool in self.tools_offered]
        return self._list

    # Held before anything is sent, as a real server waits for a slot: the call waits here until it is set.
    slot: asyncio.Event = field(default_factory=asyncio.Event)
    deliveries: list[Delivery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.slot.set()

    async def _run(self, kind: str, method: str, payload: Any, delivery: Delivery) -> Any:
        self.deliveries.append(delivery)
        await self.slot.wait()
        if delivery.still_allowed is not None:
            delivery.still_allowed()
        self.received.append((kind, method, payload))
        self.started.set()
        if delivery.on_event is not None:
            delivery.on_event({"jsonrpc": "2.0", "method": "notifications/progress",
                               "params": {"progressToken": 1, "progress": 1}})
        if method in self.slow:
            await self.slow[method].wait()
        return self.results.get(method, {"ok": method})

    async def call_tool(self, tool: str, arguments: Any, delivery: Delivery = ANYONE) -> Any:
        result = await self._run("tool", tool, arguments, delivery)
        return {"content": [{"type": "text", "text": json.dumps(result)}], "isError": False}

    async def call_method(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        return await self._run("method", method, params, delivery)

    # What it lists besides tools, by kind (`resources`, `resourceTemplates`, `prompts`), as MCP objects.
    surfaces: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    async def surface(self, kind: str) -> list[dict[str, Any]]:
        self.asked += 1
        return self.surfaces.get(kind, [])

    def surface_known(self, kind: str) -> list[dict[str, Any]] | None:
        return self.surfaces.setdefault(kind, []) if self.known else None

    async def call_surface(self, method: str, params: Any, delivery: Delivery = ANYONE) -> Any:
        return await self._run("surface", method, params, delivery)

    async def notify(self, method: str, params: Any, delivery: Delivery = ANYONE) -> bool:
        if self.notifies:
            self.received.append(("notify", method, params))
        return self.notifies

    isolation = "shared"
    protocol = "mcp"

    async def roots_changed(self, session: str) -> None:
        self.received.append(("roots_changed", session, None))


@dataclass
class Rig:
    gateway: Gateway
    upstream: Scripted
    approvals: Approvals
    inflight: Inflight
    audit: AuditLog
    trail: Path
    principal: Principal

    # What the client may do now, as a reload would change it (None: removed).
    current: Principal | None = None

    def ctx(self, emit: Any = None) -> CallContext:
        return CallContext(self.principal, {self.upstream.name: self.upstream}, emit=emit,
                           authority=lambda _name: self.current)

    async def request(self, method: str, params: Any, request_id: Any = 1, emit: Any = None) -> dict[str, Any]:
        return await self.gateway.dispatch(self.ctx(emit), Request(request_id, method, params))

    async def records(self) -> list[dict[str, Any]]:
        await self.audit.flush()
        return [json.loads(line) for line in self.trail.read_text().splitlines()]


GRANT = Grant("dev", "policies/test.toml", allow=("s.add", "s.slow", "s.echo"), confirm=("s.run",))


@asynccontextmanager
async def in_memory_gateway(trail: Path) -> AsyncIterator[tuple[Gateway, AuditLog]]:
    """A gateway wired as the daemon wires it, recording to a real audit file at `trail`; closed after."""
    audit_log = AuditLog(trail)
    await audit_log.start()
    records = Records(audit_log, Metrics())
    try:
        yield Gateway(Catalog("__"), records, ConfirmationGate(Approvals(), records), Inflight()), audit_log
    finally:
        await audit_log.close()


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    trail = tmp_path / "audit.jsonl"
    audit_log = AuditLog(trail)
    await audit_log.start()
    registry, inflight = Approvals(), Inflight()
    records = Records(audit_log, Metrics())
    gateway = Gateway(Catalog("__"), records, ConfirmationGate(registry, records), inflight)
    upstream = Scripted("s", ["add", "slow", "echo", "run", "secret"])
    try:
        principal = Principal("dev", (GRANT,))
        yield Rig(gateway, upstream, registry, inflight, audit_log, trail, principal, principal)
    finally:
        await audit_log.close()


async def test_a_direct_call_forwards_the_authorized_params_and_records_decision_and_outcome(rig: Rig) -> None:
    params = {"a": 1, "b": 2}
    answer = await rig.request("s.add", params)
    assert answer == {"jsonrpc": "2.0", "id": 1, "result": {"ok": "add"}}
    [(kind, method, sent)] = rig.upstream.received
    assert (kind, method, sent) == ("method", "add", params)
    assert rig.upstream.deliveries[0].client == "dev"
    # An ordinary call gets one record: its outcome, with the decision folded in.
    [outcome] = await rig.records()
    assert (outcome["event"], outcome["decision"], outcome["method"], outcome["route"], outcome["status"]) == \
        ("outcome", "allow", "s.add", "direct", "ok")
    assert "role 'dev'" in outcome["rule"]
    assert outcome["params"] == params and len(outcome["params_sha256"]) == 64


async def test_tools_call_reaches_the_same_target_by_its_tool_name(rig: Rig) -> None:
    answer = await rig.request("tools/call", {"name": "s__echo", "arguments": {"x": 1}})
    assert answer["result"]["isError"] is False
    assert rig.upstream.received == [("tool", "echo", {"x": 1})]
    [outcome] = await rig.records()
    assert (outcome["method"], outcome["route"], outcome["decision"]) == ("s.echo", "tools/call", "allow")


@pytest.mark.parametrize("method", ["s.secret", "s.nothing", "nothing.add", "nodot"])
async def test_denied_and_unknown_methods_answer_alike_and_reach_nothing(rig: Rig, method: str) -> None:
    answer = await rig.request(method, {})
    assert answer["error"]["code"] == -32601
    denied = await rig.request("s.secret", {})
    assert _without_data(answer["error"], method) == _without_data(denied["error"], "s.secret")
    assert rig.upstream.received == []
    assert all(record["decision"] == "deny" for record in await rig.records())


@pytest.mark.parametrize("name", ["s__secret", "s__nothing", "x__add", "s.add", "s__" + "a" * 64])
async def test_denied_and_unknown_tools_answer_alike(rig: Rig, name: str) -> None:
    answer = await rig.request("tools/call", {"name": name, "arguments": {}})
    denied = await rig.request("tools/call", {"name": "s__secret", "arguments": {}})
    assert answer["error"]["code"] == denied["error"]["code"] == -32602
    assert answer["error"]["message"].replace(name, "NAME") == denied["error"]["message"].replace("s__secret", "NAME")
    assert rig.upstream.received == []


async def test_a_confirmed_call_runs_once_after_a_person_approves(rig: Rig) -> None:
    call = asyncio.create_task(rig.request("s.run", {"cmd": "ls"}))
    await eventually(lambda: len(rig.approvals) == 1, what="the call waits for a person")
    assert rig.upstream.received == []
    [approval] = rig.approvals.pending()
    assert (approval.client, approval.method, approval.arguments) == ("dev", "s.run", {"cmd": "ls"})
    assert rig.approvals.decide(approval.id, approve=True, by="test", channel=approvals.CLI).ok
    assert (await call)["result"] == {"ok": "run"}
    assert rig.upstream.received == [("method", "run", {"cmd": "ls"})]
    events = [record["event"] for record in await rig.records()]
    assert events == ["decision", "approval_requested", "approval_decided", "outcome"]


async def test_a_denied_confirmation_never_reaches_the_server(rig: Rig) -> None:
    call = asyncio.create_task(rig.request("s.run", {"cmd": "rm"}))
    await eventually(lambda: len(rig.approvals) == 1, what="the call waits for a person")
    [approval] = rig.approvals.pending()
    rig.approvals.decide(approval.id, approve=False, by="test", channel=approvals.CLI, reason="no")
    answer = await call
    assert answer["error"]["code"] == -32015 and answer["error"]["data"]["reason"] == "no"
    assert rig.upstream.received == []


async def test_a_notification_of_a_gated_method_never_runs(rig: Rig) -> None:
    await rig.gateway.notify(rig.ctx(), Notification("s.run", {"cmd": "ls"}))
    assert rig.upstream.received == [] and len(rig.approvals) == 0


async def test_a_notification_is_sent_once_authorized_and_recorded_as_sent(rig: Rig) -> None:
    await rig.gateway.notify(rig.ctx(), Notification("s.echo", {"x": 1}))
    assert rig.upstream.received == [("notify", "echo", {"x": 1})]
    assert [record.get("status") for record in await rig.records()] == [None, "sent"]


async def test_a_notification_the_protocol_cannot_send_is_dropped(rig: Rig) -> None:
    rig.upstream.notifies = False
    await rig.gateway.notify(rig.ctx(), Notification("s.echo", {"x": 1}))
    assert rig.upstream.received == []
    assert [record["event"] for record in await rig.records()] == ["decision"]


async def test_cancelled_by_the_client_answers_request_cancelled(rig: Rig) -> None:
    rig.upstream.slow["slow"] = asyncio.Event()
    call = asyncio.create_task(rig.request("s.slow", {}, request_id="r-1"))
    await rig.upstream.started.wait()
    await rig.gateway.notify(rig.ctx(), Notification("notifications/cancelled", {"requestId": "r-1"}))
    answer = await call
    assert answer["error"]["code"] == -32017 and len(rig.inflight) == 0
    assert (await rig.records())[-1]["status"] == "cancelled"


async def test_another_clients_cancel_does_not_stop_the_call(rig: Rig) -> None:
    gate = rig.upstream.slow["slow"] = asyncio.Event()
    call = asyncio.create_task(rig.request("s.slow", {}, request_id="r-1"))
    await rig.upstream.started.wait()
    other = CallContext(Principal("other", (GRANT,)), {"s": rig.upstream})
    await rig.gateway.notify(other, Notification("notifications/cancelled", {"requestId": "r-1"}))
    gate.set()
    assert (await call)["result"] == {"ok": "slow"}


async def test_draining_stops_running_calls_and_refuses_new_ones(rig: Rig) -> None:
    rig.upstream.slow["slow"] = asyncio.Event()
    call = asyncio.create_task(rig.request("s.slow", {}))
    await rig.upstream.started.wait()
    await rig.inflight.drain(0)
    answer = await call
    assert answer["error"]["code"] == -32011 and answer["error"]["data"]["error_type"] == "shutting_down"
    late = await rig.request("s.add", {"a": 1})
    assert late["error"]["data"]["error_type"] == "shutting_down"
    assert [kind for kind, _, _ in rig.upstream.received] == ["method"]


async def test_progress_reaches_the_caller_under_its_own_token(rig: Rig) -> None:
    seen: list[dict[str, Any]] = []
    await rig.request("s.add", {"a": 1, "_meta": {"progressToken": "mine"}}, emit=seen.append)
    assert seen == [{"jsonrpc": "2.0", "method": "notifications/progress",
                     "params": {"progressToken": "mine", "progress": 1}}]


async def test_tools_list_shows_what_the_client_may_call_and_marks_confirmation(rig: Rig) -> None:
    answer = await rig.request("tools/list", {})
    tools = {tool["name"]: tool for tool in answer["result"]["tools"]}
    assert sorted(tools) == ["s__add", "s__echo", "s__run", "s__slow"]
    assert tools["s__run"]["_meta"] == {"io.gatewayd/requiresConfirmation": True}
    assert "_meta" not in tools["s__add"]


async def test_a_bug_in_the_upstream_is_an_internal_error_without_details(rig: Rig) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret detail")

    rig.upstream.call_method = broken  # type: ignore[method-assign]
    answer = await rig.request("s.add", {})
    assert answer["error"] == {"code": -32603, "message": "Internal error"}
    # No outcome to fold the decision into: it is written on its own, as the call's only record.
    assert [(r["event"], r["decision"]) for r in await rig.records()] == [("decision", "allow")]


async def test_what_reaches_the_server_is_what_was_decided_shown_and_hashed(rig: Rig) -> None:
    call = asyncio.create_task(rig.request("s.run", {"x": 1, "_meta": {"cmd": "rm -rf /", "progressToken": 5}}))
    await eventually(lambda: len(rig.approvals) == 1, what="the call waits for a person")
    [approval] = rig.approvals.pending()
    assert approval.arguments == {"x": 1}
    rig.approvals.decide(approval.id, approve=True, by="test", channel=approvals.CLI)
    await call
    assert rig.upstream.received == [("method", "run", {"x": 1})]
    decision = (await rig.records())[0]
    assert decision["params"] == {"x": 1}


async def test_a_client_removed_before_the_decision_gets_unknown(rig: Rig) -> None:
    rig.current = None
    answer = await rig.request("s.add", {"a": 1})
    assert answer["error"]["code"] == -32601 and rig.upstream.received == []


async def test_a_permission_removed_while_the_call_waited_for_a_slot_stops_it(rig: Rig) -> None:
    rig.upstream.slot.clear()
    call = asyncio.create_task(rig.request("s.add", {"a": 1}))
    await eventually(lambda: bool(rig.upstream.deliveries), what="the call waits for a slot")
    rig.current = Principal("dev", (Grant("dev", "policies/test.toml", allow=("s.echo",)),))
    rig.upstream.slot.set()
    answer = await call
    assert answer["error"]["code"] == -32601 and rig.upstream.received == []
    records = await rig.records()
    # The first decision is written before the second, not folded into the outcome.
    assert [(r["event"], r.get("decision"), r.get("status")) for r in records] == [
        ("decision", "allow", None), ("decision", "deny", None), ("outcome", None, "method_not_found")]
    assert records[1]["reason"] == "a config reload removed the permission before the call ran"


async def test_an_approved_call_whose_permission_was_removed_does_not_run(rig: Rig) -> None:
    rig.upstream.slot.clear()
    call = asyncio.create_task(rig.request("s.run", {"cmd": "ls"}))
    await eventually(lambda: len(rig.approvals) == 1, what="the call waits for a person")
    [approval] = rig.approvals.pending()
    rig.approvals.decide(approval.id, approve=True, by="test", channel=approvals.CLI)
    await eventually(lambda: bool(rig.upstream.deliveries), what="the approved call waits for a slot")
    rig.current = None
    rig.upstream.slot.set()
    assert (await call)["error"]["code"] == -32601 and rig.upstream.received == []


def _without_data(error: dict[str, Any], name: str) -> dict[str, Any]:
    """An error with the caller's own name taken out: what is left must not tell denied from unknown."""
    stripped: dict[str, Any] = json.loads(json.dumps(error).replace(json.dumps(name)[1:-1], "NAME"))
    return stripped


WIDE = Principal("dev", (Grant("dev", "policies/test.toml", allow=("s.*", "t.*")),))


async def _on(gateway: Gateway, servers: dict[str, Scripted], method: str, params: Any) -> dict[str, Any]:
    ctx = CallContext(WIDE, dict(servers))
    return await gateway.dispatch(ctx, Request(1, method, params))


async def test_a_prefix_is_what_clients_see_before_a_servers_tool_names(rig: Rig) -> None:
    server = Scripted("s", ["add"], exposed="calc")
    listed = await _on(rig.gateway, {"s": server}, "tools/list", {})
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["calc__add"]
    assert (await _on(rig.gateway, {"s": server}, "tools/call", {"name": "calc__add", "arguments": {}}))["result"]
    unknown = await _on(rig.gateway, {"s": server}, "tools/call", {"name": "s__add", "arguments": {}})
    assert unknown["error"]["code"] == -32602
    # Policies and direct calls keep the server's own name.
    assert (await _on(rig.gateway, {"s": server}, "s.add", {}))["result"] == {"ok": "add"}


@pytest.mark.parametrize("known", [False, True])
async def test_without_a_prefix_tools_keep_their_own_names_and_the_first_server_wins_a_collision(
        rig: Rig, known: bool) -> None:
    first = Scripted("s", ["add", "only_s"], exposed="", known=known)
    second = Scripted("t", ["add", "only_t"], exposed="", known=known)
    servers = {"t": second, "s": first}
    listed = await _on(rig.gateway, servers, "tools/list", {})
    assert [tool["name"] for tool in listed["result"]["tools"]] == ["add", "only_s", "only_t"]
    await _on(rig.gateway, servers, "tools/call", {"name": "add", "arguments": {}})
    await _on(rig.gateway, servers, "tools/call", {"name": "only_t", "arguments": {}})
    assert [(kind, method) for kind, method, _ in first.received] == [("tool", "add")]
    assert [(kind, method) for kind, method, _ in second.received] == [("tool", "only_t")]


@pytest.mark.parametrize("known", [False, True])
async def test_a_bare_name_that_starts_with_another_servers_prefix_reaches_the_server_that_lists_it(
        known: bool) -> None:
    # With "_" as separator, `test_tool_with_task` starts with server `test`'s prefix; `test` has no `tool_with_task`,
    # a server without a prefix lists `test_tool_with_task` itself: the call goes where tools/list showed the tool.
    prefixed = Scripted("test", ["simple_text", "tool"], known=known)
    bare = Scripted("jobs", ["test_tool_with_task", "test_simple_text"], exposed="", known=known)
    servers: dict[str, Upstream] = {"test": prefixed, "jobs": bare}
    catalog = Catalog("_")
    everyone = Principal("all", (Grant("all", "p.toml", allow=("*.*",)),))
    assert await catalog.find_tool("test_tool_with_task", everyone, servers) == (bare, "test_tool_with_task")
    # The prefixed server keeps a name it offers; one nobody offers stays its (answered as its unknown tool).
    assert await catalog.find_tool("test_simple_text", everyone, servers) == (prefixed, "simple_text")
    assert await catalog.find_tool("test_nothing", everyone, servers) == (prefixed, "nothing")
    alone = {"test": prefixed}
    asked = prefixed.asked
    assert await catalog.find_tool("test_nothing", everyone, alone) == (prefixed, "nothing")
    assert prefixed.asked == asked, "without a server lacking a prefix, the prefixed one is not asked"


async def test_a_tool_without_a_prefix_is_found_among_the_servers_the_client_may_use_asking_none_it_may_not() -> None:
    # Known lists are looked up; the one that must be asked is asked only when the client may use its server.
    hidden = Scripted("a", ["add"], exposed="", known=True)
    unasked = Scripted("b", ["add"], exposed="")
    mine = Scripted("c", ["add"], exposed="", known=True)
    servers: dict[str, Upstream] = {"a": hidden, "b": unasked, "c": mine}
    catalog = Catalog()
    only_c = Principal("c-only", (Grant("c", "p.toml", allow=("c.*",)),))
    assert await catalog.find_tool("add", only_c, servers) == (mine, "add")
    assert await catalog.find_tool("nothing", only_c, servers) is None
    assert unasked.asked == 0
    everyone = Principal("all", (Grant("all", "p.toml", allow=("*.*",)),))
    assert await catalog.find_tool("add", everyone, servers) == (hidden, "add")
    assert hidden.asked == 0 and mine.asked == 0, "a known list is looked up, not asked"
