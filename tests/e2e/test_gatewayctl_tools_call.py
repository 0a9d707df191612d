"""`gatewayctl tools [CLIENT]` and `gatewayctl call CLIENT METHOD ARGS` against the real daemon: what a client sees,
and a call made as it through the daemon's own pipeline — policy, confirmation, audit — recorded as the operator's."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from tests.daemon import (
    GATEWAYCTL_DEADLINE,
    Daemon,
    daemon_env,
    gatewayctl,
    pending_approvals,
    python_command,
    write_config,
)

CALC = python_command("-m", "gatewayd.examples.calc") + '\nprotocol = "jsonrpc"\n' + "".join(
    f'[methods.{name}]\ndescription = "{name.title()} two numbers"\n' for name in ("add", "subtract", "multiply"))
ROLES = '[roles.adder]\nallow = ["calc.add"]\nconfirm = ["calc.multiply"]\n[roles.none]\n'


async def test_tools_shows_what_each_client_sees(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES, {"c": ["adder"], "d": ["none"]})
    async with Daemon(tmp_path):
        code, out, err = await gatewayctl(tmp_path, "tools")
        assert code == 0, err
        lines = [line.split() for line in out.splitlines()]
        assert lines[0] == ["CLIENT", "TOOL", "DESCRIPTION"]
        assert [line[:2] for line in lines[1:]] == [["c", "calc__add"], ["c", "calc__multiply"], ["d", "(none)"]]
        code, out, _ = await gatewayctl(tmp_path, "tools", "c", "--json")
        tools = json.loads(out)["c"]
        assert code == 0 and [tool["name"] for tool in tools] == ["calc__add", "calc__multiply"]
        assert tools[0]["inputSchema"] == {"type": "object"}
        code, out, err = await gatewayctl(tmp_path, "tools", "nobody")
        assert (code, out) == (1, "") and "no client 'nobody'" in err


async def test_call_runs_through_policy_and_audit_as_the_operator_on_the_clients_behalf(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES, {"c": ["adder"]})
    async with Daemon(tmp_path):
        code, out, err = await gatewayctl(tmp_path, "call", "c", "calc.add", '{"a": 2, "b": 3}')
        assert (code, out) == (0, "5\n"), err
        # Denied answers as unknown, exactly as it does to the client itself.
        for method in ("calc.subtract", "calc.nosuch"):
            code, out, err = await gatewayctl(tmp_path, "call", "c", method, '{"a": 2, "b": 3}')
            assert (code, out) == (1, "") and json.loads(err) == {"code": -32601, "message": "Method not found"}
        code, _, err = await gatewayctl(tmp_path, "call", "nobody", "calc.add", "{}")
        assert code == 1 and "no client 'nobody'" in err
        code, _, err = await gatewayctl(tmp_path, "call", "c", "calc.add", "{not json")
        assert code == 64 and "arguments are not JSON" in err
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    mine = [r for r in records if r.get("method") == "calc.add" and r.get("client") == "c"]
    # An ordinary call: one record, its decision folded into its outcome.
    assert [r["event"] for r in mine] == ["outcome"]
    assert all(r["by"].startswith("operator uid ") and r["by"].endswith("(gatewayctl call)") for r in mine)
    assert mine[0]["decision"] == "allow" and mine[0]["route"] == "direct" and mine[0]["status"] == "ok"


async def test_a_call_that_needs_confirmation_waits_for_an_approval(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES, {"c": ["adder"]})
    async with Daemon(tmp_path):
        caller = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "gatewayctl"), "--config-dir", str(tmp_path), "call", "c",
            "calc.multiply", '{"a": 6, "b": 7}', stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=daemon_env(), cwd=str(tmp_path))
        [pending] = await pending_approvals(tmp_path)
        assert (pending["client"], pending["method"], pending["arguments"]) == ("c", "calc.multiply", {"a": 6, "b": 7})
        code, _, err = await gatewayctl(tmp_path, "approve", pending["id"])
        assert code == 0, err
        async with asyncio.timeout(GATEWAYCTL_DEADLINE):
            out, err_bytes = await caller.communicate()
        assert (caller.returncode, out) == (0, b"42\n"), err_bytes
