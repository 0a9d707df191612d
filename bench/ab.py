"""A/B: gatewayd from a git revision against the working tree, in alternating pairs.

Owns the paired comparison used to judge one change: two installed copies (the package at
`--base`, default HEAD, and the checkout's), each a daemon with its own child and config, both
started once; then pairs of equal measurements, the order flipped every pair, so a slow phase
of the machine hits both sides alike. A full `make bench` run moves ±0.05–0.1 in ratio between
runs on this 2-core machine; pairs still scatter by ~9% each, so 10 pairs resolve ~6% (more pairs
for less: bench/README.md). Reported per pair and as
medians: calls/s, the calls' p99, and the serving processes' CPU (daemon + child) per call (the figure
that sets the ratio when the cores are saturated: bench/README.md, "Which Python, and the CPU budget").

Run: `.venv/bin/python -m bench.ab --base HEAD~1 --pairs 8 --concurrency 8 --targets gatewayd-sse`
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp

from bench.driver import JsonTarget, LoadResult, ModernTarget, SseTarget, Target, client_session, run_load
from bench.procs import INSTALL_DEADLINE, ServerProcess, bench_env, daemon_argv, install_copy, write_config
from bench.run import GATEWAYD_JSON, GATEWAYD_MODERN, GATEWAYD_SSE, RESULTS_DIR, save

SIDES = ("base", "work")
DEFAULT_PAIRS = 6
DEFAULT_DURATION = 3.0
DEFAULT_WARMUP = 0.5
DEFAULT_CONCURRENCY = 8
REPO = Path(__file__).resolve().parent.parent


def export_package(revision: str, into: Path) -> Path:
    """The `gatewayd` package as committed at `revision`, unpacked under `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision, "gatewayd"],
                             check=True, capture_output=True, timeout=INSTALL_DEADLINE).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=INSTALL_DEADLINE)
    return into / "gatewayd"


class Side:
    """One copy of gatewayd under load: its daemon, config and the targets that call it."""

    def __init__(self, name: str, root: Path, source: Path | None) -> None:
        self.name = name
        self.python = install_copy(root / "install", source)
        self.config_dir = root / "config"
        self.token = write_config(self.config_dir)
        env = bench_env(python=self.python)
        self.daemon = ServerProcess(f"gatewayd-{name}", daemon_argv(self.config_dir, python=self.python),
                                    env=env, cwd=self.config_dir)
        self.targets: dict[str, Target] = {}

    async def start(self, http: aiohttp.ClientSession) -> None:
        url = await self.daemon.start()
        sse = SseTarget(GATEWAYD_SSE, http, url, self.token, self.daemon.pid)
        await sse.open_session()
        self.targets = {GATEWAYD_JSON: JsonTarget(GATEWAYD_JSON, http, url, self.token, self.daemon.pid),
                        GATEWAYD_SSE: sse}
        await self.targets[GATEWAYD_JSON].call()  # starts the child
        # Only revisions that speak MCP 2026-07-28 have this target (asked for with --targets).
        self.targets[GATEWAYD_MODERN] = ModernTarget(GATEWAYD_MODERN, http, url, self.token, self.daemon.pid)


async def compare(args: argparse.Namespace) -> dict[str, Any]:
    """The pairs, per target; the record."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gatewayd-ab-") as tmp:
        root = Path(tmp)
        base = Side("base", root / "base", export_package(args.base, root / "export"))
        work = Side("work", root / "work", None)
        sides = {"base": base, "work": work}
        http = client_session(args.concurrency)
        try:
            for side in sides.values():
                await side.start(http)
            for pair in range(args.pairs):
                order = SIDES if pair % 2 == 0 else SIDES[::-1]
                for target in args.targets:
                    results: dict[str, LoadResult] = {}
                    for name in order:
                        results[name] = await run_load(sides[name].targets[target], args.concurrency,
                                                       args.duration, args.warmup)
                    rows.append({"pair": pair + 1, "target": target, **{n: asdict(r) for n, r in results.items()}})
                    print(_pair_line(rows[-1]), flush=True)
        finally:
            await http.close()
            for side in sides.values():
                await side.daemon.stop()
    return {"base": args.base, "concurrency": args.concurrency, "pairs": rows,
            "summary": {target: _summary([r for r in rows if r["target"] == target]) for target in args.targets}}


def _pair_line(row: dict[str, Any]) -> str:
    base, work = row["base"], row["work"]
    return (f"pair {row['pair']} {row['target']:14} calls/s {base['calls_per_s']:7.0f} → {work['calls_per_s']:7.0f}"
            f"   server CPU µs/call {base['server_cpu_us_per_call']:5.0f} → {work['server_cpu_us_per_call']:5.0f}")


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of the per-pair ratios (work ÷ base) and how many pairs went the work's way."""
    speed = [r["work"]["calls_per_s"] / r["base"]["calls_per_s"] for r in rows if r["base"]["calls_per_s"]]
    cpu = [r["work"]["server_cpu_us_per_call"] / r["base"]["server_cpu_us_per_call"]
           for r in rows if r["base"]["server_cpu_us_per_call"]]
    p99 = [r["work"]["p99_ms"] / r["base"]["p99_ms"] for r in rows if r["base"]["p99_ms"]]
    return {
        "calls_per_s_ratio_median": round(statistics.median(speed), 3) if speed else None,
        "server_cpu_ratio_median": round(statistics.median(cpu), 3) if cpu else None,
        "p99_ratio_median": round(statistics.median(p99), 3) if p99 else None,
        "pairs_work_faster": sum(ratio > 1 for ratio in speed),
        "pairs_work_cheaper": sum(ratio < 1 for ratio in cpu),
        "pairs": len(rows),
        "errors": sum(r["base"]["errors"] + r["work"]["errors"] for r in rows),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the git revision to compare the working tree against")
    parser.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help=f"default {DEFAULT_PAIRS}")
    parser.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                        help=f"calls in flight (default {DEFAULT_CONCURRENCY})")
    parser.add_argument("--targets", default=f"{GATEWAYD_JSON},{GATEWAYD_SSE}",
                        type=lambda text: [part.strip() for part in text.split(",") if part.strip()],
                        help=f"comma-separated subset of {GATEWAYD_JSON},{GATEWAYD_SSE},{GATEWAYD_MODERN} (the last "
                        "only where both revisions speak MCP 2026-07-28)")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION,
                        help=f"measured seconds per side and pair (default {DEFAULT_DURATION})")
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP, help=f"default {DEFAULT_WARMUP}")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON record goes")
    args = parser.parse_args(argv)
    if not set(args.targets) <= {GATEWAYD_JSON, GATEWAYD_SSE, GATEWAYD_MODERN} or not args.targets:
        parser.error(f"--targets: choose from {GATEWAYD_JSON}, {GATEWAYD_SSE}, {GATEWAYD_MODERN}")
    if args.pairs < 1 or args.concurrency < 1 or args.duration <= 0 or args.warmup < 0:
        parser.error("--pairs ≥ 1, --concurrency ≥ 1, --duration > 0, --warmup ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = asyncio.run(compare(args))
    for target, summary in record["summary"].items():
        print(f"{target}: work ÷ {args.base}: calls/s ×{summary['calls_per_s_ratio_median']}, server CPU per call "
              f"×{summary['server_cpu_ratio_median']}, p99 ×{summary['p99_ratio_median']}; work faster in "
              f"{summary['pairs_work_faster']} of "
              f"{summary['pairs']} pairs, cheaper in {summary['pairs_work_cheaper']}; errors {summary['errors']}")
    print(f"raw results: {save(record, args.results_dir, 'ab-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
