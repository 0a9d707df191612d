"""Authorization as the child sees it: every client × method × route, and a property over random requests.

Ground truth is what the child received: the fault fixture records every line on its stdin. The routes are a
direct call, a batch, MCP `tools/call` in a legacy session, and MCP 2026-07-28 `tools/call` without one.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.daemon import FAULTSRV, python_command, write_config
from tests.stack import LocalClient, running_stack

SPY = """
protocol = "jsonrpc"
[methods.echo]
[methods.pid]
[methods.sleep]
[methods.crash]
confirm = true
"""
# Nobody answers confirmations here: a confirm-gated call expires quickly and never reaches the child.
ROLES = """
[roles.all]
allow = ["spy.*"]
[roles.all.confirmation."spy.*"]
timeout = "50ms"
[roles.echo]
allow = ["spy.echo"]
confirm = ["spy.pid"]
[roles.echo.confirmation."spy.*"]
timeout = "50ms"
"""
CLIENTS = {"all": ["all"], "echo": ["echo"], "none": []}
MODERN = "2026-07-28"
# What every modern request carries: the version, what the client can be asked (nothing), who it is.
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {},
               "io.modelcontextprotocol/clientInfo": {"name": "spy-test", "version": "1"}}
METHODS = ["echo", "pid", "crash", "nosuch"]
# What each client gets for each method: the method runs, answers unknown, or needs confirmation.
EXPECTED = {
    ("all", "echo"): "runs", ("all", "pid"): "runs", ("all", "crash"): "confirm", ("all", "nosuch"): "unknown",
    ("echo", "echo"): "runs", ("echo", "pid"): "confirm", ("echo", "crash"): "unknown",
    ("echo", "nosuch"): "unknown",
    ("none", "echo"): "unknown", ("none", "pid"): "unknown", ("none", "crash"): "unknown",
    ("none", "nosuch"): "unknown",
}


class Spy:
    """The gateway in-process, a recording child, and a token per client."""

    def __init__(self, client: LocalClient, tokens: dict[str, str], record: Path) -> None:
        self.client = client
        self.tokens = tokens
        self.record = record
        self.sessions: dict[str, str] = {}

    def received(self) -> list[str]:
        """Methods the child has received, in order."""
        if not self.record.exists():
            return []
        # The child may be writing a line right now: only whole lines count.
        lines = self.record.read_text().split("\n")[:-1]
        return [json.loads(line).get("method", "") for line in lines if line]

    async def post(self, who: str, body: Any, **headers: str) -> tuple[int, Any]:
        response = await self.client.post("/mcp", data=json.dumps(body), headers={
            "Authorization": f"Bearer {self.tokens[who]}", "Content-Type": "application/json", **headers})
        text = await response.text()
        if response.content_type != "application/json":
            return response.status, text  # an HTTP-level refusal (a limit), with a plain-text reason
        return response.status, json.loads(text)

    async def modern(self, who: str, method: str, params: dict[str, Any], name: str | None = None) -> Any:
        """One MCP 2026-07-28 request, stateless: the envelope in `_meta`, the routing headers."""
        headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method,
                   "Accept": "application/json, text/event-stream"}
        if name is not None:
            headers["Mcp-Name"] = name
        _, answer = await self.post(who, {"jsonrpc": "2.0", "id": 3, "method": method,
                                          "params": {**params, "_meta": MODERN_META}}, **headers)
        if isinstance(answer, str):  # an event stream: its last message is the answer
            answer = json.loads([line for line in answer.splitlines() if line.startswith("data: ")][-1][6:])
        return answer

    async def session(self, who: str) -> dict[str, str]:
        if who not in self.sessions:
            response = await self.client.post("/mcp", data=json.dumps({
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": who}}}),
                headers={"Authorization": f"Bearer {self.tokens[who]}", "Content-Type": "application/json"})
            self.sessions[who] = response.headers["Mcp-Session-Id"]
        return {"Mcp-Session-Id": self.sessions[who]}


@pytest.fixture
async def spy(tmp_path: Path) -> AsyncIterator[Spy]:
    record = tmp_path / "received.jsonl"
    tools = {"spy": python_command(str(FAULTSRV), "--record", str(record)) + SPY}
    tokens = write_config(tmp_path, tools, ROLES, CLIENTS)
    # The property test sends faster than the default per-client rate; every example must reach the gateway.
    async with running_stack(tmp_path, client_rate=1e6, client_burst=10**6) as (client, _):
        yield Spy(client, tokens, record)


def outcome(answer: dict[str, Any], unknown_code: int) -> str:
    if "result" in answer:
        return "runs"
    code = answer["error"]["code"]
    if code == -32016:  # confirmation expired: it waited for a person who never came
        return "confirm"
    assert code == unknown_code, answer
    return "unknown"


async def test_matrix_of_clients_methods_and_routes(spy: Spy) -> None:
    unknown_answers: dict[str, set[str]] = {"direct": set(), "tools/call": set(), "batch": set(), "modern": set()}
    for (who, method), expected in EXPECTED.items():
        before = spy.received().count(method)
        params = {"seconds": 0} if method == "sleep" else {}
        _, direct = await spy.post(who, {"jsonrpc": "2.0", "id": 1, "method": f"spy.{method}", "params": params})
        _, batch = await spy.post(who, [{"jsonrpc": "2.0", "id": "b", "method": f"spy.{method}", "params": params},
                                        {"jsonrpc": "2.0", "method": f"spy.{method}", "params": params}])
        tool_params = {"name": f"spy__{method}", "arguments": params}
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": tool_params}
        _, tool = await spy.post(who, call, **await spy.session(who))
        modern = await spy.modern(who, "tools/call", tool_params, f"spy__{method}")
        assert outcome(direct, -32601) == expected, (who, method, direct)
        assert outcome(batch[0], -32601) == expected, (who, method, batch)
        assert outcome(tool, -32602) == expected, (who, method, tool)
        assert outcome(modern, -32602) == expected, (who, method, modern)
        # Ground truth: a call that runs reaches the child once per route (the batch notification too).
        runs = 5 if expected == "runs" else 0
        assert spy.received().count(method) - before == runs, (who, method)
        if expected == "unknown":
            unknown_answers["direct"].add(json.dumps(direct))
            unknown_answers["batch"].add(json.dumps(batch[0]))
            # tools/call names the tool it did not find; everything else about the answer is the same.
            unknown_answers["tools/call"].add(json.dumps(tool).replace(f"spy__{method}", "NAME"))
            unknown_answers["modern"].add(json.dumps(modern).replace(f"spy__{method}", "NAME"))
    # Denied and unknown are indistinguishable on every route.
    assert all(len(answers) == 1 for answers in unknown_answers.values()), unknown_answers


async def test_tools_list_shows_exactly_what_may_be_called(spy: Spy) -> None:
    listed = {}
    for who in CLIENTS:
        _, answer = await spy.post(who, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, **await spy.session(who))
        listed[who] = {tool["name"]: tool for tool in answer["result"]["tools"]}
    assert sorted(listed["all"]) == ["spy__crash", "spy__echo", "spy__pid", "spy__sleep"]
    assert sorted(listed["echo"]) == ["spy__echo", "spy__pid"]
    assert listed["none"] == {}
    for who in CLIENTS:  # the stateless era lists exactly the same
        answer = await spy.modern(who, "tools/list", {})
        assert {tool["name"]: tool for tool in answer["result"]["tools"]} == listed[who]
    assert listed["echo"]["spy__pid"]["_meta"] == {"io.gatewayd/requiresConfirmation": True}
    assert listed["all"]["spy__crash"]["description"].startswith("[Needs a person's confirmation")
    assert "_meta" not in listed["all"]["spy__echo"]


METHOD_NAMES = st.one_of(
    st.sampled_from(["spy.echo", "spy.pid", "spy.crash", "spy.sleep", "Spy.echo", "spy.echo ", "spy..echo",
                     "spy.ech", "spy.echo\n", "ѕpy.echo", "spy．echo", "spy__echo", "tools/call", "rpc.spy"]),
    st.text(min_size=0, max_size=20),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)
MESSAGES = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "method": METHOD_NAMES},
    optional={"id": st.integers(0, 5) | st.text(max_size=3), "params": JSON_VALUES},
)
TOOL_CALLS = st.fixed_dictionaries({
    "jsonrpc": st.just("2.0"), "id": st.integers(0, 5), "method": st.just("tools/call"),
    "params": st.fixed_dictionaries({"name": METHOD_NAMES, "arguments": st.dictionaries(st.text(max_size=4),
                                                                                         JSON_VALUES, max_size=2)}),
})
BODIES = st.one_of(MESSAGES, TOOL_CALLS, st.lists(st.one_of(MESSAGES, TOOL_CALLS), min_size=1, max_size=4))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES)
async def test_no_request_makes_the_child_receive_a_method_outside_the_allowlist(spy: Spy, body: Any) -> None:
    await spy.post("echo", body, **await spy.session("echo"))
    assert set(spy.received()) <= {"echo"}


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=TOOL_CALLS)
async def test_no_modern_request_makes_the_child_receive_a_method_outside_the_allowlist(spy: Spy, call: Any) -> None:
    name = call["params"]["name"]
    await spy.modern("echo", "tools/call", call["params"], name if name.isascii() and name.isprintable() else None)
    assert set(spy.received()) <= {"echo"}
