"""`python -m bench.opcount`: the Python bytecodes gatewayd's event loop runs for one call (or one relayed
notification), by target and by function.

Owns a measure that does not drift with the machine. Timing on this 2-core machine scatters by ~9% a pair
(bench.ab), so a change of 2% cannot be seen that way; the instructions gatewayd's own functions execute for a
call are the same from run to run within a few (asyncio's share moves by tens: how many loop turns a call takes
depends on when its events arrive, so compare the `gatewayd` package figure). The daemon runs with a tracer
(`sys.settrace` with opcode events, the main thread only, switched on and off by SIGUSR2); each target makes
`--calls` calls one at a time after a warm-up, with the tracer on, and the counts per function are read back.

Beside the opcodes it counts the loop's own steps: its turns, and each callback it was handed to run in a coming
turn or at a time, by name (a task's wake-up with the coroutine it runs). Each turn costs a `select` and ~100
bytecodes of asyncio's, and on 2 cores a turn that could have been saved often paid more than its bytecodes say.

It counts Python work, not time: a call into C (JSON, a system call, the audit writer's thread) is one
instruction however long it runs, and the tracer slows the daemon ~50× while on (the figures are per call, not per
second). Use it to see how much Python a change adds or removes on a call's path, and where; use bench.ab for what
that is worth in calls/s.

The `notification` target is one streaming call in a 2025 session that relays NOTIFICATIONS progress notifications
(bench/progsrv.py, SPACING_S apart: each read and relayed in loop turns of its own), counted per notification
received; the call's own request and answer fall in the window too, 1/NOTIFICATIONS of a call each.

Run: `.venv/bin/python -m bench.opcount --targets gatewayd-json,gatewayd-sse,gatewayd-modern,notification --top 15`
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import pickle
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

import aiohttp

from bench import wire
from bench.driver import JsonTarget, ModernTarget, SseTarget, Target, client_session
from bench.procs import ServerProcess, bench_env, daemon_argv, install_copy
from bench.run import GATEWAYD_JSON, GATEWAYD_MODERN, GATEWAYD_SSE, RESULTS_DIR, save
from bench.scale import streaming_config

NOTIFICATION: Final = "notification"
TARGETS: Final = (GATEWAYD_JSON, GATEWAYD_SSE, GATEWAYD_MODERN, NOTIFICATION)
DEFAULT_CALLS: Final = 200
WARMUP_CALLS: Final = 100
DEFAULT_TOP: Final = 20
# A loop callback made fewer times a call than this is left out of the report (a timer that fires now and then).
MIN_CALLBACKS_SHOWN: Final = 0.05
# Where the daemon writes its counts when the tracer is switched off.
OUT_ENV: Final = "GATEWAYD_OPCOUNT_OUT"
# The counts file appears once the daemon has handled the signal; it is polled this often, this long.
POLL_S: Final = 0.05
DUMP_DEADLINE_S: Final = 30.0
# The notification target: one stream of this many, this far apart (a warm-up stream of WARMUP_NOTIFICATIONS first).
NOTIFICATIONS: Final = 400
WARMUP_NOTIFICATIONS: Final = 50
SPACING_S: Final = 0.005
STREAM_TIMEOUT_S: Final = 60.0
# Run in the daemon's interpreter in place of `-m gatewayd`: the tracer, then the daemon as `python -m` runs it.
# The loop's own steps, counted apart from the opcodes: each turn (`_run_once`), and each callback it is handed to
# run in a coming turn (`_call_soon`) or at a time (`call_at`), by the callback's name and, for a task's wake-up, the
# name of the coroutine it runs.
TURN: Final = "(loop turns)"
HOOK: Final = f"""
import collections, os, pickle, runpy, signal, sys
counts = collections.Counter()
loop = collections.Counter()
def local(frame, event, arg):
    if event == "opcode":
        code = frame.f_code
        counts[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
    return local
def named(callback):
    name = getattr(callback, "__qualname__", type(callback).__name__)
    coro = getattr(getattr(callback, "__self__", None), "get_coro", None)
    return name + " (" + getattr(coro(), "__qualname__", "?") + ")" if coro is not None else name
def start(frame, event, arg):
    code = frame.f_code
    if code.co_filename.endswith("asyncio/base_events.py"):
        if code.co_name == "_run_once":
            loop[{TURN!r}] += 1
        elif code.co_name == "_call_soon":
            loop["soon: " + named(frame.f_locals.get("callback"))] += 1
        elif code.co_name == "call_at":
            loop["at: " + named(frame.f_locals.get("callback"))] += 1
    frame.f_trace_opcodes = True
    return local
def toggle(signum, frame):
    if sys.gettrace() is None:
        counts.clear()
        loop.clear()
        sys.settrace(start)
        return
    sys.settrace(None)
    path = os.environ[{OUT_ENV!r}]
    with open(path + ".part", "wb") as out:
        pickle.dump((dict(counts), dict(loop)), out)
    os.replace(path + ".part", path)
signal.signal(signal.SIGUSR2, toggle)
sys.argv[0] = "gatewayd"
runpy.run_module("gatewayd", run_name="__main__", alter_sys=True)
"""


def traced_argv(argv: list[str], hook: str = HOOK) -> list[str]:
    """The daemon's command with `-m gatewayd` replaced by `hook` (the tracer's, or another probe's that is switched
    on and off by SIGUSR2 and writes what it saw, pickled, to the file OUT_ENV names)."""
    at = argv.index("-m")
    return [*argv[:at], "-c", hook, *argv[at + 2:]]


Opcodes = dict[tuple[str, int, str], int]
# What the tracer reads back: opcodes per function, and the loop's turns and callbacks (TURN).
Counts = tuple[Opcodes, dict[str, int]]


async def count(daemon: ServerProcess, target: Target, calls: int, out: Path) -> Any:
    """What the daemon's probe saw over `calls` calls of `target`, made one at a time with it on (the tracer's: opcodes
    per function, and the loop's steps)."""
    for _ in range(WARMUP_CALLS):
        await target.call()
    await asyncio.to_thread(out.unlink, True)
    os.kill(daemon.pid, signal.SIGUSR2)
    for _ in range(calls):
        await target.call()
    os.kill(daemon.pid, signal.SIGUSR2)
    return pickle.loads(await _written(out))


async def count_notifications(daemon: ServerProcess, session: SseTarget, out: Path) -> tuple[Counts, int]:
    """Opcodes per function, and the loop's steps, over one stream of NOTIFICATIONS progress notifications, and how
    many arrived."""
    await _stream(session, WARMUP_NOTIFICATIONS)
    await asyncio.to_thread(out.unlink, True)
    os.kill(daemon.pid, signal.SIGUSR2)
    received = await _stream(session, NOTIFICATIONS)
    os.kill(daemon.pid, signal.SIGUSR2)
    counts: Counts = pickle.loads(await _written(out))
    if received != NOTIFICATIONS:
        raise RuntimeError(f"{received} of {NOTIFICATIONS} notifications arrived")
    return counts, received


async def _stream(session: SseTarget, count: int) -> int:
    """One `prog__stream` call of `count` notifications, read whole; the notifications in its answer."""
    body = wire.compact(wire.request("tools/call", {
        "name": "prog__stream", "arguments": {"count": count, "interval": SPACING_S},
        "_meta": {"progressToken": 1}}))
    async with session.http.post(session.url, data=body, headers=session.headers,
                                 timeout=aiohttp.ClientTimeout(total=STREAM_TIMEOUT_S)) as response:
        return (await response.read()).count(b'"notifications/progress"')


async def _written(out: Path) -> bytes:
    """The counts file, once the daemon's signal handler has written it."""
    async with asyncio.timeout(DUMP_DEADLINE_S):
        while True:
            try:
                return await asyncio.to_thread(out.read_bytes)
            except FileNotFoundError:
                await asyncio.sleep(POLL_S)  # polled, bounded above: a signal handler has no other way to say


def where(filename: str) -> str:
    """A function's file as a reader knows it: from the package (gatewayd/…, aiohttp/…, asyncio/…) down."""
    parts = Path(filename).parts
    for anchor in ("gatewayd", "aiohttp", "asyncio", "multidict", "yarl", "json"):
        if anchor in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor):])
    return Path(filename).name


def summarise(counted: Counts, calls: int, top: int) -> dict[str, Any]:
    """Opcodes per call in all, by package, and the `top` functions; the loop's turns and callbacks per call."""
    counts, loop = counted
    by_function: collections.Counter[str] = collections.Counter()
    for (filename, line, name), n in counts.items():
        by_function[f"{where(filename)}:{line} {name}"] += n
    by_package: collections.Counter[str] = collections.Counter()
    for function, n in by_function.items():
        by_package[function.split("/", 1)[0] if "/" in function else "other"] += n
    return {"calls": calls, "opcodes_per_call": round(sum(counts.values()) / calls, 1),
            "by_package": {name: round(n / calls, 1) for name, n in by_package.most_common()},
            "top": [[function, round(n / calls, 1)] for function, n in by_function.most_common(top)],
            "loop_turns_per_call": round(loop.get(TURN, 0) / calls, 2),
            "loop_callbacks_per_call": {name: round(n / calls, 2) for name, n in sorted(
                loop.items(), key=lambda item: -item[1]) if name != TURN and n / calls >= MIN_CALLBACKS_SHOWN}}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    record: dict[str, Any] = {"args": {"targets": args.targets, "calls": args.calls}, "targets": {}}
    with tempfile.TemporaryDirectory(prefix="gatewayd-opcount-") as tmp:
        root = Path(tmp)
        python = install_copy(root / "install")
        config_dir = root / "config"
        token = streaming_config(config_dir)  # the echo server the call targets call, and the progress server
        out = root / "counts.pickle"
        daemon = ServerProcess("gatewayd", traced_argv(daemon_argv(config_dir, python=python)),
                               env={**bench_env(python=python), OUT_ENV: str(out)}, cwd=config_dir)
        url = await daemon.start()
        try:
            async with client_session(1) as http:
                for name in args.targets:
                    if name == NOTIFICATION:
                        session = SseTarget(name, http, url, token, daemon.pid)
                        await session.open_session()
                        counts, received = await count_notifications(daemon, session, out)
                        record["targets"][name] = summarise(counts, received, args.top)
                        continue
                    target = await call_target(name, http, url, token, daemon.pid)
                    counts = await count(daemon, target, args.calls, out)
                    record["targets"][name] = summarise(counts, args.calls, args.top)
        finally:
            await daemon.stop()
    return record


async def call_target(name: str, http: aiohttp.ClientSession, url: str, token: str, pid: int) -> Target:
    """The call target `name` (GATEWAYD_JSON, GATEWAYD_SSE or GATEWAYD_MODERN) on the daemon at `url`, its session
    open if it has one."""
    if name == GATEWAYD_SSE:
        session = SseTarget(name, http, url, token, pid)
        await session.open_session()
        return session
    if name == GATEWAYD_MODERN:
        return ModernTarget(name, http, url, token, pid)
    return JsonTarget(name, http, url, token, pid)


def report(record: dict[str, Any]) -> str:
    lines = []
    for name, figures in record["targets"].items():
        packages = ", ".join(f"{package} {n:g}" for package, n in figures["by_package"].items())
        unit = "a notification" if name == NOTIFICATION else "a call"
        lines += [f"{name}: {figures['opcodes_per_call']:g} opcodes {unit} ({packages})"]
        lines += [f"  {n:8.1f}  {function}" for function, n in figures["top"]]
        callbacks = ", ".join(f"{callback} {n:g}" for callback, n in figures["loop_callbacks_per_call"].items())
        lines += [f"  loop: {figures['loop_turns_per_call']:g} turns {unit}; callbacks: {callbacks or 'none'}"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.opcount", description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=lambda text: text.split(","), default=list(TARGETS),
                        help=f"comma-separated subset of {','.join(TARGETS)}")
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS, help=f"calls counted a target ({DEFAULT_CALLS})")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"functions listed a target ({DEFAULT_TOP})")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON record goes")
    args = parser.parse_args(argv)
    unknown = set(args.targets) - set(TARGETS)
    if unknown or args.calls < 1 or args.top < 0:
        parser.error(f"targets are some of {', '.join(TARGETS)}; --calls ≥ 1, --top ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = asyncio.run(measure(args))
    print(report(record))
    print(f"record: {save(record, args.results_dir, 'opcount-')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
