"""`python -m bench.soak`: a daemon kept under a changing load gives back what the load took (issue 20, measured at
scale; the reliability plan's zombie, fd and memory soak, bounded in time).

Owns the soak: one daemon on an installed copy of the working tree, every server in it stopping when idle
(IDLE_TIMEOUT), driven in cycles for `--seconds`. A cycle is:

- direct JSON-RPC calls, then stateless MCP 2026-07-28 calls, at LOAD_CONCURRENCY in flight for CALL_SECONDS each;
- SESSIONS legacy MCP sessions, each calling the echo tool and a server with a child per session (`isolation =
  "session"`): half ended with DELETE, half left to expire (`session_idle_timeout` SESSION_IDLE_S);
- STREAMS streaming calls (bench/progsrv.py) whose client goes away after the first progress event: each call is
  cancelled while its child goes on streaming into a call that is gone;
- QUIT_CALLS calls of a child that exits after every QUIT_AFTER answers (the next call starts it again);
- that server replaced by a reload (its file rewritten, then `gatewayctl reload` through the admin socket).

After WARMUP_CYCLES cycles (which fill every cache, pool and free list) and after the last, the daemon is left until
it is idle again: no session, no retiring server, no child. Then its open fds, threads, children, zombies and RSS are
read. Goals: fds and threads back to their count after the warm-up, no child and no zombie, no session left, and the
RSS gained between the two idle points under RSS_GAIN_GOAL_BYTES a call: half the smallest object a call could leave
behind (an empty dict is 64 bytes). The allocator keeps some freed pages as the load changes shape, which shows as a
few bytes a call that shrink as the soak goes on; the Python heap itself does not grow (measured: bench/README.md).
The RSS after every cycle, busy, is in the record too, so a trend shows.

Run: `.venv/bin/python -m bench.soak --seconds 90`. Prints the figures and goals; the record goes to
`bench/results/soak-<stamp>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import aiohttp

from bench import wire
from bench.driver import JsonTarget, ModernTarget, SseTarget, client_session, run_load
from bench.procs import (
    ECHO_TOML,
    KIB,
    ROLE,
    ServerProcess,
    bench_env,
    daemon_argv,
    descendants,
    install_copy,
    status_kib,
    write_config,
    zombies,
)
from bench.run import RESULTS_DIR, save
from gatewayd.admin import AdminClient

DEFAULT_SECONDS: Final = 90.0
WARMUP_CYCLES: Final = 3
LOAD_CONCURRENCY: Final = 8
CALL_SECONDS: Final = 0.5
SESSIONS: Final = 8
SESSION_IDLE_S: Final = 1.0
IDLE_TIMEOUT: Final = "1s"
STREAMS: Final = 8
# Each stream would run STREAM_COUNT × STREAM_INTERVAL s if its client stayed.
STREAM_COUNT: Final = 40
STREAM_INTERVAL: Final = 0.02
QUIT_AFTER: Final = 7
QUIT_CALLS: Final = 20
# How long the daemon may take to become idle again (servers stop after IDLE_TIMEOUT, sessions expire after
# SESSION_IDLE_S, streams' children finish): a bound, polled every SETTLE_POLL_S.
SETTLE_DEADLINE_S: Final = 30.0
SETTLE_POLL_S: Final = 0.1
RSS_GAIN_GOAL_BYTES: Final = 32.0
PROGSRV: Final = Path(__file__).resolve().parent / "progsrv.py"
# A plain JSON-RPC child that answers `echo` and exits after every QUIT_AFTER answers.
QUITTER: Final = (
    "import json, sys\n"
    f"for n, line in zip(range({QUIT_AFTER}), sys.stdin):\n"
    "    m = json.loads(line)\n"
    "    print(json.dumps({'jsonrpc': '2.0', 'id': m['id'], 'result': m.get('params')}), flush=True)\n"
)


def _quit_toml(generation: int) -> str:
    return (f"# generation {generation}: each reload replaces this server\n"
            f"command = {json.dumps(['python3', '-c', QUITTER])}\nprotocol = \"jsonrpc\"\n"
            f'idle_timeout = "{IDLE_TIMEOUT}"\nmax_restarts = 1000000\nrestart_window = "1s"\n\n'
            '[methods.echo]\ninput_schema = { type = "object" }\n')


def _config(config_dir: Path) -> str:
    """The echo server, a child per session, the progress server and the quitting child; the client's token."""
    token = write_config(config_dir)
    idle = f'protocol = "jsonrpc"\nidle_timeout = "{IDLE_TIMEOUT}"\n'
    tools = config_dir / "tools.d"
    (tools / "echo.toml").write_text(ECHO_TOML.replace('protocol = "jsonrpc"\n', idle))
    (tools / "isolated.toml").write_text(ECHO_TOML.replace(
        'protocol = "jsonrpc"\n', f'{idle}isolation = "session"\nmax_children_per_client = {SESSIONS * 4}\n'))
    (tools / "prog.toml").write_text(f'command = ["python3", "{PROGSRV}"]\nprotocol = "mcp"\n'
                                     f'idle_timeout = "{IDLE_TIMEOUT}"\n')
    (tools / "quit.toml").write_text(_quit_toml(0))
    (config_dir / "policies" / "roles.toml").write_text(
        f'[roles.{ROLE}]\nallow = ["echo.*", "isolated.*", "prog.*", "quit.*"]\n')
    return token


# -- what the daemon holds -------------------------------------------------------------------------


def _held(pid: int) -> dict[str, int]:
    """The daemon's open fds, threads, RSS (KiB), live children and zombies."""
    kids = descendants(pid)
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": status_kib(pid, "Threads"),
            "rss_kib": status_kib(pid, "VmRSS"), "children": len(kids), "zombies": zombies(kids)}


async def _settled(admin: AdminClient, pid: int) -> tuple[dict[str, int], float]:
    """What the daemon holds once it is idle again (no session, no retiring server, no child), and how long that
    took; RuntimeError past SETTLE_DEADLINE_S."""
    begun = time.perf_counter()
    while True:
        # Read before asking: the admin request's own connection is then closed, not counted.
        held = _held(pid)
        status, view = await admin.call("GET", "/status")
        if status == 200 and view["sessions"] == 0 and not view["retiring"] and held["children"] == 0:
            return held, time.perf_counter() - begun
        if time.perf_counter() - begun > SETTLE_DEADLINE_S:
            raise RuntimeError(f"not idle after {SETTLE_DEADLINE_S:g}s: {view.get('sessions')} sessions, "
                               f"{len(view.get('retiring', []))} retiring servers, {held}")
        await asyncio.sleep(SETTLE_POLL_S)  # polling a condition, with the deadline above


# -- one cycle -----------------------------------------------------------------------------------


async def _tool_call(http: aiohttp.ClientSession, url: str, headers: dict[str, str], name: str) -> None:
    body = wire.compact(wire.request("tools/call", {"name": name, "arguments": wire.ECHO_PARAMS}))
    async with http.post(url, data=body, headers=headers) as response:
        answer = await response.read()
        if response.status != 200:
            raise wire.BadAnswer(f"{name}: HTTP {response.status}: {answer[:200]!r}")
    wire.check_tool_result(wire.response_of(answer, response.content_type))


async def _sessions(http: aiohttp.ClientSession, url: str, token: str, pid: int) -> None:
    """SESSIONS sessions calling echo and the per-session server; every other one ended, the rest left to expire."""
    for index in range(SESSIONS):
        session = SseTarget("session", http, url, token, pid)
        await session.open_session()
        await session.call()
        await _tool_call(http, url, session.headers, "isolated__echo")
        if index % 2 == 0:
            async with http.delete(url, headers=session.headers) as response:
                if response.status != 204:
                    raise wire.BadAnswer(f"DELETE: HTTP {response.status}")


async def _abandoned_stream(http: aiohttp.ClientSession, url: str, headers: dict[str, str], index: int) -> None:
    """A streaming call whose client closes its connection at the first progress event."""
    body = wire.compact(wire.request("tools/call", {
        "name": "prog__stream", "arguments": {"count": STREAM_COUNT, "interval": STREAM_INTERVAL},
        "_meta": {"progressToken": f"soak-{index}"}}, request_id=index + 1))
    async with http.post(url, data=body, headers=headers) as response:
        if response.status != 200 or response.content_type != "text/event-stream":
            raise wire.BadAnswer(f"stream: HTTP {response.status} {response.content_type}")
        async for line in response.content:
            if line.startswith(b"data:") and b"notifications/progress" in line:
                response.close()  # drops the connection: the daemon cancels the call
                return
    raise wire.BadAnswer("the stream ended before its first progress event")


async def _streams(url: str, token: str, pid: int) -> None:
    # A client session of its own: the closed connections are not handed back to the others' pool.
    async with client_session(STREAMS) as http:
        session = SseTarget("streams", http, url, token, pid)
        await session.open_session()
        await asyncio.gather(*(_abandoned_stream(http, url, session.headers, index) for index in range(STREAMS)))
        async with http.delete(url, headers=session.headers):
            pass


async def _quitting(http: aiohttp.ClientSession, url: str, token: str, pid: int) -> int:
    """QUIT_CALLS calls of the quitting child, one at a time; how many failed (a call sent as the child exits)."""
    headers = JsonTarget("quit", http, url, token, pid).headers
    body = wire.compact(wire.request("quit.echo", wire.ECHO_PARAMS))
    failed = 0
    for _ in range(QUIT_CALLS):
        async with http.post(url, data=body, headers=headers) as response:
            answer = json.loads(await response.read())
        failed += "result" not in answer
    return failed


async def _cycle(http: aiohttp.ClientSession, url: str, token: str, pid: int, config_dir: Path,
                 generation: int) -> dict[str, int]:
    """One cycle of the load; its call counts."""
    counts = {}
    for name, target in (("direct", JsonTarget("direct", http, url, token, pid)),
                         ("stateless", ModernTarget("stateless", http, url, token, pid))):
        result = await run_load(target, LOAD_CONCURRENCY, CALL_SECONDS, 0.0)
        if result.errors:
            raise RuntimeError(f"{name}: {result.errors} errors: {result.first_errors[:1]}")
        counts[name] = result.calls
    await _sessions(http, url, token, pid)
    await _streams(url, token, pid)
    counts["quit_failed"] = await _quitting(http, url, token, pid)
    (config_dir / "tools.d" / "quit.toml").write_text(_quit_toml(generation))
    status, result = await AdminClient(config_dir / "gatewayd.sock").call("POST", "/reload")
    if status != 200:
        raise RuntimeError(f"reload failed: {result}")
    counts["calls"] = counts["direct"] + counts["stateless"] + SESSIONS * 2 + STREAMS + QUIT_CALLS
    return counts


# -- the soak --------------------------------------------------------------------------------------


async def soak(root: Path, python: Path, seconds: float) -> dict[str, Any]:
    config_dir = root / "soak"
    token = _config(config_dir)
    daemon = ServerProcess("gatewayd", daemon_argv(config_dir, [f"--session-idle-timeout={SESSION_IDLE_S}"],
                                                   python=python), env=bench_env(python=python), cwd=config_dir)
    url = await daemon.start()
    admin = AdminClient(config_dir / "gatewayd.sock")
    cycles: list[dict[str, Any]] = []
    try:
        async with client_session(LOAD_CONCURRENCY) as http:
            warmup = [await _cycle(http, url, token, daemon.pid, config_dir, generation)
                      for generation in range(WARMUP_CYCLES)]
            baseline, settle_s = await _settled(admin, daemon.pid)
            ends = time.perf_counter() + seconds
            while time.perf_counter() < ends:
                counts = await _cycle(http, url, token, daemon.pid, config_dir, WARMUP_CYCLES + len(cycles))
                cycles.append({**counts, "rss_kib": status_kib(daemon.pid, "VmRSS")})
            final, final_settle_s = await _settled(admin, daemon.pid)
    finally:
        await daemon.stop()
    calls = sum(cycle["calls"] for cycle in cycles)
    gained = (final["rss_kib"] - baseline["rss_kib"]) * KIB
    return {
        "seconds": seconds, "cycles": len(cycles), "calls": calls, "warmup_cycles": warmup,
        "quit_failed": sum(cycle["quit_failed"] for cycle in cycles),
        "idle_after_warmup": baseline, "idle_at_end": final,
        "settle_s": [round(settle_s, 2), round(final_settle_s, 2)],
        "rss_gain_bytes_per_call": round(gained / max(calls, 1), 2),
        "busy_rss_kib_by_cycle": [cycle["rss_kib"] for cycle in cycles],
        "goals": {
            "fds_back": final["fds"] == baseline["fds"],
            "threads_back": final["threads"] <= baseline["threads"],
            "no_child_no_zombie": final["children"] == 0 and final["zombies"] == 0,
            f"rss_gain_under_{RSS_GAIN_GOAL_BYTES:g}_bytes_a_call": gained / max(calls, 1) < RSS_GAIN_GOAL_BYTES,
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="how long the cycles run")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON record goes")
    args = parser.parse_args(argv)

    async def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="gatewayd-soak-") as tmp:
            root = Path(tmp)
            return await soak(root, install_copy(root / "install"), args.seconds)

    record = asyncio.run(run())
    print(json.dumps(record, indent=1))
    print(f"raw results: {save(record, args.results_dir, prefix='soak-')}", file=sys.stderr)
    return 0 if all(record["goals"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
