"""The daemon as an operator runs it: start-up errors, signals, no orphans, the command lines."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.daemon import Daemon, daemon_env, faultsrv_command, rpc, write_config
from tests.daemon import gatewayctl as gatewayctl_async
from tests.waiting import eventually, process_gone
from tests.web.test_metrics import sample

FAULT = faultsrv_command() + '\nprotocol = "jsonrpc"\n[methods.pid]\n[methods.grandchild]\n[methods.sleep]\n'
ROLES = '[roles.r]\nallow = ["fault.*"]\n'
# Calls at a time, and rounds of them, for the collector test: ~350 calls, each round holding as many objects alive
# as Python's default threshold (700) lets the youngest generation grow by.
IN_FLIGHT = 32
WAVES = 10


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gatewayd", *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env=daemon_env(), check=False)


def gatewayctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from gatewayd.cli import gatewayctl_main; sys.exit(gatewayctl_main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                          cwd=cwd, env=daemon_env(), check=False)


def test_help_lists_the_settings(tmp_path: Path) -> None:
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in ("--host", "--port", "--config-dir", "--audit-path", "--log-level", "--max-body-bytes"):
        assert flag in result.stdout


def test_a_broken_file_stops_startup_naming_file_and_key(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT + "call_timout = '5s'\n"}, ROLES)
    result = run_cli("--config-dir", str(tmp_path), "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert "fault.toml" in result.stderr and "call_timout" in result.stderr and "unknown key" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_setting_from_the_environment_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "gatewayd", "--check"], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path, env=daemon_env({"GATEWAYD_PORT": "not-a-port"}), check=False)
    assert result.returncode == 64
    assert "setting port" in result.stderr and "Traceback" not in result.stderr


def test_check_validates_without_running(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    result = run_cli("--config-dir", str(tmp_path), "--check", cwd=tmp_path)
    assert result.returncode == 0 and "config OK: 1 tool server, 0 clients" in result.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_stopping_the_daemon_leaves_no_child_or_grandchild(
    tmp_path: Path, http: aiohttp.ClientSession, sig: signal.Signals
) -> None:
    recording = faultsrv_command("--record", str(tmp_path / "received.jsonl"))
    tokens = write_config(tmp_path, {"fault": FAULT.replace(faultsrv_command(), recording)}, ROLES, {"c": ["r"]})
    daemon = Daemon(tmp_path, "--shutdown-grace", "0.5")
    async with daemon:
        child = (await rpc(http, daemon.url, tokens["c"], "fault.pid", {}))["result"]
        grandchild = (await rpc(http, daemon.url, tokens["c"], "fault.grandchild", {}))["result"]["pid"]
        slow = asyncio.ensure_future(rpc(http, daemon.url, tokens["c"], "fault.sleep", {"seconds": 60}, id=2))
        record = tmp_path / "received.jsonl"
        await eventually(lambda: record.exists() and '"fault.sleep"' not in record.read_text()
                         and '"sleep"' in record.read_text(), what="the slow call reached the child")
        assert await daemon.stop(sig) == 0
        await eventually(lambda: process_gone(child) and process_gone(grandchild), what="children gone")
        # The call in flight was not lost silently: it got a retryable error naming the shutdown.
        answer = await slow
        assert answer["error"]["code"] == -32011
        assert answer["error"]["data"] == {"error_type": "shutting_down", "retryable": True}
    assert any("stopped" in line for line in daemon.logs)


async def test_logs_name_the_url_server_and_pid(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = write_config(tmp_path, {"fault": FAULT}, ROLES, {"c": ["r"]})
    async with Daemon(tmp_path) as daemon:
        assert daemon.url.startswith("http://127.0.0.1:") and daemon.url.endswith("/mcp")
        pid = (await rpc(http, daemon.url, tokens["c"], "fault.pid", {}))["result"]
        await daemon.wait_log(rf"INFO .*server=fault gen=1 pid={pid} started")


async def test_token_new_makes_a_working_token(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    write_config(tmp_path, {"fault": FAULT}, ROLES)
    made = gatewayctl("--config-dir", str(tmp_path), "token", "new", "laptop", "--role", "r", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    stored = (tmp_path / "policies" / "clients.toml").read_text()
    assert token not in stored and "token_sha256" in stored
    assert (tmp_path / "policies" / "clients.toml").stat().st_mode & 0o077 == 0
    async with Daemon(tmp_path) as daemon:
        assert isinstance((await rpc(http, daemon.url, token, "fault.pid", {}))["result"], int)


def test_dev_client_is_stable_across_runs(tmp_path: Path) -> None:
    write_config(tmp_path, {"fault": FAULT}, '[roles.developer]\nallow = ["fault.*"]\n')
    first = gatewayctl("--config-dir", str(tmp_path), "dev-client", cwd=tmp_path)
    second = gatewayctl("--config-dir", str(tmp_path), "dev-client", cwd=tmp_path)
    assert first.returncode == 0 and first.stdout == second.stdout
    assert "Bearer gwd_" in first.stdout
    assert run_cli("--config-dir", str(tmp_path), "--check", cwd=tmp_path).returncode == 0


def test_explain_names_the_rule(tmp_path: Path) -> None:
    roles = ('[roles.r]\nallow = ["fault.*"]\n[roles.r.args."fault.echo".text]\nmax_length = 5\n'
             '[roles.ops]\nconfirm = ["fault.crash"]\n')
    write_config(tmp_path, {"fault": FAULT + "[methods.echo]\n[methods.crash]\n"}, roles, {"c": ["r", "ops"]})
    policy_file = str(tmp_path / "policies" / "roles.toml")

    def explain(*args: str) -> list[str]:
        result = gatewayctl("--config-dir", str(tmp_path), "explain", *args, cwd=tmp_path)
        lines = result.stdout.splitlines()
        # Exit 1 exactly when the call would be denied.
        assert result.returncode == (1 if lines[0].startswith("deny:") else 0), result.stderr
        return lines

    assert explain("c", "fault.pid") == [
        "allow: c may call fault.pid", f"  granted by role 'r' ({policy_file}) pattern 'fault.*'"]
    assert explain("c", "fault.crash")[0].startswith("confirm: c may call fault.crash after a person confirms")
    refused = explain("c", "fault.echo", '{"text": "far too long"}')
    assert refused[0] == "deny: c may call fault.echo, but not with these arguments"
    assert refused[1] == f"  refused by role 'r' ({policy_file}) pattern 'fault.echo', argument 'text': max_length 5"
    assert explain("c", "fault.echo", '{"text": "ok"}')[0] == "allow: c may call fault.echo"
    assert explain("c", "other.thing")[0].startswith("deny: c may not call other.thing (no role grants it)")
    assert "no tool server 'other'" in explain("c", "other.thing")[1]
    assert explain("nobody", "fault.pid") == ["deny: there is no client 'nobody' (clients: c)"]


async def test_audit_log_rotates_on_sigusr1(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = write_config(tmp_path, {"fault": FAULT}, ROLES, {"c": ["r"]})
    trail, rotated = tmp_path / "audit.jsonl", tmp_path / "audit.jsonl.1"
    async with Daemon(tmp_path) as daemon:
        await rpc(http, daemon.url, tokens["c"], "fault.pid", {}, id="before")
        await eventually(lambda: trail.exists() and '"event":"outcome"' in trail.read_text(),
                         what="the first call's outcome is on disk")
        trail.rename(rotated)
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGUSR1)
        await daemon.wait_log("audit log .* reopening")
        await rpc(http, daemon.url, tokens["c"], "fault.pid", {}, id="after")
        await eventually(lambda: trail.exists() and '"request_id":"after"' in trail.read_text(),
                         what="records after the rotation go to a new file")
    assert '"request_id":"after"' not in rotated.read_text()
    assert trail.stat().st_mode & 0o777 == 0o600


async def test_the_daemon_never_loads_tls(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """Plain HTTP on loopback only: Python's ssl (libssl and its tables, 3.7 MiB) stays unloaded, also once the
    config watcher has run (watchfiles' async API would import it through anyio)."""
    tokens = write_config(tmp_path, {"fault": FAULT}, ROLES, {"c": ["r"]})
    async with Daemon(tmp_path) as daemon:
        assert daemon.proc is not None
        assert isinstance((await rpc(http, daemon.url, tokens["c"], "fault.pid", {}))["result"], int)
        (tmp_path / "tools.d" / "fault.toml").write_text(FAULT + "# touched\n")
        await daemon.wait_log(r"reload \(files changed: fault\.toml\)")
        maps = await asyncio.to_thread(Path(f"/proc/{daemon.proc.pid}/maps").read_text)
        assert "libssl" not in maps and "_ssl." not in maps


async def test_calls_in_flight_do_not_run_the_cyclic_collector(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    """What calls in flight hold is freed by reference counts once they end: with the youngest generation's threshold
    raised (app.py COLLECTOR_YOUNG), 32 calls at a time no longer make the collector run, and find nothing, every few
    dozen calls."""
    tokens = write_config(tmp_path, {"fault": FAULT}, ROLES, {"c": ["r"]})
    lifted = ("--client-rate", "100000", "--client-burst", "100000", "--client-max-concurrent", "64")

    async def young_runs() -> float:
        code, out, err = await gatewayctl_async(tmp_path, "metrics")
        assert code == 0, err
        return sample(out, 'python_gc_collections_total{generation="0"}')

    async with Daemon(tmp_path, *lifted) as daemon:
        async def wave() -> None:
            answers = await asyncio.gather(*(rpc(http, daemon.url, tokens["c"], "fault.pid", {}, id=n)
                                             for n in range(IN_FLIGHT)))
            assert all(isinstance(answer["result"], int) for answer in answers)

        await wave()
        before = await young_runs()
        for _ in range(WAVES):
            await wave()
        assert await young_runs() == before
