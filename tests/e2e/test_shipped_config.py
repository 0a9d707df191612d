"""The shipped tools.d/ and policies/ work out of the box: every example tool is listed and callable."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gatewayd.config.edit import set_client_token
from gatewayd.web.auth import hash_token, new_token
from tests.daemon import REPO, Daemon, rpc


@pytest.fixture
async def shipped(tmp_path: Path) -> AsyncIterator[tuple[Daemon, str]]:
    shutil.copytree(REPO / "tools.d", tmp_path / "tools.d")
    (tmp_path / "policies").mkdir()
    shutil.copy(REPO / "policies" / "roles.toml", tmp_path / "policies" / "roles.toml")
    token = new_token()
    set_client_token(tmp_path / "policies" / "clients.toml", "laptop", hash_token(token), ["developer"])
    async with Daemon(tmp_path) as daemon:
        yield daemon, token


async def test_direct_call_to_the_shipped_calc(shipped: tuple[Daemon, str], http: aiohttp.ClientSession) -> None:
    daemon, token = shipped
    body = await rpc(http, daemon.url, token, "calc.add", {"a": 2, "b": 3})
    assert body == {"jsonrpc": "2.0", "id": 1, "result": 5}


async def test_shipped_clock_is_started_eagerly_and_answers(
    shipped: tuple[Daemon, str], http: aiohttp.ClientSession
) -> None:
    daemon, token = shipped
    await daemon.wait_log(r"server=clock pid=\d+ ready")
    body = await rpc(http, daemon.url, token, "clock.now", {"timezone": "UTC"})
    assert body["result"]["structuredContent"]["timezone"] == "UTC"


async def test_shipped_policy_refuses_shell_run_until_confirmed(
    shipped: tuple[Daemon, str], http: aiohttp.ClientSession
) -> None:
    daemon, token = shipped
    body = await rpc(http, daemon.url, token, "shell.run", {"command": "echo hi"})
    assert body["error"]["code"] == -32010
    assert body["error"]["data"]["error_type"] == "confirmation_required"
