"""The audit trail of real calls: one record for an ordinary allowed call (its decision folded into its outcome), a
decision record of its own for a denied, dangerous or confirmed call, and fail-closed dangerous calls."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.daemon import FAULTSRV, python_command, write_config
from tests.stack import LocalClient, running_stack

SPY = """
protocol = "jsonrpc"
[methods.echo]
[methods.pid]
dangerous = true
[methods.crash]
confirm = true
"""
ROLES = ('[roles.r]\nallow = ["spy.*"]\n[roles.r.args."spy.echo".text]\nmax_length = 10\noptional = true\n'
         # Nobody answers the confirmation here: it expires at once.
         '[roles.r.confirmation."spy.*"]\ntimeout = "10ms"\n')
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def config(tmp_path: Path) -> tuple[dict[str, str], Path]:
    record = tmp_path / "received.jsonl"
    tools = {"spy": python_command(str(FAULTSRV), "--record", str(record)) + SPY}
    return write_config(tmp_path, tools, ROLES, {"c": ["r"]}), record


async def post(client: LocalClient, token: str, body: Any) -> Any:
    response = await client.post("/mcp", data=json.dumps(body), headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    text = await response.text()
    return json.loads(text) if text else None


def call(method: str, params: Any, id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


async def test_every_call_leaves_its_records(tmp_path: Path) -> None:
    tokens, _ = config(tmp_path)
    trail = tmp_path / "audit.jsonl"
    async with running_stack(tmp_path, audit_path=str(trail)) as (client, state):
        token = tokens["c"]
        await post(client, token, call("spy.echo", {"text": "hi", "_meta": {"traceparent": TRACEPARENT}}, id=7))
        await post(client, token, call("spy.echo", {"text": "far too long for the rule"}, id=8))
        await post(client, token, call("spy.nosuch", {}, id=9))
        await post(client, token, call("spy.crash", {"code": 1}, id=10))
        await post(client, token, call("spy.pid", {}, id=11))
        await post(client, token, {"jsonrpc": "2.0", "method": "spy.echo", "params": {"password": "hunter2"}})
        await state.audit.flush()
    records = [json.loads(line) for line in trail.read_text().splitlines()]
    assert [r["seq"] for r in records] == list(range(1, len(records) + 1))
    summary = [(r["event"], r["request_id"], r.get("decision"), r.get("status")) for r in records]
    assert summary == [
        ("outcome", 7, "allow", "ok"),
        ("decision", 8, "deny", None),
        ("decision", 9, "deny", None),
        ("decision", 10, "confirm", None), ("approval_requested", 10, None, None),
        ("approval_decided", 10, None, None), ("outcome", 10, None, "confirmation_expired"),
        # A dangerous call's decision is on disk before it runs: a record of its own.
        ("decision", 11, "allow", None), ("outcome", 11, None, "ok"),
        ("decision", None, "allow", None), ("outcome", None, None, "sent"),
    ]
    first = records[0]
    assert first["client"] == "c" and first["method"] == "spy.echo" and first["route"] == "direct"
    assert first["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert first["rule"] == f"role 'r' ({tmp_path / 'policies' / 'roles.toml'}) pattern 'spy.*'"
    assert len(first["params_sha256"]) == 64 and first["params"] == {"text": "hi"}
    assert first["status"] == "ok" and first["duration_ms"] >= 0 and "error_code" not in first
    assert records[1]["reason"] == "arguments" and "max_length 10" in records[1]["rule"]
    assert records[2]["reason"] == "unknown"
    dangerous = records[7]
    assert len(dangerous["params_sha256"]) == 64 and "params" not in records[8]
    assert "hunter2" not in trail.read_text()


async def test_a_broken_audit_log_refuses_dangerous_calls_and_keeps_the_rest(tmp_path: Path) -> None:
    tokens, record = config(tmp_path)
    # /dev/full opens fine and fails every write: a full disk.
    async with running_stack(tmp_path, audit_path="/dev/full") as (client, state):
        token = tokens["c"]
        refused = await post(client, token, call("spy.pid", {}))
        assert refused["error"]["code"] == -32013
        assert refused["error"]["data"]["error_type"] == "audit_unavailable"
        assert "ENOSPC" in refused["error"]["data"]["reason"]
        assert (await post(client, token, call("spy.echo", {"text": "still"})))["result"] == {"text": "still"}
        assert state.audit.status()["healthy"] is False
    received = [json.loads(line).get("method") for line in record.read_text().splitlines()]
    assert "pid" not in received and "echo" in received


async def test_health_says_degraded_while_the_audit_log_is_broken(tmp_path: Path) -> None:
    config(tmp_path)
    async with running_stack(tmp_path, audit_path="/dev/full") as (client, state):
        await state.audit.record({"event": "probe"}, durable=False)
        await state.audit.flush()
        response = await client.get("/healthz")
        assert response.status == 503 and "degraded" in await response.text()
    async with running_stack(tmp_path) as (client, _):
        assert (await client.get("/healthz")).status == 200
