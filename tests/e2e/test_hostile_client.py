"""A hostile client with a read-only role runs every attack at once against the real daemon; another client is
served throughout, within bounds, and the daemon is well afterwards.

The attacker is its own process (tests/fixtures/hostile.py), so its own work does not slow this test's
measuring client. Bounded: HOSTILE_SECONDS of attack (GATEWAYD_HOSTILE_SECONDS overrides it for a quick local
run), loopback only.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

import aiohttp

from tests.daemon import FAULTSRV, REPO, Daemon, python_command, rpc, write_config

HOSTILE_SECONDS = float(os.environ.get("GATEWAYD_HOSTILE_SECONDS", "60"))
# GATEWAYD_HOSTILE_ONLY=attack,attack runs only those (to see what one attack costs); by default every one runs.
ONLY = [os.environ["GATEWAYD_HOSTILE_ONLY"]] if "GATEWAYD_HOSTILE_ONLY" in os.environ else []
# The bounds the README states (Limits: "what one client can cost the others").
RSS_BOUND_MIB = 300
AUDIT_GROWTH_BOUND_MIB = 64
# The other client's p99 under attack may be this many times its unloaded p99 …
P99_FACTOR = 5
# … where an unloaded p99 below this counts as this: a sub-millisecond figure is timer noise on a shared 2-core box.
P99_FLOOR = 0.002
# The other client's pace: one call, then this pause.
CALL_PAUSE = 0.02
UNLOADED_CALLS = 600
ATTACKS = ("initialize", "sessions", "names", "ids", "bodies", "infinity", "gated", "slots", "unread", "idle", "auth",
           "batch")
# How often the daemon's RSS is sampled.
RSS_EVERY = 0.25

# A child per client: a child answers its calls in order, so a client sharing one with the attacker would also wait
# behind the attacker's 1 MiB echoes in the child itself, which no gateway can shorten. What is measured is what the
# daemon lets one client cost another.
CALC = python_command("-m", "gatewayd.examples.calc") + """
protocol = "jsonrpc"
isolation = "client"
[methods.add]
[methods.echo]
"""
FAULT = python_command(str(FAULTSRV)) + """
protocol = "jsonrpc"
[methods.sleep]
"""
SHELL = python_command("-m", "gatewayd.examples.shell") + """
[methods.run]
confirm = true
"""
ROLES = """
[roles.reader]
allow = ["calc.add", "calc.echo", "fault.sleep"]
[roles.worker]
allow = ["calc.*", "shell.run"]
"""


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def timed_add(http: aiohttp.ClientSession, url: str, token: str) -> float:
    started = time.perf_counter()
    answer = await rpc(http, url, token, "calc.add", {"a": 2, "b": 3})
    elapsed = time.perf_counter() - started
    assert answer == {"jsonrpc": "2.0", "id": 1, "result": 5}, answer
    return elapsed


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


async def test_a_hostile_client_cannot_hurt_another_one(tmp_path: Path) -> None:
    tokens = write_config(tmp_path, {"calc": CALC, "fault": FAULT, "shell": SHELL}, ROLES,
                          {"mallory": ["reader"], "alice": ["worker"]})
    with (tmp_path / "policies" / "clients.toml").open("a") as clients:
        # The measuring client calls faster than the default rate; the attacker keeps the defaults.
        clients.write("\n[clients.alice.limits]\nrate = 1000.0\nburst = 1000\n")
    audit = tmp_path / "audit.jsonl"
    async with Daemon(tmp_path, "--audit-path", str(audit)) as daemon, aiohttp.ClientSession() as http:
        assert daemon.proc is not None
        pid = daemon.proc.pid
        unloaded = [await timed_add(http, daemon.url, tokens["alice"]) for _ in range(UNLOADED_CALLS)]
        audit_before = audit.stat().st_size
        rss_before = rss_mib(pid)
        attacker = await asyncio.create_subprocess_exec(
            sys.executable, str(REPO / "tests" / "fixtures" / "hostile.py"), daemon.url, tokens["mallory"],
            str(HOSTILE_SECONDS), *ONLY,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(REPO))
        loaded: list[float] = []
        peak = rss_before
        next_sample = 0.0
        ends = time.monotonic() + HOSTILE_SECONDS
        while time.monotonic() < ends:
            loaded.append(await timed_add(http, daemon.url, tokens["alice"]))
            if time.monotonic() >= next_sample:
                peak = max(peak, rss_mib(pid))
                next_sample = time.monotonic() + RSS_EVERY
            await asyncio.sleep(CALL_PAUSE)  # the other client's pace, not a wait for a condition
        async with asyncio.timeout(HOSTILE_SECONDS + 60):
            out, err = await attacker.communicate()
        assert attacker.returncode == 0, err.decode()[-3000:]
        attacks = json.loads(out.decode().strip().splitlines()[-1])
        grown = (audit.stat().st_size - audit_before) / 2**20

        # And the daemon serves normally afterwards: unloaded again, measured again.
        after = [await timed_add(http, daemon.url, tokens["alice"]) for _ in range(UNLOADED_CALLS // 2)]
        print(f"hostile: p99 unloaded {p99(unloaded) * 1000:.2f} ms (after: {p99(after) * 1000:.2f}), under attack "
              f"{p99(loaded) * 1000:.2f} ms ({len(loaded)} calls); RSS {rss_before:.0f} → peak {peak:.0f} MiB; "
              f"audit +{grown:.1f} MiB; {attacks}")
        # Every attack ran.
        for name in () if ONLY else ATTACKS:
            assert any(key.startswith(name + ":") for key in attacks), (name, attacks)
        # The other client was served all along, within bounds: its p99 under attack against its unloaded one, before
        # or after (the larger: this shared machine's own noise moves an unloaded p99 from 2 to 12 ms run to run).
        unloaded_p99 = max(p99(unloaded), p99(after))
        bound = P99_FACTOR * max(unloaded_p99, P99_FLOOR)
        assert p99(loaded) <= bound, (p99(loaded), bound, p99(unloaded), p99(after))
        assert peak < RSS_BOUND_MIB, (peak, rss_before)
        assert grown < AUDIT_GROWTH_BOUND_MIB, grown
        async with http.get(daemon.url.replace("/mcp", "/healthz")) as health:
            assert health.status == 200
