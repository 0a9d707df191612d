"""`python -m bench.timeline`: where one call's time goes when calls come one at a time — the daemon before the
child, the child, the daemon after it, and the client — with the daemon's steps in between.

Owns the answer to "how much of a call at 1 in flight is gatewayd's to save". At 1 in flight a call's time is a
chain: the client sends, the daemon reads, checks and writes to the child, the child answers, the daemon writes the
answer, the client reads it and sends the next. Calls/s there is one over the whole chain, and only the daemon's two
stretches are gatewayd's; the client's and the child's are the same for any gateway in front of the same child.

The daemon runs with a probe in place of `-m gatewayd` (bench.opcount's way): a few of its methods are wrapped, at
start, to note the time (`perf_counter_ns`) as they are entered or left, only while the probe is switched on
(SIGUSR2). Each target makes `--calls` calls one at a time after a warm-up, the probe on. The marks, in a call's
order (MARKS): its HTTP bytes arrive (the connection's `data_received`) and are parsed; the request's handler runs (a
loop turn later); the message is dispatched (parsed, authenticated, admitted); the tool server is called (authorized
and routed); the line is written to the child (the write, whose system call also wakes the child); the child's
answer arrives and is read; the HTTP response has been written (its `send` included). Medians over the calls, each
stretch on its own. Each mark costs ~0.3 µs, and a lone call runs on cold caches: the figures are time on this
machine at 1 in flight, not the warm cost of the same steps (a microbenchmark of the same function is ~3× faster).

Run: `.venv/bin/python -m bench.timeline --targets gatewayd-json,gatewayd-sse,gatewayd-modern` (~30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from bench.driver import JsonTarget, client_session
from bench.floor import TOKEN_ENV
from bench.opcount import OUT_ENV, call_target, count, traced_argv
from bench.procs import ServerProcess, bench_env, daemon_argv, floor_argv, install_copy
from bench.run import GATEWAYD_JSON, GATEWAYD_MODERN, GATEWAYD_SSE, RELAY, RESULTS_DIR, save
from bench.scale import streaming_config

TARGETS: Final = (GATEWAYD_JSON, GATEWAYD_SSE, GATEWAYD_MODERN, RELAY)
DEFAULT_CALLS: Final = 2000
# The four parts of a call: (name, from mark, to mark); the client's runs to the next call's `request`.
PARTS: Final = (("daemon, in", "request", "child_written"), ("child", "child_written", "child_answer"),
                ("daemon, out", "child_answer", "response_written"), ("client", "response_written", None))
# A gatewayd call's marks in order; a call is the run of marks from one `request` to the next.
MARKS: Final = ("request", "parsed", "handler", "dispatch", "server", "child_write", "child_written",
                "child_answer", "answer_read", "response_written")
# The relay floor (bench/relay.py) has no steps of gatewayd's between reading a request and writing to its child.
RELAY_MARKS: Final = ("request", "parsed", "child_write", "child_written", "child_answer", "answer_read",
                      "response_written")
# The probe, run in the server's interpreter: wraps the methods that mark a call's steps (WRAPS), then runs the
# server as `python -m` would. The marks are noted only while it is on; SIGUSR2 switches it, and switching it off
# writes them out.
PROBE: Final = f"""
import os, pickle, runpy, signal, sys, time
now = time.perf_counter_ns
on = False
marks = []
def wrap(owner, name, entered, left=None, when=None):
    inner = getattr(owner, name)
    def marked(*args, **kwargs):
        noted = on and (when is None or when(*args))
        if noted:
            marks.append((entered, now()))
        if left is None:
            return inner(*args, **kwargs)
        result = inner(*args, **kwargs)
        if noted:
            marks.append((left, now()))
        return result
    setattr(owner, name, marked)
def read_bytes(protocol, data):
    # aiohttp feeds its parser no bytes when a body has been read (gatewayd's connection does not): not a request.
    return bool(data)
def toggle(signum, frame):
    global on
    if not on:
        marks.clear()
        on = True
        return
    on = False
    path = os.environ[{OUT_ENV!r}]
    with open(path + ".part", "wb") as out:
        pickle.dump(marks, out)
    os.replace(path + ".part", path)
signal.signal(signal.SIGUSR2, toggle)
"""
GATEWAYD_WRAPS: Final = """
from gatewayd.gateway import Gateway
from gatewayd.upstream import process
from gatewayd.upstream.server import ToolServer
from gatewayd.web import aiohttp_hooks
wrap(aiohttp_hooks.Connection, "data_received", "request", "parsed", read_bytes)
wrap(aiohttp_hooks.Direct, "__call__", "handler")
wrap(Gateway, "dispatch", "dispatch")
wrap(ToolServer, "call_method", "server")
wrap(ToolServer, "call_tool", "server")
wrap(process.ChildProcess, "write", "child_write", "child_written")
wrap(process._Stdout, "data_received", "child_answer", "answer_read")
prepare = aiohttp_hooks.WholeResponse.prepare
async def prepared(self, request):
    writer = await prepare(self, request)
    if on:
        marks.append(("response_written", now()))
    return writer
aiohttp_hooks.WholeResponse.prepare = prepared
sys.argv[0] = "gatewayd"
runpy.run_module("gatewayd", run_name="__main__", alter_sys=True)
"""
# The relay floor writes to its child through asyncio's pipe transport, reads it through asyncio's subprocess
# protocol, and answers with aiohttp's own response (headers and body in one `_writelines`).
RELAY_WRAPS: Final = """
from asyncio import base_subprocess, unix_events
from aiohttp import http_writer, web_protocol
wrap(web_protocol.RequestHandler, "data_received", "request", "parsed", read_bytes)
wrap(unix_events._UnixWritePipeTransport, "write", "child_write", "child_written")
wrap(base_subprocess.ReadSubprocessPipeProto, "data_received", "child_answer", "answer_read")
wrap(http_writer.StreamWriter, "_writelines", "response_write", "response_written")
sys.argv[0] = "bench.relay"
runpy.run_module("bench.relay", run_name="__main__", alter_sys=True)
"""


Mark = tuple[str, int]


def calls_of(marks: list[Mark], names: tuple[str, ...]) -> list[dict[str, int]]:
    """Each whole call's marks (the first of each name), from one `request` to the next; the last call, whose next
    request never came, is left out, as is one missing any of `names`."""
    calls: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    for name, at in marks:
        if name == "request":
            if current is not None:
                current["next_request"] = at
                if all(mark in current for mark in names):
                    calls.append(current)
            current = {}
        if current is not None:
            current.setdefault(name, at)
    return calls


def summarise(marks: list[Mark], names: tuple[str, ...]) -> dict[str, Any]:
    """Median µs of each step between the marks `names` and of each part of a call, and the calls/s that makes."""
    calls = calls_of(marks, names)
    if not calls:
        raise RuntimeError("no whole call was marked")

    def median_us(start: str, end: str) -> float:
        return round(statistics.median((call[end] - call[start]) / 1000 for call in calls), 1)

    steps = {f"{start} → {end}": median_us(start, end) for start, end in itertools.pairwise(names)}
    steps[f"{names[-1]} → next request"] = median_us(names[-1], "next_request")
    parts = {name: median_us(start, end or "next_request") for name, start, end in PARTS}
    whole = median_us("request", "next_request")
    return {"calls": len(calls), "steps_us": steps, "parts_us": parts, "call_us": whole,
            "calls_per_s": round(1e6 / whole), "daemon_share": round(
                (parts["daemon, in"] + parts["daemon, out"]) / whole, 3)}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    record: dict[str, Any] = {"args": {"targets": args.targets, "calls": args.calls}, "targets": {}}
    with tempfile.TemporaryDirectory(prefix="gatewayd-timeline-") as tmp:
        root = Path(tmp)
        python = install_copy(root / "install")
        config_dir = root / "config"
        token = streaming_config(config_dir)
        out = root / "marks.pickle"
        servers = [name for name in args.targets if name != RELAY]
        if servers:
            daemon = ServerProcess("gatewayd", traced_argv(daemon_argv(config_dir, python=python),
                                                           PROBE + GATEWAYD_WRAPS),
                                   env={**bench_env(python=python), OUT_ENV: str(out)}, cwd=config_dir)
            await _timed(daemon, servers, token, out, MARKS, args, record)
        if RELAY in args.targets:
            relay = ServerProcess("relay", traced_argv(floor_argv("bench.relay"), PROBE + RELAY_WRAPS),
                                  env=bench_env({TOKEN_ENV: token, OUT_ENV: str(out)}))
            await _timed(relay, [RELAY], token, out, RELAY_MARKS, args, record)
    return record


async def _timed(server: ServerProcess, names: list[str], token: str, out: Path, marks: tuple[str, ...],
                 args: argparse.Namespace, record: dict[str, Any]) -> None:
    """Start `server`, time `args.calls` calls of each target `names` on it, stop it."""
    url = await server.start()
    try:
        async with client_session(1) as http:
            for name in names:
                target = JsonTarget(name, http, url, token, server.pid) if name == RELAY else await call_target(
                    name, http, url, token, server.pid)
                record["targets"][name] = summarise(await count(server, target, args.calls, out), marks)
    finally:
        await server.stop()


def report(record: dict[str, Any]) -> str:
    lines = []
    for name, figures in record["targets"].items():
        parts = ", ".join(f"{part} {us:g}" for part, us in figures["parts_us"].items())
        lines += [f"{name}: {figures['call_us']:g} µs a call ({figures['calls_per_s']:,} calls/s), median µs: {parts};"
                  f" the daemon's share {figures['daemon_share']:.0%}"]
        lines += [f"  {us:8.1f}  {step}" for step, us in figures["steps_us"].items()]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=lambda text: text.split(","), default=list(TARGETS),
                        help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help=f"calls timed a target ({DEFAULT_CALLS})")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON record goes")
    args = parser.parse_args(argv)
    unknown = set(args.targets) - set(TARGETS)
    if unknown or args.calls < 2:
        parser.error(f"targets are some of {', '.join(TARGETS)}; --calls ≥ 2")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = asyncio.run(measure(args))
    print(report(record))
    print(f"record: {save(record, args.results_dir, 'timeline-')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
