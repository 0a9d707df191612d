"""A tools.d server's `era` against the real daemon: a silent legacy child starts without the probe's wait, a restart
of an "auto" one is not probed again, and `gatewayctl status` shows the era each is spoken to in."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp

from gatewayd.upstream.dialects import DISCOVER_TIMEOUT
from tests.daemon import Daemon, faultsrv_command, gatewayctl, rpc, write_config

# A first call whose start did not wait for a probe: a python child's start, on a loaded 2-core machine.
NO_PROBE_WAIT = 1.0
# The "auto" server's probe wait here (its startup_timeout bounds the probe), shorter than DISCOVER_TIMEOUT.
PROBE_WAIT = 2.0
ROLES = '[roles.r]\nallow = ["old.*", "probed.*"]\n'


async def timed(http: aiohttp.ClientSession, daemon: Daemon, token: str, method: str) -> float:
    started = time.monotonic()
    answer = await rpc(http, daemon.url, token, method, {"n": 1})
    assert answer["result"]["structuredContent"] == {"value": {"n": 1}}, answer
    return time.monotonic() - started


async def test_legacy_skips_the_probe_and_auto_probes_once(tmp_path: Path, http: aiohttp.ClientSession) -> None:
    silent = faultsrv_command("--mcp", "--ignore-unknown")
    tokens = write_config(tmp_path, {"old": silent + '\nera = "legacy"\n',
                                     "probed": silent + f'\nstartup_timeout = "{PROBE_WAIT:g}s"\n'},
                          ROLES, {"c": ["r"]})
    async with Daemon(tmp_path) as daemon:
        assert await timed(http, daemon, tokens["c"], "old.echo") < NO_PROBE_WAIT < DISCOVER_TIMEOUT
        assert await timed(http, daemon, tokens["c"], "probed.echo") >= PROBE_WAIT
        code, _, err = await gatewayctl(tmp_path, "restart", "probed")
        assert code == 0, err
        assert await timed(http, daemon, tokens["c"], "probed.echo") < NO_PROBE_WAIT
        code, out, err = await gatewayctl(tmp_path, "status", "--json")
        assert code == 0, err
        servers = json.loads(out)["servers"]
        assert servers["old"]["era"] == servers["probed"]["era"] == "legacy"
        code, out, err = await gatewayctl(tmp_path, "status")
        assert code == 0 and "ERA" in out and [line.split()[2] for line in out.splitlines()
                                                if line.startswith(("old ", "probed "))] == ["legacy", "legacy"]
