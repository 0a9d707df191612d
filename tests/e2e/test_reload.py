"""Hot reload against the real daemon: calls in flight survive it, bad saves never apply, policies bite at once.

Ground truth for "lost or duplicated" is each child's own record of the calls it received.
Reloads are observed through `gatewayctl status --json` (generation, last reload), never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp

from gatewayd.config.edit import set_client_token
from gatewayd.tokens import hash_token, new_token
from tests.daemon import FAULTSRV, Daemon, gatewayctl, headers, python_command, rpc, write_config
from tests.waiting import eventually

ROLES = '[roles.r]\nallow = ["a.*", "b.*", "c.*", "d.*"]\n'
CALLS_IN_FLIGHT = 50
# Long enough that every call is still running when the reload lands, short enough for a quick test.
CALL_SECONDS = 1.5
SAVES = 20
# Deadline for the daemon to notice a file change and reload (watchfiles groups changes up to 1.6 s).
RELOAD_DEADLINE = 15.0


def server(record: Path, timeout: str = "30s") -> str:
    return (python_command(str(FAULTSRV), "--record", str(record)) + f'\nprotocol = "jsonrpc"\nmax_in_flight = 64\n'
            f'call_timeout = "{timeout}"\n[methods.sleep]\n[methods.pid]\n[methods.echo]\n')


def received(record: Path) -> list[dict[str, Any]]:
    if not record.exists():
        return []
    lines = record.read_text().split("\n")[:-1]
    return [json.loads(line) for line in lines if line]


async def status(config_dir: Path) -> dict[str, Any]:
    code, out, err = await gatewayctl(config_dir, "status", "--json")
    assert code == 0, err
    result: dict[str, Any] = json.loads(out)
    return result


async def wait_config(config_dir: Path, generation: int | None = None, failed: bool | None = None,
                      in_sync: bool | None = None) -> dict[str, Any]:
    """Poll the daemon's status until its config reaches the state asked for; its `config` part."""
    async with asyncio.timeout(RELOAD_DEADLINE):
        while True:
            config: dict[str, Any] = (await status(config_dir))["config"]
            last = config["last_reload"]
            if ((generation is None or config["generation"] == generation)
                    and (failed is None or (last is not None and last["ok"] is not failed))
                    and (in_sync is None or config["in_sync"] is in_sync)):
                return config


async def test_calls_in_flight_survive_a_reload_that_changes_removes_and_keeps_servers(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    records = {name: tmp_path / f"{name}.jsonl" for name in "abc"}
    tokens = write_config(tmp_path, {name: server(path) for name, path in records.items()}, ROLES, {"x": ["r"]})
    token = tokens["x"]
    async with Daemon(tmp_path, "--watch-config", "false", "--client-max-concurrent", "100") as daemon:
        pids = {name: (await rpc(http, daemon.url, token, f"{name}.pid", {}))["result"] for name in "abc"}
        calls = [asyncio.create_task(rpc(http, daemon.url, token, f"{'abc'[n % 3]}.sleep",
                                         {"seconds": CALL_SECONDS, "n": n}, id=n)) for n in range(CALLS_IN_FLIGHT)]

        def sleeping() -> int:
            return sum(1 for path in records.values() for m in received(path) if m.get("method") == "sleep")

        await eventually(lambda: sleeping() >= CALLS_IN_FLIGHT, what="every call reached its child")
        (tmp_path / "tools.d" / "a.toml").write_text(server(records["a"], timeout="45s"))  # changed
        (tmp_path / "tools.d" / "b.toml").unlink()  # removed
        code, out, err = await gatewayctl(tmp_path, "reload")
        assert code == 0, err
        assert "servers removed: b" in out and "servers changed (restarted on new children): a" in out
        answers = await asyncio.gather(*calls)
        # Zero lost: every call answered with its own result.
        assert all(answer["result"] == {"slept": CALL_SECONDS} for answer in answers), answers
        assert sorted(answer["id"] for answer in answers) == list(range(CALLS_IN_FLIGHT))
        # Zero duplicated: each child received each of its calls once.
        sent = [m["params"]["n"] for path in records.values() for m in received(path) if m.get("method") == "sleep"]
        assert sorted(sent) == list(range(CALLS_IN_FLIGHT))
        # Untouched keeps its child; changed runs a new one; removed is gone.
        assert (await rpc(http, daemon.url, token, "c.pid", {}))["result"] == pids["c"]
        assert (await rpc(http, daemon.url, token, "a.pid", {}))["result"] != pids["a"]
        await daemon.wait_log(r"server=a gen=2 pid=\d+ started")  # log lines name the config generation
        assert (await rpc(http, daemon.url, token, "b.pid", {}))["error"]["code"] == -32601
        config = await wait_config(tmp_path, generation=2)
        assert config["in_sync"]


async def test_a_half_written_file_never_applies_and_the_finished_one_does(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = write_config(tmp_path, {"a": server(tmp_path / "a.jsonl")}, ROLES, {"x": ["r"]})
    async with Daemon(tmp_path) as daemon:
        whole = server(tmp_path / "d.jsonl")
        (tmp_path / "tools.d" / "d.toml").write_text(whole[: len(whole) // 2])
        config = await wait_config(tmp_path, failed=True)
        assert config["generation"] == 1 and "d.toml" in config["last_reload"]["errors"][0]
        assert (await rpc(http, daemon.url, tokens["x"], "a.echo", {"ok": 1}))["result"] == {"ok": 1}
        (tmp_path / "tools.d" / "d.toml").write_text(whole)
        await wait_config(tmp_path, generation=2, in_sync=True)
        assert (await rpc(http, daemon.url, tokens["x"], "d.echo", {"new": 1}))["result"] == {"new": 1}


async def test_a_save_by_rename_is_seen(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = write_config(tmp_path, {"a": server(tmp_path / "a.jsonl")}, '[roles.r]\nallow = ["a.pid"]\n',
                          {"x": ["r"]})
    async with Daemon(tmp_path) as daemon:
        assert (await rpc(http, daemon.url, tokens["x"], "a.echo", {}))["error"]["code"] == -32601
        # What editors do: write a hidden temporary file, then rename it over the original.
        temporary = tmp_path / "policies" / ".roles.toml.swp"
        temporary.write_text('[roles.r]\nallow = ["a.*"]\n')
        os.replace(temporary, tmp_path / "policies" / "roles.toml")
        await wait_config(tmp_path, generation=2)
        assert (await rpc(http, daemon.url, tokens["x"], "a.echo", {"v": 2}))["result"] == {"v": 2}


async def test_a_symlinked_directory_swapped_whole_is_followed(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = write_config(tmp_path, {"a": server(tmp_path / "a.jsonl")}, '[roles.r]\nallow = ["a.pid"]\n',
                          {"x": ["r"]})
    # policies/ becomes a symlink to a versioned directory, as deployment tools lay it out.
    (tmp_path / "policies").rename(tmp_path / "policies-v1")
    (tmp_path / "policies").symlink_to("policies-v1")
    async with Daemon(tmp_path) as daemon:
        v2 = tmp_path / "policies-v2"
        v2.mkdir()
        for path in (tmp_path / "policies-v1").iterdir():
            (v2 / path.name).write_text(path.read_text())
        (v2 / "roles.toml").write_text('[roles.r]\nallow = ["a.*"]\n')
        (tmp_path / "policies.new").symlink_to("policies-v2")
        os.replace(tmp_path / "policies.new", tmp_path / "policies")  # the atomic swap
        await wait_config(tmp_path, generation=2)
        assert (await rpc(http, daemon.url, tokens["x"], "a.echo", {"v": 2}))["result"] == {"v": 2}
        # The watcher now follows the new directory.
        (v2 / "roles.toml").write_text('[roles.r]\nallow = ["a.pid"]\n')
        await wait_config(tmp_path, generation=3)
        assert (await rpc(http, daemon.url, tokens["x"], "a.echo", {}))["error"]["code"] == -32601


async def test_twenty_saves_in_a_second_reload_once_or_twice_and_never_break(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = write_config(tmp_path, {"a": server(tmp_path / "a.jsonl")}, ROLES, {"x": ["r"]})
    async with Daemon(tmp_path, "--client-rate", "1e6", "--client-burst", "1000000") as daemon:
        await wait_config(tmp_path, generation=1)
        saving = True
        answers: list[dict[str, Any]] = []

        async def keep_calling() -> None:
            while saving:
                answers.append(await rpc(http, daemon.url, tokens["x"], "a.echo", {"n": len(answers)}))

        caller = asyncio.create_task(keep_calling())
        roles = tmp_path / "policies" / "roles.toml"
        for n in range(SAVES):
            roles.write_text(ROLES + f"# save {n}\n[roles.extra{n % 3}]\nallow = [\"a.pid\"]\n")
            await asyncio.sleep(1 / SAVES)  # pacing the saves over one second, not waiting for anything
        config = await wait_config(tmp_path, in_sync=True)
        saving = False
        await caller
        assert 2 <= config["generation"] <= 3, config  # one or two reloads
        # Served throughout: a reload that read a file mid-write was refused, never applied.
        assert answers and all(answer["result"] == {"n": n} for n, answer in enumerate(answers))


async def test_a_revoked_token_and_a_removed_permission_bite_on_open_sessions(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = write_config(tmp_path, {"a": server(tmp_path / "a.jsonl")}, ROLES, {"x": ["r"], "y": ["r"]})
    async with Daemon(tmp_path, "--watch-config", "false") as daemon:
        sessions = {}
        for who in ("x", "y"):
            async with http.post(daemon.url, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": who}}},
                    headers=headers(tokens[who])) as response:
                sessions[who] = response.headers["Mcp-Session-Id"]

        async def tools_call(who: str, token: str) -> tuple[int, Any]:
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "a__echo", "arguments": {}}}
            async with http.post(daemon.url, json=body,
                                 headers=headers(token, **{"Mcp-Session-Id": sessions[who]})) as response:
                return response.status, (await response.json() if response.status == 200 else None)

        assert (await tools_call("x", tokens["x"]))[1]["result"]["isError"] is False
        assert (await tools_call("y", tokens["y"]))[1]["result"]["isError"] is False
        # x's token is replaced; y's role loses a.echo.
        set_client_token(tmp_path / "policies" / "clients.toml", "x", hash_token(new_token()))
        (tmp_path / "policies" / "roles.toml").write_text('[roles.r]\nallow = ["a.pid"]\n')
        code, _, err = await gatewayctl(tmp_path, "reload")
        assert code == 0, err
        assert (await tools_call("x", tokens["x"]))[0] == 401
        status, body = await tools_call("y", tokens["y"])
        assert status == 200 and body["error"]["code"] == -32602 and "Unknown tool" in body["error"]["message"]


async def test_reload_of_an_invalid_config_fails_visibly_and_changes_nothing(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    tokens = write_config(tmp_path, {"a": server(tmp_path / "a.jsonl")}, ROLES, {"x": ["r"]})
    async with Daemon(tmp_path, "--watch-config", "false") as daemon:
        pid = (await rpc(http, daemon.url, tokens["x"], "a.pid", {}))["result"]
        (tmp_path / "tools.d" / "a.toml").write_text(server(tmp_path / "a.jsonl") + "call_timout = 1\n")
        code, _, err = await gatewayctl(tmp_path, "reload")
        assert code == 2 and "a.toml" in err and "call_timout" in err and "unknown key" in err
        assert (await rpc(http, daemon.url, tokens["x"], "a.pid", {}))["result"] == pid
        config = (await status(tmp_path))["config"]
        assert config["generation"] == 1 and not config["in_sync"] and not config["last_reload"]["ok"]
        code, out, _ = await gatewayctl(tmp_path, "status")
        assert "files on disk differ" in out and "last reload FAILED" in out


async def test_restart_leaves_the_failed_state(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    crashing = server(tmp_path / "a.jsonl").replace("max_in_flight = 64", "max_in_flight = 64\nmax_restarts = 0")
    tokens = write_config(tmp_path, {"a": crashing + "[methods.crash]\n"}, ROLES, {"x": ["r"]})
    async with Daemon(tmp_path, "--watch-config", "false") as daemon:
        await rpc(http, daemon.url, tokens["x"], "a.crash", {})
        async with asyncio.timeout(10):
            while (await status(tmp_path))["servers"]["a"]["state"] != "failed":
                pass
        assert (await rpc(http, daemon.url, tokens["x"], "a.pid", {}))["error"]["code"] == -32011
        code, out, _ = await gatewayctl(tmp_path, "restart", "a")
        assert code == 0 and "a restarted" in out
        assert isinstance((await rpc(http, daemon.url, tokens["x"], "a.pid", {}))["result"], int)
        code, _, err = await gatewayctl(tmp_path, "restart", "nosuch")
        assert code == 1 and "no tool server 'nosuch'" in err


async def test_sighup_reloads(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    tokens = write_config(tmp_path, {"a": server(tmp_path / "a.jsonl")}, '[roles.r]\nallow = ["a.pid"]\n',
                          {"x": ["r"]})
    async with Daemon(tmp_path, "--watch-config", "false") as daemon:
        (tmp_path / "policies" / "roles.toml").write_text('[roles.r]\nallow = ["a.*"]\n')
        assert daemon.proc is not None
        daemon.proc.send_signal(1)  # SIGHUP
        await wait_config(tmp_path, generation=2)
        assert (await rpc(http, daemon.url, tokens["x"], "a.echo", {"v": 1}))["result"] == {"v": 1}
        await daemon.wait_log(r"reload \(SIGHUP\): generation 2 applied")


async def test_a_config_directory_that_is_a_symlink_swapped_whole_is_followed(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    # /etc/gatewayd -> releases/1, then atomically -> releases/2: how deploy tools ship a config.
    releases = tmp_path / "releases"
    tokens = write_config(releases / "1", {"a": server(tmp_path / "a.jsonl")}, '[roles.r]\nallow = ["a.pid"]\n',
                          {"x": ["r"]})
    (releases / "2").mkdir()
    for sub in ("tools.d", "policies"):
        (releases / "2" / sub).mkdir()
        for path in (releases / "1" / sub).iterdir():
            (releases / "2" / sub / path.name).write_text(path.read_text())
    (releases / "2" / "policies" / "roles.toml").write_text('[roles.r]\nallow = ["a.*"]\n')
    config = tmp_path / "config"
    config.symlink_to(releases / "1")
    socket_path = tmp_path / "admin.sock"
    # State that must outlive a release lives outside it.
    async with Daemon(config, "--admin-socket", str(socket_path), "--audit-path", str(tmp_path / "audit.jsonl")) as d:
        assert (await rpc(http, d.url, tokens["x"], "a.echo", {}))["error"]["code"] == -32601
        (tmp_path / "config.new").symlink_to(releases / "2")
        os.replace(tmp_path / "config.new", config)
        async with asyncio.timeout(RELOAD_DEADLINE):
            while True:
                code, out, err = await gatewayctl(tmp_path, "--socket", str(socket_path), "status", "--json")
                assert code == 0, err
                if json.loads(out)["config"]["generation"] == 2:
                    break
        assert (await rpc(http, d.url, tokens["x"], "a.echo", {"v": 2}))["result"] == {"v": 2}
