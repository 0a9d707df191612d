"""What an agent wrote reaches an operator's terminal escaped: `gatewayctl approvals` and `status` against the real
daemon, while the call it waits for still runs with exactly the arguments the agent sent."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp

from gatewayd import display
from gatewayd.cli import ARGUMENTS_COLUMN
from tests.daemon import Daemon, faultsrv_command, gatewayctl, pending_approvals, rpc, write_config
from tests.test_display import NASTY, raw_unsafe

ECHO = faultsrv_command() + '\nprotocol = "jsonrpc"\n[methods.echo]\nconfirm = true\n'
ROLES = '[roles.r]\nallow = ["fault.*"]\n'


async def test_approvals_and_status_print_an_agents_control_and_bidi_characters_escaped(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = write_config(tmp_path, {"fault": ECHO}, ROLES, {"c": ["r"]})
    arguments: dict[str, Any] = {"note": NASTY, f"key{NASTY}": [NASTY]}
    async with Daemon(tmp_path) as daemon:
        call = asyncio.create_task(rpc(http, daemon.url, tokens["c"], "fault.echo", arguments))
        [pending] = await pending_approvals(tmp_path)
        assert pending["arguments"] == arguments  # --json: ASCII, and the exact value

        code, out, err = await gatewayctl(tmp_path, "approvals")
        assert code == 0, err
        assert raw_unsafe(out, allow="\n") == []
        cell = display.shown_json(arguments)[:ARGUMENTS_COLUMN - 1] + "…"
        assert cell in out and "\\u001b[2J" in cell and "\\u202egnp.exe" in cell

        for verb in (["approvals", "--json"], ["status", "--json"]):
            code, out, err = await gatewayctl(tmp_path, *verb)
            assert code == 0 and out.isascii(), (verb, err)
        assert json.loads(out)["approvals"][0]["arguments"] == arguments
        code, out, _ = await gatewayctl(tmp_path, "status")
        assert code == 0 and f"waiting for approval: {pending['id']}  c  fault.echo" in out
        assert raw_unsafe(out, allow="\n") == []

        code, out, err = await gatewayctl(tmp_path, "approve", pending["id"])
        assert code == 0, err
        async with asyncio.timeout(10):
            answer = await call
        # Only what is shown changed: the child got the agent's exact arguments.
        assert answer["result"] == arguments
