"""The era an MCP child is spoken to in: tools.d `era`, and the probe made once per config, not at every start.

Real children: the fault fixture with `--ignore-unknown` is a legacy server that never answers `server/discover`
(the probe's worst case); `--record` shows what the gateway sent it. modernsrv.py speaks 2026-07-28.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gatewayd.config.loader import Snapshot, load_snapshot
from gatewayd.config.models import ServerConfig
from gatewayd.errors import ToolServerUnavailable
from gatewayd.explain import explain
from gatewayd.upstream.api import Delivery
from gatewayd.upstream.dialects import DISCOVER, DISCOVER_TIMEOUT, MODERN_VERSION
from gatewayd.upstream.eras import Eras
from gatewayd.upstream.fleet import Fleet
from gatewayd.upstream.pool import Pool
from gatewayd.upstream.server import ToolServer
from tests.daemon import FAULTSRV, REPO, faultsrv_command, write_config

MODERNSRV = REPO / "tests" / "fixtures" / "modernsrv.py"
# A start without the probe's wait: a python child's start and handshake, with room for a loaded 2-core machine.
NO_PROBE_WAIT = 1.0
# The probe's wait in "auto" tests, shorter than DISCOVER_TIMEOUT (it is bounded by startup_timeout too).
PROBE_WAIT = 2.0


def silent_legacy(tmp_path: Path, **config: Any) -> dict[str, Any]:
    """The fields of a legacy MCP server that never answers an unknown request, recording what it is sent."""
    record = tmp_path / f"sent-{len(list(tmp_path.glob('sent-*')))}.jsonl"
    return {"command": [sys.executable, str(FAULTSRV), "--mcp", "--ignore-unknown", "--record", str(record)],
            "idle_timeout": 0, **config}


def sent(fields: dict[str, Any], method: str) -> int:
    """How many `method` requests the child(ren) of these fields were sent."""
    record = Path(fields["command"][-1])
    lines = record.read_text().splitlines() if record.exists() else []
    return sum(1 for line in lines if json.loads(line).get("method") == method)


@pytest.fixture
async def stopped() -> Any:
    servers: list[ToolServer | Fleet] = []
    yield servers
    await asyncio.gather(*(server.stop() for server in servers))


def server(servers: list[ToolServer | Fleet], tmp_path: Path, fields: dict[str, Any],
           eras: Eras | None = None) -> ToolServer:
    made = ToolServer("legacy", ServerConfig.model_validate(fields), tmp_path, eras=eras)
    servers.append(made)
    return made


async def timed_echo(target: ToolServer | Fleet, delivery: Delivery | None = None) -> float:
    """Seconds one `echo` tool call took, its child's start included."""
    started = time.monotonic()
    result = await target.call_tool("echo", {"n": 1}, delivery or Delivery())
    assert result["structuredContent"] == {"value": {"n": 1}}
    return time.monotonic() - started


async def test_legacy_skips_the_probe_so_the_first_call_does_not_wait(tmp_path: Path,
                                                                      stopped: list[ToolServer | Fleet]) -> None:
    fields = silent_legacy(tmp_path, era="legacy")
    legacy = server(stopped, tmp_path, fields)
    assert await timed_echo(legacy) < NO_PROBE_WAIT < DISCOVER_TIMEOUT
    assert sent(fields, DISCOVER) == 0 and sent(fields, "initialize") == 1
    assert legacy.status()["era"] == "legacy"


async def test_auto_probes_a_silent_child_once_then_starts_it_without_waiting(
        tmp_path: Path, stopped: list[ToolServer | Fleet]) -> None:
    fields = silent_legacy(tmp_path, startup_timeout=PROBE_WAIT)
    auto = server(stopped, tmp_path, fields)
    assert auto.status()["era"] is None  # not spoken to yet
    assert await timed_echo(auto) >= PROBE_WAIT  # the probe waited for an answer that never came
    assert auto.status()["era"] == "legacy"
    for again in (auto.restart, auto.stop):  # an admin restart, and a stop as when idle
        await again()
        assert await timed_echo(auto) < NO_PROBE_WAIT
    assert sent(fields, DISCOVER) == 1 and sent(fields, "initialize") == 3


async def test_a_crash_restart_is_not_probed_again(tmp_path: Path, stopped: list[ToolServer | Fleet]) -> None:
    fields = silent_legacy(tmp_path, startup_timeout=PROBE_WAIT)
    auto = server(stopped, tmp_path, fields)
    await timed_echo(auto)
    with pytest.raises(ToolServerUnavailable):
        await auto.call_tool("crash", {"code": 1})
    assert await timed_echo(auto) < NO_PROBE_WAIT
    assert auto.restarts == 1 and sent(fields, DISCOVER) == 1


async def test_children_of_one_server_and_a_reload_share_what_the_probe_found(
        tmp_path: Path, stopped: list[ToolServer | Fleet]) -> None:
    fields = silent_legacy(tmp_path, startup_timeout=PROBE_WAIT, isolation="client")
    pool = Pool()
    servers, _ = pool.build(Snapshot({"legacy": ServerConfig.model_validate(fields)}, {}, {}, config_dir=tmp_path), 1)
    fleet = servers["legacy"]
    stopped.append(fleet)
    assert await timed_echo(fleet, Delivery(client="a")) >= PROBE_WAIT
    assert await timed_echo(fleet, Delivery(client="b")) < NO_PROBE_WAIT  # another client's own child
    # A reload that changed the file but not the program: a new server, the same program, no probe.
    changed = ServerConfig.model_validate({**fields, "call_timeout": "20s"})
    reloaded, diff = pool.build(Snapshot({"legacy": changed}, {}, {}, config_dir=tmp_path), 2, servers)
    assert diff.changed == ["legacy"]
    stopped.append(reloaded["legacy"])
    assert await timed_echo(reloaded["legacy"], Delivery(client="a")) < NO_PROBE_WAIT
    assert sent(fields, DISCOVER) == 1
    # Another program (its environment differs) is probed anew.
    other = ServerConfig.model_validate({**fields, "env": {"MODE": "other"}})
    third, _ = pool.build(Snapshot({"legacy": other}, {}, {}, config_dir=tmp_path), 3, reloaded)
    stopped.append(third["legacy"])
    assert await timed_echo(third["legacy"], Delivery(client="a")) >= PROBE_WAIT
    assert sent(fields, DISCOVER) == 2


async def test_a_modern_child_is_probed_at_each_start(tmp_path: Path, stopped: list[ToolServer | Fleet]) -> None:
    modern = server(stopped, tmp_path, {"command": [sys.executable, str(MODERNSRV)], "idle_timeout": 0})
    await modern.tools()
    assert modern.status()["era"] == MODERN_VERSION and modern.dialect.eras.get(modern.dialect.era_key) == \
        MODERN_VERSION
    await modern.restart()
    await modern.tools()
    assert modern.status()["era"] == MODERN_VERSION  # only a probe's answer makes a child modern


async def test_2026_07_28_speaks_statelessly_to_a_modern_child(tmp_path: Path,
                                                               stopped: list[ToolServer | Fleet]) -> None:
    modern = server(stopped, tmp_path, {"command": [sys.executable, str(MODERNSRV)], "era": MODERN_VERSION})
    result = await modern.call_tool("add", {"a": 2, "b": 3})
    assert "5" in json.dumps(result) and modern.status()["era"] == MODERN_VERSION


@pytest.mark.parametrize("flags", [(), ("--ignore-unknown",)], ids=["refuses discover", "never answers it"])
async def test_2026_07_28_against_a_legacy_child_fails_its_start_naming_server_and_key(
        tmp_path: Path, stopped: list[ToolServer | Fleet], flags: tuple[str, ...]) -> None:
    fields = {"command": [sys.executable, str(FAULTSRV), "--mcp", *flags], "era": MODERN_VERSION,
              "startup_timeout": "300ms", "idle_timeout": 0}
    legacy = server(stopped, tmp_path, fields)
    with pytest.raises(ToolServerUnavailable) as failed:
        await legacy.call_tool("echo", {})
    wire = failed.value.to_wire()
    assert wire["code"] == -32011 and wire["data"]["server"] == "legacy" and wire["data"]["key"] == "era"
    assert "'legacy' does not speak MCP 2026-07-28" in wire["message"] and "tools.d key era" in wire["message"]
    assert legacy.restarts == 1 and legacy.status()["last_exit"]  # reported as any failed start


def test_remembered_eras_are_bounded_oldest_forgotten_first() -> None:
    eras = Eras(limit=2)
    eras.remember("a", "legacy")
    eras.remember("b", "legacy")
    eras.remember("a", "legacy")  # seen again: now the newest
    eras.remember("c", MODERN_VERSION)
    assert len(eras) == 2 and eras.get("b") is None and eras.get("a") == "legacy" and eras.get("c") == MODERN_VERSION
    eras.forget("a")
    assert eras.get("a") is None


def test_explain_says_a_server_s_era_is_fixed(tmp_path: Path) -> None:
    write_config(tmp_path, {"old": faultsrv_command("--mcp") + '\nera = "legacy"\n', "any": faultsrv_command("--mcp")},
                 '[roles.r]\nallow = ["old.*", "any.*"]\n', {"c": ["r"]})
    snapshot = load_snapshot(tmp_path)
    assert '  spoken to in the legacy era without a server/discover probe (era = "legacy")' in explain(
        snapshot, "c", "old.echo", None)
    assert not any("server/discover" in line for line in explain(snapshot, "c", "any.echo", None))
