"""`gatewayctl token new` writes only a config a reload accepts, and `--replace` rotates; `check`, `gatewayd --check`
and a reload refuse a program that cannot be run. Against the real daemon where the reload matters."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp

from tests.daemon import Daemon, daemon_env, gatewayctl, python_command, rpc, write_config

CALC = python_command("-m", "gatewayd.examples.calc") + '\nprotocol = "jsonrpc"\n[methods.add]\n'
ROLES = '[roles.r]\nallow = ["calc.*"]\n'
EXIT_CONFIG = 2


def policy_files(root: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted((root / "policies").iterdir())}


async def test_each_refusal_names_file_and_key_and_writes_nothing(tmp_path: Path) -> None:
    write_config(tmp_path, {"calc": CALC}, ROLES, {"c": ["r"]})
    code, _, _ = await gatewayctl(tmp_path, "dev-client")  # client "dev" in policies/dev.local.toml
    assert code == 0
    before = policy_files(tmp_path)
    clients, dev = tmp_path / "policies" / "clients.toml", tmp_path / "policies" / "dev.local.toml"
    refusals = {
        ("x", "--role", "nosuchrole"): f"{clients} [clients.x.roles]: no such role 'nosuchrole'",
        ("x",): f"{clients} [clients.x.roles]: a new client needs at least one --role",
        ("c", "--role", "r"): f"{clients} [clients.c]: already exists; pass --replace",
        ("dev", "--role", "r"): f"{dev} [clients.dev]: already exists; pass --replace",
        ("dev", "--role", "r", "--policy-file", "clients.toml", "--replace"):
            f"{dev} [clients.dev]: already defined in {clients}",
        ("y", "--replace", "--role", "r"): f"{clients} [clients.y]: no client 'y' to replace",
        ("dev-operator", "--operator"): f"{dev} [operators.dev-operator]: already exists; pass --replace",
        ("z", "--role", "r", "--policy-file", str(tmp_path / "elsewhere.toml")):
            f"{tmp_path / 'elsewhere.toml'}: the daemon reads policy files only from {tmp_path / 'policies'}",
    }
    for args, reason in refusals.items():
        code, out, err = await gatewayctl(tmp_path, "token", "new", *args)
        assert (code, out) == (EXIT_CONFIG, ""), (args, err)
        assert reason in err, (args, err)
        assert policy_files(tmp_path) == before, args
    assert not (tmp_path / "elsewhere.toml").exists()


async def test_replace_rotates_a_live_clients_token_and_a_refusal_leaves_the_daemon_in_sync(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = write_config(tmp_path, {"calc": CALC}, ROLES + '[roles.other]\nallow = ["calc.add"]\n', {"c": ["r"]})
    async with Daemon(tmp_path, "--watch-config", "false") as daemon:
        code, _, err = await gatewayctl(tmp_path, "token", "new", "x", "--role", "nosuchrole")
        assert code == EXIT_CONFIG and "no such role 'nosuchrole'" in err
        code, out, _ = await gatewayctl(tmp_path, "status", "--json")
        assert json.loads(out)["config"]["in_sync"] is True  # nothing was written for a reload to refuse

        code, out, err = await gatewayctl(tmp_path, "token", "new", "c", "--replace")
        assert code == 0, err
        new = out.strip()
        assert new.startswith("gwd_") and new != tokens["c"]
        code, _, err = await gatewayctl(tmp_path, "reload")
        assert code == 0, err
        async with http.post(daemon.url, json={"jsonrpc": "2.0", "id": 1, "method": "calc.add"},
                             headers={"Authorization": f"Bearer {tokens['c']}"}) as response:
            assert response.status == 401  # the old token stopped working
        answer = await rpc(http, daemon.url, new, "calc.add", {"a": 2, "b": 3})
        assert answer["result"] == 5  # its roles stayed

        code, out, err = await gatewayctl(tmp_path, "token", "new", "c", "--replace", "--role", "other")
        assert code == 0, err
        assert 'roles = [\n    "other",\n]' in (tmp_path / "policies" / "clients.toml").read_text()


MISSING = 'command = ["no-such-program-4711"]\nprotocol = "jsonrpc"\n[methods.add]\n'


async def test_a_program_that_cannot_run_fails_check_and_reload_which_keeps_the_running_config(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = write_config(tmp_path, {"calc": CALC}, ROLES, {"c": ["r"]})
    async with Daemon(tmp_path, "--watch-config", "false") as daemon:
        (tmp_path / "tools.d" / "calc.toml").write_text(MISSING)
        reason = f"{tmp_path / 'tools.d' / 'calc.toml'} [command]: program 'no-such-program-4711' is not on PATH"
        code, _, err = await gatewayctl(tmp_path, "check")
        assert code == EXIT_CONFIG and reason in err
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gatewayd", "--config-dir", str(tmp_path), "--check",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=daemon_env(), cwd="/")
        async with asyncio.timeout(30):
            _, check_err = await proc.communicate()
        assert proc.returncode == EXIT_CONFIG and reason in check_err.decode()
        code, _, err = await gatewayctl(tmp_path, "reload")
        assert code == EXIT_CONFIG and reason in err and "reload refused" in err
        assert (await rpc(http, daemon.url, tokens["c"], "calc.add", {"a": 1, "b": 1}))["result"] == 2
