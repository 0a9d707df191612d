"""What a caller's `_meta` says about delivery: its deadline bounds the call, its trace context reaches the child."""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gatewayd.forwarding import TIMEOUT_KEY
from gatewayd.state import DaemonState
from tests.daemon import FAULTSRV, headers, python_command, write_config
from tests.stack import LocalClient, running_stack

FAULT = "\ncall_timeout = \"10s\"\n[methods.sleep]\ntimeout = \"400ms\"\n"
ROLES = '[roles.r]\nallow = ["fault.*"]\n'
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
# A generous bound for "failed at its deadline, not at the configured timeout" on a loaded machine.
DEADLINE_SLACK = 2.0


class Envelope:
    def __init__(self, client: LocalClient, token: str, record: Path, state: DaemonState) -> None:
        self.client, self.token, self.record, self.state = client, token, record, state

    async def call(self, method: str, params: Any) -> dict[str, Any]:
        response = await self.client.post("/mcp", data=json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}), headers=headers(self.token))
        answer: dict[str, Any] = await response.json()
        return answer

    def sent(self, method: str) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [m["params"] for m in lines if m.get("method") == "tools/call" and m["params"]["name"] == method]


@pytest.fixture
async def envelope(tmp_path: Path) -> AsyncIterator[Envelope]:
    record = tmp_path / "received.jsonl"
    child = python_command(str(FAULTSRV), "--mcp", "--record", str(record)) + FAULT
    tokens = write_config(tmp_path, {"fault": child}, ROLES, {"c": ["r"]})
    async with running_stack(tmp_path, audit_path=str(tmp_path / "audit.jsonl")) as (client, state):
        yield Envelope(client, tokens["c"], record, state)


async def test_the_callers_trace_context_reaches_the_child(envelope: Envelope) -> None:
    await envelope.call("fault.echo", {"x": 1, "_meta": {"traceparent": TRACEPARENT, "tracestate": "k=v"}})
    [sent] = envelope.sent("echo")
    assert sent["_meta"] == {"traceparent": TRACEPARENT, "tracestate": "k=v"} and sent["arguments"] == {"x": 1}


async def test_without_one_the_child_gets_the_trace_id_of_the_calls_audit_records(envelope: Envelope) -> None:
    await envelope.call("fault.echo", {"x": 1, "_meta": {"traceparent": "not one"}})
    [sent] = envelope.sent("echo")
    match = re.fullmatch(r"00-([0-9a-f]{32})-[0-9a-f]{16}-01", sent["_meta"]["traceparent"])
    assert match is not None
    await envelope.state.audit.flush()
    assert envelope.state.audit.path is not None
    records = [json.loads(line) for line in envelope.state.audit.path.read_text().splitlines()]
    assert {r["trace_id"] for r in records if r["method"] == "fault.echo"} == {match[1]}


async def test_a_callers_deadline_shorter_than_the_configured_timeout_wins(envelope: Envelope) -> None:
    started = time.monotonic()
    answer = await envelope.call("fault.sleep", {"seconds": 5, "_meta": {TIMEOUT_KEY: 150}})
    assert answer["error"]["code"] == -32012 and answer["error"]["data"]["remaining_ms"] == 0
    assert answer["error"]["data"]["timeout"] <= 0.15 and time.monotonic() - started < DEADLINE_SLACK


async def test_a_configured_timeout_shorter_than_the_callers_leaves_its_remaining_budget(envelope: Envelope) -> None:
    answer = await envelope.call("fault.sleep", {"seconds": 5, "_meta": {TIMEOUT_KEY: 60_000}})
    data = answer["error"]["data"]
    assert answer["error"]["code"] == -32012 and data["timeout"] == 0.4 and 50_000 < data["remaining_ms"] < 60_000


@pytest.mark.parametrize("bad", [-1, 0, "10", True, None])
async def test_a_deadline_that_is_not_a_positive_number_is_ignored(envelope: Envelope, bad: Any) -> None:
    answer = await envelope.call("fault.echo", {"x": 1, "_meta": {TIMEOUT_KEY: bad}})
    assert "result" in answer
