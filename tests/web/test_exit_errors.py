"""A tool server that exits mid-call: the caller learns how it ended, never what the shared child wrote on stderr
(another client's call may have made it write a secret); the operators have it in the daemon's log."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import faultsrv_command, write_config
from tests.stack import LocalClient, running_stack
from tests.web.test_console import bearer

FAULT = faultsrv_command() + '\nprotocol = "jsonrpc"\n[methods.stderr_flood]\n[methods.crash]\n'
ROLES = '[roles.r]\nallow = ["fault.*"]\n'


async def call(client: LocalClient, token: str, method: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """One JSON-RPC call: the response's raw text, and its decoded error."""
    response = await client.post("/mcp", headers=bearer(token),
                                 json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
    text = await response.text()
    return text, json.loads(text).get("error")


async def test_a_callers_exit_error_carries_no_stderr_of_the_shared_child(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gatewayd.upstream.process")
    tokens = write_config(tmp_path, {"fault": FAULT}, ROLES, {"alice": ["r"], "bob": ["r"]})
    async with running_stack(tmp_path) as (client, _):
        # Alice's call makes the child write to stderr; then Bob's call finds it crashing.
        text, error = await call(client, tokens["alice"], "fault.stderr_flood", {"lines": 3})
        assert error is None, text
        text, error = await call(client, tokens["bob"], "fault.crash", {"code": 7})
    assert error["code"] == -32011 and error["data"]["exit_status"] == 7 and error["data"]["method"] == "crash"
    assert "exit status 7" in error["message"]
    for leaked in ("stderr flood line", "crashing", "stderr"):
        assert leaked not in text
    # The operators still see every line, in the daemon's log.
    assert "stderr: stderr flood line 3" in caplog.text and "stderr: crashing" in caplog.text
