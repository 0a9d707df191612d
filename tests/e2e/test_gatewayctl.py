"""`gatewayctl` against a live daemon's admin socket, and against none: every admin verb, its exit status."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import stat
import sys
from pathlib import Path

import aiohttp

from tests.daemon import GATEWAYCTL_DEADLINE, Daemon, daemon_env, faultsrv_command, gatewayctl, headers, write_config

FAULT = faultsrv_command() + '\nprotocol = "jsonrpc"\n[methods.pid]\n'
ROLES = '[roles.r]\nallow = ["fault.*"]\n'
EXIT_UNAVAILABLE = 69


async def test_every_admin_verb_says_the_daemon_is_not_running(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    for verb in (["approvals"], ["approve", "abc"], ["deny", "abc"], ["status"], ["reload"], ["restart", "x"],
                 ["metrics"]):
        code, out, err = await gatewayctl(tmp_path, *verb)
        assert code == EXIT_UNAVAILABLE and out == ""
        assert "gatewayd is not running" in err and str(tmp_path / "gatewayd.sock") in err and "Traceback" not in err


async def test_status_approvals_and_unknown_ids_against_a_live_daemon(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = write_config(tmp_path, {"fault": FAULT}, ROLES, {"c": ["r"]})
    async with Daemon(tmp_path) as daemon:
        code, out, _ = await gatewayctl(tmp_path, "status")
        assert code == 0 and "pending approvals 0" in out and "fault" in out and "stopped" in out
        assert f"listening on {daemon.url}\n" in out
        assert "IN FLIGHT  WAITING" in out  # calls waiting for a slot: whether max_in_flight is short
        code, out, _ = await gatewayctl(tmp_path, "status", "--json")
        status = json.loads(out)
        assert code == 0 and status["servers"]["fault"]["state"] == "stopped" and status["audit"]["healthy"]
        assert (status["servers"]["fault"]["waiting"], status["servers"]["fault"]["queued_total"]) == (0, 0)
        assert status["url"] == daemon.url
        code, out, _ = await gatewayctl(tmp_path, "approvals")
        assert code == 0 and out.strip() == "no calls are waiting for confirmation"
        async with http.post(daemon.url, headers=headers(tokens["c"]), json={
                "jsonrpc": "2.0", "id": 0, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe"}}}) as r:
            session_id = r.headers["Mcp-Session-Id"]
        code, out, _ = await gatewayctl(tmp_path, "status", "--json")
        [session] = json.loads(out)["session_list"]
        assert (session["client"], session["version"], session["client_info"]) == ("c", "2025-06-18", "probe")
        assert session["id"] == session_id[:12] and session_id not in out  # never the whole id
        code, out, _ = await gatewayctl(tmp_path, "status")
        assert f"session {session_id[:12]}…  client c  MCP 2025-06-18" in out
        code, _, err = await gatewayctl(tmp_path, "approve", "0123456789")
        assert code == 1 and "no approval '0123456789'" in err
        code, out, _ = await gatewayctl(tmp_path, "metrics")
        assert code == 0 and "# TYPE gatewayd_calls_total counter" in out and "gatewayd_config_in_sync 1" in out
        # What start-up made is kept out of the cyclic collector's runs (app.serve).
        frozen = re.search(r"^python_gc_frozen_objects (\d+)$", out, re.MULTILINE)
        assert frozen is not None and int(frozen.group(1)) > 0


async def test_the_admin_socket_is_private_and_removed_on_stop(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    path = tmp_path / "gatewayd.sock"
    async with Daemon(tmp_path):
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert not path.exists()


async def test_a_group_mode_can_be_asked_for(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    async with Daemon(tmp_path, "--admin-socket-mode", "0660"):
        assert stat.S_IMODE((tmp_path / "gatewayd.sock").stat().st_mode) == 0o660


async def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "gatewayd.sock"))
    stale.close()  # the file stays, nobody listens: what a crashed daemon leaves behind
    async with Daemon(tmp_path):
        code, _, _ = await gatewayctl(tmp_path, "status")
        assert code == 0


async def test_a_second_daemon_on_the_same_socket_refuses_to_start(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    async with Daemon(tmp_path):
        second = Daemon(tmp_path)
        try:
            await second.__aenter__()
        except RuntimeError as exc:
            assert "another gatewayd is listening on the admin socket" in str(exc)
        else:
            await second.stop()
            raise AssertionError("a second daemon started on a live admin socket")
        code, _, _ = await gatewayctl(tmp_path, "status")
        assert code == 0  # the first one is untouched


async def test_an_operator_token_is_no_client_token(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    code, out, _ = await gatewayctl(tmp_path, "token", "new", "alice", "--operator")
    assert code == 0 and "[operators.alice]" in (tmp_path / "policies" / "clients.toml").read_text()
    operator = out.strip()
    async with Daemon(tmp_path) as daemon:
        headers = {"Authorization": f"Bearer {operator}"}
        async with http.post(daemon.url, json={"jsonrpc": "2.0", "id": 1, "method": "fault.pid"},
                             headers=headers) as response:
            assert response.status == 401
        async with http.get(daemon.url.removesuffix("/mcp") + "/approvals/api/pending", headers=headers) as response:
            assert response.status == 200 and (await response.json()) == {"approvals": []}


async def test_check_takes_the_directory_and_its_exit_status_is_the_verdict(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    write_config(good, {"fault": FAULT}, ROLES)
    write_config(bad, {"fault": FAULT + "call_timout = 1\n"}, ROLES)
    code, out, _ = await gatewayctl(tmp_path, "check", str(good))
    assert code == 0 and out == "config OK: 1 tool server, 0 clients\n"  # "1 clients" was wrong
    code, _, err = await gatewayctl(tmp_path, "check", str(bad))
    assert code == 2 and "fault.toml" in err and "call_timout" in err


async def test_version_and_a_reader_that_stops_early_get_no_traceback(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    code, out, _ = await gatewayctl(tmp_path, "--version")
    assert code == 0 and re.fullmatch(r"gatewayctl \d+\.\d+\.\d+\n", out)
    async with Daemon(tmp_path):
        # `gatewayctl status --json | true`: the reader is gone before gatewayctl (a Python start-up and an admin
        # request away) writes its first byte.
        reader_fd, writer_fd = os.pipe()
        proc = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "gatewayctl"), "--config-dir", str(tmp_path), "status", "--json",
            stdout=writer_fd, stderr=asyncio.subprocess.PIPE, env=daemon_env(), cwd=str(tmp_path))
        os.close(writer_fd)
        os.close(reader_fd)
        async with asyncio.timeout(GATEWAYCTL_DEADLINE):
            _, err = await proc.communicate()
        assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err
