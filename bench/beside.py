"""`python -m bench.beside`: gatewayd beside the MCP relay floor and ContextForge, through the peer harness's client.

Owns one question the peer harness (`../shared/peers-bench`) does not answer: how far an aiohttp gateway in
front of a stdio child can get at all. It runs, in the same rounds with the order rotated, the harness's own
load client (`load.py`: one MCP session, N `tools/call echo` in flight) against the harness's echo server
behind: `mcprelay-json` and `mcprelay-sse` (`bench/mcprelay.py`, the least such a relay does, answering as JSON
or as SSE), `gatewayd` (an installed copy of this checkout, audit on, as the harness runs it), `gatewayd-modern`
(the same daemon on the MCP 2026-07-28 stateless path, which `load.py` does not speak: `bench/modernload.py` runs
it with only the request changed) and `contextforge` (the harness's ContextForge translate install, if
present). Prints calls/s, p50 and p99 per
target and concurrency (medians over rounds) and the per-round ratios to ContextForge; writes the record to
`bench/results/beside-<stamp>.json`.

Needs the harness's installs: run `bash ../shared/peers-bench/run_all.sh` once (or point `--work` at its
`$BENCH_WORK`); `load.py` runs on its `venv-floor` python, as in the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shlex
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.floor import TOKEN_ENV
from bench.mcprelay import CHILD_ENV, SSE_ENV
from bench.procs import CLIENT, ROLE, ServerProcess, bench_env, daemon_argv, floor_argv, install_copy
from bench.run import save
from gatewayd.config.edit import set_client_token
from gatewayd.tokens import hash_token, new_token

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HARNESS = ROOT.parent / "shared" / "peers-bench"
DEFAULT_WORK = Path(os.environ.get("TMPDIR", "/tmp")) / "benchwork"
# Time for a server without a "listening on" line (ContextForge) to accept connections.
PORT_DEADLINE = 60.0
# Seconds load.py may run beyond its measured window before it counts as hung.
LOAD_SLACK = 60.0
MCPRELAY_JSON, MCPRELAY_SSE, GATEWAYD, CONTEXTFORGE = "mcprelay-json", "mcprelay-sse", "gatewayd", "contextforge"
# The same daemon on its 2026-07-28 stateless path, driven by load.py through bench/modernload.py.
GATEWAYD_MODERN = "gatewayd-modern"
MODERNLOAD = ROOT / "bench" / "modernload.py"
# Issue 20's goal 1 (calls/s part): gatewayd, on both paths, at least this many times ContextForge's at every
# concurrency. Its p99 part needs the HTTP floor, which the peer harness runs and this does not.
GOAL_PER_CONTEXTFORGE = 1.2


def gatewayd_config(root: Path, echo_argv: list[str]) -> str:
    """tools.d/echo.toml in front of the harness's echo server and one client allowed `echo.*`; its token."""
    (root / "tools.d").mkdir(parents=True)
    (root / "policies").mkdir()
    (root / "tools.d" / "echo.toml").write_text(f'command = {json.dumps(echo_argv)}\nprotocol = "mcp"\n')
    (root / "policies" / "roles.toml").write_text(f'[roles.{ROLE}]\nallow = ["echo.*"]\n')
    token = new_token()
    set_client_token(root / "policies" / "clients.toml", CLIENT, hash_token(token), [ROLE])
    return token


def contextforge_env() -> dict[str, str]:
    """ContextForge refuses to start on its placeholder secrets: throwaway ones, as the harness gives it."""
    return {**os.environ, "JWT_SECRET_KEY": secrets.token_urlsafe(48),
            "AUTH_ENCRYPTION_SECRET": secrets.token_urlsafe(48),
            "PLATFORM_ADMIN_PASSWORD": secrets.token_urlsafe(24) + "A1!",
            "DEFAULT_USER_PASSWORD": secrets.token_urlsafe(24) + "A1!"}


def free_port() -> int:
    """A loopback port nobody listens on now (ContextForge takes a port number, not 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def wait_for_port(port: int, proc: asyncio.subprocess.Process) -> None:
    """Until something accepts on 127.0.0.1:`port` (bounded by PORT_DEADLINE; fails if `proc` exits)."""
    deadline = time.monotonic() + PORT_DEADLINE
    while time.monotonic() < deadline and proc.returncode is None:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.1)
    raise RuntimeError(f"nothing listened on port {port} within {PORT_DEADLINE:g}s (exit {proc.returncode})")


async def load(python: Path, harness: Path, target: Target, concurrency: int,
               args: argparse.Namespace) -> dict[str, Any]:
    """One load.py measurement (as bench/modernload.py for a 2026-07-28 target); its JSON record."""
    url, token, tool, modern = target
    client = [str(MODERNLOAD), str(harness)] if modern else [str(harness / "load.py")]
    argv = [str(python), *client, url, "-c", str(concurrency), "-d", str(args.duration),
            "-w", str(args.warmup), "--tool", tool, "--json", "--wait-ready", "30"]
    if token:
        argv += ["--token", token]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.DEVNULL)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), args.duration + args.warmup + LOAD_SLACK)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    record: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return record


Target = tuple[str, str | None, str, bool]  # URL, bearer token, tool name, spoken to as MCP 2026-07-28
Targets = dict[str, Target]


async def start_relays(echo_argv: list[str], servers: list[ServerProcess], targets: Targets) -> None:
    """The MCP relay floor twice: answering as JSON and as SSE."""
    token = new_token()
    for name, sse in ((MCPRELAY_JSON, "0"), (MCPRELAY_SSE, "1")):
        relay = ServerProcess(name, floor_argv("bench.mcprelay"), env=bench_env(
            {TOKEN_ENV: token, CHILD_ENV: shlex.join(echo_argv), SSE_ENV: sse}))
        servers.append(relay)
        targets[name] = (await relay.start(), token, "echo", False)


async def start_contextforge(python: Path, echo_argv: list[str],
                             workdir: Path) -> tuple[asyncio.subprocess.Process, str]:
    """ContextForge translate in front of the echo server, as the harness runs it; the process and its URL."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        str(python), "-m", "mcpgateway.translate", "--stdio", shlex.join(echo_argv), "--expose-streamable-http",
        "--host", "127.0.0.1", "--port", str(port), "--logLevel", "warning", cwd=workdir, env=contextforge_env(),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    await wait_for_port(port, proc)
    return proc, f"http://127.0.0.1:{port}/mcp"


async def rounds(targets: Targets, load_python: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every target at every concurrency, once per round, the order of the targets rotated each round."""
    results: list[dict[str, Any]] = []
    names = list(targets)
    for round_ in range(args.rounds):
        for concurrency in args.concurrency:
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                record = await load(load_python, args.harness.resolve(), targets[name], concurrency, args)
                record.update(target=name, round=round_)
                results.append(record)
                print(f"round {round_ + 1} {name:14} c={concurrency:<3} {record['calls_per_s']:8.0f} calls/s "
                      f"p50 {record['p50_ms']:.2f} p99 {record['p99_ms']:.2f} errors {record['errors']}",
                      file=sys.stderr, flush=True)
    return results


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start every target once, run the rounds, stop them; the record."""
    harness, work = args.harness.resolve(), args.work.resolve()
    load_python = work / "venv-floor" / "bin" / "python"
    cf_python = work / "venv-cf" / "bin" / "python"
    if not load_python.exists():
        raise SystemExit(f"no {load_python}: run `bash {harness}/run_all.sh` once first (it installs the harness)")
    echo_argv = [sys.executable, str(harness / "echo_server.py")]
    with tempfile.TemporaryDirectory(prefix="gatewayd-beside-") as tmp:
        install_copy(Path(tmp))
        config = Path(tmp) / "config"
        gw_token = gatewayd_config(config, echo_argv)
        servers: list[ServerProcess] = []
        cf_proc: asyncio.subprocess.Process | None = None
        targets: Targets = {}
        try:
            await start_relays(echo_argv, servers, targets)
            daemon = ServerProcess(GATEWAYD, daemon_argv(config, ["--watch-config", "false"]), env=bench_env(),
                                   cwd=config)
            servers.append(daemon)
            targets[GATEWAYD] = (await daemon.start(), gw_token, "echo__echo", False)
            targets[GATEWAYD_MODERN] = (targets[GATEWAYD][0], gw_token, "echo__echo", True)
            if cf_python.exists() and not args.no_contextforge:
                (Path(tmp) / "cf").mkdir()
                cf_proc, cf_url = await start_contextforge(cf_python, echo_argv, Path(tmp) / "cf")
                targets[CONTEXTFORGE] = (cf_url, None, "echo", False)
            results = await rounds(targets, load_python, args)
        finally:
            for server in servers:
                await server.stop()
            if cf_proc is not None and cf_proc.returncode is None:
                cf_proc.terminate()
                await asyncio.wait_for(cf_proc.wait(), PORT_DEADLINE)
    summary = summarise(results, args)
    return {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "results": results, "summary": summary, "goal": goal(summary)}


def goal(summary: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Goal 1's calls/s part, with the ratios it was judged on; None when ContextForge did not run."""
    ratios = {f"{row['target']}@{row['concurrency']}": round(row["per_contextforge"], 3) for row in summary
              if row["target"] in (GATEWAYD, GATEWAYD_MODERN) and row["per_contextforge"] is not None}
    return {"met": min(ratios.values()) >= GOAL_PER_CONTEXTFORGE, "ratios": ratios} if ratios else None


def summarise(results: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Medians per target and concurrency, and the median of the per-round ratios to ContextForge."""
    cell = {(r["target"], r["concurrency"], r["round"]): r for r in results}
    rows = []
    for name in dict.fromkeys(r["target"] for r in results):
        for c in args.concurrency:
            runs = [cell[(name, c, n)] for n in range(args.rounds) if (name, c, n) in cell]
            ratios = [cell[(name, c, n)]["calls_per_s"] / cell[(CONTEXTFORGE, c, n)]["calls_per_s"]
                      for n in range(args.rounds) if (name, c, n) in cell and (CONTEXTFORGE, c, n) in cell]
            rows.append({"target": name, "concurrency": c,
                         "calls_per_s": statistics.median(r["calls_per_s"] for r in runs),
                         "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                         "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                         "errors": sum(r["errors"] for r in runs),
                         "per_contextforge": statistics.median(ratios) if ratios else None})
    return rows


def report(summary: list[dict[str, Any]]) -> str:
    lines = ["| target | in flight | calls/s | p50 ms | p99 ms | ÷ ContextForge (median of rounds) | errors |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for row in summary:
        ratio = f"{row['per_contextforge']:.2f}" if row["per_contextforge"] is not None else "—"
        lines.append(f"| {row['target']} | {row['concurrency']} | {row['calls_per_s']:.0f} | {row['p50_ms']:.2f} | "
                     f"{row['p99_ms']:.2f} | {ratio} | {row['errors']} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.beside", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--harness", type=Path, default=DEFAULT_HARNESS, help="the peer harness's folder")
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="its $BENCH_WORK (the installs)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--concurrency", type=lambda text: [int(x) for x in text.split(",")], default=[1, 8, 32])
    parser.add_argument("--no-contextforge", action="store_true")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = asyncio.run(measure(args))
    print(report(record["summary"]))
    verdict = record["goal"]
    if verdict is not None:
        print(f"goal at_least_{GOAL_PER_CONTEXTFORGE}x_contextforge: {'MET' if verdict['met'] else 'NOT MET'} "
              f"{json.dumps(verdict['ratios'])}")
    print(f"record: {save(record, args.results_dir, 'beside-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
