"""The smaller things an operator meets (issue 17, item 7): one duration syntax, `explain`'s exit status, failed
logins in the log, the audit log and the metrics, JSON logs, and `--check` naming the full path."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp

from gatewayd.web.auth import AUTH_RECORDS_PER_INTERVAL
from tests.daemon import Daemon, daemon_env, gatewayctl, python_command, write_config
from tests.waiting import eventually

CALC = python_command("-m", "gatewayd.examples.calc") + '\nprotocol = "jsonrpc"\n[methods.add]\n'
ROLES = '[roles.r]\nallow = ["calc.add"]\n'


async def gatewayd(cwd: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gatewayd", *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=daemon_env(), cwd=str(cwd))
    async with asyncio.timeout(30):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_one_duration_syntax_for_settings_and_approve_for(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES)
    code, out, err = await gatewayd(tmp_path, "--check", "--reload-drain", "1m", "--shutdown-grace", "500ms",
                                    "--session-idle-timeout", "2h")
    assert (code, out) == (0, "config OK: 1 tool server, 0 clients\n"), err
    code, _, err = await gatewayd(tmp_path, "--check", "--reload-drain", "1x")
    assert code == 64 and "setting reload_drain" in err and "expected a duration" in err
    code, _, err = await gatewayctl(tmp_path, "approve", "abc", "--for", "10m")
    assert code == 69, err  # parsed; only the daemon is missing


async def test_check_from_the_wrong_directory_names_the_full_path(tmp_path: Path) -> None:
    code, _, err = await gatewayd(tmp_path, "--check")
    assert code == 2 and f"config error: {tmp_path / 'tools.d'}: directory not found" in err


async def test_explain_of_a_denied_call_exits_1(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES, {"c": ["r"]})
    code, out, _ = await gatewayctl(tmp_path, "explain", "c", "calc.add")
    assert code == 0 and out.startswith("allow:")
    for args in (("c", "calc.subtract"), ("nobody", "calc.add")):
        code, out, _ = await gatewayctl(tmp_path, "explain", *args)
        assert code == 1 and out.startswith("deny:"), args


async def test_failed_logins_are_logged_audited_and_counted_with_the_log_rate_limited(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES, {"c": ["r"]})
    tries = AUTH_RECORDS_PER_INTERVAL + 3
    async with Daemon(tmp_path) as daemon:
        for attempt in range(tries):
            token = {"Authorization": "Bearer gwd_wrong"} if attempt else {}
            async with http.post(daemon.url, json={"jsonrpc": "2.0", "id": 1, "method": "calc.add"},
                                 headers=token) as response:
                assert response.status == 401
        code, out, _ = await gatewayctl(tmp_path, "metrics")
        assert code == 0 and f"gatewayd_auth_failures_total {tries}\n" in out
        await eventually(lambda: sum("401 for POST '/mcp' from 127.0.0.1" in line for line in daemon.logs)
                         == AUTH_RECORDS_PER_INTERVAL, what="ten 401 log lines")
        assert "missing bearer token" in await daemon.wait_log("401 for POST")
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    failed = [record for record in records if record["event"] == "auth_failed"]
    assert len(failed) == AUTH_RECORDS_PER_INTERVAL and "gwd_wrong" not in json.dumps(failed)
    assert failed[0]["peer"] == "127.0.0.1" and failed[0]["path"] == "/mcp"
    assert [record["reason"] for record in failed[:2]] == ["missing bearer token", "invalid token"]
    assert sum("401 for" in line for line in daemon.logs) == AUTH_RECORDS_PER_INTERVAL


async def test_log_format_json_is_one_object_a_line(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES)
    async with Daemon(tmp_path, "--log-format", "json") as daemon:
        assert daemon.url
    lines = [json.loads(line) for line in daemon.logs if line]
    assert lines and all(set(line) >= {"time", "level", "logger", "message"} for line in lines)
    assert any(line["message"].startswith("listening on http://") for line in lines)
